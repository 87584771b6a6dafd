//! A run's hold on its state id (`hold-run`): a second run refused at once, naming the first;
//! the hold kept through a quiet run by `idle`'s renewals and costing no statement per update;
//! `force` fencing the first run out; a dead run's hold lapsing within the lock timeout; and
//! writes from outside the run waiting for it as for any lock. On a virtual clock: time moves
//! only when every instance sleeps, so leases go by in no wall time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use integration_tests::state_host::clock::{Clock, VirtualClock};
use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::{
    Backend, Error, InstanceOptions, Runtime, RuntimeOptions, State, default_component_path,
    this_process,
};
use integration_tests::{TestTable, json};
use tokio::task::JoinHandle;

const ID: &str = "pipeline";

use crate::common::Requests;

struct World {
    runtime: Runtime,
    clock: VirtualClock,
    table: Arc<TestTable>,
}

impl World {
    fn new(label: &str) -> World {
        let clock = VirtualClock::new();
        let runtime = Runtime::load(
            &default_component_path(),
            RuntimeOptions {
                clock: Arc::new(clock.clone()),
                ..integration_tests::runtime_options()
            },
        )
        .expect("component loads");
        World {
            runtime,
            clock,
            table: TestTable::new(label),
        }
    }

    /// A run's instance, identified as `meltano run`, its requests counted. No linger: a grant
    /// kept between updates here is the hold's alone. The lock timeout is 10 s: a run's hold
    /// lasts that long if it dies.
    async fn run(&self, run_id: &str) -> (Backend, Arc<Requests>) {
        self.run_with(run_id, &[]).await
    }

    async fn run_with(&self, run_id: &str, extra: &[(&str, &str)]) -> (Backend, Arc<Requests>) {
        let requests = Arc::new(Requests::default());
        let options = InstanceOptions {
            interceptor: Some(requests.clone() as Arc<dyn Interceptor>),
            ..InstanceOptions::default()
        };
        let mut settings = self.table.with(&[
            ("lock_linger_seconds", "0"),
            ("lock_timeout_seconds", "10"),
            ("lock_retry_seconds", "1"),
        ]);
        settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut b = self
            .runtime
            .open_with(&self.table.target.uri(), settings, options)
            .await
            .expect("open");
        b.identify(&this_process("run", run_id, "4.4.1"))
            .await
            .expect("identify");
        (b, requests)
    }
}

fn bookmark(i: u64) -> State {
    State::partial(
        ID,
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#),
    )
}

fn last_id(b: &State) -> u64 {
    json(&b.partial)["singer_state"]["bookmarks"]["orders"]["id"]
        .as_u64()
        .expect("a bookmark")
}

/// The host's idle loop (as `serve` and the embedded host run it): `idle` when it asks to be
/// called, until `stop`; then the instance is given back (closed, or dropped: a crash).
fn idler(
    mut b: Backend,
    clock: VirtualClock,
    stop: Arc<AtomicUsize>,
) -> JoinHandle<(Backend, usize)> {
    tokio::spawn(async move {
        let mut renewals = 0;
        while stop.load(Ordering::SeqCst) == 0 {
            let due = b.idle().await.expect("idle").expect("a hold is kept");
            let wait = due.saturating_sub(clock.now_ms()).clamp(1, 1_000);
            clock.sleep(wait).await;
            renewals += 1;
        }
        (b, renewals)
    })
}

/// Stops the idle loop and takes its instance back: this task sleeps a moment meanwhile, so
/// that the virtual clock (which moves only when every instance sleeps) wakes the loop.
async fn stop_idler(
    idling: JoinHandle<(Backend, usize)>,
    stop: &AtomicUsize,
    clock: &VirtualClock,
) -> (Backend, usize) {
    stop.store(1, Ordering::SeqCst);
    let (stopped, ()) = tokio::join!(idling, clock.sleep(1_000));
    stopped.expect("idler")
}

#[tokio::test]
async fn a_second_run_is_refused_at_once_naming_the_first_and_the_first_ends_last() {
    let world = World::new("hold_refused");
    let (mut first, first_requests) = world.run("run-1").await;
    let (mut second, _) = world.run("run-2").await;
    first
        .hold_run(ID, false)
        .await
        .expect("the first run holds");
    first.update(&bookmark(0)).await.expect("update");

    let asked = world.clock.now_ms();
    let refused = second.hold_run(ID, false).await;
    let Err(Error::Locked(holder)) = refused else {
        panic!("the second run must be refused: {refused:?}");
    };
    assert_eq!(world.clock.now_ms() - asked, 0, "refused at once, no wait");
    let who = holder.who.as_deref().expect("the holder's process");
    assert_eq!(
        (who.run_id.as_str(), who.command.as_str()),
        ("run-1", "run")
    );
    assert!(holder.expires_at_ms > world.clock.now_ms());

    // The first run goes on at one statement per update: the hold is its kept grant.
    first_requests.take();
    for i in 1..=20 {
        first
            .update(&bookmark(i))
            .await
            .expect("update under the hold");
        assert_eq!(first_requests.take(), 1, "update {i}");
    }
    first.close().await.expect("close gives the hold back");
    second
        .hold_run(ID, false)
        .await
        .expect("free once the first ended");
    let stored = second.get(ID).await.unwrap().expect("stored");
    assert_eq!(last_id(&stored), 20, "the first run's last bookmark");
    second.close().await.expect("close");
}

#[tokio::test]
async fn a_quiet_run_keeps_its_hold_for_many_leases_through_idle() {
    let world = World::new("hold_quiet");
    let (mut first, requests) = world.run("run-1").await;
    let (mut second, _) = world.run("run-2").await;
    first.hold_run(ID, false).await.expect("hold");
    first.update(&bookmark(1)).await.expect("update");
    let started = world.clock.now_ms();
    let stop = Arc::new(AtomicUsize::new(0));
    let idling = idler(first, world.clock.clone(), stop.clone());
    // A tap that sends no STATE for a minute: six leases of 10 s.
    for _ in 0..6 {
        world.clock.sleep(10_000).await;
        let refused = second.hold_run(ID, false).await;
        assert!(
            matches!(refused, Err(Error::Locked(_))),
            "held at {} s: {refused:?}",
            (world.clock.now_ms() - started) / 1_000
        );
    }
    let (mut first, _) = stop_idler(idling, &stop, &world.clock).await;
    // renewed every half lease (5 s) of the quiet minute
    let renewals = world.table.target.must(&format!(
        "SELECT count() FROM {}_lock_log WHERE event = 'renew'",
        world.table.qualified()
    ));
    let renewals: u64 = renewals.trim().parse().expect("a count");
    assert!((10..=14).contains(&renewals), "{renewals} renewals in 60 s");
    requests.take();
    first
        .update(&bookmark(2))
        .await
        .expect("the run writes after its quiet minute");
    assert!(requests.take() <= 4, "one write, or a renewal and a write");
    first.close().await.expect("close");
    second
        .hold_run(ID, false)
        .await
        .expect("free after the run");
    assert_eq!(last_id(&second.get(ID).await.unwrap().unwrap()), 2);
    second.close().await.expect("close");
}

#[tokio::test]
async fn a_forced_hold_fences_the_first_run_out() {
    let world = World::new("hold_forced");
    let (mut first, _) = world.run("run-1").await;
    let (mut second, _) = world.run("run-2").await;
    first.hold_run(ID, false).await.expect("hold");
    first.update(&bookmark(1)).await.expect("update");
    second.hold_run(ID, true).await.expect("forced");
    second
        .update(&bookmark(100))
        .await
        .expect("the forcing run writes");

    let lost = first.update(&bookmark(2)).await;
    assert!(
        matches!(&lost, Err(Error::LockLost(why)) if why.contains("this run's hold")),
        "{lost:?}"
    );
    // and every later update of the fenced run
    assert!(matches!(
        first.update(&bookmark(3)).await,
        Err(Error::LockLost(_))
    ));
    assert_eq!(last_id(&second.get(ID).await.unwrap().unwrap()), 100);
    // Once the forcing run has ended too, the fenced run still does not write.
    second.close().await.expect("close");
    assert!(matches!(
        first.update(&bookmark(4)).await,
        Err(Error::LockLost(_))
    ));
    let (mut reader, _) = world.run("reader").await;
    assert_eq!(last_id(&reader.get(ID).await.unwrap().unwrap()), 100);
    first.close().await.expect("close");
    reader.close().await.expect("close");
}

#[tokio::test]
async fn a_dead_runs_hold_lapses_within_the_lock_timeout() {
    let world = World::new("hold_dead");
    let (mut first, _) = world.run("run-1").await;
    let (mut second, _) = world.run("run-2").await;
    first.hold_run(ID, false).await.expect("hold");
    first.update(&bookmark(1)).await.expect("update");
    let died = world.clock.now_ms();
    drop(first); // killed: nothing given back, nothing renewed
    for _ in 0..60 {
        match second.hold_run(ID, false).await {
            Ok(()) => break,
            Err(Error::Locked(_)) => world.clock.sleep(500).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    let waited = world.clock.now_ms() - died;
    assert!(
        (9_500..=10_500).contains(&waited),
        "the dead run's hold lapsed after {waited} ms (lock timeout 10 s)"
    );
    second
        .update(&bookmark(2))
        .await
        .expect("the next run writes");
    assert_eq!(last_id(&second.get(ID).await.unwrap().unwrap()), 2);
    second.close().await.expect("close");
}

#[tokio::test]
async fn writes_from_outside_the_run_wait_for_it_and_reads_never_do() {
    let world = World::new("hold_outside");
    let (mut run, _) = world.run("run-1").await;
    run.hold_run(ID, false).await.expect("hold");
    run.update(&bookmark(1)).await.expect("update");
    let stop = Arc::new(AtomicUsize::new(0));
    let idling = idler(run, world.clock.clone(), stop.clone());
    // `meltano state set` and the CLI: another instance, not a run.
    let mut outside = world
        .runtime
        .open(
            &world.table.target.uri(),
            world
                .table
                .with(&[("lock_timeout_seconds", "3"), ("lock_retry_seconds", "1")]),
        )
        .await
        .expect("open");
    let before = world.clock.now_ms();
    let state = outside.get(ID).await.expect("a read is never held up");
    assert_eq!(world.clock.now_ms(), before, "read at once");
    assert_eq!(last_id(&state.expect("stored")), 1);
    assert!(
        outside
            .state_ids(None)
            .await
            .expect("list")
            .contains(&ID.to_string())
    );
    let refused = outside
        .update(&State::completed(ID, r#"{"singer_state":{}}"#))
        .await;
    let Err(Error::Locked(holder)) = refused else {
        panic!("a write from outside must wait for the run, then be refused: {refused:?}");
    };
    assert!(
        world.clock.now_ms() - before >= 3_000,
        "it waited the lock timeout"
    );
    assert_eq!(
        holder.who.as_deref().map(|w| w.run_id.as_str()),
        Some("run-1")
    );
    let (run, _) = stop_idler(idling, &stop, &world.clock).await;
    run.close().await.expect("close");
    outside
        .update(&State::completed(ID, r#"{"singer_state":{"after":1}}"#))
        .await
        .expect("written once the run ended");
    outside.close().await.expect("close");
}

#[tokio::test]
async fn with_run_lock_off_a_run_holds_nothing() {
    let world = World::new("hold_off");
    let off = [("run_lock", "false")];
    let (mut first, _) = world.run_with("run-1", &off).await;
    let (mut second, _) = world.run_with("run-2", &off).await;
    first.hold_run(ID, false).await.expect("nothing to hold");
    assert_eq!(first.lock_info(ID).await.unwrap(), None, "no hold taken");
    first.update(&bookmark(1)).await.expect("update");
    assert_eq!(first.lock_info(ID).await.unwrap(), None, "nothing kept");
    second.hold_run(ID, false).await.expect("not refused");
    second.update(&bookmark(2)).await.expect("update");
    first.close().await.expect("close");
    second.close().await.expect("close");
}
