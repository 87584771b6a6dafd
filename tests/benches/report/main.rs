//! The benchmark report (not a test): what users pay for, measured in one run on the ClickHouse
//! at $CLICKHOUSE_URL (default: the local one), printed as ratios because this machine is
//! shared and absolute times drift.
//!
//!   just bench-report   full run; writes sections 1-7 of tests/benches/results/report.md
//!                       (`integration_tests::report`) and latency.svg
//!   just bench-quick    the same sections with small counts (CI runs it); writes target/bench/
//!
//! Sections: per-operation overhead (component vs the same SQL over the same HTTP stack without
//! it), scale (1k/10k/100k states), the lock (fenced vs settle, throughput), the component
//! (size, compile vs .cwasm, instantiation), connection reuse (keep-alive vs a connection
//! per request, over http and https), noisy neighbours (100 tenants in one process, one
//! spinning and one with a slow ClickHouse) and long streams (latency and parts over thousands
//! of updates).

mod native;
mod plot;
mod stats;
mod streams;
mod tenants;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::http::pool::PoolLimits;
use integration_tests::state_host::http::tls::TlsOptions;
use integration_tests::state_host::{
    Backend, InstanceOptions, Runtime, RuntimeOptions, State, default_component_path,
};
use integration_tests::tls::{Pki, TlsProxy};
use integration_tests::{TestTable, insert_target, runtime, runtime_options};
use native::NativeStore;
use stats::Samples;

/// Runs of each list at each size (the median is reported): a 100k-state list takes a fraction
/// of a second, and three were too few to tell a change from the machine's noise.
const SCALE_RUNS: usize = 9;

/// When each update of a throughput run ended (ms from the start) and which writer made it.
#[derive(Default)]
struct Timeline(Vec<(f64, usize)>);

impl Timeline {
    /// The times between consecutive updates: by the same writer, and across a hand-off of the
    /// lock to another writer.
    fn split(mut self) -> (Samples, Samples) {
        self.0.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut same, mut handoff) = (Samples::default(), Samples::default());
        for pair in self.0.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            if pair[0].1 == pair[1].1 {
                same.push(gap);
            } else {
                handoff.push(gap);
            }
        }
        (same, handoff)
    }
}

/// A median in ms, or a dash when there is nothing to take it of.
fn fmt_p50(samples: &Samples) -> String {
    if samples.len() == 0 {
        "–".into()
    } else {
        format!("{:.0} ms", samples.p50())
    }
}

/// How much to measure.
struct Mode {
    name: &'static str,
    per_op: usize,
    scale: &'static [usize],
    fenced: usize,
    settle: usize,
    writers: &'static [usize],
    /// Updates per throughput run, shared among its writers (so one writer's figure rests on
    /// as many updates as sixteen writers').
    updates_per_run: usize,
    instances: usize,
    gets: usize,
    tenants: tenants::Plan,
    streams: streams::Plan,
    out: PathBuf,
}

fn mode() -> Mode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if std::env::var_os("BENCH_QUICK").is_some() {
        Mode {
            name: "quick",
            per_op: 15,
            scale: &[1_000],
            fenced: 10,
            settle: 2,
            writers: &[1, 4],
            updates_per_run: 12,
            instances: 20,
            gets: 15,
            tenants: tenants::Plan {
                tenants: 100,
                rounds: 1,
                phase: Duration::from_secs(5),
                think: Duration::from_secs(3),
            },
            streams: streams::Plan {
                one_id: 200,
                ids: 10,
                per_id: 20,
                instances: 2,
                bucket: 50,
                watch: Duration::ZERO,
            },
            out: root.join("target").join("bench"),
        }
    } else {
        Mode {
            name: "full",
            per_op: 300,
            scale: &[1_000, 10_000, 100_000],
            fenced: 100,
            settle: 10,
            writers: &[1, 4, 16],
            updates_per_run: 160,
            instances: 300,
            gets: 200,
            tenants: tenants::Plan {
                tenants: 100,
                rounds: 12,
                phase: Duration::from_secs(5),
                think: Duration::from_secs(3),
            },
            streams: streams::Plan {
                one_id: 10_000,
                ids: 100,
                per_id: 1_000,
                instances: 4,
                bucket: 1_000,
                watch: Duration::from_secs(30),
            },
            out: root.join("tests").join("benches").join("results"),
        }
    }
}

fn bookmark(i: usize) -> String {
    format!(
        r#"{{"singer_state":{{"bookmarks":{{"stream_{:02}":{{"replication_key":"updated_at","replication_key_value":"2026-11-29T10:{:02}:{:02}Z"}}}}}}}}"#,
        i % 17,
        i / 60 % 60,
        i % 60
    )
}

fn guest_state(id: &str, partial: String, completed: String) -> clickhouse_state::store::State {
    clickhouse_state::store::State {
        state_id: id.into(),
        partial,
        completed,
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Counts the requests an instance sends (round trips per operation).
struct Counter(AtomicUsize);

impl Interceptor for Counter {
    fn before_send(&self, _: &http::Method, _: &http::Uri) -> Option<Duration> {
        self.0.fetch_add(1, Ordering::SeqCst);
        None
    }
}

/// What a set of instances asked of the server: every request, and the inserts by table.
#[derive(Default)]
struct Census {
    requests: AtomicUsize,
    inserts: Mutex<BTreeMap<String, usize>>,
}

impl Interceptor for Census {
    fn before_send(&self, _: &http::Method, uri: &http::Uri) -> Option<Duration> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(table) = insert_target(uri)
            && let Ok(mut inserts) = self.inserts.lock()
        {
            *inserts.entry(table).or_default() += 1;
        }
        None
    }
}

impl Census {
    fn inserts_into(&self, table: &str) -> usize {
        self.inserts
            .lock()
            .map(|i| i.get(table).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// One throughput run: its rate, when each update ended, and what the writers asked of the
/// server.
struct Run {
    rate: f64,
    timeline: Timeline,
    census: Arc<Census>,
    updates: usize,
    seconds: f64,
}

struct Bench {
    tokio: tokio::runtime::Runtime,
    mode: Mode,
    md: String,
}

impl Bench {
    fn open(&self, table: &TestTable, extra: &[(&str, &str)]) -> Backend {
        self.tokio
            .block_on(runtime().open(&table.target.uri(), table.with(extra)))
            .expect("opens the component")
    }

    fn native(&self, table: &TestTable) -> (NativeStore, std::rc::Rc<std::cell::Cell<u64>>) {
        native::open(
            &table.target.uri(),
            &table.settings(),
            self.tokio.handle().clone(),
            PoolLimits::default(),
            &TlsOptions::default(),
        )
    }

    /// 1. Each operation through the component and natively, interleaved.
    fn per_operation(&mut self) -> Vec<(&'static str, Samples, Samples)> {
        let table = TestTable::new("bench_ops");
        let mut backend = self.open(&table, &[]);
        let (native, _) = self.native(&table);
        let states: Vec<State> = (0..100)
            .map(|i| State::completed(format!("bench:{i:03}"), bookmark(i)))
            .collect();
        self.tokio
            .block_on(backend.set_all(&states))
            .expect("set-all");
        let mut results: Vec<(&'static str, Samples, Samples)> =
            ["get", "set", "update", "state-ids", "get-all"]
                .into_iter()
                .map(|op| (op, Samples::default(), Samples::default()))
                .collect();
        let warm_up = 5;
        for i in 0..self.mode.per_op + warm_up {
            for (op, component, raw) in results.iter_mut() {
                // Alternate which path goes first, so neither always follows the other.
                for first in [i % 2 == 0, i % 2 != 0] {
                    if first {
                        component.time(|| self.tokio.block_on(component_op(&mut backend, op, i)));
                    } else {
                        raw.time(|| native_op(&native, op, i));
                    }
                }
            }
        }
        for (_, component, raw) in results.iter_mut() {
            component.discard_first(warm_up);
            raw.discard_first(warm_up);
        }
        let _ = writeln!(
            self.md,
            "\n## 1. Per-operation overhead\n\n{} calls of each, interleaved, on a table of about 100 \
             states. *Raw*: the same statements, built by the guest's code compiled natively, \
             sent by the host's HTTP sender (same keep-alive pool) from the host process. Goal: \
             component / raw <= 1.2.\n\n| operation | component p50 ms | raw p50 ms | ratio p50 | \
             component p99 ms | raw p99 ms | ratio p99 |\n|---|---:|---:|---:|---:|---:|---:|",
            self.mode.per_op
        );
        for (op, component, raw) in &results {
            let _ = writeln!(
                self.md,
                "| {op} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} | {:.2} |",
                component.p50(),
                raw.p50(),
                component.p50() / raw.p50(),
                component.p99(),
                raw.p99(),
                component.p99() / raw.p99()
            );
        }
        results
    }

    /// 2. state-ids and get-all over 1k, 10k, 100k states; set-all of all of them in one call.
    fn scale(&mut self) {
        let _ = writeln!(
            self.md,
            "\n## 2. Scale\n\nEach size in a table of its own; each measurement in a fresh \
             instance, so *memory* is that instance's peak linear memory. *Bytes*: the HTTP \
             response body. Times are medians of {SCALE_RUNS}, the component and the raw query \
             alternating.\n\n| states | set-all, one call | \
             state-ids: component / raw | memory | bytes | get-all: component / raw | memory \
             | bytes |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let mut previous: Option<(usize, f64, f64)> = None;
        let mut growth = Vec::new();
        for &n in self.mode.scale {
            let table = TestTable::new(&format!("bench_scale_{n}"));
            let states: Vec<State> = (0..n)
                .map(|i| State::completed(format!("dev:tap-{i:06}-to-target"), bookmark(i)))
                .collect();
            let mut writer = self.open(&table, &[]);
            let started = Instant::now();
            let written = self
                .tokio
                .block_on(writer.set_all(&states))
                .expect("set-all");
            let set_all_ms = started.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(written, n as u64);
            let set_all_memory = writer.peak_memory_bytes();
            let (native, bytes_in) = self.native(&table);
            let measure = |get_all: bool| {
                let mut backend = self.open(&table, &[]);
                let (mut component, mut raw) = (Samples::default(), Samples::default());
                let before = bytes_in.get();
                for _ in 0..SCALE_RUNS {
                    let count = component.time(|| {
                        self.tokio.block_on(async {
                            if get_all {
                                backend.get_all(None).await.map(|v| v.len())
                            } else {
                                backend.state_ids(None).await.map(|v| v.len())
                            }
                        })
                    });
                    assert_eq!(count.expect("lists"), n);
                    let count = raw.time(|| {
                        if get_all {
                            native.get_all(None).map(|v| v.len())
                        } else {
                            native.state_ids(None).map(|v| v.len())
                        }
                    });
                    assert_eq!(count.expect("lists natively"), n);
                }
                let bytes = (bytes_in.get() - before) / SCALE_RUNS as u64;
                (component, raw, backend.peak_memory_bytes(), bytes)
            };
            let (ids_c, ids_r, ids_mem, ids_bytes) = measure(false);
            let (all_c, all_r, all_mem, all_bytes) = measure(true);
            let _ = writeln!(
                self.md,
                "| {n} | {:.0} ms ({:.1} MiB) | {:.1} / {:.1} ms | {:.1} MiB | {:.2} MB | {:.1} / {:.1} ms | {:.1} MiB | {:.2} MB |",
                set_all_ms,
                mib(set_all_memory),
                ids_c.p50(),
                ids_r.p50(),
                mib(ids_mem),
                ids_bytes as f64 / 1e6,
                all_c.p50(),
                all_r.p50(),
                mib(all_mem),
                all_bytes as f64 / 1e6
            );
            if let Some((m, ids, all)) = previous {
                growth.push(format!(
                    "{m} -> {n} states ({}x): state-ids {:.1}x, get-all {:.1}x",
                    n / m,
                    ids_c.p50() / ids,
                    all_c.p50() / all
                ));
            }
            previous = Some((n, ids_c.p50(), all_c.p50()));
        }
        if !growth.is_empty() {
            let _ = writeln!(
                self.md,
                "\nGrowth of the component's time (linear is the size factor): {}.",
                growth.join("; ")
            );
        }
    }

    /// 3. Uncontended update, fenced vs settle; throughput with several writers.
    fn lock(&mut self) -> (Samples, Samples) {
        let table = TestTable::new("bench_lock");
        let timed = |mode: &str, linger: &str, n: usize| {
            let counter = Arc::new(Counter(AtomicUsize::new(0)));
            let options = InstanceOptions {
                label: format!("bench-{mode}"),
                interceptor: Some(counter.clone()),
                ..InstanceOptions::default()
            };
            let mut backend = self
                .tokio
                .block_on(runtime().open_with(
                    &table.target.uri(),
                    table.with(&[("lock_mode", mode), ("lock_linger_seconds", linger)]),
                    options,
                ))
                .expect("opens");
            let id = format!("bench:{mode}:{linger}");
            self.tokio
                .block_on(backend.update(&State::partial(&id, bookmark(0))))
                .expect("warm-up");
            counter.0.store(0, Ordering::SeqCst);
            let mut samples = Samples::default();
            for i in 0..n {
                samples
                    .time(|| {
                        self.tokio
                            .block_on(backend.update(&State::partial(&id, bookmark(i))))
                    })
                    .expect("update");
            }
            let trips = counter.0.load(Ordering::SeqCst) as f64 / n as f64;
            self.tokio.block_on(backend.close()).expect("closes");
            (samples, trips)
        };
        let (fenced, fenced_trips) = timed("fenced", "0", self.mode.fenced);
        let (kept, kept_trips) = timed("fenced", "5", self.mode.fenced);
        let (settle, settle_trips) = timed("settle", "0", self.mode.settle);
        let _ = writeln!(
            self.md,
            "\n## 3. The lock\n\nUncontended `update` of one id, one instance, after a first \
             update (steady state).\n\n\
             | lock mode | updates | p50 ms | p99 ms | round trips |\n|---|---:|---:|---:|---:|\n\
             | fenced, lock kept between updates (`lock_linger_seconds=5`; `serve`'s default) | {} | {:.1} | {:.1} | {:.1} |\n\
             | fenced, released after each (the library's default) | {} | {:.1} | {:.1} | {:.1} |\n\
             | settle (1.0 s) | {} | {:.1} | {:.1} | {:.1} |\n\n\
             settle / fenced kept at p50: **{:.0}x**.\n\nThroughput: the lock released after each update, \
             `lock_retry_seconds=0.05`. On one id, the time from one update's end to the next \
             one's, when the same writer goes on and when the lock changes hands (medians).\n\n\
             | writers | updates/s, one id | between updates: same writer / hand-off | updates/s, an id each |\n|---:|---:|---:|---:|",
            kept.len(),
            kept.p50(),
            kept.p99(),
            kept_trips,
            fenced.len(),
            fenced.p50(),
            fenced.p99(),
            fenced_trips,
            settle.len(),
            settle.p50(),
            settle.p99(),
            settle_trips,
            settle.p50() / kept.p50()
        );
        let mut profile = Vec::new();
        for &writers in self.mode.writers {
            let shared = self.throughput(&table, writers, true);
            let distinct = self.throughput(&table, writers, false);
            let line = self.asked(&table, writers, &shared);
            let (same, handoff) = shared.timeline.split();
            let _ = writeln!(
                self.md,
                "| {writers} | {:.1} | {} / {} | {:.1} |",
                shared.rate,
                fmt_p50(&same),
                fmt_p50(&handoff),
                distinct.rate
            );
            profile.push((writers, line));
        }
        let _ = writeln!(
            self.md,
            "\nWhat the writers of one id asked of the server, per update (the same runs): \
             requests, the inserts among them by table, and the lock log's rows by event (a \
             claim that lost is an `acquire` row too). The rate is the server's requests per \
             second from these writers.\n\n\
             | on one id | requests | reads | inserts: state / lock log | log rows: acquire / want / release | requests/s |\n\
             |---:|---:|---:|---:|---:|---:|"
        );
        for (writers, line) in profile {
            let noun = if writers == 1 { "writer" } else { "writers" };
            let _ = writeln!(self.md, "| {writers} {noun} | {line} |");
        }
        (kept, settle)
    }

    /// The profile line of a one-id throughput run (see `lock`).
    fn asked(&self, table: &TestTable, writers: usize, run: &Run) -> String {
        let n = run.updates as f64;
        let requests = run.census.requests.load(Ordering::SeqCst) as f64;
        // A state write goes into the history when it is on (its view fills the state table).
        let state = (run.census.inserts_into(&table.name)
            + run.census.inserts_into(&format!("{}_history", table.name)))
            as f64;
        let log_table = format!("{}_lock_log", table.name);
        let log = run.census.inserts_into(&log_table) as f64;
        let rows = table.target.must(&format!(
            "SELECT event, count() FROM {}_lock_log WHERE state_id = 'bench:shared:{writers}' \
             GROUP BY event FORMAT TSV",
            table.qualified()
        ));
        let events: BTreeMap<&str, f64> = rows
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter_map(|(e, c)| Some((e, c.trim().parse::<f64>().ok()?)))
            .collect();
        let per = |event: &str| events.get(event).copied().unwrap_or(0.0) / n;
        format!(
            "{:.1} | {:.1} | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.0}",
            requests / n,
            (requests - state - log) / n,
            state / n,
            log / n,
            per("acquire"),
            per("want"),
            per("release"),
            requests / run.seconds
        )
    }

    /// Updates per second of `writers` writers (one id, or one each), when each update ended and
    /// by whom, and what they asked of the server.
    fn throughput(&self, table: &Arc<TestTable>, writers: usize, one_id: bool) -> Run {
        let per_writer = self.mode.updates_per_run / writers;
        let census = Arc::new(Census::default());
        self.tokio.block_on(async {
            let mut backends = Vec::new();
            for _ in 0..writers {
                let options = InstanceOptions {
                    label: format!("bench-throughput-{writers}"),
                    interceptor: Some(census.clone()),
                    ..InstanceOptions::default()
                };
                backends.push(
                    runtime()
                        .open_with(
                            &table.target.uri(),
                            table.with(&[
                                ("lock_retry_seconds", "0.05"),
                                ("lock_timeout_seconds", "600"),
                            ]),
                            options,
                        )
                        .await
                        .expect("opens"),
                );
            }
            // Opening counts no request of the runs.
            census.requests.store(0, Ordering::SeqCst);
            if let Ok(mut inserts) = census.inserts.lock() {
                inserts.clear();
            }
            let started = Instant::now();
            let tasks: Vec<_> = backends
                .into_iter()
                .enumerate()
                .map(|(w, mut backend)| {
                    let id = if one_id {
                        format!("bench:shared:{writers}")
                    } else {
                        format!("bench:own:{writers}:{w}")
                    };
                    tokio::spawn(async move {
                        let mut ends = Vec::with_capacity(per_writer);
                        for i in 0..per_writer {
                            backend
                                .update(&State::partial(&id, bookmark(w * 1000 + i)))
                                .await
                                .expect("update");
                            ends.push((started.elapsed().as_secs_f64() * 1000.0, w));
                        }
                        ends
                    })
                })
                .collect();
            let mut timeline = Timeline::default();
            for task in tasks {
                timeline.0.extend(task.await.expect("writer"));
            }
            let seconds = started.elapsed().as_secs_f64();
            let updates = writers * per_writer;
            Run {
                rate: updates as f64 / seconds,
                timeline,
                census: census.clone(),
                updates,
                seconds,
            }
        })
    }

    /// 4. The component: size, compile vs precompiled load, instantiation.
    fn component(&mut self) {
        let path = default_component_path();
        let wasm = std::fs::read(&path).expect("the built component (just guest)");
        let started = Instant::now();
        let compiled = Runtime::from_bytes(&wasm, runtime_options()).expect("compiles");
        let compile = started.elapsed();
        drop(compiled);
        let native = Runtime::precompile(&wasm).expect("precompiles");
        let started = Instant::now();
        let loaded = Runtime::from_bytes(&native, runtime_options()).expect("loads");
        let load = started.elapsed();
        let mut instantiate = Samples::default();
        for _ in 0..self.mode.instances {
            let backend = instantiate.time(|| {
                self.tokio
                    .block_on(loaded.open("clickhouse://default:@127.0.0.1:8123/default", vec![]))
                    .expect("opens")
            });
            self.tokio.block_on(backend.close()).expect("closes");
        }
        let _ = writeln!(
            self.md,
            "\n## 4. The component\n\n| measure | value | goal |\n|---|---:|---:|\n\
             | `clickhouse_state.wasm` (release) | {:.0} KB | <= 450 KB |\n\
             | compile `.wasm` vs load `.cwasm` ({:.0} KB) | {:.0} ms vs {:.1} ms ({:.0}x) | |\n\
             | instantiate + open, p50 / p99 ({} instances) | {:.0} / {:.0} µs | |",
            wasm.len() as f64 / 1000.0,
            native.len() as f64 / 1000.0,
            compile.as_secs_f64() * 1000.0,
            load.as_secs_f64() * 1000.0,
            compile.as_secs_f64() / load.as_secs_f64(),
            self.mode.instances,
            instantiate.p50() * 1000.0,
            instantiate.p99() * 1000.0
        );
    }

    /// 5. `get` with keep-alive vs a new connection per request, over http and https.
    /// 6. Noisy neighbours among 100 tenants in one process.
    fn tenants(&mut self) {
        let plan = &self.mode.tenants;
        let outcome = tenants::run(&self.tokio, plan);
        let share = runtime_options()
            .cpu_share
            .expect("tenants have a CPU share by default");
        let _ = writeln!(
            self.md,
            "\n## 6. Noisy neighbours\n\n{} tenants in one process, an instance each. {} do \
             ordinary work: `update`, then `get`, of their own state, with a pause of 0–{:.0} s \
             between calls. In the noisy phases one more tenant's guest spins (stopped by its \
             CPU budget of {:?}, then opened again) and another's ClickHouse answers {:?} late \
             (the fault hook). The spinner runs under the default CPU share of a tenant ({:.0} % \
             of a core once a call has run {:?}), and, in a third kind of phase, with no share. \
             Phases of {:.0} s, {} of each kind, in turn. The machine's 2 cores also run the \
             local ClickHouse, which now and then stalls every tenant's inserts for 0.3–2 s at \
             once, in any kind of phase (a phase with {} calls over {:.0} ms counts as stalled): \
             one stall decides a p99 pooled over all calls, so the goal is judged on the p99 \
             of each phase, the median over the phases of a kind.\n\n\
             | the {} ordinary tenants | calls | p50 ms | p99 ms, all calls | p99 ms, per phase (median) | phases stalled | spinner stopped | slow tenant's calls, p50 |\n|---|---:|---:|---:|---:|---:|---:|---:|",
            plan.tenants,
            plan.tenants - 2,
            2.0 * plan.think.as_secs_f64(),
            tenants::SPIN_BUDGET,
            tenants::LATE_BY,
            share.share * 100.0,
            share.after,
            plan.phase.as_secs_f64(),
            plan.rounds,
            tenants::STALL_CALLS,
            tenants::STALL_MS,
            plan.tenants - 2,
        );
        for (label, seen) in [
            ("quiet", &outcome.quiet),
            ("beside a spinning and a slow tenant", &outcome.noisy),
            (
                "the same, the spinner without a CPU share",
                &outcome.unshared,
            ),
        ] {
            let _ = writeln!(
                self.md,
                "| {label} | {} | {:.1} | {:.1} | {:.1} | {} of {} | {} | {} |",
                seen.calls.len(),
                seen.calls.p50(),
                seen.calls.p99(),
                seen.phase_p99.p50(),
                seen.stalled_phases,
                seen.phase_p99.len(),
                seen.spinner_stops,
                fmt_p50(&seen.slow)
            );
        }
        let (quiet, noisy, unshared) = (&outcome.quiet, &outcome.noisy, &outcome.unshared);
        let _ = writeln!(
            self.md,
            "\nnoisy / quiet: p50 **{:.2}x**, p99 per phase **{:.2}x** (goal: within 1.5x), p99 \
             of all calls {:.2}x; without the share: p50 {:.2}x, p99 per phase {:.2}x.",
            noisy.calls.p50() / quiet.calls.p50(),
            noisy.phase_p99.p50() / quiet.phase_p99.p50(),
            noisy.calls.p99() / quiet.calls.p99(),
            unshared.calls.p50() / quiet.calls.p50(),
            unshared.phase_p99.p50() / quiet.phase_p99.p50()
        );
    }

    fn keep_alive(&mut self) {
        let table = TestTable::new("bench_keepalive");
        let pki = Pki::new("bench");
        let server = pki.server("server", &["localhost"], false);
        let proxy = self.tokio.block_on(TlsProxy::start(
            pki.server_config(&server, false),
            table.target.clone(),
        ));
        let target = &table.target;
        let plain = target.uri();
        let secure = target.secure_uri("localhost", proxy.port());
        let trusting = TlsOptions {
            ca_bundle: Some(pki.ca_path()),
            ..TlsOptions::default()
        };
        let _ = writeln!(
            self.md,
            "\n## 5. Connection reuse\n\n`get` of one state, {} calls each. https goes through a \
             local TLS endpoint (test CA) in front of the same ClickHouse.\n\n| transport | \
             keep-alive p50 / p99 ms | new connection p50 / p99 ms | new / keep-alive at p50 \
             |\n|---|---:|---:|---:|",
            self.mode.gets
        );
        let scheme = if target.secure { "https" } else { "http" };
        for (name, uri, tls) in [
            (scheme, plain.as_str(), TlsOptions::default()),
            ("https (local TLS)", secure.as_str(), trusting),
        ] {
            let mut results = Vec::new();
            for keep_alive in [PoolLimits::default(), PoolLimits::off()] {
                let runtime = Runtime::load(
                    &default_component_path(),
                    RuntimeOptions {
                        tls: tls.clone(),
                        keep_alive,
                        ..runtime_options()
                    },
                )
                .expect("loads");
                let mut backend = self
                    .tokio
                    .block_on(runtime.open(uri, table.settings()))
                    .expect("opens");
                self.tokio
                    .block_on(backend.set(&State::completed("k", bookmark(1))))
                    .expect("set");
                let mut samples = Samples::default();
                for _ in 0..self.mode.gets {
                    samples
                        .time(|| self.tokio.block_on(backend.get("k")))
                        .expect("get");
                }
                results.push(samples);
            }
            let _ = writeln!(
                self.md,
                "| {name} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2}x |",
                results[0].p50(),
                results[0].p99(),
                results[1].p50(),
                results[1].p99(),
                results[1].p50() / results[0].p50()
            );
        }
        drop(proxy);
    }
}

async fn component_op(backend: &mut Backend, op: &str, i: usize) {
    match op {
        "get" => drop(backend.get("bench:042").await.expect("get")),
        "set" => backend
            .set(&State::completed("bench:set:component", bookmark(i)))
            .await
            .expect("set"),
        "update" => backend
            .update(&State::partial("bench:update:component", bookmark(i)))
            .await
            .expect("update"),
        "state-ids" => drop(backend.state_ids(None).await.expect("state-ids")),
        _ => drop(backend.get_all(None).await.expect("get-all")),
    }
}

fn native_op(native: &NativeStore, op: &str, i: usize) {
    match op {
        "get" => drop(native.get("bench:042").expect("get")),
        "set" => native
            .set(&guest_state("bench:set:raw", "{}".into(), bookmark(i)))
            .expect("set"),
        "update" => native
            .update(&guest_state("bench:update:raw", bookmark(i), "{}".into()))
            .expect("update"),
        "state-ids" => drop(native.state_ids(None).expect("state-ids")),
        _ => drop(native.get_all(None).expect("get-all")),
    }
}

fn main() {
    let mode = mode();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let started = Instant::now();
    let mut bench = Bench {
        tokio,
        md: format!(
            "Sections 1–7: `cargo bench -p integration-tests --bench report` (`just \
             bench-report`), {} mode, {}, on {}; ClickHouse: the local chDB 26.9 server unless \
             $CLICKHOUSE_URL said otherwise.\n",
            mode.name,
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
            integration_tests::machine_summary()
        ),
        mode,
    };
    // BENCH_ONLY=scale (for example) runs one section, to profile it; nothing is written then.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        match only.as_str() {
            "per-op" => drop(bench.per_operation()),
            "scale" => bench.scale(),
            "lock" => drop(bench.lock()),
            "component" => bench.component(),
            "keep-alive" => bench.keep_alive(),
            "tenants" => bench.tenants(),
            "streams" => streams::section(&bench.tokio, &bench.mode.streams, &mut bench.md),
            other => panic!(
                "BENCH_ONLY={other}: one of per-op, scale, lock, component, keep-alive, tenants, \
                 streams"
            ),
        }
        println!("{}", bench.md);
        return;
    }
    let per_op = bench.per_operation();
    bench.scale();
    let (fenced, settle) = bench.lock();
    bench.component();
    bench.keep_alive();
    bench.tenants();
    streams::section(&bench.tokio, &bench.mode.streams, &mut bench.md);
    let _ = writeln!(
        bench.md,
        "\nThe plot, `latency.svg`: latency distributions per operation (component vs raw) and \
         of `update` with the default vs the settle lock. Whole run: {:.0} s.",
        started.elapsed().as_secs_f64()
    );

    std::fs::create_dir_all(&bench.mode.out).expect("output directory");
    let report = bench.mode.out.join("report.md");
    integration_tests::report::write_section(&report, "report", &bench.md)
        .expect("writes the report");
    let mut series = Vec::new();
    for (op, component, raw) in &per_op {
        series.push(plot::Series {
            group: op,
            label: "component",
            samples: component,
            baseline: false,
        });
        series.push(plot::Series {
            group: op,
            label: "raw HTTP",
            samples: raw,
            baseline: true,
        });
    }
    series.push(plot::Series {
        group: "update",
        label: "fenced, kept",
        samples: &fenced,
        baseline: true,
    });
    series.push(plot::Series {
        group: "update",
        label: "settle lock",
        samples: &settle,
        baseline: false,
    });
    let svg = bench.mode.out.join("latency.svg");
    plot::latency(
        &svg,
        "Latency per operation: component vs raw HTTP; default (fenced) vs settle lock",
        &series,
    )
    .expect("draws the plot");
    println!("{}", bench.md);
    println!("wrote {} and {}", report.display(), svg.display());
}
