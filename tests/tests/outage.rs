//! ClickHouse restarts under the backend (a server of the test's own, killed with SIGKILL and
//! started again on the same data): with the default retry budget no call fails, and every
//! acknowledged operation is read back, right after it returned and again at the end; the check
//! sees a loss when a write is acknowledged without being sent. An outage longer than the budget
//! fails with an error that says how long it tried, and leaves the state as it was; pooled
//! connections to a restarted server are not used.

// In a module, so that `just test` can run these beside the other suites (`--skip outage::`
// there, and this binary on its own: they mostly wait for their server to come back).
mod outage {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use integration_tests::state_host::http::faults::{Fault, FaultPlan};
    use integration_tests::state_host::http::hook::Interceptor;
    use integration_tests::state_host::{Backend, Error, InstanceOptions, State};
    use integration_tests::tls::{Pki, TlsProxy};
    use integration_tests::{
        LocalServer, Target, insert_target, json, runtime, splitmix64 as draw,
    };

    /// What the test expects of one state id: the keys its partial state holds, and its completed
    /// state's counter.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Expected {
        partial: BTreeMap<String, u64>,
        completed: Option<u64>,
    }

    /// Every id the run wrote, `None` where it was cleared since.
    type Model = BTreeMap<String, Option<Expected>>;

    /// The ids that updates go to (Meltano's streams); each update adds a key of its own.
    const STREAMS: u64 = 8;
    /// How near a restart (in operations) the check must cover every operation.
    const NEAR: usize = 20;
    /// No restart yet (or its swallow done), for `restarted_at`.
    const NOT_YET: usize = usize::MAX;

    /// What an acknowledged operation did, and to which ids.
    #[derive(Debug, Clone)]
    struct Done {
        ids: Vec<String>,
        kind: Kind,
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        Update,
        Set,
        Clear,
    }

    /// One operation of the mix on the backend and the model; returns the ids whose stored
    /// state now shows it. Losses stay visible: updates add a key of their own, and each set or
    /// set-all writes ids of its own, which only a later clear removes.
    async fn operate(
        backend: &mut Backend,
        model: &mut Model,
        n: usize,
        roll: u64,
    ) -> Result<Done, Error> {
        let done = |ids: Vec<String>, kind| Done { ids, kind };
        let written: Vec<&String> = model
            .keys()
            .filter(|id| !id.starts_with("stream:"))
            .collect();
        let cleared_candidates: Vec<String> = model
            .iter()
            .filter(|(id, e)| !id.starts_with("stream:") && e.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        // Now and then a set goes over a stored state, or one cleared before.
        let again = ((roll >> 8) % 10 == 7 && !written.is_empty())
            .then(|| written[(roll >> 24) as usize % written.len()].clone());
        let completed = |c: usize| Expected {
            partial: BTreeMap::new(),
            completed: Some(c as u64),
        };
        match (roll >> 8) % 10 {
            // Meltano's pattern: incremental updates most of the time.
            0..=5 => {
                let id = format!("stream:{}", roll % STREAMS);
                let key = format!("k{n}");
                backend
                    .update(&State::partial(
                        &id,
                        format!(r#"{{"singer_state":{{"{key}":{n}}}}}"#),
                    ))
                    .await?;
                let entry = model.entry(id.clone()).or_default();
                entry
                    .get_or_insert_with(Expected::default)
                    .partial
                    .insert(key, n as u64);
                Ok(done(vec![id], Kind::Update))
            }
            8 if !cleared_candidates.is_empty() => {
                let id =
                    cleared_candidates[(roll >> 16) as usize % cleared_candidates.len()].clone();
                backend.clear(&id).await?;
                model.insert(id.clone(), None);
                Ok(done(vec![id], Kind::Clear))
            }
            9 => {
                let ids: Vec<String> = (0..3).map(|k| format!("all:{n}:{k}")).collect();
                let states: Vec<State> = ids
                    .iter()
                    .map(|id| State::completed(id, format!(r#"{{"singer_state":{{"c":{n}}}}}"#)))
                    .collect();
                backend.set_all(&states).await?;
                for id in &ids {
                    model.insert(id.clone(), Some(completed(n)));
                }
                Ok(done(ids, Kind::Set))
            }
            _ => {
                let id = again.unwrap_or_else(|| format!("set:{n}"));
                backend
                    .set(&State::completed(
                        &id,
                        format!(r#"{{"singer_state":{{"c":{n}}}}}"#),
                    ))
                    .await?;
                model.insert(id.clone(), Some(completed(n)));
                Ok(done(vec![id], Kind::Set))
            }
        }
    }

    /// Reads `ids` back and lists what differs from the model, one item per missing or wrong
    /// piece (`id`, `id.key`, `id.completed`): empty when all is as acknowledged.
    async fn differences(
        reader: &mut Backend,
        model: &Model,
        ids: &[String],
    ) -> Result<Vec<String>, Error> {
        let mut found = Vec::new();
        for id in ids {
            let stored = reader.get(id).await?.map(|s| {
                let partial = json(&s.partial)["singer_state"]
                    .as_object()
                    .map(|keys| {
                        keys.iter()
                            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(u64::MAX)))
                            .collect()
                    })
                    .unwrap_or_default();
                let completed = json(&s.completed)["singer_state"]["c"].as_u64();
                Expected { partial, completed }
            });
            let acknowledged = model.get(id).cloned().flatten();
            match (stored, acknowledged) {
                (Some(stored), Some(acknowledged)) => {
                    let keys: BTreeSet<&String> = stored
                        .partial
                        .keys()
                        .chain(acknowledged.partial.keys())
                        .collect();
                    for key in keys {
                        let (s, a) = (stored.partial.get(key), acknowledged.partial.get(key));
                        if s != a {
                            found.push(format!("{id}.{key}: stored {s:?}, acknowledged {a:?}"));
                        }
                    }
                    if stored.completed != acknowledged.completed {
                        found.push(format!(
                            "{id}.completed: stored {:?}, acknowledged {:?}",
                            stored.completed, acknowledged.completed
                        ));
                    }
                }
                (None, None) => {}
                (stored, acknowledged) => found.push(format!(
                    "{id}: stored {stored:?}, acknowledged {acknowledged:?}"
                )),
            }
        }
        Ok(found)
    }

    /// One restart: the operations done when the server was killed and when it was back.
    #[derive(Debug, Clone, Copy)]
    struct Restart {
        killed_at: usize,
        resumed_at: usize,
        outage: Duration,
    }

    impl Restart {
        fn near(&self, n: usize) -> bool {
            n + NEAR >= self.killed_at && n <= self.resumed_at + NEAR
        }
    }

    /// How a run goes: its operations, and when the server goes down and for how long.
    struct Plan {
        schema: &'static str,
        operations: usize,
        /// The operation count at which the first kill comes, and the mean gap between kills.
        first_kill: usize,
        gap: usize,
        /// The outage of the n-th restart (from a seeded draw in [0, 1)).
        outage: fn(usize, f64) -> Duration,
        restarts: usize,
    }

    /// What a run saw.
    struct Report {
        acknowledged: Vec<(usize, Done)>,
        failed: Vec<String>,
        /// Operations whose read-back right after they returned differed, with how.
        lost_at_once: BTreeMap<usize, Vec<String>>,
        /// Ids that differ from the model at the end.
        lost_at_end: Vec<String>,
        model: Model,
        restarts: Vec<Restart>,
        elapsed: Duration,
    }

    impl Report {
        /// Acknowledged operations near a restart, all of them read back right after.
        fn near_restarts(&self) -> usize {
            self.acknowledged
                .iter()
                .filter(|(n, _)| self.restarts.iter().any(|r| r.near(*n)))
                .count()
        }

        /// Operations whose effect the final state still shows (a later set or clear of its ids
        /// hides a set's, a later set hides a clear's).
        fn still_shown(&self) -> usize {
            self.acknowledged
                .iter()
                .filter(|(n, op)| {
                    op.ids.iter().all(|id| match (op.kind, self.model.get(id)) {
                        (Kind::Update, _) => true,
                        (Kind::Clear, Some(None)) => true,
                        (Kind::Set, Some(Some(e))) => e.completed == Some(*n as u64),
                        _ => false,
                    })
                })
                .count()
        }

        fn summary(&self, plan: &Plan) -> String {
            let restarts: Vec<String> = self
                .restarts
                .iter()
                .map(|r| {
                    let at = if r.killed_at == r.resumed_at {
                        format!("{}", r.killed_at)
                    } else {
                        format!("{}-{}", r.killed_at, r.resumed_at)
                    };
                    format!("{at} ({:.1} s)", r.outage.as_secs_f64())
                })
                .collect();
            let down: f64 = self.restarts.iter().map(|r| r.outage.as_secs_f64()).sum();
            format!(
                "{} operations in {:.1?}, {} restarts ({down:.1} s down in all) during operations \
                 {}: {} calls failed; {} operations acknowledged, each read back by another \
                 instance right after it returned ({} of them within {NEAR} operations of a \
                 restart), {} with a loss; at the end the final state shows {} of them (the \
                 others' ids were written or cleared since) and differs from what was acknowledged in {} \
                 places",
                plan.operations,
                self.elapsed,
                self.restarts.len(),
                restarts.join(", "),
                self.failed.len(),
                self.acknowledged.len(),
                self.near_restarts(),
                self.lost_at_once.len(),
                self.still_shown(),
                self.lost_at_end.len(),
            )
        }
    }

    /// Runs `plan` against a server of its own that is killed and started again, with the
    /// writer's exchanges under `faults`. At each restart `restarted_at` is set to the count of
    /// operations done then.
    async fn run(
        plan: &Plan,
        faults: Option<Arc<dyn FaultPlan>>,
        restarted_at: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
    ) -> Report {
        let server = LocalServer::start("default", "");
        let uri = server.uri();
        // As Meltano runs it: each update keeps its lock for the next (one round trip), through
        // the restarts.
        let settings = vec![
            ("schema".into(), plan.schema.into()),
            ("lock_linger_seconds".into(), "5".into()),
        ];
        let options = InstanceOptions {
            label: "writer".into(),
            faults,
            ..InstanceOptions::default()
        };
        let mut writer = runtime()
            .open_with(&uri, settings, options)
            .await
            .expect("opens");
        // An instance of its own reads each acknowledged write back: not the writer's cache.
        let mut reader = runtime()
            .open(&uri, vec![("schema".into(), plan.schema.into())])
            .await
            .expect("opens");
        let finished = Arc::new(AtomicBool::new(false));

        // The chaos: SIGKILL at drawn points, an outage, a start on the same data.
        let chaos = {
            let (done, finished, restarted_at) =
                (Arc::clone(&done), Arc::clone(&finished), restarted_at);
            let (first_kill, gap, outage_of, most) =
                (plan.first_kill, plan.gap, plan.outage, plan.restarts);
            std::thread::spawn(move || {
                let mut server = server;
                let mut seed = 20_261_201;
                let mut restarts: Vec<Restart> = Vec::new();
                let mut next_kill = first_kill;
                while !finished.load(Ordering::SeqCst) && restarts.len() < most {
                    if done.load(Ordering::SeqCst) < next_kill {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let unit = (draw(&mut seed) >> 11) as f64 / (1u64 << 53) as f64;
                    let outage = outage_of(restarts.len(), unit);
                    let killed_at = done.load(Ordering::SeqCst);
                    server.kill();
                    std::thread::sleep(outage);
                    server.resume();
                    restarted_at.store(done.load(Ordering::SeqCst), Ordering::SeqCst);
                    restarts.push(Restart {
                        killed_at,
                        resumed_at: done.load(Ordering::SeqCst),
                        outage,
                    });
                    next_kill += gap / 2 + (draw(&mut seed) % gap as u64) as usize;
                }
                (server, restarts)
            })
        };

        let mut model = Model::new();
        let mut seed = 7;
        let mut report = Report {
            acknowledged: Vec::new(),
            failed: Vec::new(),
            lost_at_once: BTreeMap::new(),
            lost_at_end: Vec::new(),
            model: Model::new(),
            restarts: Vec::new(),
            elapsed: Duration::ZERO,
        };
        let mut seen = BTreeSet::new();
        let started = Instant::now();
        for n in 0..plan.operations {
            let roll = draw(&mut seed);
            let before = model.clone();
            match operate(&mut writer, &mut model, n, roll).await {
                // A failed call promised nothing: the model stays as it was.
                Err(e) => {
                    report.failed.push(format!("operation {n}: {e}"));
                    model = before;
                }
                Ok(op) => {
                    // A loss counts at the first operation whose read-back shows it.
                    match differences(&mut reader, &model, &op.ids).await {
                        Ok(found) => {
                            let new: Vec<String> = found
                                .into_iter()
                                .filter(|d| seen.insert(d.clone()))
                                .collect();
                            if !new.is_empty() {
                                report.lost_at_once.insert(n, new);
                            }
                        }
                        Err(e) => report
                            .failed
                            .push(format!("reading back operation {n}: {e}")),
                    }
                    report.acknowledged.push((n, op));
                }
            }
            done.store(n + 1, Ordering::SeqCst);
        }
        finished.store(true, Ordering::SeqCst);
        let (server, restarts) = chaos.join().expect("the chaos thread");
        report.elapsed = started.elapsed();
        let ids: Vec<String> = model.keys().cloned().collect();
        report.lost_at_end = differences(&mut reader, &model, &ids)
            .await
            .expect("reads back after the restarts");
        report.model = model;
        report.restarts = restarts;
        drop(server);
        report
    }

    /// 2,000 operations (update, set, clear, set-all) with the server killed at 20 or more
    /// points, each outage between 0.5 and 10 s: no call fails, and every acknowledged
    /// operation is read back by another instance right after it returned, and again at the
    /// end. The retry budget is the default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarts_in_the_middle_of_two_thousand_operations_fail_no_call_and_lose_nothing() {
        let plan = Plan {
            schema: "outage",
            operations: 2_000,
            first_kill: 40,
            gap: 2_000 / 22,
            // The first outage is the longest allowed, the second the shortest; the others are
            // drawn log-uniformly between them.
            outage: |i, unit| match i {
                0 => Duration::from_secs(10),
                1 => Duration::from_millis(500),
                _ => Duration::from_secs_f64(0.5 * 20f64.powf(unit)),
            },
            restarts: usize::MAX,
        };
        let report = run(
            &plan,
            None,
            Arc::new(AtomicUsize::new(NOT_YET)),
            Arc::new(AtomicUsize::new(0)),
        )
        .await;
        println!("{}", report.summary(&plan));
        let longest = report
            .restarts
            .iter()
            .map(|r| r.outage)
            .max()
            .unwrap_or_default();
        assert!(
            report.restarts.len() >= 20,
            "only {} restarts",
            report.restarts.len()
        );
        assert!(longest >= Duration::from_secs(10));
        assert!(
            report.failed.is_empty(),
            "calls failed: {:#?}",
            report.failed
        );
        assert!(
            report.lost_at_once.is_empty(),
            "acknowledged operations not read back: {:#?}",
            report.lost_at_once
        );
        assert!(
            report.lost_at_end.is_empty(),
            "acknowledged writes lost by the end: {:#?}",
            report.lost_at_end
        );
    }

    /// A server that acknowledges a state write without receiving it (one after each restart):
    /// the same check reports exactly those operations as lost. The check can see a
    /// loss, so the run above, which reports none, had none to see.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_acknowledged_but_never_sent_after_a_restart_is_reported_lost() {
        let plan = Plan {
            schema: "outage_swallowed",
            operations: 240,
            first_kill: 30,
            gap: 60,
            outage: |_, unit| Duration::from_secs_f64(0.5 + 0.5 * unit),
            restarts: 3,
        };
        let restarted_at = Arc::new(AtomicUsize::new(NOT_YET));
        let done = Arc::new(AtomicUsize::new(0));
        let swallow = Arc::new(SwallowAfterRestart {
            restarted_at: Arc::clone(&restarted_at),
            done: Arc::clone(&done),
            swallowed: std::sync::Mutex::new(BTreeSet::new()),
        });
        let report = run(&plan, Some(swallow.clone()), restarted_at, done).await;
        println!("{}", report.summary(&plan));
        let swallowed = swallow.swallowed.lock().expect("not poisoned").clone();
        assert_eq!(report.restarts.len(), 3);
        assert_eq!(swallowed.len(), 3, "one write swallowed after each restart");
        assert!(
            report.failed.is_empty(),
            "calls failed: {:#?}",
            report.failed
        );
        let reported: BTreeSet<usize> = report.lost_at_once.keys().copied().collect();
        assert_eq!(reported, swallowed, "{:#?}", report.lost_at_once);
        for n in &reported {
            assert!(
                report.restarts.iter().any(|r| r.near(*n)),
                "operation {n} is not near a restart"
            );
        }
    }

    /// Swallows the first state write of the first operation begun after each restart (not a
    /// retry of the write in flight at the kill, which may have landed before it), and notes
    /// which operation it belonged to.
    /// it belonged to.
    struct SwallowAfterRestart {
        restarted_at: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
        swallowed: std::sync::Mutex<BTreeSet<usize>>,
    }

    impl FaultPlan for SwallowAfterRestart {
        fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
            let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
            let at = self.restarted_at.load(Ordering::SeqCst);
            let operation = self.done.load(Ordering::SeqCst);
            if !state_write
                || at == NOT_YET
                || operation <= at
                || self
                    .restarted_at
                    .compare_exchange(at, NOT_YET, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
            {
                return None;
            }
            if let Ok(mut swallowed) = self.swallowed.lock() {
                swallowed.insert(operation);
            }
            Some(Fault::Swallowed {
                written_rows: integration_tests::rows_a_landing_reports(uri),
            })
        }
    }

    /// Holds the first state write back until the test has killed the server.
    struct HoldFirstWrite {
        sent: AtomicUsize,
        held: AtomicBool,
    }

    impl Interceptor for HoldFirstWrite {
        fn before_send(&self, _: &http::Method, uri: &http::Uri) -> Option<Duration> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
            (state_write && !self.held.swap(true, Ordering::SeqCst))
                .then_some(Duration::from_millis(1500))
        }
    }

    /// The server dies in the middle of an update (its lock claimed, its state write not yet
    /// sent) and stays down past the budget: the call fails with the endpoint, how long it tried
    /// and the setting, after about the budget; and the stored state is the one before. (The
    /// write never reaches a live server here; the next test kills the server after it did.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_longer_than_the_budget_fails_clearly_and_leaves_the_state_as_it_was() {
        let mut server = LocalServer::start("default", "");
        let settings = || {
            vec![
                ("schema".to_string(), "outage_long".to_string()),
                ("retry_budget_seconds".to_string(), "3".to_string()),
            ]
        };
        let hold = Arc::new(HoldFirstWrite {
            sent: AtomicUsize::new(0),
            held: AtomicBool::new(true),
        });
        let interceptor: Arc<dyn Interceptor> = hold.clone();
        let options = InstanceOptions {
            interceptor: Some(interceptor),
            ..InstanceOptions::default()
        };
        let mut backend = runtime()
            .open_with(&server.uri(), settings(), options)
            .await
            .expect("opens");
        let before = r#"{"singer_state":{"k":1}}"#;
        backend
            .update(&State::partial("long", before))
            .await
            .expect("update before the outage");

        // From here on the first state write is held back; the requests before it go through.
        let sent_before = hold.sent.load(Ordering::SeqCst);
        hold.held.store(false, Ordering::SeqCst);
        let started = Instant::now();
        let updating = tokio::spawn(async move {
            let outcome = backend
                .update(&State::partial("long", r#"{"singer_state":{"down":2}}"#))
                .await;
            (backend, outcome)
        });
        while !hold.held.load(Ordering::SeqCst) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the write never came"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reached = hold.sent.load(Ordering::SeqCst) - sent_before - 1;
        assert!(
            reached >= 1,
            "nothing of the update reached the server before its write"
        );
        server.kill();
        let (mut backend, outcome) = updating.await.expect("the update task");
        let tried = started.elapsed();
        match outcome {
            Err(Error::Unreachable(m)) => {
                assert!(m.contains(&format!("127.0.0.1:{}", server.port)), "{m}");
                assert!(m.contains("times over"), "{m}");
                assert!(m.contains("retry budget is 3 s"), "{m}");
                assert!(m.contains("retry_budget_seconds"), "{m}");
            }
            other => panic!("expected unreachable, got {other:?}"),
        }
        // No try starts past the budget, which the held write's 1.5 s count against, and the
        // longest pause is 2 s: it gives up at least 1 s after the call began, and within the
        // budget plus the time the tries themselves take.
        assert!(
            tried >= Duration::from_secs(1) && tried < Duration::from_secs(10),
            "gave up after {tried:?} under a budget of 3 s"
        );

        let (mut other, state) = read_after_restart(&mut server, settings(), "long").await;
        assert_eq!(
            json(&state.partial),
            json(before),
            "the failed update wrote nothing"
        );
        backend
            .update(&State::partial("long", r#"{"singer_state":{"up":3}}"#))
            .await
            .expect("works again once the server is back");
        let state = other.get("long").await.expect("reads").expect("kept");
        assert_eq!(
            json(&state.partial),
            json(r#"{"singer_state":{"k":1,"up":3}}"#)
        );
    }

    /// The server dies after an update's state write reached it and was done, before its answer
    /// came back, and stays down past the budget. The call fails, and what it says matches what
    /// is stored: it says the write may have been stored, and after the restart it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_after_a_write_reached_the_server_reports_that_it_may_have_been_stored() {
        let mut server = LocalServer::start("default", "");
        let target = Target {
            secure: false,
            host: "127.0.0.1".into(),
            port: server.port,
            user: "default".into(),
            password: String::new(),
        };
        let settings = || {
            vec![
                ("schema".to_string(), "outage_reached".to_string()),
                ("retry_budget_seconds".to_string(), "6".to_string()),
            ]
        };
        let lose = Arc::new(LoseFirstWriteAnswer {
            armed: AtomicBool::new(false),
            lost_at: std::sync::Mutex::new(None),
            resent: AtomicUsize::new(0),
        });
        let options = InstanceOptions {
            faults: Some(lose.clone() as Arc<dyn FaultPlan>),
            ..InstanceOptions::default()
        };
        let mut backend = runtime()
            .open_with(&server.uri(), settings(), options)
            .await
            .expect("opens");
        backend
            .update(&State::partial("reached", r#"{"singer_state":{"k":1}}"#))
            .await
            .expect("update before the outage");

        lose.armed.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let updating = tokio::spawn(async move {
            let outcome = backend
                .update(&State::partial("reached", r#"{"singer_state":{"down":2}}"#))
                .await;
            (backend, outcome)
        });
        // The kill comes once the server has stored the write, and while its answer is held.
        let stored = "SELECT count() FROM outage_reached.state \
                      WHERE state_id = 'reached' AND position(partial_state, 'down') > 0";
        while target
            .query(stored)
            .map(|n| n.trim() == "0")
            .unwrap_or(true)
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the write never reached the server"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let lost_at = lose
            .lost_at
            .lock()
            .expect("not poisoned")
            .expect("the write's answer was held");
        server.kill();
        assert!(
            lost_at.elapsed() < ANSWER_HELD,
            "the kill came {:?} after the write was sent, after its answer was let go",
            lost_at.elapsed()
        );
        let (_backend, outcome) = updating.await.expect("the update task");
        match outcome {
            Err(Error::Unreachable(m)) => {
                assert!(m.contains("may have been stored"), "{m}");
                assert!(m.contains("retry_budget_seconds"), "{m}");
            }
            other => panic!("expected unreachable, got {other:?}"),
        }
        // Sent again after the lost answer, to the dead server (within the budget): the doubt
        // is the first send's, and outlives the refusals after it.
        assert!(
            lose.resent.load(Ordering::SeqCst) >= 1,
            "no retry of the write"
        );

        let (_other, state) = read_after_restart(&mut server, settings(), "reached").await;
        assert_eq!(
            json(&state.partial),
            json(r#"{"singer_state":{"k":1,"down":2}}"#),
            "the write the call could not confirm is stored"
        );
    }

    /// Brings `server` back, and reads `id`'s state through another instance (kept for more).
    async fn read_after_restart(
        server: &mut LocalServer,
        settings: Vec<(String, String)>,
        id: &str,
    ) -> (Backend, State) {
        server.resume();
        let mut other = runtime()
            .open(&server.uri(), settings)
            .await
            .expect("opens");
        let state = other
            .get(id)
            .await
            .expect("reads after the restart")
            .expect("the state is kept");
        (other, state)
    }

    /// How long the answer of the write the test kills the server after is held back: less
    /// than the retry budget, so the write is sent again, to the dead server.
    const ANSWER_HELD: Duration = Duration::from_secs(2);

    /// Once armed, holds the answer to the first state write (done on the server) for
    /// [`ANSWER_HELD`], then drops the connection without it; counts the write's later sends.
    struct LoseFirstWriteAnswer {
        armed: AtomicBool,
        lost_at: std::sync::Mutex<Option<Instant>>,
        resent: AtomicUsize,
    }

    impl FaultPlan for LoseFirstWriteAnswer {
        fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
            let state_write = insert_target(uri).is_some_and(|t| !t.contains("_lock"));
            if !state_write || !self.armed.load(Ordering::SeqCst) {
                return None;
            }
            let mut lost_at = self.lost_at.lock().expect("not poisoned");
            if lost_at.is_some() {
                self.resent.fetch_add(1, Ordering::SeqCst);
                return None;
            }
            *lost_at = Some(Instant::now());
            Some(Fault::AnswerLost(ANSWER_HELD))
        }
    }

    /// With no retries at all, the first call after a restart must not go out on a pooled
    /// connection the restart closed: over http, and over https (a TLS endpoint whose upstream
    /// died closes its connections too).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pooled_connections_to_a_restarted_server_are_not_used() {
        let mut server = LocalServer::start("default", "");
        let pki = Pki::new("outage_pool");
        let identity = pki.server("server", &["localhost", "127.0.0.1"], false);
        let upstream = Target {
            secure: false,
            host: "127.0.0.1".into(),
            port: server.port,
            user: "default".into(),
            password: String::new(),
        };
        let proxy = TlsProxy::start(pki.server_config(&identity, false), upstream).await;
        let no_retries = || {
            vec![
                ("schema".to_string(), "outage_pool".to_string()),
                ("retry_budget_seconds".to_string(), "0".to_string()),
            ]
        };
        let secure = format!(
            "clickhouse://default:@127.0.0.1:{}/default?secure=true",
            proxy.port()
        );
        let tls_runtime = integration_tests::state_host::Runtime::load(
            &integration_tests::state_host::default_component_path(),
            integration_tests::state_host::RuntimeOptions {
                tls: integration_tests::state_host::http::tls::TlsOptions {
                    ca_bundle: Some(pki.ca_path()),
                    ..Default::default()
                },
                ..integration_tests::runtime_options()
            },
        )
        .expect("loads");
        let mut plain = runtime()
            .open(&server.uri(), no_retries())
            .await
            .expect("opens");
        let mut tls = tls_runtime
            .open(&secure, no_retries())
            .await
            .expect("opens over https");
        for round in 0..3 {
            for (label, backend) in [("http", &mut plain), ("https", &mut tls)] {
                for _ in 0..3 {
                    backend
                        .set(&State::completed(
                            label,
                            format!(r#"{{"singer_state":{{"round":{round}}}}}"#),
                        ))
                        .await
                        .unwrap_or_else(|e| panic!("{label}, round {round}: {e}"));
                }
            }
            server.kill();
            server.resume();
            for (label, backend) in [("http", &mut plain), ("https", &mut tls)] {
                let state = backend
                    .get(label)
                    .await
                    .unwrap_or_else(|e| panic!("{label}, first call after restart {round}: {e}"))
                    .expect("kept");
                assert_eq!(
                    json(&state.completed)["singer_state"]["round"],
                    round,
                    "{label}"
                );
            }
        }
    }
}
