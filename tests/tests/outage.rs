//! ClickHouse restarts under the backend (a server of the test's own, killed with SIGKILL and
//! started again on the same data): with the default retry budget no call fails and nothing
//! acknowledged is lost; an outage longer than the budget fails with an error that says how
//! long it tried, and writes nothing; pooled connections to a restarted server are not used.

// In a module, so that `just test` can run these beside the other suites (`--skip outage::`
// there, and this binary on its own: they mostly wait for their server to come back).
mod outage {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use integration_tests::state_host::{Backend, Error, State};
    use integration_tests::tls::{Pki, TlsProxy};
    use integration_tests::{LocalServer, Target, json, runtime, splitmix64 as draw};

    /// What the test expects of one state id: the keys its partial state holds, and its completed
    /// state's counter (`None`: no state).
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Expected {
        partial: BTreeMap<String, u64>,
        completed: Option<u64>,
    }

    const IDS: usize = 8;
    const OPERATIONS: usize = 2_000;
    const RESTARTS: usize = 20;

    /// One operation of the mix on the model and on the backend.
    async fn operate(
        backend: &mut Backend,
        model: &mut [Option<Expected>],
        n: usize,
        roll: u64,
    ) -> Result<(), Error> {
        let id = (roll % IDS as u64) as usize;
        let name = format!("outage:{id}");
        match (roll >> 8) % 10 {
            // Meltano's pattern: incremental updates most of the time.
            0..=5 => {
                let key = format!("k{n}");
                backend
                    .update(&State::partial(
                        &name,
                        format!(r#"{{"singer_state":{{"{key}":{n}}}}}"#),
                    ))
                    .await?;
                let entry = model[id].get_or_insert_with(Expected::default);
                entry.partial.insert(key, n as u64);
            }
            6 | 7 => {
                backend
                    .set(&State::completed(
                        &name,
                        format!(r#"{{"singer_state":{{"c":{n}}}}}"#),
                    ))
                    .await?;
                model[id] = Some(Expected {
                    partial: BTreeMap::new(),
                    completed: Some(n as u64),
                });
            }
            8 => {
                backend.clear(&name).await?;
                model[id] = None;
            }
            _ => {
                let others: Vec<usize> = (0..3).map(|k| (id + k) % IDS).collect();
                let states: Vec<State> = others
                    .iter()
                    .map(|&o| {
                        State::completed(
                            format!("outage:{o}"),
                            format!(r#"{{"singer_state":{{"c":{n}}}}}"#),
                        )
                    })
                    .collect();
                backend.set_all(&states).await?;
                for o in others {
                    model[o] = Some(Expected {
                        partial: BTreeMap::new(),
                        completed: Some(n as u64),
                    });
                }
            }
        }
        Ok(())
    }

    /// What is stored for each id, in the model's terms.
    async fn stored(backend: &mut Backend) -> Vec<Option<Expected>> {
        let mut found = Vec::new();
        for id in 0..IDS {
            let state = backend
                .get(&format!("outage:{id}"))
                .await
                .expect("reads back after the restarts");
            found.push(state.map(|s| {
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
            }));
        }
        found
    }

    /// 2,000 operations (update, set, clear, set-all over 8 ids) with the server killed at 20 or
    /// more points, each outage between 0.5 and 10 s: no call fails, and every acknowledged write is
    /// what is stored at the end. The retry budget is the default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarts_in_the_middle_of_two_thousand_operations_fail_no_call_and_lose_nothing() {
        let server = LocalServer::start("default", "");
        let uri = server.uri();
        // As Meltano runs it: each update keeps its lock for the next (one round trip), through
        // the restarts.
        let settings = vec![
            ("schema".into(), "outage".into()),
            ("lock_linger_seconds".into(), "5".into()),
        ];
        let mut backend = runtime().open(&uri, settings).await.expect("opens");
        let done = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicBool::new(false));

        // The chaos: after every ~90 operations (drawn), SIGKILL, an outage, a start on the same
        // data. The first outage is the longest allowed, the second the shortest; the others are
        // drawn log-uniformly between them.
        let chaos = {
            let (done, finished) = (Arc::clone(&done), Arc::clone(&finished));
            std::thread::spawn(move || {
                let mut server = server;
                let mut seed = 20_261_201;
                let mut outages: Vec<Duration> = Vec::new();
                let mut next_kill = 40;
                while !finished.load(Ordering::SeqCst) {
                    if done.load(Ordering::SeqCst) < next_kill {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let outage = match outages.len() {
                        0 => Duration::from_secs(10),
                        1 => Duration::from_millis(500),
                        _ => {
                            let unit = (draw(&mut seed) >> 11) as f64 / (1u64 << 53) as f64;
                            Duration::from_secs_f64(0.5 * 20f64.powf(unit))
                        }
                    };
                    server.kill();
                    std::thread::sleep(outage);
                    server.resume();
                    outages.push(outage);
                    let gap = OPERATIONS / (RESTARTS + 2);
                    next_kill += gap / 2 + (draw(&mut seed) % gap as u64) as usize;
                }
                (server, outages)
            })
        };

        let mut model: Vec<Option<Expected>> = vec![None; IDS];
        let mut seed = 7;
        let mut failed = Vec::new();
        let started = Instant::now();
        for n in 0..OPERATIONS {
            let roll = draw(&mut seed);
            let before = model.clone();
            if let Err(e) = operate(&mut backend, &mut model, n, roll).await {
                // A failed call promised nothing: the model stays as it was.
                failed.push(format!("operation {n}: {e}"));
                model = before;
            }
            done.store(n + 1, Ordering::SeqCst);
        }
        finished.store(true, Ordering::SeqCst);
        let (server, outages) = chaos.join().expect("the chaos thread");
        let elapsed = started.elapsed();

        let found = stored(&mut backend).await;
        let lost: Vec<String> = (0..IDS)
            .filter(|&id| found[id] != model[id])
            .map(|id| {
                format!(
                    "outage:{id}: stored {:?}, acknowledged {:?}",
                    found[id], model[id]
                )
            })
            .collect();
        let longest = outages.iter().max().copied().unwrap_or_default();
        println!(
            "{OPERATIONS} operations in {elapsed:.1?}, {} restarts (outages {:.1} s in all, the \
             longest {longest:.1?}), {} calls failed, {} ids differ from what was acknowledged",
            outages.len(),
            outages.iter().map(Duration::as_secs_f64).sum::<f64>(),
            failed.len(),
            lost.len()
        );
        assert!(outages.len() >= RESTARTS, "only {} restarts", outages.len());
        assert!(longest >= Duration::from_secs(10));
        assert!(failed.is_empty(), "calls failed: {failed:#?}");
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:#?}");
        drop(server);
    }

    /// Down for longer than the budget: the call fails with the endpoint, how long it tried and the
    /// setting, after about the budget; and nothing of it was written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_longer_than_the_budget_fails_clearly_and_writes_nothing() {
        let mut server = LocalServer::start("default", "");
        let settings = vec![
            ("schema".to_string(), "outage_long".to_string()),
            ("retry_budget_seconds".to_string(), "3".to_string()),
        ];
        let mut backend = runtime()
            .open(&server.uri(), settings)
            .await
            .expect("opens");
        let before = r#"{"singer_state":{"k":1}}"#;
        backend
            .update(&State::partial("long", before))
            .await
            .expect("update before the outage");

        server.kill();
        let started = Instant::now();
        let outcome = backend
            .update(&State::partial("long", r#"{"singer_state":{"down":2}}"#))
            .await;
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
        // No try starts past the budget and the longest pause is 2 s: it gives up between 1 s
        // and 3 s (plus the time the tries themselves take).
        assert!(
            tried >= Duration::from_secs(1) && tried < Duration::from_secs(8),
            "gave up after {tried:?} under a budget of 3 s"
        );

        server.resume();
        let state = backend
            .get("long")
            .await
            .expect("reads after the restart")
            .expect("the state is kept");
        assert_eq!(json(&state.partial), json(before), "nothing half-written");
        backend
            .update(&State::partial("long", r#"{"singer_state":{"up":3}}"#))
            .await
            .expect("works again once the server is back");
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
