//! The difference between two versions of a state: the bookmarks a tap would start from.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::records::State;

/// The bookmarks that differ between two versions, stream by stream, as Meltano hands them to
/// a tap (the partial state over the completed one): `{"<stream>": {"from": ..., "to": ...}}`,
/// `null` where a side has no bookmark; and `currently_syncing` when it changed.
pub fn diff(from: Option<&State>, to: Option<&State>) -> Result<Value> {
    let (from, to) = (singer_state(from)?, singer_state(to)?);
    let bookmarks = |singer: &Map<String, Value>| -> Map<String, Value> {
        singer
            .get("bookmarks")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (before, after) = (bookmarks(&from), bookmarks(&to));
    let mut streams: Vec<&String> = before.keys().chain(after.keys()).collect();
    streams.sort();
    streams.dedup();
    let mut changed = Map::new();
    for stream in streams {
        let (a, b) = (before.get(stream), after.get(stream));
        if a != b {
            changed.insert(stream.clone(), json!({"from": a, "to": b}));
        }
    }
    let mut out = Map::new();
    out.insert("bookmarks".into(), Value::Object(changed));
    let syncing = |singer: &Map<String, Value>| singer.get("currently_syncing").cloned();
    if syncing(&from) != syncing(&to) {
        out.insert(
            "currently_syncing".into(),
            json!({"from": syncing(&from), "to": syncing(&to)}),
        );
    }
    Ok(Value::Object(out))
}

/// `singer_state` of the view a tap gets (partial over completed); empty for no state.
fn singer_state(state: Option<&State>) -> Result<Map<String, Value>> {
    let Some(state) = state else {
        return Ok(Map::new());
    };
    let object = |text: &str| match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Error::InvalidInput(
            "a stored state part is not a JSON object".into(),
        )),
    };
    let mut view = object(&state.completed)?;
    clickhouse_state_contract::merge::merge(object(&state.partial)?, &mut view);
    Ok(match view.remove("singer_state") {
        Some(Value::Object(singer)) => singer,
        _ => Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(completed: &str, partial: &str) -> State {
        State::new("id", partial, completed)
    }

    #[test]
    fn a_diff_names_the_streams_whose_bookmarks_changed() {
        let old = state(
            r#"{"singer_state":{"bookmarks":{"a":{"id":1},"b":{"id":2}}}}"#,
            "{}",
        );
        let new = state(
            r#"{"singer_state":{"bookmarks":{"a":{"id":1},"b":{"id":2}}}}"#,
            r#"{"singer_state":{"bookmarks":{"b":{"id":3},"c":{"id":1}},"currently_syncing":"c"}}"#,
        );
        let d = diff(Some(&old), Some(&new)).expect("diff");
        assert_eq!(
            d,
            json!({
                "bookmarks": {
                    "b": {"from": {"id": 2}, "to": {"id": 3}},
                    "c": {"from": null, "to": {"id": 1}},
                },
                "currently_syncing": {"from": null, "to": "c"},
            })
        );
        assert_eq!(
            diff(Some(&new), Some(&new)).expect("diff"),
            json!({"bookmarks": {}})
        );
        assert_eq!(
            diff(Some(&old), None).expect("diff")["bookmarks"]["a"],
            json!({"from": {"id": 1}, "to": null})
        );
    }
}
