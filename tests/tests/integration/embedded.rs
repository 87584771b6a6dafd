//! The host inside the caller's process (`state_host::embedded`), through its C ABI as Meltano's
//! bridge calls it with ctypes: a configuration it cannot start with opens nothing and says
//! why, without the password; an open instance answers the `serve` protocol against ClickHouse
//! and gives back the locks it holds when closed.

use integration_tests::state_host::embedded::{
    GONE, HUNG, Host, sb_call, sb_close, sb_free, sb_open,
};
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

#[test]
fn a_kept_lock_is_given_back_between_calls_on_the_instances_own_timer() {
    // Calls run on the caller's thread; the idle work (the linger's end) on the instance's
    // own, with no call to carry it.
    let table = TestTable::new("embedded_idle");
    let (host, first) = open(&config(&table, &[("lock_linger_seconds", "1")]));
    assert!(!host.is_null(), "{first}");
    let (watcher, first) = open(&config(&table, &[]));
    assert!(!watcher.is_null(), "{first}");
    let holder = || {
        let (status, answer) = call(
            watcher,
            r#"{"id": 1, "method": "lock_info", "params": {"state_id": "dev:idle"}}"#,
        );
        let answer = json(&answer);
        assert!(status == 0 && answer.get("error").is_none(), "{answer}");
        answer["result"].clone()
    };

    let (status, answer) = call(
        host,
        r#"{"id": 1, "method": "update", "params": {"state_id": "dev:idle", "partial": "{}",
            "completed": "{\"singer_state\": {\"n\": 1}}"}}"#,
    );
    assert_eq!(status, 0, "{answer}");
    assert!(json(&answer).get("error").is_none(), "{answer}");
    let kept = std::time::Instant::now();
    assert!(holder()["owner"].is_string(), "the update kept no lock");
    // Well within the lease (30 s), at whose end it would lapse by itself.
    while holder() != Value::Null {
        assert!(
            kept.elapsed() < std::time::Duration::from_secs(10),
            "the kept lock was not given back between calls"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Given back at the linger's end, not before it, and by its holder.
    assert!(kept.elapsed() >= std::time::Duration::from_millis(900));
    let released = table.target.must(&format!(
        "SELECT count() FROM {}_lock_log WHERE state_id = 'dev:idle' AND event = 'release'",
        table.qualified()
    ));
    assert_eq!(
        released.trim(),
        "1",
        "no release row: the lock was not given back"
    );

    // The instance goes on answering after its idle work.
    let (status, answer) = call(host, r#"{"id": 2, "method": "ping"}"#);
    assert_eq!(
        (status, json(&answer)["result"].clone()),
        (0, "pong".into())
    );
    // SAFETY: handles from `sb_open`, not used again.
    unsafe {
        sb_close(host, 60_000);
        sb_close(watcher, 60_000);
    }
}

/// An open instance of the hostile component (`tests/guests/evil`): `get(id)` runs the attack
/// `id` names.
fn open_evil(label: &str) -> *mut Host {
    let evil =
        integration_tests::state_host::default_component_path().with_file_name("evil_guest.wasm");
    let table = TestTable::new(label);
    let config = serde_json::json!({
        "uri": table.target.uri(),
        "allow_loopback": true,
        "component": evil,
    })
    .to_string();
    let (host, first) = open(&config);
    assert!(!host.is_null(), "{first}");
    host
}

#[test]
fn a_call_that_never_ends_is_given_up_at_its_timeout_and_its_instance_with_it() {
    // The call runs on the caller's thread: only the guest's yields (at each tick of the
    // engine's epoch, which must outlive the runtime that opened the instance) let its timeout
    // fire. The evil component's `get("loop")` spins without end.
    let host = open_evil("embedded_evil");
    let handle = host as usize;
    let (answered, answers) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = r#"{"id": 1, "method": "get", "params": {"state_id": "loop"}}"#;
        let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a handle from `sb_open`, closed only after this answers; valid buffers.
        let status = unsafe {
            sb_call(
                handle as *const Host,
                line.as_ptr(),
                line.len(),
                1_000,
                &mut out,
                &mut len,
            )
        };
        let _ = answered.send((status, taken(out, len)));
    });
    let (status, answer) = answers
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the endless call was never given up");
    assert_eq!(status, HUNG, "{answer}");
    // Given up with its instance: the handle says so at once, and closes at once.
    let (status, answer) = call(host, r#"{"id": 2, "method": "ping"}"#);
    assert_eq!(status, GONE, "{answer}");
    // SAFETY: a handle from `sb_open`, not used again.
    unsafe { sb_close(host, 0) };
}

#[test]
fn a_call_that_traps_gives_up_its_instance_so_that_the_next_opens_another() {
    // A trapped instance (here the evil component's panic; a deadline or a CPU budget does the
    // same) cannot be entered again: kept, every later call would fail.
    let host = open_evil("embedded_trap");
    let (status, answer) = call(
        host,
        r#"{"id": 1, "method": "get", "params": {"state_id": "panic"}}"#,
    );
    assert_eq!(status, GONE, "{answer}");
    assert!(answer.contains("panicked on purpose"), "{answer}");
    let (status, answer) = call(host, r#"{"id": 2, "method": "ping"}"#);
    assert_eq!((status, answer.as_str()), (GONE, "the host has ended"));
    // SAFETY: a handle from `sb_open`, not used again.
    unsafe { sb_close(host, 0) };
}
