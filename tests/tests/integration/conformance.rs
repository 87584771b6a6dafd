//! The shared conformance cases (`tests/conformance/cases.json`) through this host: the same
//! list the Node host runs (`hosts/node/conformance.js`), each case on a table of its own.
//! `CONFORMANCE_CASE` runs the cases whose name contains it.

use std::collections::HashMap;

use integration_tests::state_host::{Backend, Error, HistoryEntry, Lock, LockInfo, Point, State};
use integration_tests::{SCHEMA, TestTable, runtime};
use serde_json::{Value, json};

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance/cases.json");
    let text = std::fs::read_to_string(path).expect("the cases");
    let all: Value = serde_json::from_str(&text).expect("the cases are JSON");
    all["cases"].as_array().expect("a list of cases").clone()
}

/// A state in the cases' form: its parts parsed, so that key order does not matter.
fn state_json(s: &State) -> Value {
    let part = |text: &str| serde_json::from_str(text).unwrap_or(Value::String(text.into()));
    json!({"state_id": s.state_id, "partial": part(&s.partial), "completed": part(&s.completed)})
}

fn lock_json(info: &LockInfo) -> Value {
    json!({
        "state_id": info.state_id,
        "owner": info.owner,
        "token": info.token,
        "acquired_at_ms": info.acquired_at_ms,
        "expires_at_ms": info.expires_at_ms,
    })
}

/// The cases' expected value with the parts of its states parsed, as `state_json` gives them.
fn expected(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let parsed = match (k.as_str(), v) {
                        ("partial" | "completed", Value::String(text)) => {
                            serde_json::from_str(text).unwrap_or(v.clone())
                        }
                        _ => expected(v),
                    };
                    (k.clone(), parsed)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(expected).collect()),
        other => other.clone(),
    }
}

fn state_of(value: &Value) -> State {
    let text = |k: &str| value[k].as_str().expect("a string").to_string();
    State::new(text("state_id"), text("partial"), text("completed"))
}

/// The point a step names: a version, or the version of an entry of the last listing.
fn point(s: &Value, listed: &[HistoryEntry]) -> Point {
    match s["at_history"].as_u64() {
        Some(i) => Point::Version(listed[i as usize].version),
        None => Point::Version(s["version"].as_u64().expect("a version")),
    }
}

fn entry_json(e: &HistoryEntry) -> Value {
    json!({"version": e.version, "op": e.op, "state": e.state.as_ref().map(state_json)})
}

async fn step(
    stores: &mut HashMap<String, Backend>,
    locks: &mut HashMap<String, Lock>,
    listed: &mut Vec<HistoryEntry>,
    s: &Value,
) -> Result<Value, Error> {
    let store = stores
        .get_mut(s["store"].as_str().unwrap_or("a"))
        .expect("a store the case opened");
    let id = || s["state_id"].as_str().expect("a state id");
    let pattern = s["pattern"].as_str();
    fn held<'a>(locks: &'a HashMap<String, Lock>, s: &Value) -> &'a Lock {
        locks
            .get(s["lock"].as_str().expect("a lock's name"))
            .expect("a lock the case holds")
    }
    Ok(match s["op"].as_str().expect("an op") {
        "get" => store
            .get(id())
            .await?
            .as_ref()
            .map_or(Value::Null, state_json),
        "set" => store
            .set(&state_of(&s["state"]))
            .await
            .map(|()| Value::Null)?,
        "update" => store
            .update(&state_of(&s["state"]))
            .await
            .map(|()| Value::Null)?,
        "delete" => store.delete(id()).await.map(|()| Value::Null)?,
        "clear" => store.clear(id()).await.map(|()| Value::Null)?,
        "state_ids" => json!(store.state_ids(pattern).await?),
        "get_all" => Value::Array(
            store
                .get_all(pattern)
                .await?
                .iter()
                .map(state_json)
                .collect(),
        ),
        "set_all" => {
            let states: Vec<State> = s["states"]
                .as_array()
                .expect("states")
                .iter()
                .map(state_of)
                .collect();
            json!(store.set_all(&states).await?)
        }
        "clear_all" => json!(store.clear_all().await?),
        "lock_info" => store
            .lock_info(id())
            .await?
            .as_ref()
            .map_or(Value::Null, lock_json),
        "force_unlock" => json!(store.force_unlock(id()).await?),
        "acquire_lock" => {
            let held = store.acquire_lock(id()).await?;
            locks.insert(s["lock"].as_str().expect("a lock's name").into(), held);
            Value::Null
        }
        "release" => {
            let name = s["lock"].as_str().expect("a lock's name");
            let held = locks.remove(name).expect("a lock the case holds");
            store.release(held).await.map(|()| Value::Null)?
        }
        "renew" => store.renew(held(locks, s)).await.map(|()| Value::Null)?,
        "set_locked" => store
            .set_locked(&state_of(&s["state"]), held(locks, s))
            .await
            .map(|()| Value::Null)?,
        "delete_locked" => store
            .delete_locked(held(locks, s))
            .await
            .map(|()| Value::Null)?,
        "clear_streams_locked" => {
            let streams: Vec<String> = s["streams"]
                .as_array()
                .expect("streams")
                .iter()
                .map(|v| v.as_str().expect("a stream").to_string())
                .collect();
            state_json(&store.clear_streams_locked(&streams, held(locks, s)).await?)
        }
        "restore_locked" => {
            let restored = store
                .restore_locked(point(s, listed), held(locks, s))
                .await?;
            json!({
                "replaced": restored.replaced.as_ref().map(state_json),
                "restored": entry_json(&restored.restored),
            })
        }
        "get_at" => {
            let entry = store.get_at(id(), point(s, listed)).await?;
            entry.state.as_ref().map_or(Value::Null, state_json)
        }
        "history" => {
            let limit = s["limit"].as_u64().expect("a limit") as u32;
            *listed = store.history(id(), limit).await?;
            Value::Array(listed.iter().map(entry_json).collect())
        }
        "migrate" => store.migrate().await.map(|()| Value::Null)?,
        other => panic!("the cases name an operation this runner lacks: {other}"),
    })
}

/// What went wrong in one case, or None.
async fn run_case(case: &Value) -> Option<String> {
    let table = TestTable::new("conformance");
    let mut names = vec!["a".to_string()];
    let settings = case["settings"].as_object().cloned().unwrap_or_default();
    let steps = case["steps"].as_array().cloned().unwrap_or_default();
    for name in settings.keys().cloned().chain(
        steps
            .iter()
            .filter_map(|s| s["store"].as_str().map(String::from)),
    ) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let mut stores = HashMap::new();
    for name in names {
        let mut with = table.settings();
        if let Some(extra) = settings.get(&name).and_then(Value::as_object) {
            with.extend(
                extra
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())),
            );
        }
        match (
            runtime().open(&table.target.uri(), with).await,
            case["open_error"].as_str(),
        ) {
            (Ok(store), None) => drop(stores.insert(name, store)),
            (Ok(_), Some(kind)) => return Some(format!("opened, expected {kind}")),
            // Bad input changes nothing: not even the schema is created (so the rows, checked
            // all the same, are none because there is no table).
            (Err(e), Some(kind)) if e.kind() == kind => {
                return tables_created(&table).or_else(|| stored_rows_differ(case, &table));
            }
            (Err(e), _) => return Some(format!("open: {e}")),
        }
    }
    let mut locks = HashMap::new();
    let mut listed = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let op = s["op"].as_str().unwrap_or_default();
        let got = match step(&mut stores, &mut locks, &mut listed, s).await {
            Ok(got) => got,
            Err(e) if s["error"].as_str() == Some(e.kind()) => continue,
            Err(e) => return Some(format!("step {} ({op}): {}: {e}", i + 1, e.kind())),
        };
        if let Some(kind) = s["error"].as_str() {
            return Some(format!("step {} ({op}): expected {kind}, got {got}", i + 1));
        }
        if let Some(want) = s.get("expect").map(expected)
            && got != want
        {
            return Some(format!("step {} ({op}): expected {want}, got {got}", i + 1));
        }
        if let Some(want) = s.get("expect_ops") {
            let ops: Vec<Value> = got
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| e["op"].clone())
                .collect();
            if &Value::Array(ops.clone()) != want {
                return Some(format!(
                    "step {} ({op}): ops {ops:?}, expected {want}",
                    i + 1
                ));
            }
        }
        if let Some(want) = s.get("expect_replaced").map(expected)
            && got["replaced"] != want
        {
            return Some(format!(
                "step {} ({op}): replaced {}, expected {want}",
                i + 1,
                got["replaced"]
            ));
        }
        for (k, want) in s["expect_fields"].as_object().into_iter().flatten() {
            if &got[k] != want {
                return Some(format!(
                    "step {} ({op}): {k} is {}, expected {want}",
                    i + 1,
                    got[k]
                ));
            }
        }
    }
    for (_, store) in stores {
        let _ = store.close().await;
    }
    stored_rows_differ(case, &table)
}

/// The case's tables that exist, read from `system.tables`, as an error; None when there are none.
fn tables_created(table: &TestTable) -> Option<String> {
    let sql = format!(
        "SELECT name FROM system.tables WHERE database = '{SCHEMA}' AND startsWith(name, '{}') \
         ORDER BY name",
        table.name
    );
    match table.target.query(&sql) {
        Ok(names) if names.trim().is_empty() => None,
        Ok(names) => Some(format!(
            "a failed open created {}",
            names.split_whitespace().collect::<Vec<_>>().join(", ")
        )),
        Err((status, body)) => Some(format!("system.tables: HTTP {status}: {body}")),
    }
}

/// How the case's table differs from its `rows`, read with SQL of this test's own rather than
/// through the host: the newest row of each id (`FINAL`, the engine's own choice), but for a
/// delete's tombstone (both parts NULL), sorted by id. A table never created holds none.
fn stored_rows_differ(case: &Value, table: &TestTable) -> Option<String> {
    let Some(want) = case.get("rows").map(expected) else {
        return Some("the case has no `rows`".into());
    };
    let sql = format!(
        "SELECT state_id, ifNull(partial_state, '') AS partial, \
         ifNull(completed_state, '') AS completed FROM {} FINAL \
         WHERE NOT (partial_state IS NULL AND completed_state IS NULL) \
         ORDER BY state_id FORMAT JSONEachRow",
        table.qualified()
    );
    let body = match table.target.query(&sql) {
        Ok(body) => body,
        Err((_, body)) if body.contains("UNKNOWN_TABLE") => String::new(),
        Err((status, body)) => return Some(format!("rows: HTTP {status}: {body}")),
    };
    let got = Value::Array(
        body.lines()
            .map(|line| {
                let row: Value = serde_json::from_str(line).expect("a JSONEachRow row");
                let text = |k: &str| row[k].as_str().unwrap_or_default().to_string();
                state_json(&State::new(
                    text("state_id"),
                    text("partial"),
                    text("completed"),
                ))
            })
            .collect(),
    );
    (got != want).then(|| format!("rows: expected {want}, got {got}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shared_case_passes_on_this_host() {
    let only = std::env::var("CONFORMANCE_CASE").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in cases() {
        let name = case["name"].as_str().expect("a name").to_string();
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        ran += 1;
        if let Some(problem) = run_case(&case).await {
            failures.push(format!("{name}: {problem}"));
        }
    }
    assert!(ran > 0, "no case ran");
    assert!(
        failures.is_empty(),
        "{} of {ran} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Both hosts' egress policies class each address of the shared table alike
/// (`tests/conformance/addresses.json`; `hosts/node/test/host.test.js` holds the Node host to it).
#[test]
fn the_address_classes_are_the_shared_tables() {
    use integration_tests::state_host::http::policy::AddressClass;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance/addresses.json");
    let table: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the table")).expect("JSON");
    let addresses = table["addresses"].as_object().expect("addresses");
    assert!(addresses.len() > 30);
    for (address, want) in addresses {
        let ip: std::net::IpAddr = address.parse().expect("an address");
        let got = match AddressClass::of(ip) {
            None => "public",
            Some(AddressClass::Loopback) => "loopback",
            Some(AddressClass::LinkLocal) => "link-local",
            Some(AddressClass::Metadata) => "metadata",
            Some(AddressClass::Private) => "private",
        };
        assert_eq!(got, want, "{address}");
    }
}
