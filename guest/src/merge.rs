//! Meltano's deep merge of state objects.
//!
//! `merge(src, dest)`: for each key of `src`, an object value is merged recursively into
//! `dest[key]`; any other value replaces `dest[key]` (arrays are replaced, not concatenated).
//! Meltano's own version crashes when `dest[key]` exists but is not an object while `src[key]`
//! is one; here the object from `src` replaces it, as any other `src` value would.

use serde_json::{Map, Value};

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
