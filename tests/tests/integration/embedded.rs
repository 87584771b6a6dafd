//! The host inside the caller's process (`state_host::embedded`), through its C ABI as Meltano's
//! bridge calls it with ctypes: a configuration it cannot start with opens nothing and says
//! why, without the password; an open instance answers the `serve` protocol against ClickHouse
//! and gives back the locks it holds when closed.

use integration_tests::state_host::embedded::{GONE, Host, sb_call, sb_close, sb_free, sb_open};
use integration_tests::{TestTable, json};
use serde_json::Value;

/// Opens from `config`; the handle (null when it did not start) and the first line.
fn open(config: &str) -> (*mut Host, Value) {
    let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: a valid buffer and out-pointers.
    let host = unsafe { sb_open(config.as_ptr(), config.len(), &mut out, &mut len) };
    (host, json(&taken(out, len)))
}

fn call(host: *mut Host, line: &str) -> (i32, String) {
    let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: a handle from `sb_open`, a valid buffer and out-pointers.
    let status = unsafe { sb_call(host, line.as_ptr(), line.len(), 60_000, &mut out, &mut len) };
    (status, taken(out, len))
}

fn taken(out: *mut u8, len: usize) -> String {
    // SAFETY: what the ABI gave out, freed once.
    let text = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(out, len) }).into();
    unsafe { sb_free(out, len) };
    text
}

fn config(table: &TestTable, extra: &[(&str, &str)]) -> String {
    serde_json::json!({
        "uri": table.target.uri(),
        "settings": table.with(extra),
        "allow_loopback": true,
    })
    .to_string()
}

#[test]
fn a_configuration_it_cannot_start_with_opens_nothing_and_says_why() {
    let (host, first) = open("{not json");
    assert!(host.is_null());
    assert_eq!(first["error"]["kind"], "component", "{first}");
    assert!(
        first["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("configuration")
    );

    let table = TestTable::new("embedded_bad");
    let (host, first) = open(&config(&table, &[("lock_mode", "sometimes")]));
    assert!(host.is_null());
    assert_eq!(first["error"]["kind"], "invalid-config", "{first}");
    assert_eq!(first["error"]["setting"], "lock_mode", "{first}");

    // A value of the wrong type: serde's own message would quote it, and it may be a secret.
    let (host, first) =
        open(r#"{"uri": "clickhouse://u:s3cret-pw@127.0.0.1/db", "settings": "s3cret-pw"}"#);
    assert!(host.is_null());
    assert!(!first.to_string().contains("s3cret-pw"), "{first}");
    assert!(first.to_string().contains("line 1"), "{first}");
}

#[test]
fn an_open_instance_answers_and_gives_back_held_locks_when_closed() {
    let table = TestTable::new("embedded");
    let (host, first) = open(&config(&table, &[]));
    assert!(!host.is_null(), "{first}");
    assert!(
        first["ready"]["call_deadline_ms"].as_u64().is_some(),
        "{first}"
    );

    let (status, answer) = call(host, r#"{"id": 1, "method": "ping"}"#);
    assert_eq!(
        (status, json(&answer)["result"].clone()),
        (0, "pong".into())
    );
    let (_, answer) = call(host, "not json");
    assert_eq!(json(&answer)["error"]["kind"], "invalid-input", "{answer}");
    let (_, answer) = call(
        host,
        r#"{"id": 2, "method": "acquire_lock", "params": {"state_id": "dev:embedded"}}"#,
    );
    assert!(json(&answer)["result"]["lock"].is_u64(), "{answer}");
    let (_, answer) = call(
        host,
        r#"{"id": 3, "method": "lock_info", "params": {"state_id": "dev:embedded"}}"#,
    );
    assert!(json(&answer)["result"]["owner"].is_string(), "{answer}");

    // SAFETY: a handle from `sb_open`, not used again.
    unsafe { sb_close(host, 60_000) };
    let (again, _) = open(&config(&table, &[]));
    let (_, answer) = call(
        again,
        r#"{"id": 1, "method": "lock_info", "params": {"state_id": "dev:embedded"}}"#,
    );
    assert_eq!(
        json(&answer)["result"],
        Value::Null,
        "a lock outlived its host"
    );
    // SAFETY: as above.
    unsafe { sb_close(again, 60_000) };
}

#[test]
fn no_handle_is_a_clear_status_not_a_crash() {
    let (status, answer) = call(std::ptr::null_mut(), r#"{"id": 1, "method": "ping"}"#);
    assert_eq!(status, GONE);
    assert!(answer.contains("no host"), "{answer}");
}
