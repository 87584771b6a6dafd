//! What `serve` takes: one typed request per line. The variants are the operations a caller of
//! `serve` has, in one list: `state-backend methods` prints their names, and a test holds them
//! to the contract's exports and to the Meltano adapter's calls.

use serde::Deserialize;
use serde_json::{Value, json};
use state_host::{Error, State};
use strum::VariantNames;

/// A request: `{"id": …, "method": "<name>", "params": {…}}`, the method a variant's name in
/// snake case. Locks are referred to by the number `acquire_lock` returned.
#[derive(Debug, Deserialize, VariantNames)]
#[serde(tag = "method", content = "params", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Request {
    /// Answers "pong": the host is alive.
    Ping {},
    Get {
        state_id: String,
    },
    Set(StateParams),
    Update(StateParams),
    Delete {
        state_id: String,
    },
    Clear {
        state_id: String,
    },
    StateIds {
        #[serde(default)]
        pattern: Option<String>,
    },
    GetAll {
        #[serde(default)]
        pattern: Option<String>,
    },
    SetAll {
        states: Vec<StateParams>,
    },
    ClearAll {},
    AcquireLock {
        state_id: String,
    },
    Release {
        lock: u64,
    },
    Renew {
        lock: u64,
    },
    SetLocked {
        #[serde(flatten)]
        state: StateParams,
        lock: u64,
    },
    DeleteLocked {
        lock: u64,
    },
    LockInfo {
        state_id: String,
    },
    ForceUnlock {
        state_id: String,
    },
    Migrate {},
}

/// A state in a request; an absent part is `{}`.
#[derive(Debug, Deserialize)]
pub struct StateParams {
    state_id: String,
    #[serde(default = "empty_object")]
    partial: String,
    #[serde(default = "empty_object")]
    completed: String,
}

fn empty_object() -> String {
    "{}".into()
}

impl From<StateParams> for State {
    fn from(p: StateParams) -> State {
        State::new(&p.state_id, &p.partial, &p.completed)
    }
}

impl Request {
    /// The request named `method` with `params` (absent: none).
    pub fn parse(method: &str, params: Option<Value>) -> Result<Request, Error> {
        let params = params.unwrap_or_else(|| json!({}));
        serde_json::from_value(json!({"method": method, "params": params}))
            .map_err(|e| Error::InvalidInput(format!("request '{method}': {e}")))
    }

    /// Every method's name.
    pub fn methods() -> &'static [&'static str] {
        Request::VARIANTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_parses_with_its_parameters_and_an_unknown_one_does_not() {
        let ok = [
            ("ping", None),
            ("get", Some(json!({"state_id": "a"}))),
            ("set", Some(json!({"state_id": "a", "partial": "{}"}))),
            ("state_ids", Some(json!({}))),
            ("state_ids", Some(json!({"pattern": "a*"}))),
            ("set_locked", Some(json!({"state_id": "a", "lock": 1}))),
            ("clear_all", Some(json!({}))),
        ];
        for (method, params) in ok {
            assert!(
                Request::parse(method, params.clone()).is_ok(),
                "{method} {params:?}"
            );
        }
        for (method, params) in [
            ("get", Some(json!({}))),
            ("release", Some(json!({"lock": "one"}))),
            ("no_such_method", None),
        ] {
            assert!(
                matches!(Request::parse(method, params), Err(Error::InvalidInput(_))),
                "{method}"
            );
        }
        assert!(Request::methods().contains(&"force_unlock"));
    }
}
