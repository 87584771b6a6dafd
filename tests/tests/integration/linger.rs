//! `update` at one round trip: the guarded write, the kept lock (`lock_linger_seconds`), and
//! what must never happen with them: a stale cache overwriting what another process wrote, a
//! kept lock outliving a force-unlock, a waiting process kept out longer than the linger.
//! Round trips are counted by the host's interceptor, one per HTTP request.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use integration_tests::state_host::clock::{Clock, VirtualClock};
use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::{
    Backend, InstanceOptions, Runtime, RuntimeOptions, State, default_component_path,
};
use integration_tests::{TestTable, json, runtime};

use crate::common::Requests;

async fn counted(table: &TestTable, extra: &[(&str, &str)]) -> (Backend, Arc<Requests>) {
    let requests = Arc::new(Requests::default());
    let options = InstanceOptions {
        interceptor: Some(requests.clone() as Arc<dyn Interceptor>),
        ..InstanceOptions::default()
    };
    let backend = runtime()
        .open_with(&table.target.uri(), table.with(extra), options)
        .await
        .expect("open");
    (backend, requests)
}

fn bookmark(i: usize) -> State {
    State::partial(
        "stream",
        format!(r#"{{"singer_state":{{"bookmarks":{{"k{i}":{i}}}}}}}"#),
    )
}

fn bookmarks(state: &State) -> serde_json::Value {
    json(&state.partial)["singer_state"]["bookmarks"].clone()
}

#[tokio::test]
async fn an_update_stream_costs_one_round_trip_per_update_after_the_first() {
    let table = TestTable::new("stream_trips");
    let (mut b, requests) = counted(&table, &[("lock_linger_seconds", "60")]).await;
    // Meltano reads the state at the start of a run (and this instance checks the deployment).
    assert_eq!(b.get("stream").await.unwrap(), None);
    requests.take();
    b.update(&bookmark(0)).await.expect("first update");
    let first = requests.take();
    // read the newest generation with the state, claim, guarded write
    assert!(first <= 3, "the first update took {first} round trips");
    for i in 1..=20 {
        b.update(&bookmark(i)).await.expect("update");
        assert_eq!(requests.take(), 1, "update {i}");
    }
    // Nothing is due yet: idle gives nothing back and sends nothing.
    assert!(b.idle().await.unwrap().is_some());
    assert_eq!(requests.take(), 0);
    let stored = b.get("stream").await.unwrap().expect("stored");
    assert_eq!(bookmarks(&stored).as_object().map(|o| o.len()), Some(21));
    // The lock is still held (kept), by this instance; close gives it back.
    let holder = b.lock_info("stream").await.unwrap().expect("kept");
    b.close().await.expect("close");
    let mut other = table.open().await;
    assert_eq!(other.lock_info("stream").await.unwrap(), None, "{holder:?}");
}

#[tokio::test]
async fn without_linger_an_update_gives_its_lock_back_at_once() {
    let table = TestTable::new("no_linger");
    let (mut b, requests) = counted(&table, &[]).await;
    b.get("stream").await.unwrap();
    requests.take();
    b.update(&bookmark(0)).await.unwrap();
    // read, claim, guarded write, release
    assert_eq!(requests.take(), 4);
    assert_eq!(b.lock_info("stream").await.unwrap(), None);
    requests.take();
    // This instance released the newest generation itself: claim, guarded write, release.
    b.update(&bookmark(1)).await.unwrap();
    assert_eq!(requests.take(), 3);
    assert_eq!(b.idle().await.unwrap(), None, "nothing kept");
}

#[tokio::test]
async fn a_kept_lock_never_writes_over_what_another_process_stored_meanwhile() {
    let table = TestTable::new("stale_cache");
    let mut keeper = table.open_with(&[("lock_linger_seconds", "60")]).await;
    let mut other = table.open().await;
    keeper.update(&bookmark(1)).await.unwrap();
    // Another process overwrites the state without the lock (`meltano state set`).
    other
        .set(&State::new(
            "stream",
            r#"{"singer_state":{"bookmarks":{"from_set":1}}}"#,
            "{}",
        ))
        .await
        .unwrap();
    // The keeper's cache says {k1}; merging into it would drop `from_set`.
    keeper.update(&bookmark(2)).await.unwrap();
    let stored = other.get("stream").await.unwrap().unwrap();
    assert_eq!(
        bookmarks(&stored),
        json(r#"{"from_set":1,"k2":2}"#),
        "merged into what was stored, not into the keeper's cache"
    );
    // A delete meanwhile is seen too: nothing of the cache comes back.
    other.delete("stream").await.unwrap();
    keeper.update(&bookmark(3)).await.unwrap();
    let stored = other.get("stream").await.unwrap().unwrap();
    assert_eq!(bookmarks(&stored), json(r#"{"k3":3}"#));
    keeper.close().await.unwrap();
}

#[tokio::test]
async fn a_kept_lock_forced_open_is_taken_anew_and_nothing_is_lost() {
    let table = TestTable::new("kept_forced");
    let mut keeper = table.open_with(&[("lock_linger_seconds", "60")]).await;
    let mut operator = table.open().await;
    keeper.update(&bookmark(1)).await.unwrap();
    let kept = keeper.lock_info("stream").await.unwrap().expect("kept");
    assert!(operator.force_unlock("stream").await.unwrap());
    // Someone else takes the lock and writes.
    operator.update(&bookmark(2)).await.unwrap();
    // The keeper's grant is gone: its guarded write is refused, it takes the lock anew (a
    // later generation) and merges into what is stored. Having met another writer, it gives
    // the new grant back rather than keeping it (the id is shared).
    keeper.update(&bookmark(3)).await.unwrap();
    assert_eq!(keeper.lock_info("stream").await.unwrap(), None);
    let log = format!("{}_lock_log", table.qualified());
    let newest: u64 = table
        .target
        .must(&format!(
            "SELECT max(generation) FROM {log} WHERE state_id = 'stream'"
        ))
        .trim()
        .parse()
        .expect("a generation");
    assert!(
        newest > kept.token + 1,
        "a new grant: {newest} after {kept:?}"
    );
    let released = table.target.must(&format!(
        "SELECT count() FROM {log} WHERE state_id = 'stream' AND generation = {newest} \
         AND event = 'release'"
    ));
    assert_eq!(released.trim(), "1", "the new grant was given back");
    let stored = operator.get("stream").await.unwrap().unwrap();
    assert_eq!(bookmarks(&stored), json(r#"{"k1":1,"k2":2,"k3":3}"#));
    keeper.close().await.unwrap();
}

/// A runtime on a virtual clock: time moves only when every instance sleeps, so waits are
/// measured exactly, whatever the machine's load.
fn virtual_runtime() -> (Runtime, VirtualClock) {
    let clock = VirtualClock::new();
    let runtime = Runtime::load(
        &default_component_path(),
        RuntimeOptions {
            clock: Arc::new(clock.clone()),
            ..integration_tests::runtime_options()
        },
    )
    .expect("component loads");
    (runtime, clock)
}

fn lock_settings(table: &TestTable, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut settings = table.with(&[("lock_retry_seconds", "1"), ("lock_timeout_seconds", "60")]);
    settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    settings
}

#[tokio::test]
async fn a_waiting_process_gets_a_kept_lock_at_the_keepers_next_look_not_after_the_linger() {
    // The keeper's host calls `idle` when it asks to be called (as `serve` does). The waiter
    // says it wants the lock; the keeper looks once it has been idle a retry interval, and
    // gives the lock back then instead of at the end of its linger (30 s here).
    let (runtime, clock) = virtual_runtime();
    let table = TestTable::new("kept_wait");
    let uri = table.target.uri();
    let mut keeper = runtime
        .open(
            &uri,
            lock_settings(&table, &[("lock_linger_seconds", "30")]),
        )
        .await
        .expect("open");
    let mut waiter = runtime
        .open(&uri, lock_settings(&table, &[]))
        .await
        .expect("open");
    keeper.update(&bookmark(1)).await.unwrap();
    let kept_at = clock.now_ms();
    let idler = tokio::spawn({
        let clock = clock.clone();
        async move {
            while let Some(due) = keeper.idle().await.expect("idle") {
                clock.sleep(due.saturating_sub(clock.now_ms())).await;
            }
            // Leaves the clock, which otherwise waits for this instance to sleep too.
            keeper.close().await.expect("close");
        }
    });
    waiter
        .update(&bookmark(2))
        .await
        .expect("the waiter gets the lock");
    let waited = clock.now_ms() - kept_at;
    // Held out until the keeper's first look (a retry interval idle), let in at the waiter's
    // next try after it (two retries at most, +20 % jitter).
    assert!(
        waited >= 1_000,
        "the waiter got in after {waited} ms, before the keeper looked"
    );
    assert!(waited <= 2 * 1_200, "the waiter waited {waited} ms");
    idler.await.expect("idler");
    let stored = waiter.get("stream").await.unwrap().unwrap();
    assert_eq!(bookmarks(&stored), json(r#"{"k1":1,"k2":2}"#));
    // The waiter's want landed (the wants of one generation share a token: repeats would not
    // show here; `a_waiter_wants_each_holder_once` counts them).
    assert_eq!(count_wants(&table).await, 1);
}

/// A kept grant nobody wants survives the keeper's looks: each look is one read, and the grant
/// stays kept (the next update is still one round trip).
#[tokio::test]
async fn a_kept_lock_nobody_wants_stays_kept_through_its_looks() {
    let table = TestTable::new("unwanted_look");
    let (mut b, requests) = counted(
        &table,
        &[("lock_linger_seconds", "60"), ("lock_retry_seconds", "0.1")],
    )
    .await;
    b.update(&bookmark(0)).await.expect("first update");
    requests.take();
    // Real time: a look falls due once the grant has been idle a retry interval.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(b.idle().await.unwrap().is_some(), "still kept");
    assert_eq!(requests.take(), 1, "one look");
    assert!(b.idle().await.unwrap().is_some(), "still kept");
    assert_eq!(
        requests.take(),
        0,
        "not looked at again within the interval"
    );
    b.update(&bookmark(1)).await.expect("update");
    assert_eq!(requests.take(), 1, "the kept grant is written under");
    b.close().await.expect("close");
}

/// Rows of the lock log that say a grant is wanted.
async fn count_wants(table: &TestTable) -> u64 {
    let sql = format!(
        "SELECT count() FROM {}_lock_log WHERE event = 'want'",
        table.qualified()
    );
    table.target.must(&sql).trim().parse().expect("a count")
}

#[tokio::test]
async fn a_stream_gives_way_to_a_waiter_at_its_next_renewal() {
    // A stream whose updates come faster than any linger never idles: it looks in the log when
    // it renews, once past half its lease (10 s here), sees the waiter's want, and gives the
    // lock back after that update. The waiter gets in within about half a lease; the stream
    // goes on after it.
    let (runtime, clock) = virtual_runtime();
    let table = TestTable::new("stream_gives_way");
    let uri = table.target.uri();
    let stream_settings = [("lock_linger_seconds", "5"), ("lock_timeout_seconds", "10")];
    let mut stream = runtime
        .open(&uri, lock_settings(&table, &stream_settings))
        .await
        .expect("open");
    let mut waiter = runtime
        .open(
            &uri,
            lock_settings(&table, &[("lock_timeout_seconds", "30")]),
        )
        .await
        .expect("open");
    stream.update(&bookmark(0)).await.unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let streaming = tokio::spawn({
        let (clock, done) = (clock.clone(), done.clone());
        async move {
            let mut sent = 1;
            let start = clock.now_ms();
            // Until the waiter is through and a few more, or 60 s.
            while clock.now_ms() - start < 60_000 {
                clock.sleep(100).await;
                stream
                    .update(&bookmark(sent))
                    .await
                    .expect("the stream goes on");
                sent += 1;
                if done.load(Ordering::SeqCst) {
                    break;
                }
            }
            stream.close().await.expect("close");
            sent
        }
    });
    clock.sleep(1_000).await;
    let asked_at = clock.now_ms();
    waiter
        .update(&State::partial(
            "stream",
            r#"{"singer_state":{"bookmarks":{"waiter":1}}}"#.to_string(),
        ))
        .await
        .expect("the waiter gets the lock while the stream runs");
    let waited = clock.now_ms() - asked_at;
    // Leaves the clock, which otherwise waits for this instance to sleep too.
    waiter.close().await.expect("close");
    done.store(true, Ordering::SeqCst);
    let sent = streaming.await.expect("stream");
    // The stream's grant is at most 1 s old when the waiter asks: it renews within 5 s, and
    // the waiter's next try (1 s, +20 %) comes after that.
    assert!(waited <= 5_000 + 2 * 1_200, "the waiter waited {waited} ms");
    let stored = table.open().await.get("stream").await.unwrap().unwrap();
    let marks = bookmarks(&stored);
    assert_eq!(marks["waiter"], 1, "{marks}");
    assert_eq!(
        marks.as_object().map(|o| o.len()),
        Some(sent + 1),
        "every update of the stream and the waiter's: {marks}"
    );
}

#[tokio::test]
async fn set_is_one_round_trip_and_lands_above_a_newer_stored_version() {
    let table = TestTable::new("set_trip");
    let (mut b, requests) = counted(&table, &[]).await;
    b.get("x").await.unwrap();
    requests.take();
    b.set(&State::completed("x", r#"{"n":1}"#)).await.unwrap();
    assert_eq!(requests.take(), 1);
    // A version far in the future (a writer whose clock is ahead): the next set still wins, in
    // three round trips (its write finds something newer, reads it, and writes above it: a
    // version the server computed at landing could let a resend land twice, see `set`).
    table.target.must(&format!(
        "INSERT INTO {} VALUES ('x', '{{}}', '{{\"n\":2}}', '2100-01-01 00:00:00.000')",
        table.qualified()
    ));
    b.set(&State::completed("x", r#"{"n":3}"#)).await.unwrap();
    assert_eq!(requests.take(), 3);
    let stored = b.get("x").await.unwrap().unwrap();
    assert_eq!(json(&stored.completed), json(r#"{"n":3}"#));
    requests.take();
    // A state too large for query parameters takes two round trips, and lands the same way.
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(100 * 1024));
    b.set(&State::completed("x", big.clone())).await.unwrap();
    assert_eq!(requests.take(), 2);
    assert_eq!(b.get("x").await.unwrap().unwrap().completed, big);
}

/// Signals the second request an instance sends after `armed`: it goes out only once the first
/// has been answered.
#[derive(Default)]
struct SecondRequestAfterArm {
    armed: std::sync::atomic::AtomicBool,
    after: std::sync::atomic::AtomicUsize,
    sent: tokio::sync::Notify,
}

impl Interceptor for SecondRequestAfterArm {
    fn before_send(&self, _method: &http::Method, _uri: &http::Uri) -> Option<Duration> {
        if self.armed.load(Ordering::SeqCst) && self.after.fetch_add(1, Ordering::SeqCst) == 1 {
            self.sent.notify_one();
        }
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_forced_open_never_writes_under_the_next_holder() {
    // The keeper's grant is forced open and another process takes the lock and reads the
    // state. The keeper's next update must not land before that holder's write (which would
    // bury it): its guard sees the newer grant, and the update waits for the lock instead.
    // The holder writes only once the keeper's first write has been answered (or the keeper's
    // update is over), so the keeper's write always comes first: with the guard's lock checks
    // removed it lands, and the holder's write then buries it (k3 lost), every time.
    let table = TestTable::new("kept_next_holder");
    let signal = Arc::new(SecondRequestAfterArm::default());
    let options = InstanceOptions {
        interceptor: Some(signal.clone() as Arc<dyn Interceptor>),
        ..InstanceOptions::default()
    };
    let mut keeper = runtime()
        .open_with(
            &table.target.uri(),
            table.with(&[
                ("lock_linger_seconds", "60"),
                ("lock_retry_seconds", "0.05"),
            ]),
            options,
        )
        .await
        .expect("open");
    let mut next = table.open().await;
    keeper.update(&bookmark(1)).await.unwrap();
    assert!(next.force_unlock("stream").await.unwrap());
    let lock = next.acquire_lock("stream").await.expect("the next holder");
    let read = next.get("stream").await.unwrap().expect("k1 stored");
    signal.armed.store(true, Ordering::SeqCst);
    let mut keeping = tokio::spawn(async move {
        keeper.update(&bookmark(3)).await.expect("update");
        keeper
    });
    // Once the keeper's first write has been answered, the holder writes what it read plus
    // its own.
    let finished = tokio::select! {
        _ = signal.sent.notified() => None,
        keeper = &mut keeping => Some(keeper.expect("keeper")),
    };
    let mut with_k2 = bookmarks(&read);
    with_k2["k2"] = 2.into();
    let partial = serde_json::json!({ "singer_state": { "bookmarks": with_k2 } });
    next.set_locked(&State::partial("stream", partial.to_string()), &lock)
        .await
        .expect("the holder's write");
    next.release(lock).await.unwrap();
    let keeper = match finished {
        Some(keeper) => keeper,
        None => keeping.await.expect("keeper"),
    };
    keeper.close().await.unwrap();
    let stored = next.get("stream").await.unwrap().unwrap();
    assert_eq!(bookmarks(&stored), json(r#"{"k1":1,"k2":2,"k3":3}"#));
}

/// The rows of `state_id` in `table`'s lock log once every pruning mutation is done (they are
/// sent without waiting, `mutations_sync=0`; the wait is for ClickHouse to finish, bounded).
fn lock_log_rows(table: &TestTable, state_id: &str) -> u64 {
    let log = format!("{}_lock_log", table.name);
    let pending = format!(
        "SELECT count() FROM system.mutations WHERE database = '{}' AND table = '{log}' \
         AND NOT is_done",
        integration_tests::SCHEMA
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while table.target.must(&pending).trim() != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock log's pruning did not finish in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    table
        .target
        .must(&format!(
            "SELECT count() FROM {}_lock_log WHERE state_id = '{state_id}'",
            table.qualified()
        ))
        .trim()
        .parse()
        .expect("a count")
}

#[tokio::test]
async fn meltanos_update_path_prunes_the_lock_log() {
    use protocol::fenced::{PRUNE_EVERY, PRUNE_KEEP};
    let table = TestTable::new("log_pruned");
    // No linger: every update claims a generation and gives it back (an acquire and a release
    // row), as runs of Meltano do; `update` is the only call.
    let mut b = table.open_with(&[("lock_linger_seconds", "0")]).await;
    let updates = 2 * PRUNE_EVERY as usize + PRUNE_KEEP as usize;
    for i in 0..updates {
        b.update(&bookmark(i)).await.expect("update");
    }
    let rows = lock_log_rows(&table, "stream");
    // Update n claims generation n: two rows each, and none older than `PRUNE_KEEP` before the
    // last pruning claim.
    let newest = updates as u64;
    let last_pruning = newest / PRUNE_EVERY * PRUNE_EVERY;
    let kept = 2 * (newest - (last_pruning - PRUNE_KEEP) + 1);
    assert!(
        rows <= kept,
        "{rows} lock-log rows after {updates} updates; at most {kept} are kept"
    );
    // Pruning keeps what decides: the newest generation, its release, and the merged state.
    assert_eq!(b.lock_info("stream").await.unwrap(), None);
    let stored = b.get("stream").await.unwrap().expect("stored");
    assert_eq!(
        bookmarks(&stored).as_object().map(|o| o.len()),
        Some(updates)
    );
    b.close().await.unwrap();
}
