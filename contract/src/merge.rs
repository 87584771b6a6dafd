//! Meltano's deep merge of state objects, its update rule, and the JSON objects a state's parts
//! are.
//!
//! `merge(src, dest)`: for each key of `src`, an object value is merged recursively into
//! `dest[key]`; any other value replaces `dest[key]` (arrays are replaced, not concatenated).
//! Meltano's own version crashes when `dest[key]` exists but is not an object while `src[key]`
//! is one; here the object from `src` replaces it, as any other `src` value would.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Merges `src` into `dest`; `src` wins.
pub fn merge(src: Map<String, Value>, dest: &mut Map<String, Value>) {
    for (key, value) in src {
        match value {
            Value::Object(src_child) => match dest.get_mut(&key) {
                Some(Value::Object(dest_child)) => merge(src_child, dest_child),
                _ => {
                    let mut fresh = Map::new();
                    merge(src_child, &mut fresh);
                    dest.insert(key, Value::Object(fresh));
                }
            },
            other => {
                dest.insert(key, other);
            }
        }
    }
}

/// Meltano's update of the stored parts (partial, completed) by a state whose parts are
/// `partial` and `completed`: a partial state merges into the stored partial and keeps the
/// stored completed; a complete state replaces everything and resets the partial.
pub fn merged(
    partial: Map<String, Value>,
    completed: Map<String, Value>,
    stored: Option<(Option<String>, Option<String>)>,
) -> (String, String) {
    match stored {
        Some((stored_partial, stored_completed)) if completed.is_empty() => {
            let mut merged = stored_partial
                .as_deref()
                .and_then(|p| parse_object(p, "stored partial state").ok())
                .unwrap_or_default();
            merge(partial, &mut merged);
            (
                Value::Object(merged).to_string(),
                or_empty(stored_completed),
            )
        }
        _ if !completed.is_empty() => ("{}".into(), Value::Object(completed).to_string()),
        _ => (Value::Object(partial).to_string(), "{}".into()),
    }
}

/// Parses JSON text that must be an object.
pub fn parse_object(text: &str, what: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(Error::InvalidInput(format!(
            "the {what} must be a JSON object, not {}",
            kind_of(&other)
        ))),
        Err(e) => Err(Error::InvalidInput(format!(
            "the {what} is not valid JSON: {e}"
        ))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub fn or_empty(part: Option<String>) -> String {
    // JSON's whitespace is ASCII; `trim_ascii` looks at the ends only (`trim`'s Unicode
    // predicate showed up in the profile of a 100k-state `get-all`).
    match part {
        Some(text) if !matches!(text.trim_ascii(), "" | "null") => text,
        _ => "{}".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(src: Value, dest: Value) -> Value {
        let (Value::Object(src), Value::Object(mut dest)) = (src, dest) else {
            panic!("objects only");
        };
        merge(src, &mut dest);
        Value::Object(dest)
    }

    #[test]
    fn src_wins_and_other_keys_stay() {
        assert_eq!(
            merged(json!({"a": 2, "c": 3}), json!({"a": 1, "b": 1})),
            json!({"a": 2, "b": 1, "c": 3})
        );
    }

    #[test]
    fn nested_objects_merge() {
        let dest =
            json!({"singer_state": {"bookmarks": {"s1": {"ts": "2024-01-01"}, "s2": {"ts": "x"}}}});
        let src = json!({"singer_state": {"bookmarks": {"s1": {"ts": "2024-02-01", "id": 9}}}});
        assert_eq!(
            merged(src, dest),
            json!({"singer_state": {"bookmarks": {"s1": {"ts": "2024-02-01", "id": 9}, "s2": {"ts": "x"}}}})
        );
    }

    #[test]
    fn arrays_are_replaced() {
        assert_eq!(
            merged(json!({"a": [3]}), json!({"a": [1, 2]})),
            json!({"a": [3]})
        );
    }

    #[test]
    fn object_replaces_a_scalar_where_meltano_would_crash() {
        assert_eq!(
            merged(json!({"a": {"b": 1}}), json!({"a": 5})),
            json!({"a": {"b": 1}})
        );
        assert_eq!(
            merged(json!({"a": {"b": {"c": 1}}}), json!({"a": [1]})),
            json!({"a": {"b": {"c": 1}}})
        );
    }

    #[test]
    fn scalar_replaces_an_object() {
        assert_eq!(
            merged(json!({"a": 1}), json!({"a": {"b": 1}})),
            json!({"a": 1})
        );
    }

    #[test]
    fn null_is_a_value() {
        assert_eq!(
            merged(json!({"a": null}), json!({"a": {"b": 1}})),
            json!({"a": null})
        );
    }

    #[test]
    fn empty_src_changes_nothing() {
        assert_eq!(merged(json!({}), json!({"a": 1})), json!({"a": 1}));
    }
}
