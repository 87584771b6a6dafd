//! What one `update` costs through Meltano and the bridge, against the host library directly
//! (not a test): prints ratios measured in one run on the ClickHouse at $CLICKHOUSE_URL.
//!
//!   cargo bench -p integration-tests --bench meltano      (or `just bench-meltano`)
//!
//! Three paths, each a partial-state `update` of one id, run in alternating rounds so that
//! drift on a shared machine hits them alike:
//! - `library`: `Backend::update` in this process (the component's update; the library's
//!   default releases the lock after each update: four round trips);
//! - `bridge`: the same update as one JSON-lines call to `state-backend serve --stdio`, which
//!   keeps the lock between updates (one round trip);
//! - `meltano`: Meltano's `StateStoreManager.update` on the Python adapter: one bridge call.
//!
//! Then the **update stream** (`python/bench/update_stream.py`): Meltano runs of STATE messages
//! on one id each, through Meltano's API, on this adapter (default and settle mode) and on the
//! original backend's test copy; the first message and the steady state apart; then `set`, `get`
//! and `state-ids` against the original's. It writes section 8 of
//! `tests/benches/results/report.md` and `stream.svg`.
//!
//! Needs the project's .venv (Meltano and the adapter) and a built `state-backend` (release if
//! there is one). `BENCH_UPDATES` sets the updates per path per round (default 100),
//! `BENCH_MESSAGES` the STATE messages of a stream (default 1000).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use integration_tests::state_host::State;
use integration_tests::{TestTable, runtime};

// Shared with the report harness, whose methods this bench does not all use.
#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;
#[path = "report/plot.rs"]
mod plot;

const ROUNDS: usize = 3;

#[path = "report/host.rs"]
mod host;
use host::{host_binary, root};

async fn library(table: &TestTable, n: usize) -> Vec<f64> {
    let mut backend = runtime()
        .open(&table.target.uri(), table.settings())
        .await
        .expect("open");
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let partial = format!(r#"{{"singer_state":{{"bookmarks":{{"s":{i}}}}}}}"#);
        let started = Instant::now();
        backend
            .update(&State::partial("bench:library", partial))
            .await
            .expect("update");
        if i >= 10 {
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    backend.close().await.expect("close");
    times
}

/// The update stream and the other calls, against the original (see the module comment).
fn update_stream(table: &TestTable, messages: usize) -> serde_json::Value {
    let target = &table.target;
    // The other tables the Python side writes, dropped (with their lock tables) at the end.
    let tables = ["original", "ops", "original_ops"].map(TestTable::new);
    let kwargs = serde_json::json!({
        "uri": target.uri(),
        "schema": integration_tests::SCHEMA,
        "table": table.name,
        "tables": {
            "original": tables[0].name,
            "ops": tables[1].name,
            "original_ops": tables[2].name,
        },
        "allow_loopback": true,
        "clickhouse": {
            "secure": target.secure, "host": target.host, "port": target.port,
            "user": target.user, "password": target.password,
        },
    });
    let (slow, streams, ops) = (10, 3, 100);
    let args = [messages, slow, streams, ops].map(|n| n.to_string());
    run_python("update_stream.py", &args, &kwargs)
}

/// Runs `python/bench/<script>` with `args`, `kwargs` as one JSON line on its stdin; returns
/// the JSON object on the last line of its output.
fn run_python(script: &str, args: &[String], kwargs: &serde_json::Value) -> serde_json::Value {
    let mut child = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("python/bench").join(script))
        .args(args)
        .env("STATE_BACKEND_BIN", host_binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("runs .venv/bin/python (run tests/bootstrap.sh first)");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{kwargs}").expect("writes the settings");
    drop(stdin);
    let output = child.wait_with_output().expect("waits");
    assert!(output.status.success(), "{script} failed");
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().expect("an answer")).expect("JSON")
}

/// The list of milliseconds named `name` in a Python side's answer.
fn floats(value: &serde_json::Value, name: &str) -> Vec<f64> {
    value[name]
        .as_array()
        .unwrap_or_else(|| panic!("no {name}"))
        .iter()
        .filter_map(|v| v.as_f64())
        .collect()
}

fn samples(value: &serde_json::Value, name: &str) -> Samples {
    floats(value, name).into_iter().collect()
}

/// Runs the Python side; returns (meltano, bridge) latencies in ms.
fn python(table: &TestTable, n: usize) -> (Vec<f64>, Vec<f64>) {
    let kwargs = serde_json::json!({
        "uri": table.target.uri(),
        "schema": integration_tests::SCHEMA,
        "table": table.name,
        "allow_loopback": true,
    });
    let value = run_python("update_cost.py", &[n.to_string()], &kwargs);
    (floats(&value, "meltano"), floats(&value, "bridge"))
}

fn main() {
    let n: usize = std::env::var("BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let table = TestTable::new("bench_meltano");
    let tokio = tokio::runtime::Runtime::new().expect("tokio");
    let (mut lib, mut meltano, mut bridge) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..ROUNDS {
        lib.extend(tokio.block_on(library(&table, n)));
        let (m, b) = python(&table, n);
        meltano.extend(m);
        bridge.extend(b);
    }
    let [lib, meltano, bridge] = [lib, meltano, bridge].map(Samples::from_iter);
    let messages: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let stream_started = Instant::now();
    let stream = update_stream(&table, messages);
    let stream_seconds = stream_started.elapsed().as_secs_f64();
    let base = lib.p50();
    println!(
        "update cost, {} updates per path in {ROUNDS} alternating rounds ({:.0} s), host {}",
        n * ROUNDS,
        started.elapsed().as_secs_f64(),
        host_binary().display()
    );
    println!("| path | p50 ms | p99 ms | p50 / library |");
    println!("|---|---:|---:|---:|");
    for (name, times) in [
        (
            "library: Backend::update in-process, lock released each time",
            &lib,
        ),
        ("bridge: one serve --stdio call, lock kept", &bridge),
        (
            "meltano: StateStoreManager.update, one bridge call",
            &meltano,
        ),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2}x |",
            times.p50(),
            times.p99(),
            times.p50() / base
        );
    }
    let mut report = format!(
        "## 8. Meltano's API: the update stream and the other calls\n\n\
         `cargo bench -p integration-tests --bench meltano` on {}, host `{}`, {:.0} s. \
         Each stream is a Meltano run on one state id: a fresh manager, Meltano's read of the \
         state, then one `update` (Meltano's `StateStoreManager.update`) per STATE message. \
         Three streams per backend, alternating; {messages} messages per stream for ours, 10 \
         for settle mode and the original (each waits out a one-second settle). The original \
         is its test copy (`python/tests/original_backend.py`).\n\n\
         | stream | messages | first p50 ms | steady p50 ms | steady p99 ms | original p50 / this p50 (steady) |\n\
         |---|---:|---:|---:|---:|---:|\n",
        integration_tests::machine_summary(),
        host_binary()
            .strip_prefix(root())
            .unwrap_or(&host_binary())
            .display(),
        stream_seconds
    );
    let original_steady = samples(&stream, "original_steady").p50();
    for (name, label) in [
        ("ours", "ours (fenced, lock kept 5 s)"),
        ("settle", "ours, settle mode"),
        ("original", "the original"),
    ] {
        let first = samples(&stream, &format!("{name}_first"));
        let steady = samples(&stream, &format!("{name}_steady"));
        report += &format!(
            "| {label} | {} | {:.1} | {:.2} | {:.2} | {:.1}x |\n",
            steady.len() + first.len(),
            first.p50(),
            steady.p50(),
            steady.p99(),
            original_steady / steady.p50()
        );
    }
    report +=
        "\n| call | original p50 ms | ours p50 ms | ours / original |\n|---|---:|---:|---:|\n";
    for name in ["set", "get", "state_ids"] {
        let ours = samples(&stream, &format!("ours_{name}"));
        let original = samples(&stream, &format!("original_{name}"));
        report += &format!(
            "| {} through Meltano's API | {:.2} | {:.2} | {:.2}x |\n",
            name.replace('_', "-"),
            original.p50(),
            ours.p50(),
            ours.p50() / original.p50()
        );
    }
    println!("\n{report}");
    let results = root().join("tests/benches/results");
    integration_tests::report::write_section(&results.join("report.md"), "meltano", &report)
        .expect("writes section 8 of report.md");
    let parts: Vec<(String, Samples)> = ["ours", "settle", "original"]
        .iter()
        .flat_map(|name| ["first", "steady"].map(|part| format!("{name}_{part}")))
        .map(|key| {
            let s = samples(&stream, &key);
            (key, s)
        })
        .collect();
    let series: Vec<plot::Series<'_>> = parts
        .iter()
        .map(|(key, s)| plot::Series {
            group: key.split('_').next().unwrap_or(""),
            label: key.split('_').nth(1).unwrap_or(""),
            samples: s,
            baseline: key.starts_with("original"),
        })
        .collect();
    plot::latency(
        &results.join("stream.svg"),
        "update per STATE message through Meltano's API (ms, log scale)",
        &series,
    )
    .expect("plots");
}
