//! Lock benchmark (not a test): prints ratios measured in one run on the ClickHouse at
//! $CLICKHOUSE_URL (default: the local one).
//!
//!   cargo bench -p integration-tests --bench lock        (or `just bench-lock`)
//!
//! - uncontended `update` latency, fenced (default) vs settle mode (1.0 s settle), and the ratio;
//! - HTTP round trips per uncontended `update`;
//! - `update` throughput with 1, 4 and 16 writers on one state id.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use integration_tests::state_host::egress::Interceptor;
use integration_tests::state_host::{InstanceOptions, State};
use integration_tests::{TestTable, runtime};

struct Counter(AtomicUsize);

impl Interceptor for Counter {
    fn before_send(&self, _: &http::Method, _: &http::Uri) -> Option<Duration> {
        self.0.fetch_add(1, Ordering::SeqCst);
        None
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn uncontended(table: &TestTable, mode: &str, n: usize) -> (Vec<Duration>, f64) {
    let counter = Arc::new(Counter(AtomicUsize::new(0)));
    let options = InstanceOptions {
        label: format!("bench-{mode}"),
        interceptor: Some(counter.clone()),
        ..InstanceOptions::default()
    };
    let mut b = runtime()
        .open_with(
            &table.target.uri(),
            table.with(&[("lock_mode", mode)]),
            options,
        )
        .await
        .expect("open");
    b.update(&State::partial("warm", r#"{"w":0}"#))
        .await
        .expect("warm-up");
    counter.0.store(0, Ordering::SeqCst);
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let partial = format!(r#"{{"singer_state":{{"bookmarks":{{"s":{i}}}}}}}"#);
        let started = Instant::now();
        b.update(&State::partial("bench", partial))
            .await
            .expect("update");
        times.push(started.elapsed());
    }
    times.sort();
    let trips = counter.0.load(Ordering::SeqCst) as f64 / n as f64;
    (times, trips)
}

async fn throughput(table: Arc<TestTable>, writers: usize, per_writer: usize) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let table = table.clone();
        tasks.push(tokio::spawn(async move {
            let mut b = runtime()
                .open(
                    &table.target.uri(),
                    table.with(&[
                        ("lock_retry_seconds", "0.05"),
                        ("lock_timeout_seconds", "600"),
                    ]),
                )
                .await
                .expect("open");
            for i in 0..per_writer {
                let partial = format!(r#"{{"k{w}-{i}":{i}}}"#);
                b.update(&State::partial("hot", partial))
                    .await
                    .expect("update");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    (writers * per_writer) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let table = TestTable::new("bench_lock");
    let (fenced, fenced_trips) = uncontended(&table, "fenced", if quick { 10 } else { 100 }).await;
    let (settle, settle_trips) = uncontended(&table, "settle", if quick { 2 } else { 5 }).await;
    // One raw round trip of a trivial query, from the same process: the floor of any operation.
    let mut raw: Vec<Duration> = (0..20)
        .map(|_| {
            let started = Instant::now();
            table.target.must("SELECT 1");
            started.elapsed()
        })
        .collect();
    raw.sort();
    let fenced_p50 = percentile(&fenced, 0.5);
    let settle_p50 = percentile(&settle, 0.5);
    let mut report = String::new();
    report.push_str("| uncontended `update` | p50 | p99 | HTTP round trips |\n|---|---|---|---|\n");
    report.push_str(&format!(
        "| fenced (default) | {:.1} ms | {:.1} ms | {:.1} |\n",
        ms(fenced_p50),
        ms(percentile(&fenced, 0.99)),
        fenced_trips
    ));
    report.push_str(&format!(
        "| settle (1.0 s) | {:.1} ms | {:.1} ms | {:.1} |\n",
        ms(settle_p50),
        ms(percentile(&settle, 0.99)),
        settle_trips
    ));
    report.push_str(&format!(
        "| one raw HTTP round trip (`SELECT 1`) | {:.1} ms | {:.1} ms | 1 |\n",
        ms(percentile(&raw, 0.5)),
        ms(percentile(&raw, 0.99))
    ));
    report.push_str(&format!(
        "\nsettle / fenced p50 ratio: **{:.0}x** (goal: at least 100x)\n\n",
        settle_p50.as_secs_f64() / fenced_p50.as_secs_f64()
    ));
    report.push_str("| writers on one id | updates/s |\n|---|---|\n");
    for writers in [1, 4, 16] {
        let per_writer = if quick { 3 } else { 200 / writers.max(1) };
        let table = TestTable::new(&format!("bench_hot{writers}"));
        let rate = throughput(table, writers, per_writer).await;
        report.push_str(&format!("| {writers} | {rate:.0} |\n"));
    }
    println!("{report}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("lock.md"), &report);
    }
}
