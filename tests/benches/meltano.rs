//! What one `update` costs through Meltano and the bridge, against the host library directly
//! (not a test): prints ratios measured in one run on the ClickHouse at $CLICKHOUSE_URL.
//!
//!   cargo bench -p integration-tests --bench meltano      (or `just bench-meltano`)
//!
//! Three paths, each a partial-state `update` of one id, run in alternating rounds so that
//! drift on a shared machine hits them alike:
//! - `library`: `Backend::update` in this process (the component's update, lock included);
//! - `bridge`: the same update as one JSON-lines call to `state-backend serve --stdio`;
//! - `meltano`: Meltano's own `StateStoreManager.update` on the Python adapter, which takes the
//!   lock, reads, writes under the lock's token and releases: four bridge calls.
//!
//! Needs the project's .venv (Meltano and the adapter) and a built `state-backend` (release if
//! there is one). `BENCH_UPDATES` sets the updates per path per round (default 100).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use integration_tests::state_host::State;
use integration_tests::{TestTable, runtime};

// Shared with the report harness, whose methods this bench does not all use.
#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

const ROUNDS: usize = 3;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn host_binary() -> PathBuf {
    ["release", "debug"]
        .iter()
        .map(|profile| root().join("target").join(profile).join("state-backend"))
        .find(|path| path.exists())
        .expect("no state-backend built: run `cargo build --release -p meltano-state-host`")
}

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

/// Runs the Python side; returns (meltano, bridge) latencies in ms.
fn python(table: &TestTable, n: usize) -> (Vec<f64>, Vec<f64>) {
    let kwargs = serde_json::json!({
        "uri": table.target.uri(),
        "schema": integration_tests::SCHEMA,
        "table": table.name,
        "allow_loopback": true,
    });
    let mut child = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("python/bench/update_cost.py"))
        .arg(n.to_string())
        .env("STATE_BACKEND_BIN", host_binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("runs .venv/bin/python (run tests/bootstrap.sh first)");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{kwargs}").expect("writes the settings");
    drop(stdin);
    let output = child.wait_with_output().expect("waits");
    assert!(output.status.success(), "the Python side failed");
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text.lines().last().expect("an answer");
    let value: serde_json::Value = serde_json::from_str(last).expect("JSON");
    let list = |name: &str| -> Vec<f64> {
        value[name]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|v| v.as_f64())
            .collect()
    };
    (list("meltano"), list("bridge"))
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
        ("library: Backend::update in-process", &lib),
        ("bridge: one serve --stdio call", &bridge),
        ("meltano: StateStoreManager.update (4 calls)", &meltano),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2}x |",
            times.p50(),
            times.p99(),
            times.p50() / base
        );
    }
}
