//! Settle mode beside the original Python backend (its test copy, `python/tests/original_backend.py`,
//! run as it is): from a client whose clock is ahead of the server's, no write of ours hides a
//! later write of the original's (whose versions are the server's clock), and a delete of ours
//! is one the original sees: it neither lists the id nor reads a state for it.

use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;

use integration_tests::state_host::clock::{Clock, SystemClock};
use integration_tests::state_host::{Runtime, RuntimeOptions, State, default_component_path};
use integration_tests::{SCHEMA, TestTable, json, runtime_options};

/// The system clock, `ahead_ms` ahead: a client whose clock runs ahead of the server's.
struct Ahead(u64);

impl Clock for Ahead {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        SystemClock.sleep(ms)
    }
}

/// Runs one call of the original backend's test copy on `table`: `set ID JSON` (the completed
/// state), `get ID` (its completed state as JSON, or null) or `list` (the ids, as JSON).
fn original(table: &TestTable, args: &[&str]) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = r#"
import json, sys
sys.path.insert(0, "python/tests")
from conftest import ClickHouse
from original_backend import OriginalStateStoreManager
from meltano.core.state_store.base import MeltanoState
schema, table, op, *args = sys.argv[1:]
o = OriginalStateStoreManager(ClickHouse.from_env(), schema, table)
if op == "set":
    o.set(MeltanoState(args[0], {}, json.loads(args[1])))
elif op == "get":
    s = o.get(args[0])
    print(json.dumps(None if s is None else s.completed_state))
elif op == "list":
    print(json.dumps(sorted(o.get_state_ids())))
"#;
    let output = Command::new(root.join("python/tests/offline/run"))
        .arg(root.join(".venv/bin/python"))
        .args(["-c", script, SCHEMA, &table.name])
        .args(args)
        .current_dir(&root)
        .output()
        .expect("the original's test copy runs");
    assert!(
        output.status.success(),
        "the original's {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[tokio::test]
async fn from_a_client_ahead_of_the_server_settle_mode_hides_no_write_of_the_original() {
    let options = RuntimeOptions {
        clock: Arc::new(Ahead(60_000)),
        ..runtime_options()
    };
    let ahead = Runtime::load(&default_component_path(), options).expect("the component");
    let table = TestTable::new("settle_ahead");
    let mut ours = ahead
        .open(
            &table.target.uri(),
            table.with(&[("lock_mode", "settle"), ("lock_settle_seconds", "0.05")]),
        )
        .await
        .expect("open");
    ours.migrate().await.expect("migrate");

    // Ours writes, then the original: the original's write is the state.
    for (n, write) in ["set", "update"].into_iter().enumerate() {
        let id = format!("dev:{write}");
        let state = State::completed(&id, format!(r#"{{"ours":{n}}}"#));
        match write {
            "set" => ours.set(&state).await.expect("set"),
            _ => ours.update(&state).await.expect("update"),
        }
        original(&table, &["set", &id, r#"{"original":1}"#]);
        let stored = ours.get(&id).await.unwrap().expect("a state");
        assert_eq!(
            json(&stored.completed),
            json(r#"{"original":1}"#),
            "our {write} hid the original's later write"
        );
    }

    // Ours deletes: the original neither lists the id nor reads a state for it, and its next
    // write is the state.
    ours.set(&State::completed("dev:deleted", r#"{"ours":1}"#))
        .await
        .unwrap();
    ours.delete("dev:deleted").await.expect("delete");
    assert_eq!(ours.get("dev:deleted").await.unwrap(), None);
    let listed = original(&table, &["list"]);
    assert!(
        !listed.contains("dev:deleted"),
        "the original lists {listed}"
    );
    assert_eq!(original(&table, &["get", "dev:deleted"]), "null");
    original(&table, &["set", "dev:deleted", r#"{"original":2}"#]);
    let stored = ours
        .get("dev:deleted")
        .await
        .unwrap()
        .expect("the original's write");
    assert_eq!(json(&stored.completed), json(r#"{"original":2}"#));
    ours.close().await.ok();
}
