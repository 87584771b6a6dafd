//! The lock under contention, delays, merges, crashes and long holds; in real time and on the
//! host's virtual clock. The host records every enter and exit of a critical section in its own
//! log; overlaps are counted and must be zero.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration_tests::state_host::clock::{Clock, SystemClock, VirtualClock};
use integration_tests::state_host::http::faults::{Fault, FaultPlan};
use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::{
    Backend, Error, InstanceOptions, Lock, Runtime, RuntimeOptions, State, default_component_path,
};
use integration_tests::{TestTable, insert_target, json};

/// Real time or virtual time, and the runtime that uses it.
struct Timeline {
    runtime: Runtime,
    clock: Arc<dyn Clock>,
    virtual_clock: Option<VirtualClock>,
}

impl Timeline {
    fn real() -> Timeline {
        Self::with(Arc::new(SystemClock), None)
    }

    fn virtual_time() -> Timeline {
        let clock = VirtualClock::new();
        Self::with(Arc::new(clock.clone()), Some(clock))
    }

    fn with(clock: Arc<dyn Clock>, virtual_clock: Option<VirtualClock>) -> Timeline {
        let runtime = Runtime::load(
            &default_component_path(),
            RuntimeOptions {
                clock: Arc::clone(&clock),
                ..integration_tests::runtime_options()
            },
        )
        .expect("component loads");
        Timeline {
            runtime,
            clock,
            virtual_clock,
        }
    }

    fn is_virtual(&self) -> bool {
        self.virtual_clock.is_some()
    }

    /// Retry pause: Meltano's default (1 s) costs nothing in virtual time.
    fn retry(&self) -> &'static str {
        if self.is_virtual() { "1" } else { "0.2" }
    }

    async fn open(&self, table: &TestTable, extra: &[(&str, &str)]) -> Backend {
        self.open_with(table, extra, InstanceOptions::default())
            .await
    }

    async fn open_with(
        &self,
        table: &TestTable,
        extra: &[(&str, &str)],
        options: InstanceOptions,
    ) -> Backend {
        let mut settings = table.with(&[
            ("lock_retry_seconds", self.retry()),
            ("lock_timeout_seconds", "600"),
        ]);
        settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.runtime
            .open_with(&table.target.uri(), settings, options)
            .await
            .expect("open")
    }
}

/// The host's own log of critical sections.
#[derive(Default)]
struct Sections {
    events: Mutex<Vec<(usize, bool)>>,
    inside: AtomicUsize,
    violations: AtomicUsize,
}

impl Sections {
    fn enter(&self, who: usize) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.events.lock().unwrap().push((who, true));
    }

    fn exit(&self, who: usize) {
        self.events.lock().unwrap().push((who, false));
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// Overlaps found by replaying the log: an enter while another section is open.
    fn overlaps(&self) -> usize {
        let events = self.events.lock().unwrap();
        let mut open: Option<usize> = None;
        let mut overlaps = 0;
        for (who, enter) in events.iter() {
            match (enter, open) {
                (true, None) => open = Some(*who),
                (true, Some(_)) => overlaps += 1,
                (false, Some(o)) if o == *who => open = None,
                (false, _) => overlaps += 1,
            }
        }
        overlaps + self.violations.load(Ordering::SeqCst)
    }

    fn entries(&self) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| *e)
            .count()
    }
}

/// One round: acquire, a read-modify-write under the lock, release.
async fn round(backend: &mut Backend, sections: &Sections, who: usize, id: &str) {
    let lock = backend.acquire_lock(id).await.expect("acquire");
    sections.enter(who);
    let n = backend
        .get(id)
        .await
        .expect("get")
        .map_or(0, |s| json(&s.completed)["n"].as_u64().unwrap_or(0));
    backend
        .set_locked(
            &State::completed(id, format!(r#"{{"n":{}}}"#, n + 1)),
            &lock,
        )
        .await
        .expect("fenced write");
    sections.exit(who);
    backend.release(lock).await.expect("release");
}

/// Turns off the lock log's insert deduplication (on by default for a single server): a claim
/// retried or held back then lands beside the others instead of being dropped, so exclusion
/// rests on the read-back rule alone, as `docs/lock.md` says it does.
async fn without_deduplication(table: &TestTable, timeline: &Timeline) {
    let mut b = timeline.open(table, &[]).await;
    b.migrate().await.expect("migrate");
    table.target.must(&format!(
        "ALTER TABLE {}_lock_log MODIFY SETTING non_replicated_deduplication_window = 0",
        table.qualified()
    ));
    let create = table
        .target
        .must(&format!("SHOW CREATE TABLE {}_lock_log", table.qualified()));
    assert!(
        create.contains("non_replicated_deduplication_window = 0"),
        "{create}"
    );
}

/// Without deduplication a stray claim can hold the next contenders off until its lease ends
/// (liveness, not exclusion): those runs take a short lease.
fn lease(deduplication: bool) -> &'static [(&'static str, &'static str)] {
    if deduplication {
        &[]
    } else {
        &[("lock_lease_seconds", "5")]
    }
}

async fn contention(timeline: Timeline, label: &str, instances: usize, rounds: usize) {
    contention_with(timeline, label, instances, rounds, true).await
}

async fn contention_with(
    timeline: Timeline,
    label: &str,
    instances: usize,
    rounds: usize,
    deduplication: bool,
) {
    let table = TestTable::new(label);
    if !deduplication {
        without_deduplication(&table, &timeline).await;
    }
    let timeline = Arc::new(timeline);
    let sections = Arc::new(Sections::default());
    let mut tasks = Vec::new();
    for who in 0..instances {
        let (table, timeline, sections) = (table.clone(), timeline.clone(), sections.clone());
        tasks.push(tokio::spawn(async move {
            let mut b = timeline.open(&table, lease(deduplication)).await;
            for _ in 0..rounds {
                round(&mut b, &sections, who, "shared").await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(sections.entries(), instances * rounds);
    assert_eq!(sections.overlaps(), 0);
    let mut b = timeline.open(&table, &[]).await;
    let n = json(&b.get("shared").await.unwrap().unwrap().completed)["n"].as_u64();
    assert_eq!(n, Some((instances * rounds) as u64), "no increment lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_8x50_real_time() {
    contention(Timeline::real(), "contend_real", 8, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_8x50_virtual_time() {
    contention(Timeline::virtual_time(), "contend_virtual", 8, 50).await;
}

/// Holds back this instance's `nth` insert into a lock table (0-based) for `delay`: the lock
/// log, or in settle mode the candidates' table. `delayed` says once the delay has begun.
#[derive(Default)]
struct SlowNthLockInsert {
    inserts: AtomicUsize,
    nth: usize,
    delay: Duration,
    settle_table: bool,
    delayed: AtomicBool,
}

impl Interceptor for SlowNthLockInsert {
    fn before_send(&self, _method: &http::Method, uri: &http::Uri) -> Option<Duration> {
        let target = insert_target(uri).unwrap_or_default();
        let table = if self.settle_table {
            target.ends_with("_lock")
        } else {
            target.ends_with("_lock_log")
        };
        let slow = table && self.inserts.fetch_add(1, Ordering::SeqCst) == self.nth;
        if slow {
            self.delayed.store(true, Ordering::SeqCst);
        }
        slow.then_some(self.delay)
    }
}

fn slow_nth_insert(nth: usize, delay: Duration) -> InstanceOptions {
    InstanceOptions {
        interceptor: Some(Arc::new(SlowNthLockInsert {
            nth,
            delay,
            ..SlowNthLockInsert::default()
        })),
        ..InstanceOptions::default()
    }
}

async fn slow_insert(timeline: Timeline, label: &str) {
    slow_insert_with(timeline, label, true).await
}

async fn slow_insert_with(timeline: Timeline, label: &str, deduplication: bool) {
    let table = TestTable::new(label);
    if !deduplication {
        without_deduplication(&table, &timeline).await;
    }
    let timeline = Arc::new(timeline);
    let sections = Arc::new(Sections::default());
    let slow = Arc::new(SlowNthLockInsert {
        nth: 0,
        // Past any settle window and past several other grants.
        delay: Duration::from_secs(3),
        ..SlowNthLockInsert::default()
    });
    let mut tasks = Vec::new();
    for who in 0..4 {
        let (table, timeline, sections) = (table.clone(), timeline.clone(), sections.clone());
        let interceptor: Option<Arc<dyn Interceptor>> =
            (who == 0).then(|| slow.clone() as Arc<dyn Interceptor>);
        tasks.push(tokio::spawn(async move {
            let options = InstanceOptions {
                label: format!("contender-{who}"),
                interceptor,
                ..InstanceOptions::default()
            };
            let mut b = timeline
                .open_with(&table, lease(deduplication), options)
                .await;
            for _ in 0..10 {
                round(&mut b, &sections, who, "shared").await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert!(
        slow.inserts.load(Ordering::SeqCst) > 0,
        "the delay was applied"
    );
    assert_eq!(sections.entries(), 40);
    assert_eq!(sections.overlaps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_insert_real_time() {
    slow_insert(Timeline::real(), "slow_real").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_insert_virtual_time() {
    slow_insert(Timeline::virtual_time(), "slow_virtual").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_without_deduplication_real_time() {
    contention_with(Timeline::real(), "contend_nodedup", 8, 25, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_insert_without_deduplication_real_time() {
    slow_insert_with(Timeline::real(), "slow_nodedup", false).await;
}

async fn merge_during_contention(timeline: Timeline, label: &str) {
    let table = TestTable::new(label);
    let timeline = Arc::new(timeline);
    timeline.open(&table, &[]).await.migrate().await.unwrap();
    let sections = Arc::new(Sections::default());
    let stop = Arc::new(AtomicBool::new(false));
    let merges = Arc::new(AtomicUsize::new(0));
    let merger = {
        let (table, stop, merges) = (table.clone(), stop.clone(), merges.clone());
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::SeqCst) {
                table.target.must(&format!(
                    "OPTIMIZE TABLE {}_lock_log FINAL",
                    table.qualified()
                ));
                merges.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let mut tasks = Vec::new();
    for who in 0..8 {
        let (table, timeline, sections) = (table.clone(), timeline.clone(), sections.clone());
        tasks.push(tokio::spawn(async move {
            let mut b = timeline.open(&table, &[]).await;
            for _ in 0..10 {
                round(&mut b, &sections, who, "shared").await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    stop.store(true, Ordering::SeqCst);
    merger.await.unwrap();
    assert!(merges.load(Ordering::SeqCst) > 0);
    assert_eq!(sections.entries(), 80);
    assert_eq!(sections.overlaps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merge_during_contention_real_time() {
    merge_during_contention(Timeline::real(), "merge_real").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merge_during_contention_virtual_time() {
    merge_during_contention(Timeline::virtual_time(), "merge_virtual").await;
}

async fn crashed_holder(timeline: Timeline, label: &str, lease: &str) {
    let table = TestTable::new(label);
    let mut holder = timeline
        .open(&table, &[("lock_lease_seconds", lease)])
        .await;
    let lock = holder.acquire_lock("s").await.unwrap();
    let owner = holder.lock_details(&lock).await.unwrap().owner;
    drop(holder); // crashed: no release
    let mut next = timeline
        .open(&table, &[("lock_lease_seconds", lease)])
        .await;
    assert_eq!(
        next.lock_info("s").await.unwrap().map(|i| i.owner),
        Some(owner)
    );
    let before = timeline.clock.now_ms();
    let lock = next
        .acquire_lock("s")
        .await
        .expect("acquired after the lease");
    let waited = timeline.clock.now_ms() - before;
    let lease_ms = (lease.parse::<f64>().unwrap() * 1000.0) as u64;
    assert!(
        waited >= lease_ms - 1000,
        "waited {waited} ms for a {lease_ms} ms lease"
    );
    assert_eq!(lock.token, 2);
    next.release(lock).await.unwrap();
}

#[tokio::test]
async fn crashed_holder_real_time() {
    crashed_holder(Timeline::real(), "crash_real", "2").await;
}

#[tokio::test]
async fn crashed_holder_virtual_time_takes_no_wall_time() {
    let started = Instant::now();
    let timeline = Timeline::virtual_time();
    let virtual_clock = timeline.virtual_clock.clone().unwrap();
    crashed_holder(timeline, "crash_virtual", "300").await;
    assert!(virtual_clock.advanced_ms() >= 299_000);
    // 300 s of lease went by on the virtual clock; the wall clock saw a few round trips.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

async fn long_holder(timeline: Timeline, label: &str, lease_s: f64) {
    let table = TestTable::new(label);
    let lease = lease_s.to_string();
    let mut holder = timeline
        .open(&table, &[("lock_lease_seconds", &lease)])
        .await;
    let lock = holder.acquire_lock("s").await.unwrap();
    let owner = holder.lock_details(&lock).await.unwrap().owner;
    let lease_ms = (lease_s * 1000.0) as u64;
    let clock = timeline.clock.clone();
    let started = clock.now_ms();
    // A contender tries for three leases while the holder renews every third of a lease.
    let contender = {
        let timeline_clock = clock.clone();
        let mut contender = timeline
            .open(
                &table,
                &[
                    ("lock_lease_seconds", &lease),
                    ("lock_timeout_seconds", &(3.0 * lease_s).to_string()),
                ],
            )
            .await;
        tokio::spawn(async move {
            let result = contender.acquire_lock("s").await;
            (result.map(|l| l.token), timeline_clock.now_ms())
        })
    };
    // Ten renewals, a third of a lease apart: the lock is held for more than three leases.
    let mut renewed_at = started;
    for _ in 0..10 {
        clock.sleep(lease_ms / 3).await;
        let asked_at = clock.now_ms();
        if let Err(e) = holder.renew(&lock).await {
            panic!(
                "renewal while held, asked {} ms after the last one (lease {lease_ms} ms): {e:?}",
                asked_at - renewed_at
            );
        }
        renewed_at = asked_at;
    }
    assert!(clock.now_ms() - started >= 3 * lease_ms);
    let (result, gave_up_at) = contender.await.unwrap();
    match result {
        Err(Error::Locked(info)) => assert_eq!(info.owner, owner),
        other => panic!("the contender must not get a renewed lock: {other:?}"),
    }
    assert!(gave_up_at - started >= 3 * lease_ms);
    // still the holder: a fenced write goes through
    holder
        .set_locked(&State::completed("s", r#"{"held":"long"}"#), &lock)
        .await
        .expect("still held");
    holder.release(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_holder_renews_for_three_leases_real_time() {
    // A renewal must be asked for within nine tenths of a lease: 6 s leaves a renewal every 2 s
    // more than 3 s of slack on a loaded machine (1.5 s left 0.85 s, and CI once missed it).
    long_holder(Timeline::real(), "long_real", 6.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_holder_renews_for_three_leases_virtual_time() {
    long_holder(Timeline::virtual_time(), "long_virtual", 300.0).await;
}

async fn lost_updates(timeline: Timeline, label: &str) {
    let table = TestTable::new(label);
    let timeline = Arc::new(timeline);
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let (table, timeline) = (table.clone(), timeline.clone());
        tasks.push(tokio::spawn(async move {
            let mut b = timeline.open(&table, &[]).await;
            for i in 0..25 {
                let partial =
                    format!(r#"{{"singer_state":{{"bookmarks":{{"w{writer}-{i}":{i}}}}}}}"#);
                b.update(&State::partial("shared", partial))
                    .await
                    .expect("update");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let mut b = timeline.open(&table, &[]).await;
    let state = b.get("shared").await.unwrap().unwrap();
    let bookmarks = json(&state.partial)["singer_state"]["bookmarks"].clone();
    let keys = bookmarks.as_object().expect("bookmarks").len();
    assert_eq!(keys, 200, "every update's key is present");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_updates_8x25_real_time() {
    lost_updates(Timeline::real(), "lost_real").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_updates_8x25_virtual_time() {
    lost_updates(Timeline::virtual_time(), "lost_virtual").await;
}

async fn lock_timeout(timeline: Timeline, label: &str) {
    let table = TestTable::new(label);
    let mut holder = timeline.open(&table, &[]).await;
    let lock = holder.acquire_lock("s").await.unwrap();
    let owner = holder.lock_details(&lock).await.unwrap().owner;
    let mut waiter = timeline
        .open(
            &table,
            &[("lock_timeout_seconds", "2"), ("lock_retry_seconds", "0.5")],
        )
        .await;
    let before = timeline.clock.now_ms();
    // In virtual time the holder must be seen as idle, not working: it waits for the result.
    let attempt =
        tokio::spawn(async move { (waiter.acquire_lock("s").await.map(|l| l.token), waiter) });
    let (result, _waiter) = if timeline.is_virtual() {
        let clock = timeline.clock.clone();
        // the holder sleeps (idles) while the waiter tries
        let idle = tokio::spawn(async move { clock.sleep(10_000).await });
        let out = attempt.await.unwrap();
        idle.abort();
        out
    } else {
        attempt.await.unwrap()
    };
    let waited = timeline.clock.now_ms() - before;
    match result {
        Err(Error::Locked(info)) => {
            assert_eq!(info.owner, owner, "the error names the holder");
            assert_eq!(info.state_id, "s");
        }
        other => panic!("expected locked, got {other:?}"),
    }
    assert!(
        waited >= 2_000,
        "gave up after {waited} ms, before the timeout"
    );
    if timeline.is_virtual() {
        // exact on the virtual clock: the last pause is cut to the deadline
        assert!(waited < 2_000 + 100, "gave up after {waited} ms");
    }
    holder.release(lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_timeout_real_time() {
    lock_timeout(Timeline::real(), "timeout_real").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_timeout_virtual_time() {
    lock_timeout(Timeline::virtual_time(), "timeout_virtual").await;
}

#[tokio::test]
async fn fencing_stops_a_holder_whose_lock_was_forced_open() {
    let timeline = Timeline::real();
    let table = TestTable::new("fence");
    let mut old = timeline.open(&table, &[]).await;
    let mut operator = timeline.open(&table, &[]).await;
    let mut new = timeline.open(&table, &[]).await;
    let old_lock = old.acquire_lock("s").await.unwrap();
    assert!(operator.force_unlock("s").await.unwrap());
    assert!(
        !operator.force_unlock("s").await.unwrap(),
        "nothing left to break"
    );
    let new_lock = new.acquire_lock("s").await.unwrap();
    assert!(
        new_lock.token > old_lock.token,
        "tokens grow with each grant"
    );
    new.set_locked(&State::completed("s", r#"{"by":"new"}"#), &new_lock)
        .await
        .unwrap();
    // The old holder does not know it lost the lock; its fenced writes are refused.
    let err = old
        .set_locked(&State::completed("s", r#"{"by":"old"}"#), &old_lock)
        .await
        .expect_err("fenced out");
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
    assert!(matches!(
        old.delete_locked(&old_lock).await,
        Err(Error::LockLost(_))
    ));
    assert!(matches!(
        old.renew(&old_lock).await,
        Err(Error::LockLost(_))
    ));
    assert_eq!(
        json(&new.get("s").await.unwrap().unwrap().completed),
        json(r#"{"by":"new"}"#)
    );
    new.release(new_lock).await.unwrap();
    old.release(old_lock).await.unwrap();
}

#[tokio::test]
async fn lock_info_reports_the_holder_and_its_lease() {
    let timeline = Timeline::real();
    let table = TestTable::new("info");
    let mut b = timeline
        .open(&table, &[("lock_lease_seconds", "120")])
        .await;
    assert_eq!(b.lock_info("s").await.unwrap(), None);
    let lock = b.acquire_lock("s").await.unwrap();
    let info = b.lock_info("s").await.unwrap().expect("held");
    let details = b.lock_details(&lock).await.unwrap();
    assert_eq!(info, details);
    assert_eq!(info.token, lock.token);
    assert_eq!(info.expires_at_ms - info.acquired_at_ms, 120_000);
    b.release(lock).await.unwrap();
    assert_eq!(b.lock_info("s").await.unwrap(), None);
    let again = b.acquire_lock("s").await.unwrap();
    assert_eq!(again.token, info.token + 1);
    b.release(again).await.unwrap();
}

// -- a mixed fleet: settle mode next to a process speaking the original protocol -------------

/// The original Python backend's lock protocol, spoken over raw HTTP as it does: check for a
/// live candidate, insert a random candidate, settle 1 s, lowest id wins, else withdraw.
fn original_protocol_round(table: &TestTable, sections: &Sections, who: usize) {
    let target = &table.target;
    let lock_table = format!("{}_lock", table.qualified());
    let id = "shared";
    loop {
        target.must(&format!(
            "DELETE FROM {lock_table} WHERE state_id = '{id}' AND locked_at < now() - INTERVAL 300 SECOND"
        ));
        let live = target.must(&format!(
            "SELECT count() FROM {lock_table} WHERE state_id = '{id}'"
        ));
        if live.trim() != "0" {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let mine = uuid::Uuid::new_v4().to_string();
        target.must(&format!(
            "INSERT INTO {lock_table} (state_id, lock_id) SETTINGS async_insert = 0 VALUES ('{id}', '{mine}')"
        ));
        std::thread::sleep(Duration::from_secs(1));
        let lowest = target.must(&format!(
            "SELECT lock_id FROM {lock_table} WHERE state_id = '{id}' ORDER BY lock_id LIMIT 1"
        ));
        if lowest.trim() == mine {
            sections.enter(who);
            std::thread::sleep(Duration::from_millis(20));
            sections.exit(who);
            target.must(&format!(
                "DELETE FROM {lock_table} WHERE state_id = '{id}' AND lock_id = '{mine}'"
            ));
            return;
        }
        target.must(&format!(
            "DELETE FROM {lock_table} WHERE state_id = '{id}' AND lock_id = '{mine}'"
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settle_mode_excludes_a_process_speaking_the_original_protocol() {
    let timeline = Arc::new(Timeline::real());
    let table = TestTable::new("mixed");
    timeline
        .open(&table, &[("lock_mode", "settle")])
        .await
        .migrate()
        .await
        .unwrap();
    let sections = Arc::new(Sections::default());
    let mut ours = Vec::new();
    for who in 0..2 {
        let (table, timeline, sections) = (table.clone(), timeline.clone(), sections.clone());
        ours.push(tokio::spawn(async move {
            let mut b = timeline
                .open(
                    &table,
                    &[("lock_mode", "settle"), ("lock_retry_seconds", "0.1")],
                )
                .await;
            for _ in 0..3 {
                let lock = b.acquire_lock("shared").await.expect("acquire");
                sections.enter(who);
                let n = b
                    .get("shared")
                    .await
                    .unwrap()
                    .map_or(0, |s| json(&s.completed)["n"].as_u64().unwrap_or(0));
                b.set_locked(
                    &State::completed("shared", format!(r#"{{"n":{}}}"#, n + 1)),
                    &lock,
                )
                .await
                .unwrap();
                sections.exit(who);
                b.release(lock).await.expect("release");
            }
        }));
    }
    let mut theirs = Vec::new();
    for who in 2..4 {
        let (table, sections) = (table.clone(), sections.clone());
        theirs.push(tokio::task::spawn_blocking(move || {
            for _ in 0..3 {
                original_protocol_round(&table, &sections, who);
            }
        }));
    }
    for task in ours {
        task.await.unwrap();
    }
    for task in theirs {
        task.await.unwrap();
    }
    assert_eq!(sections.entries(), 12);
    assert_eq!(sections.overlaps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_settle_candidate_yields_to_a_holder_that_decided_while_it_was_in_flight() {
    // Our candidate's insert stalls 4 s. Meanwhile a process speaking the original protocol
    // inserts its candidate, settles and takes the lock (ours is not in the table yet). Ours then
    // lands with the lower id: it must yield to the established holder, not win the draw.
    let table = TestTable::new("late_settle");
    let timeline = Timeline::real();
    let slow = Arc::new(SlowNthLockInsert {
        nth: 0,
        delay: Duration::from_secs(4),
        settle_table: true,
        ..SlowNthLockInsert::default()
    });
    let options = InstanceOptions {
        interceptor: Some(slow.clone() as Arc<dyn Interceptor>),
        ..InstanceOptions::default()
    };
    let mut ours = timeline
        .open_with(
            &table,
            &[("lock_mode", "settle"), ("lock_timeout_seconds", "2")],
            options,
        )
        .await;
    ours.migrate().await.unwrap();
    let acquiring = tokio::spawn(async move {
        let got = ours.acquire_lock("s").await;
        (ours, got)
    });
    // Once our insert is in flight, the other process runs the original protocol with an id
    // above any UUID, so that ours has the lower id.
    while !slow.delayed.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lock_table = format!("{}_lock", table.qualified());
    let target = table.target.clone();
    let theirs = "zzzzzzzz-original-protocol";
    let holds = tokio::task::spawn_blocking(move || {
        target.must(&format!(
            "INSERT INTO {lock_table} (state_id, lock_id) SETTINGS async_insert = 0 VALUES ('s', '{theirs}')"
        ));
        std::thread::sleep(Duration::from_secs(1));
        let lowest = target.must(&format!(
            "SELECT lock_id FROM {lock_table} WHERE state_id = 's' ORDER BY lock_id LIMIT 1"
        ));
        lowest.trim() == theirs
    })
    .await
    .unwrap();
    assert!(
        holds,
        "the original protocol took the lock while ours was in flight"
    );
    let (_ours, got) = acquiring.await.unwrap();
    assert!(
        matches!(got, Err(Error::Locked(_))),
        "two holders: ours was granted while the original process held the lock: {got:?}"
    );
}

// -- the lock log's pruning ------------------------------------------------------------------

#[tokio::test]
async fn every_1024th_grant_prunes_old_generations_of_its_id_only() {
    let table = TestTable::new("prune");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    let log = format!("{}_lock_log", table.qualified());
    // 1023 granted and released generations of two ids, long ago (as a busy id would have).
    for id in ["busy", "other"] {
        for event in ["acquire", "release"] {
            table.target.must(&format!(
                "INSERT INTO {log} (state_id, generation, event, owner, at_ms, until_ms, floor_ms) \
                 SELECT '{id}', number, '{event}', 'old-owner', 1000000 + number * 1000, \
                 1000000 + number * 1000 + 500, 1000000 + number * 1000 FROM numbers(1, 1023)"
            ));
        }
    }
    let generations = |id: &str| {
        table.target.must(&format!(
            "SELECT count(DISTINCT generation), min(generation), max(generation) FROM {log} \
             WHERE state_id = '{id}'"
        ))
    };
    assert_eq!(generations("busy"), "1023\t1\t1023\n");

    // The 1024th grant prunes the generations below 1024 - 16 (asynchronously: it does not wait
    // for the delete).
    let lock = b.acquire_lock("busy").await.unwrap();
    assert_eq!(lock.token, 1024);
    let deadline = Instant::now() + Duration::from_secs(60);
    while generations("busy") != "17\t1008\t1024\n" {
        assert!(
            Instant::now() < deadline,
            "old generations were not pruned: {}",
            generations("busy")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // another id keeps all of its history
    assert_eq!(generations("other"), "1023\t1\t1023\n");
    // and the lock goes on from where it was
    b.release(lock).await.unwrap();
    let next = b.acquire_lock("busy").await.unwrap();
    assert_eq!(next.token, 1025);
    b.release(next).await.unwrap();
    let other = b.acquire_lock("other").await.unwrap();
    assert_eq!(other.token, 1024);
    b.release(other).await.unwrap();
}

// -- a claim whose read-back is lost ---------------------------------------------------------

/// Loses the answer to the first read that follows this instance's first lock-log insert: the
/// read-back of its first claim. The claim itself lands.
struct LoseFirstReadBack {
    claimed: AtomicBool,
    lost: AtomicBool,
    /// How the answer is lost: a reset connection by default.
    fault: Fault,
}

impl Default for LoseFirstReadBack {
    fn default() -> Self {
        LoseFirstReadBack {
            claimed: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            fault: Fault::ResetBeforeResponse,
        }
    }
}

impl FaultPlan for LoseFirstReadBack {
    fn fault(&self, _method: &http::Method, uri: &http::Uri) -> Option<Fault> {
        let query = uri.query().unwrap_or("");
        if query.contains("INSERT") && query.contains("_lock_log") {
            self.claimed.store(true, Ordering::SeqCst);
            return None;
        }
        (self.claimed.load(Ordering::SeqCst) && !self.lost.swap(true, Ordering::SeqCst))
            .then_some(self.fault)
    }
}

async fn losing_read_back(
    timeline: &Timeline,
    table: &TestTable,
    extra: &[(&str, &str)],
) -> (Backend, Arc<LoseFirstReadBack>) {
    losing_read_back_to(timeline, table, extra, Fault::ResetBeforeResponse).await
}

async fn losing_read_back_to(
    timeline: &Timeline,
    table: &TestTable,
    extra: &[(&str, &str)],
    fault: Fault,
) -> (Backend, Arc<LoseFirstReadBack>) {
    let lose = Arc::new(LoseFirstReadBack {
        fault,
        ..LoseFirstReadBack::default()
    });
    let plan: Arc<dyn FaultPlan> = lose.clone();
    let mut settings = vec![("retries", "0")];
    settings.extend_from_slice(extra);
    let backend = timeline
        .open_with(
            table,
            &settings,
            InstanceOptions {
                faults: Some(plan),
                ..InstanceOptions::default()
            },
        )
        .await;
    (backend, lose)
}

#[tokio::test]
async fn a_claim_whose_read_back_was_lost_is_found_to_have_won() {
    let timeline = Timeline::real();
    let table = TestTable::new("doubt");
    let mut other = timeline
        .open(&table, &[("lock_timeout_seconds", "5")])
        .await;
    other.migrate().await.unwrap();
    let (mut a, lose) = losing_read_back(&timeline, &table, &[]).await;
    // The read-back fails (and is not retried): the claim is in doubt, and the next try reads
    // the log and finds it won.
    let lock = a
        .acquire_lock("s")
        .await
        .expect("the claim in doubt had won");
    assert!(lose.lost.load(Ordering::SeqCst), "the read-back was lost");
    assert_eq!(lock.token, 1);
    a.release(lock).await.unwrap();
    let next = other.acquire_lock("s").await.expect("free again at once");
    assert_eq!(next.token, 2);
    other.release(next).await.unwrap();
}

/// A read-back the server refuses for good (a permanent error, not a lost answer) leaves no
/// doubt to resolve: taking the lock fails at once with that error, and is not tried again.
#[tokio::test]
async fn a_claim_whose_read_back_is_refused_for_good_fails_at_once() {
    let timeline = Timeline::real();
    let table = TestTable::new("doubt_refused");
    timeline.open(&table, &[]).await.migrate().await.unwrap();
    // Code 62, SYNTAX_ERROR: permanent (60, a missing table, would migrate first).
    let refused = Fault::Server(62);
    let (mut a, lose) =
        losing_read_back_to(&timeline, &table, &[("lock_timeout_seconds", "5")], refused).await;
    let taken = a.acquire_lock("s").await;
    assert!(
        lose.lost.load(Ordering::SeqCst),
        "the read-back was refused"
    );
    assert!(
        matches!(&taken, Err(Error::Server { code: 62, .. })),
        "the refusal is the caller's at once, not a doubt tried again: {taken:?}"
    );
}

/// A claim in doubt whose lease has ended is not adopted, even had it won; the id it leaves
/// free is claimed anew in the same try, not after another pause.
#[tokio::test]
async fn a_claim_in_doubt_past_its_lease_is_not_adopted_and_the_free_id_is_claimed_at_once() {
    let timeline = Timeline::real();
    let table = TestTable::new("doubt_lapsed");
    timeline.open(&table, &[]).await.migrate().await.unwrap();
    // A 1 s lease and a 3 s wait: the one pause after the lost read-back is cut to the wait's
    // end, so the claim's lease has ended at the next try (if the claim was sent within 2 s),
    // and that try is the last one.
    let settings = [
        ("lock_lease_seconds", "1"),
        ("lock_timeout_seconds", "3"),
        ("lock_retry_seconds", "30"),
    ];
    let (mut a, lose) = losing_read_back(&timeline, &table, &settings).await;
    let lock = a
        .acquire_lock("s")
        .await
        .expect("the id is free once the claim in doubt has lapsed: taken in the last try");
    assert!(lose.lost.load(Ordering::SeqCst), "the read-back was lost");
    assert_eq!(
        lock.token, 2,
        "a new generation, not the lapsed claim in doubt adopted"
    );
    a.release(lock).await.unwrap();
}

#[tokio::test]
async fn a_claim_in_doubt_is_released_when_its_instance_gives_up() {
    let timeline = Timeline::real();
    let table = TestTable::new("doubt_give_up");
    let mut other = timeline
        .open(&table, &[("lock_timeout_seconds", "5")])
        .await;
    other.migrate().await.unwrap();
    // No time to try again: the instance gives up with its claim in doubt.
    let (mut a, lose) = losing_read_back(&timeline, &table, &[("lock_timeout_seconds", "0")]).await;
    assert!(matches!(a.acquire_lock("s").await, Err(Error::Locked(_))));
    assert!(lose.lost.load(Ordering::SeqCst), "the read-back was lost");
    // The claim had won; giving up released it, so nobody waits out its 300 s lease.
    let lock = other
        .acquire_lock("s")
        .await
        .expect("the id is not blocked by the abandoned claim");
    assert_eq!(lock.token, 2);
    other.release(lock).await.unwrap();
}

// -- a renewal that lands after the lease ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_that_lands_after_a_contender_took_over_is_not_adopted() {
    let timeline = Timeline::real();
    let table = TestTable::new("late_renew");
    let lease = [("lock_lease_seconds", "20")];
    // The holder's second lock-log insert is its renewal.
    let mut holder = timeline
        .open_with(&table, &lease, slow_nth_insert(1, Duration::from_secs(6)))
        .await;
    holder.migrate().await.unwrap();
    let lock = holder.acquire_lock("s").await.unwrap();
    let mut contender = timeline.open(&table, &lease).await;
    // The contender waits for the lock and writes as soon as it has it.
    let contending = tokio::spawn(async move {
        let lock = contender.acquire_lock("s").await.expect("acquire");
        contender
            .set_locked(&State::completed("s", r#"{"by":"contender"}"#), &lock)
            .await
            .expect("the contender writes");
        (contender, lock)
    });
    // The holder renews late in its lease (16 s of 20, before the 2 s margin and its check),
    // and its renew row is held back 6 s: it lands after the lease ended and the
    // contender took the next generation.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let renewed = holder.renew(&lock).await;
    let (mut contender, next) = contending.await.unwrap();
    assert_eq!(next.token, lock.token + 1);
    assert!(
        matches!(renewed, Err(Error::LockLost(_))),
        "the late renewal was adopted: {renewed:?}"
    );
    // The old holder's lease was not extended: its write is refused, the contender's stays.
    assert!(matches!(
        holder
            .set_locked(&State::completed("s", r#"{"by":"old holder"}"#), &lock)
            .await,
        Err(Error::LockLost(_))
    ));
    let state = contender.get("s").await.unwrap().unwrap();
    assert_eq!(json(&state.completed)["by"], "contender");
    contender.release(next).await.unwrap();
}

/// The renew race's first half: a holder with a 20 s lease renews at 17 s, and its renew row is
/// held back 5 s (it lands at about 22 s). Returns at 20.1 s, when the lease has ended in the
/// log and no renewal is in yet, with the renewal in flight.
async fn a_renewal_in_flight(
    timeline: &Timeline,
    table: &TestTable,
) -> tokio::task::JoinHandle<(Backend, Lock, Result<(), Error>)> {
    let lease = [("lock_lease_seconds", "20")];
    let mut holder = timeline
        .open_with(table, &lease, slow_nth_insert(1, Duration::from_secs(5)))
        .await;
    holder.migrate().await.unwrap();
    let lock = holder.acquire_lock("s").await.unwrap();
    let acquired = Instant::now();
    tokio::time::sleep(Duration::from_secs(17)).await;
    let renewing = tokio::spawn(async move {
        let renewed = holder.renew(&lock).await;
        (holder, lock, renewed)
    });
    tokio::time::sleep(Duration::from_millis(20_100).saturating_sub(acquired.elapsed())).await;
    renewing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_gives_way_to_a_renewal_that_landed_before_it() {
    // The other order of the renew race: the contender reads the log while the holder's
    // renewal is in flight, the renewal lands and the holder checks the log, and only then does
    // the contender's claim land. The holder rightly believes it holds the lock (nothing newer
    // was in the log when it checked), so the contender must not get it.
    let timeline = Timeline::real();
    let table = TestTable::new("renew_first");
    let renewing = a_renewal_in_flight(&timeline, &table).await;
    // The contender reads the log now (the lease has ended, no renewal is in yet); its claim is
    // held back 3 s, so it lands after the renewal and the holder's check.
    let mut contender = timeline
        .open_with(
            &table,
            &[("lock_lease_seconds", "20"), ("lock_timeout_seconds", "5")],
            slow_nth_insert(0, Duration::from_secs(3)),
        )
        .await;
    let contended = contender.acquire_lock("s").await;
    let (mut holder, lock, renewed) = renewing.await.unwrap();
    renewed.expect("the renewal landed before any newer claim");
    assert!(
        matches!(contended, Err(Error::Locked(_))),
        "the contender got the lock the renewed holder holds: {contended:?}"
    );
    // The holder keeps working inside its renewed lease.
    holder
        .set_locked(&State::completed("s", r#"{"by":"holder"}"#), &lock)
        .await
        .expect("the renewed holder writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_in_doubt_gives_way_to_a_renewal_that_landed_before_it() {
    // The race above, with the contender's read-back lost as well: its claim is in doubt, and
    // when it next looks, the log shows its claim as the newest grant. The renewal landed
    // before the claim, so the claim gave way by the read-back rule; taking it now would make
    // two holders.
    let timeline = Timeline::real();
    let table = TestTable::new("renew_first_doubt");
    let renewing = a_renewal_in_flight(&timeline, &table).await;
    let lose = Arc::new(LoseFirstReadBack::default());
    let options = InstanceOptions {
        faults: Some(lose.clone() as Arc<dyn FaultPlan>),
        ..slow_nth_insert(0, Duration::from_secs(3))
    };
    let mut contender = timeline
        .open_with(
            &table,
            &[
                ("lock_lease_seconds", "20"),
                ("lock_timeout_seconds", "5"),
                ("retries", "0"),
            ],
            options,
        )
        .await;
    let contended = contender.acquire_lock("s").await;
    assert!(lose.lost.load(Ordering::SeqCst), "the read-back was lost");
    let (mut holder, lock, renewed) = renewing.await.unwrap();
    renewed.expect("the renewal landed before any newer claim");
    assert!(
        matches!(contended, Err(Error::Locked(_))),
        "the contender took the lock the renewed holder holds: {contended:?}"
    );
    holder
        .set_locked(&State::completed("s", r#"{"by":"holder"}"#), &lock)
        .await
        .expect("the renewed holder writes");
}

/// Refuses this instance's first state write (not a lock table's), as a connection refused.
#[derive(Default)]
struct RefuseFirstStateWrite {
    refused: AtomicBool,
}

impl FaultPlan for RefuseFirstStateWrite {
    fn fault(&self, _method: &http::Method, uri: &http::Uri) -> Option<Fault> {
        let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
        (state_write && !self.refused.swap(true, Ordering::SeqCst)).then_some(Fault::Refused)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_update_whose_claim_was_left_in_doubt_gives_way_to_a_renewal_that_landed_before_it() {
    // The same race through `update`: the contender's claim lands after the renewal, and its
    // first write (which would have confirmed or refused the claim) fails, so the claim is left
    // in doubt. Its next update finds the claim the newest grant; writing as a confirmed holder
    // would write under the renewed holder.
    let timeline = Timeline::real();
    let table = TestTable::new("renew_first_update_doubt");
    let renewing = a_renewal_in_flight(&timeline, &table).await;
    let refuse = Arc::new(RefuseFirstStateWrite::default());
    let options = InstanceOptions {
        faults: Some(refuse.clone() as Arc<dyn FaultPlan>),
        ..slow_nth_insert(0, Duration::from_secs(3))
    };
    let mut contender = timeline
        .open_with(
            &table,
            &[
                ("lock_lease_seconds", "20"),
                ("lock_timeout_seconds", "5"),
                ("retry_budget_seconds", "0"),
            ],
            options,
        )
        .await;
    let first = contender
        .update(&State::partial("s", r#"{"by":"contender"}"#))
        .await;
    assert!(
        refuse.refused.load(Ordering::SeqCst),
        "the write was refused"
    );
    assert!(matches!(first, Err(Error::Unreachable(_))), "{first:?}");
    let (mut holder, lock, renewed) = renewing.await.unwrap();
    renewed.expect("the renewal landed before any newer claim");
    let second = contender
        .update(&State::partial("s", r#"{"by":"contender"}"#))
        .await;
    assert!(
        matches!(second, Err(Error::Locked(_))),
        "the contender wrote under the renewed holder: {second:?}"
    );
    assert!(
        holder.get("s").await.unwrap().is_none(),
        "the contender's update landed"
    );
    holder
        .set_locked(&State::completed("s", r#"{"by":"holder"}"#), &lock)
        .await
        .expect("the renewed holder writes");
}

// -- a write that lands after its lease ------------------------------------------------------

/// Holds back this instance's first state write (not a lock table's) for `delay`.
struct SlowStateWrite {
    delay: Duration,
    delayed: AtomicBool,
}

impl Interceptor for SlowStateWrite {
    fn before_send(&self, _method: &http::Method, uri: &http::Uri) -> Option<Duration> {
        let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
        (state_write && !self.delayed.swap(true, Ordering::SeqCst)).then_some(self.delay)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_that_lands_after_its_lease_is_not_acknowledged_when_a_later_holder_read_before_it()
{
    // The holder's write is held back past its 3 s lease. A contender takes the lock meanwhile,
    // reads the state without the holder's write and writes its own (a higher version). The
    // holder's write then lands under it: acknowledging it would report an update that is
    // already lost.
    let timeline = Timeline::real();
    let table = TestTable::new("late_write");
    let lease = [("lock_lease_seconds", "3")];
    let slow = Arc::new(SlowStateWrite {
        delay: Duration::from_secs(6),
        delayed: AtomicBool::new(false),
    });
    let options = InstanceOptions {
        interceptor: Some(slow.clone() as Arc<dyn Interceptor>),
        ..InstanceOptions::default()
    };
    let mut holder = timeline.open_with(&table, &lease, options).await;
    holder.migrate().await.unwrap();
    let lock = holder.acquire_lock("s").await.unwrap();
    let writing = tokio::spawn(async move {
        let written = holder
            .set_locked(&State::completed("s", r#"{"by":"holder"}"#), &lock)
            .await;
        (holder, written)
    });
    let mut contender = timeline.open(&table, &lease).await;
    let next = contender.acquire_lock("s").await.expect("acquire");
    contender
        .set_locked(&State::completed("s", r#"{"by":"contender"}"#), &next)
        .await
        .expect("the contender writes");
    let (_holder, written) = writing.await.unwrap();
    assert!(slow.delayed.load(Ordering::SeqCst), "the delay was applied");
    let stored = contender.get("s").await.unwrap().unwrap();
    let holders_write_counts = json(&stored.completed)["by"] == "holder";
    assert!(
        written.is_err() || holders_write_counts,
        "the holder's write was acknowledged ({written:?}) but the state is {stored:?}"
    );
    assert!(matches!(written, Err(Error::LockLost(_))), "{written:?}");
    contender.release(next).await.unwrap();
}
