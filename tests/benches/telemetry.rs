//! What traces and metrics cost (not a test, but CI runs its check and it fails): the same
//! component and host, one runtime exporting to an OTLP/HTTP receiver on loopback and one
//! without telemetry, on tables of the same shape, taking turns call by call (the order flips
//! every call). An operation fails when its median ratio of paired calls (exporting over not)
//! passes [`BOUND`] in every one of [`ROUNDS`] rounds (see `ab.rs` for why rounds).
//!
//!   just bench-telemetry         the report's section (release build, 300 pairs)
//!   just bench-telemetry-check   CI's check (dev build, 100 pairs; target/bench/telemetry.md)
//!
//! Without telemetry an instance holds no recorder: each call and each request checks one
//! `Option`, and nothing else of `telemetry` runs.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use integration_tests::otlp::Receiver;
use integration_tests::state_host::http::proxy::Proxies;
use integration_tests::state_host::telemetry::{Telemetry, TelemetryConfig};
use integration_tests::state_host::{Backend, InstanceOptions, Runtime, RuntimeOptions, State};
use integration_tests::turns::Turns;
use integration_tests::{TestTable, runtime_options};

/// The goal: exporting costs at most 5 % per call.
const BOUND: f64 = 1.05;

const ROUNDS: usize = 3;

/// The calls Meltano makes in a run: a read, the stream of updates, and a set.
const OPERATIONS: [&str; 3] = ["get", "update", "set"];

fn bookmark(i: usize) -> String {
    format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#)
}

async fn call(backend: &mut Backend, op: &str, i: usize) {
    match op {
        "get" => drop(backend.get("otel").await.expect("get")),
        "update" => backend
            .update(&State::partial("otel", bookmark(i)))
            .await
            .expect("update"),
        _ => backend
            .set(&State::completed("otel", bookmark(i)))
            .await
            .expect("set"),
    }
}

async fn instance(runtime: &Runtime, label: &str) -> (Backend, Arc<TestTable>) {
    let table = TestTable::new(label);
    let mut backend = runtime
        .open_with(
            &table.target.uri(),
            table.with(&[("lock_linger_seconds", "60")]),
            InstanceOptions::default(),
        )
        .await
        .expect("opens");
    for op in OPERATIONS {
        for i in 0..3 {
            call(&mut backend, op, i).await;
        }
    }
    (backend, table)
}

struct Measured {
    on_ms: f64,
    off_ms: f64,
    ratio: f64,
}

async fn round(on: &Runtime, off: &Runtime, pairs: usize, on_first: bool) -> Vec<Measured> {
    let ((mut a, _a), (mut b, _b)) = if on_first {
        let a = instance(on, "otel_on").await;
        (a, instance(off, "otel_off").await)
    } else {
        let b = instance(off, "otel_off").await;
        (instance(on, "otel_on").await, b)
    };
    let mut out = Vec::new();
    let mut n = 100;
    for op in OPERATIONS {
        let mut turns = Turns::default();
        for pair in 0..pairs {
            n += 1;
            for on_turn in Turns::order(pair) {
                let side = if on_turn { &mut a } else { &mut b };
                turns.time(on_turn, call(side, op, n)).await;
            }
        }
        let paired = turns.medians();
        out.push(Measured {
            on_ms: paired.first_ms,
            off_ms: paired.second_ms,
            ratio: paired.ratio,
        });
    }
    a.close().await.expect("closes");
    b.close().await.expect("closes");
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let check = std::env::var_os("BENCH_TELEMETRY_CHECK").is_some();
    let pairs = if check { 100 } else { 300 };
    let started = Instant::now();
    let receiver = Receiver::start().await;
    // http/protobuf, the protocol's default
    let config = TelemetryConfig {
        endpoint: Some(receiver.endpoint()),
        ..TelemetryConfig::default()
    };
    let telemetry = Telemetry::start(&config, Arc::new(Proxies::none())).expect("exporter");
    let component = integration_tests::state_host::default_component_path();
    let load = |telemetry| {
        Runtime::load(
            &component,
            RuntimeOptions {
                telemetry,
                ..runtime_options()
            },
        )
        .expect("load")
    };
    let (on, off) = (load(Some(Arc::clone(&telemetry))), load(None));

    let mut table = String::new();
    let mut best = [f64::INFINITY; OPERATIONS.len()];
    for r in 0..ROUNDS {
        let measured = round(&on, &off, pairs, r % 2 == 0).await;
        let _ = write!(
            table,
            "\nRound {}:\n\n| operation | exporting p50 ms | without p50 ms | ratio |\n\
             |---|---:|---:|---:|\n",
            r + 1
        );
        for ((op, m), best) in OPERATIONS.iter().zip(&measured).zip(&mut best) {
            let _ = writeln!(
                table,
                "| {op} | {:.2} | {:.2} | **{:.3}x** |",
                m.on_ms, m.off_ms, m.ratio
            );
            *best = best.min(m.ratio);
        }
        if best.iter().all(|&ratio| ratio <= BOUND) {
            break;
        }
    }
    let exported = tokio::task::spawn_blocking(move || {
        telemetry.shutdown();
    });
    exported.await.expect("shutdown");
    let exports = receiver.exports();
    let md = format!(
        "## 14. Traces and metrics\n\n`cargo bench {}-p integration-tests --bench telemetry` \
         (`just {}`) on {}, {:.0} s.\n\n\
         The same component and host: one runtime exporting traces and metrics (OTLP/HTTP, \
         http/protobuf) to a receiver on loopback, one without telemetry (no `OTEL_*` \
         variable), each on a table of its own, {pairs} pairs per operation taking turns call by \
         call; ratio: the median, pair by pair, of the exporting call's time over the other's. \
         Goal: at most {BOUND}x, in at least one of up to {ROUNDS} rounds. The receiver got {} \
         exports. Without telemetry no code of it runs (a `None` per call and per request).\n{table}",
        if check { "--profile dev " } else { "" },
        if check {
            "bench-telemetry-check"
        } else {
            "bench-telemetry"
        },
        integration_tests::machine_summary(),
        started.elapsed().as_secs_f64(),
        exports.len(),
    );
    println!("{md}");
    assert!(
        exports.iter().any(|e| e.path == "/v1/traces")
            && exports.iter().any(|e| e.path == "/v1/metrics"),
        "the exporting side exported nothing: the ratio would measure nothing"
    );
    let failed: Vec<String> = OPERATIONS
        .iter()
        .zip(best)
        .filter(|(_, ratio)| *ratio > BOUND)
        .map(|(op, ratio)| format!("{op}: at best {ratio:.3}x in {ROUNDS} rounds (bound {BOUND}x)"))
        .collect();
    if check {
        let out = root.join("target/bench");
        std::fs::create_dir_all(&out).expect("target/bench");
        std::fs::write(out.join("telemetry.md"), &md).expect("writes telemetry.md");
    } else {
        let path = root.join("tests/benches/results/report.md");
        integration_tests::report::write_section(&path, "telemetry", &md)
            .expect("writes section 14 of report.md");
    }
    if !failed.is_empty() {
        eprintln!("exporting costs more than the goal:\n{}", failed.join("\n"));
        std::process::exit(1);
    }
}
