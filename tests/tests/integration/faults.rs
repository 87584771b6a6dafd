//! Invariants under a seeded fault schedule: after every operation, the state is the one before
//! it or the one after it (never a mix, an empty state or an older one); an operation that
//! reported success is never lost; every failure is a typed error.
//!
//! `FAULT_SEED` replays a run; `FAULT_OPERATIONS` sets its length.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use integration_tests::state_host::http::hook::Interceptor;

use integration_tests::state_host::http::faults::{Fault, FaultPlan, FaultSchedule};
use integration_tests::state_host::{Backend, Error, InstanceOptions, State};
use integration_tests::{TestTable, insert_target, json, runtime};
use serde_json::{Map, Value};

type Parts = (Value, Value);

fn merge(src: &Map<String, Value>, dest: &mut Map<String, Value>) {
    for (key, value) in src {
        match (value, dest.get_mut(key)) {
            (Value::Object(s), Some(Value::Object(d))) => merge(s, d),
            (Value::Object(s), _) => {
                let mut fresh = Map::new();
                merge(s, &mut fresh);
                dest.insert(key.clone(), Value::Object(fresh));
            }
            (other, _) => {
                dest.insert(key.clone(), other.clone());
            }
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a run of the invariants saw.
struct Outcome {
    succeeded: u64,
    failed: u64,
    failures_by_kind: HashMap<&'static str, u64>,
    violations: u64,
}

/// `operations` drawn from `seed` (update, set, delete, get over 3 ids) through an instance
/// whose exchanges get `plan`'s faults; after each, a clean instance reads the id back and the
/// invariants are checked against what the operation reported.
async fn run_invariants(
    label: &str,
    plan: Arc<dyn FaultPlan>,
    seed: u64,
    operations: u64,
) -> Outcome {
    let table = TestTable::new(label);
    let settings = table.with(&[
        ("retries", "2"),
        ("retry_backoff_seconds", "0.01"),
        ("lock_lease_seconds", "2"),
        ("lock_timeout_seconds", "5"),
        ("lock_retry_seconds", "0.1"),
    ]);
    let options = InstanceOptions {
        label: "faulty".into(),
        faults: Some(plan),
        ..InstanceOptions::default()
    };
    let mut faulty = runtime()
        .open_with(&table.target.uri(), settings, options)
        .await
        .expect("open");
    let mut clean = table.open().await;
    clean.migrate().await.unwrap();

    let ids = ["dev:a", "dev:b", "dev:c"];
    let mut model: HashMap<&str, Option<Parts>> = ids.iter().map(|id| (*id, None)).collect();
    let (mut failed, mut violations, mut succeeded) = (0u64, 0u64, 0u64);
    let mut failures_by_kind: HashMap<&'static str, u64> = HashMap::new();
    let mut rng = seed;
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        rng >> 33
    };
    for op in 0..operations {
        let id = ids[(next() % ids.len() as u64) as usize];
        let before = model[id].clone();
        let kind = next() % 10;
        let (result, after): (Result<(), Error>, Option<Parts>) = match kind {
            0..=3 => {
                // update with a partial state: a new key, Meltano-style
                let partial =
                    serde_json::json!({"singer_state": {"bookmarks": {format!("k{op}"): op}}});
                let after = match &before {
                    Some((p, c)) => {
                        let mut merged = p.as_object().cloned().unwrap_or_default();
                        merge(partial.as_object().unwrap(), &mut merged);
                        Some((Value::Object(merged), c.clone()))
                    }
                    None => Some((partial.clone(), serde_json::json!({}))),
                };
                let r = faulty
                    .update(&State::partial(id, partial.to_string()))
                    .await;
                (r, after)
            }
            4..=5 => {
                let completed = serde_json::json!({"singer_state": {"full": op}});
                let r = faulty
                    .set(&State::completed(id, completed.to_string()))
                    .await;
                (r, Some((serde_json::json!({}), completed)))
            }
            6 => (faulty.delete(id).await, None),
            7 => {
                let completed = serde_json::json!({"singer_state": {"complete": op}});
                let r = faulty
                    .update(&State::completed(id, completed.to_string()))
                    .await;
                (r, Some((serde_json::json!({}), completed)))
            }
            _ => {
                // a read: it changes nothing, and when it succeeds it sees the current state
                match faulty.get(id).await {
                    Ok(got) => {
                        let got = got.map(|s| (json(&s.partial), json(&s.completed)));
                        if got != before {
                            violations += 1;
                            eprintln!("op {op}: get {id} saw {got:?}, expected {before:?}");
                        }
                        (Ok(()), before.clone())
                    }
                    Err(e) => (Err(e), before.clone()),
                }
            }
        };
        let actual = clean
            .get(id)
            .await
            .expect("the clean instance reads")
            .map(|s| (json(&s.partial), json(&s.completed)));
        match result {
            Ok(()) => {
                succeeded += 1;
                if actual != after {
                    violations += 1;
                    eprintln!(
                        "op {op} ({kind}) on {id} succeeded but the state is {actual:?}, expected {after:?}"
                    );
                }
            }
            Err(error) => {
                failed += 1;
                *failures_by_kind.entry(error.kind()).or_default() += 1;
                if matches!(error, Error::Component(_) | Error::Panicked(_)) {
                    violations += 1;
                    eprintln!("op {op}: not a typed error: {error}");
                }
                if actual != before && actual != after {
                    violations += 1;
                    eprintln!(
                        "op {op} ({kind}) on {id} failed ({error}) and left {actual:?}, neither {before:?} nor {after:?}"
                    );
                }
            }
        }
        model.insert(id, actual);
    }
    Outcome {
        succeeded,
        failed,
        failures_by_kind,
        violations,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariants_hold_under_seeded_faults() {
    let seed = env_u64("FAULT_SEED", 20261129);
    let operations = env_u64("FAULT_OPERATIONS", 1000);
    let schedule = Arc::new(FaultSchedule::new(seed, 150));
    let outcome = run_invariants("faults", schedule.clone(), seed, operations).await;
    let injected = schedule.injected();
    println!(
        "seed {seed}: {operations} operations, {} requests, {} faults injected, {} succeeded, {} failed {:?}, states lost or mixed: {}",
        schedule.requests(),
        injected.len(),
        outcome.succeeded,
        outcome.failed,
        outcome.failures_by_kind,
        outcome.violations,
    );
    assert!(
        injected.len() as u64 >= operations / 10,
        "the schedule injected faults"
    );
    assert_eq!(outcome.violations, 0);
}

/// Acknowledges every 20th state write without sending it.
#[derive(Default)]
struct SwallowSome {
    writes: std::sync::atomic::AtomicU64,
}

impl FaultPlan for SwallowSome {
    fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
        let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
        (state_write && self.writes.fetch_add(1, Ordering::SeqCst) % 20 == 19).then_some(
            Fault::Swallowed {
                written_rows: integration_tests::rows_a_landing_reports(uri),
            },
        )
    }
}

/// The invariants can see a loss: with writes acknowledged but never sent, the same run
/// reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariants_see_a_write_acknowledged_but_never_sent() {
    let swallow = Arc::new(SwallowSome::default());
    let outcome = run_invariants("faults_swallowed", swallow.clone(), 20261129, 300).await;
    let swallowed = swallow.writes.load(Ordering::SeqCst) / 20;
    println!(
        "{swallowed} writes swallowed, {} succeeded, {} failed, states lost or mixed: {}",
        outcome.succeeded, outcome.failed, outcome.violations
    );
    assert!(swallowed >= 3, "only {swallowed} writes swallowed");
    // Each swallowed write is one operation that reported success and is not stored; nothing
    // else is wrong.
    assert_eq!(
        outcome.violations, swallowed,
        "violations seen against writes swallowed"
    );
}

/// Refuses every release of a lock (and its retries).
struct NoRelease;

impl FaultPlan for NoRelease {
    fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
        uri.query()
            .is_some_and(|q| q.contains("insert_deduplication_token=release"))
            .then_some(Fault::Refused)
    }
}

#[tokio::test]
async fn a_failed_release_leaves_a_lock_that_expires_with_its_lease() {
    let table = TestTable::new("norelease");
    let settings = table.with(&[
        ("lock_lease_seconds", "2"),
        ("retries", "1"),
        ("retry_backoff_seconds", "0.01"),
    ]);
    let options = InstanceOptions {
        label: "no-release".into(),
        faults: Some(Arc::new(NoRelease)),
        ..InstanceOptions::default()
    };
    let mut faulty = runtime()
        .open_with(&table.target.uri(), settings, options)
        .await
        .unwrap();
    let result = faulty.update(&State::partial("s", r#"{"a":1}"#)).await;
    assert!(matches!(result, Err(Error::Unreachable(_))), "{result:?}");
    let mut other = table
        .open_with(&[
            ("lock_timeout_seconds", "10"),
            ("lock_retry_seconds", "0.2"),
        ])
        .await;
    // the write itself landed; the lock is still held...
    assert_eq!(
        json(&other.get("s").await.unwrap().unwrap().partial),
        json(r#"{"a":1}"#)
    );
    let held = other.lock_info("s").await.unwrap().expect("still held");
    assert_eq!(held.expires_at_ms - held.acquired_at_ms, 2_000);
    // ...until its lease ends, then the next writer gets it
    other
        .update(&State::partial("s", r#"{"b":2}"#))
        .await
        .expect("after the lease");
    assert_eq!(
        json(&other.get("s").await.unwrap().unwrap().partial),
        json(r#"{"a":1,"b":2}"#)
    );
}

/// Runs the first request that `matches` and loses its answer, then holds its resend back for
/// `hold` (and says so): long enough for another client to write in between.
struct LoseFirstAnswer {
    matches: fn(&http::Uri) -> bool,
    hold: Duration,
    sent: std::sync::atomic::AtomicUsize,
    faulted: std::sync::atomic::AtomicUsize,
    resend_held: std::sync::atomic::AtomicBool,
}

impl LoseFirstAnswer {
    fn of(matches: fn(&http::Uri) -> bool, hold: Duration) -> Arc<Self> {
        Arc::new(LoseFirstAnswer {
            matches,
            hold,
            sent: Default::default(),
            faulted: Default::default(),
            resend_held: Default::default(),
        })
    }

    /// An instance of `table` whose requests go through this plan (two quick retries).
    async fn instance(self: &Arc<Self>, table: &TestTable) -> Backend {
        let interceptor: Arc<dyn Interceptor> = self.clone();
        runtime()
            .open_with(
                &table.target.uri(),
                table.with(&[("retries", "2"), ("retry_backoff_seconds", "0.05")]),
                InstanceOptions {
                    interceptor: Some(interceptor),
                    faults: Some(self.clone()),
                    ..InstanceOptions::default()
                },
            )
            .await
            .unwrap()
    }

    /// Waits until the resend is being held.
    async fn resend_held(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.resend_held.load(Ordering::SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "the request was never sent again"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Interceptor for LoseFirstAnswer {
    fn before_send(&self, _method: &http::Method, uri: &http::Uri) -> Option<Duration> {
        if !(self.matches)(uri) || self.sent.fetch_add(1, Ordering::SeqCst) != 1 {
            return None;
        }
        self.resend_held.store(true, Ordering::SeqCst);
        Some(self.hold)
    }
}

impl FaultPlan for LoseFirstAnswer {
    fn fault(&self, _method: &http::Method, uri: &http::Uri) -> Option<Fault> {
        ((self.matches)(uri) && self.faulted.fetch_add(1, Ordering::SeqCst) == 0)
            .then_some(Fault::ResetBeforeResponse)
    }
}

/// A delete's one write is its tombstone, an insert (its other request is a read).
fn is_delete(uri: &http::Uri) -> bool {
    uri.query().unwrap_or("").contains("INSERT")
}

/// A state write carries the state as a query parameter; the setter's other requests are reads.
fn is_state_write(uri: &http::Uri) -> bool {
    uri.query().unwrap_or("").contains("param_completed=")
}

#[tokio::test]
async fn a_delete_retried_after_its_answer_was_lost_spares_a_newer_state() {
    let table = TestTable::new("delete_retry");
    let mut writer = table.open().await;
    writer
        .set(&State::completed("s", r#"{"v":"old"}"#))
        .await
        .unwrap();
    let lose = LoseFirstAnswer::of(is_delete, Duration::from_millis(1500));
    let mut deleter = lose.instance(&table).await;
    let deleting = tokio::spawn(async move { deleter.delete("s").await });
    // The delete ran and its answer was lost; its retry waits. Another client writes now.
    lose.resend_held().await;
    assert_eq!(
        writer.get("s").await.unwrap(),
        None,
        "the first send deleted"
    );
    writer
        .set(&State::completed("s", r#"{"v":"new"}"#))
        .await
        .unwrap();
    deleting
        .await
        .unwrap()
        .expect("the delete succeeds after its retry");
    let state = writer
        .get("s")
        .await
        .unwrap()
        .expect("the state written after the delete survives its retry");
    assert_eq!(json(&state.completed)["v"], "new");
}

/// A `set` lands and its answer is lost; an update merges into it and is acknowledged; a merge
/// leaves only the update's row; then the set is sent again. The resend must not land above
/// the update (it would bury an acknowledged update that was built on the set itself): it
/// writes nothing, and the set reports that its outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_resent_after_a_merge_does_not_bury_the_update_built_on_it() {
    let table = TestTable::new("set_resend");
    let mut writer = table.open().await;
    writer
        .set(&State::completed("s", r#"{"v":"old"}"#))
        .await
        .unwrap();
    let lose = LoseFirstAnswer::of(is_state_write, Duration::from_secs(5));
    let mut setter = lose.instance(&table).await;
    let setting =
        tokio::spawn(async move { setter.set(&State::completed("s", r#"{"v":"set"}"#)).await });
    lose.resend_held().await;
    // The set landed: the update merges into it.
    writer
        .update(&State::partial("s", r#"{"u":1}"#))
        .await
        .expect("the update");
    table
        .target
        .must(&format!("OPTIMIZE TABLE {} FINAL", table.qualified()));
    assert_eq!(
        table.raw_rows(),
        1,
        "merged: no row of the set's landing is left"
    );
    assert!(
        !setting.is_finished(),
        "the update and the merge came before the resend"
    );
    let outcome = setting.await.unwrap();
    let state = writer.get("s").await.unwrap().expect("a state");
    assert_eq!(json(&state.completed)["v"], "set", "built on the set");
    assert_eq!(
        json(&state.partial)["u"],
        1,
        "the acknowledged update survives the resend"
    );
    match outcome {
        Err(Error::Timeout(m)) => assert!(m.contains("unknown"), "{m}"),
        other => panic!("expected the set's outcome reported unknown, got {other:?}"),
    }
}

/// A `set` lands and its answer is lost; the state is deleted (acknowledged); then the set is
/// sent again. The delete's tombstone is above the set's version, so the resend writes nothing:
/// the deleted state does not come back, and the set reports that its outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_resent_after_a_delete_does_not_bring_the_state_back() {
    let table = TestTable::new("set_resend_delete");
    let mut writer = table.open().await;
    writer
        .set(&State::completed("other", "{}"))
        .await
        .expect("the tables made");
    let lose = LoseFirstAnswer::of(is_state_write, Duration::from_secs(5));
    let mut setter = lose.instance(&table).await;
    let setting =
        tokio::spawn(async move { setter.set(&State::completed("s", r#"{"v":"set"}"#)).await });
    lose.resend_held().await;
    assert!(
        writer.get("s").await.unwrap().is_some(),
        "the set's first send landed"
    );
    writer.delete("s").await.expect("the delete");
    assert_eq!(writer.get("s").await.unwrap(), None, "deleted");
    assert!(!setting.is_finished(), "the delete came before the resend");
    let outcome = setting.await.unwrap();
    assert_eq!(
        writer.get("s").await.unwrap(),
        None,
        "the resend does not bring the deleted state back"
    );
    assert_eq!(writer.state_ids(None).await.unwrap(), ["other"]);
    match outcome {
        Err(Error::Timeout(m)) => assert!(m.contains("unknown"), "{m}"),
        other => panic!("expected the set's outcome reported unknown, got {other:?}"),
    }
}

/// Answers the first `garbled` requests with an HTTP protocol error, as Node's WASI shim words a
/// reset connection; counts the requests.
struct GarbleFirst {
    garbled: u64,
    requests: std::sync::atomic::AtomicU64,
}

impl FaultPlan for GarbleFirst {
    fn fault(&self, _: &http::Method, _: &http::Uri) -> Option<Fault> {
        (self.requests.fetch_add(1, Ordering::SeqCst) < self.garbled).then_some(Fault::Garbled)
    }
}

/// A reset that a host words as an HTTP protocol error is tried again like any reset; one that
/// keeps coming is a peer that does not speak HTTP, given up after `GARBLED_TRIES` tries rather
/// than after the whole retry budget.
#[tokio::test]
async fn a_reset_worded_as_a_protocol_error_is_tried_again() {
    let table = TestTable::new("garbled");
    let open = |garbled: u64| {
        let plan = Arc::new(GarbleFirst {
            garbled,
            requests: Default::default(),
        });
        let options = InstanceOptions {
            label: "garbled".into(),
            faults: Some(plan.clone()),
            ..InstanceOptions::default()
        };
        let settings = table.with(&[("retry_backoff_seconds", "0.01")]);
        let uri = table.target.uri();
        async move {
            let backend = runtime().open_with(&uri, settings, options).await.unwrap();
            (backend, plan)
        }
    };
    let (mut b, plan) = open(2).await;
    b.set(&State::completed("s", "{}"))
        .await
        .expect("tried again past two garbled answers");
    assert!(plan.requests.load(Ordering::SeqCst) > 2);

    let (mut b, plan) = open(u64::MAX).await;
    let started = std::time::Instant::now();
    let err = b.get("s").await.unwrap_err();
    assert!(
        matches!(&err, Error::Unreachable(m) if m.contains("in a row")),
        "{err:?}"
    );
    assert_eq!(
        plan.requests.load(Ordering::SeqCst),
        u64::from(clickhouse_state::http::GARBLED_TRIES)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not the whole budget"
    );
}

/// A server that resets every connection it accepts: each try is one connection, and a call
/// tries again as `retries` allows before it fails as unreachable.
#[tokio::test]
async fn a_server_that_resets_every_connection_is_tried_again() {
    use std::io::Read as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            let _ = stream.read(&mut [0u8; 4096]);
            // Dropped with SO_LINGER 0: a reset, not a close.
        }
    });
    let uri = format!("clickhouse://default:@127.0.0.1:{port}/default");
    let settings = vec![
        ("retries".to_string(), "3".to_string()),
        ("retry_backoff_seconds".to_string(), "0.01".to_string()),
    ];
    let mut b = runtime().open(&uri, settings).await.unwrap();
    let err = b.get("x").await.unwrap_err();
    assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        4,
        "one try and three retries"
    );
}
