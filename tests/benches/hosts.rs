//! The same component in two hosts, side by side (not a test): each operation through the Rust
//! host and through the Node host (`hosts/node`, jco), in one run, batches taking turns. Prints
//! the ratios and writes section 12 of `tests/benches/results/report.md`.
//!
//!   cargo bench -p integration-tests --bench hosts      (or `just bench-hosts`, which builds
//!   the Node host first)
//!
//! `BENCH_ROUNDS` batches per host (default 5) of `BENCH_COUNT` calls per operation (default 40).
//! Both hosts keep the lock between updates (`lock_linger_seconds` 5), as Meltano's runs do.

use std::collections::BTreeMap;
use std::time::Instant;

use integration_tests::state_host::{Backend, State};
use integration_tests::{SCHEMA, TestTable};

#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

#[allow(dead_code)]
#[path = "report/host.rs"]
mod host;
use host::root;

const OPERATIONS: [&str; 4] = ["get", "set", "update", "state_ids"];
/// Parts of the Node path that `bench.js` times alone: one synchronous call to the shim's IO
/// worker, one message to a store's Worker and back.
const PARTS: [&str; 2] = ["shim_call", "worker_message"];

fn state(i: usize) -> State {
    State::completed(
        "bench",
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#),
    )
}

fn partial(i: usize) -> State {
    State::partial(
        "bench",
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#),
    )
}

async fn rust_batch(b: &mut Backend, count: usize, samples: &mut BTreeMap<&str, Samples>) {
    for op in OPERATIONS {
        for i in 1..=count {
            let started = Instant::now();
            match op {
                "get" => drop(b.get("bench").await.expect("get")),
                "set" => b.set(&state(i)).await.expect("set"),
                "update" => b.update(&partial(i)).await.expect("update"),
                _ => drop(b.state_ids(None).await.expect("state_ids")),
            }
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            samples.entry(op).or_default().push(ms);
        }
    }
}

/// Runs a script of hosts/node on `table`, with `more` arguments; what it prints last, as JSON.
fn node_json<T: serde::de::DeserializeOwned>(script: &str, table: &TestTable, more: &[&str]) -> T {
    let output = std::process::Command::new("node")
        .current_dir(root().join("hosts/node"))
        .args([script, &table.target.uri(), SCHEMA, &table.name])
        .args(more)
        .output()
        .expect("node runs (`just bench-hosts` builds the Node host)");
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("JSON from {script}: {e}"))
}

fn node_batch(table: &TestTable, count: usize, samples: &mut BTreeMap<&str, Samples>) {
    let batch: BTreeMap<String, Vec<f64>> = node_json("bench.js", table, &[&count.to_string()]);
    for op in OPERATIONS.into_iter().chain(PARTS) {
        let s = samples.entry(op).or_default();
        for ms in batch.get(op).expect("each operation") {
            s.push(*ms);
        }
    }
}

/// The calls to the shim's IO worker each operation makes (`calls.js` counts them).
fn shim_calls(table: &TestTable) -> BTreeMap<String, u32> {
    node_json("calls.js", table, &[])
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rounds = env_or("BENCH_ROUNDS", 5);
    let count = env_or("BENCH_COUNT", 40);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let started = Instant::now();
    let md = tokio.block_on(async {
        let ours_table = TestTable::new("bench_hosts_rust");
        let node_table = TestTable::new("bench_hosts_node");
        let mut ours = ours_table.open_with(&[("lock_linger_seconds", "5")]).await;
        ours.set(&state(0)).await.expect("warm");
        ours.update(&partial(0)).await.expect("warm");
        let (mut rust, mut node) = (BTreeMap::new(), BTreeMap::new());
        for _ in 0..rounds {
            // The kept lock may have lapsed during the Node batch; each batch starts holding it,
            // as the Node batch's own warm-up does.
            ours.update(&partial(0)).await.expect("warm");
            rust_batch(&mut ours, count, &mut rust).await;
            node_batch(&node_table, count, &mut node);
        }
        ours.close().await.expect("close");
        let calls = shim_calls(&node_table);
        let (call, message) = (node["shim_call"].p50(), node["worker_message"].p50());
        println!(
            "one call to the shim's IO worker {:.0} µs, one message to the Worker {:.0} µs",
            call * 1000.0,
            message * 1000.0
        );
        let mut rows = String::new();
        for op in OPERATIONS {
            let (r, n) = (&rust[op], &node[op]);
            let ratio = n.p50() / r.p50();
            let count = calls.get(op).copied().expect("a count for each operation");
            let spent = f64::from(count) * call + message;
            println!(
                "{op}: ours p50 {:.2} ms, Node {:.2} ms: {ratio:.2}x; {count} shim calls",
                r.p50(),
                n.p50()
            );
            rows += &format!(
                "| `{op}` | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | **{ratio:.2}x** | {:.2} ms | \
                 {count} | {spent:.2} ms |\n",
                r.p50(),
                r.quantile(0.95),
                n.p50(),
                n.quantile(0.95),
                n.p50() - r.p50(),
            );
        }
        format!(
            "## 12. Two hosts, one component\n\n`cargo bench -p integration-tests --bench hosts` \
             (`just bench-hosts`) on {}, {:.0} s.\n\n\
             The same component through the Rust host (this library, release build) and the \
             Node host (`hosts/node`: jco and its WASI shim, Node {}), each on its own table of \
             the local ClickHouse, {rounds} batches each taking turns, {count} calls per \
             operation per batch; the lock kept between updates in both.\n\n\
             Where Node's time goes, in the same run: one synchronous call to the shim's IO worker \
             takes {:.0} µs (p50), and one message to a store's Worker and back {:.0} µs. `shim \
             calls` is how many calls an operation makes (`hosts/node/calls.js` counts them); \
             `their time` is those calls and one message, at these medians.\n\n\
             | operation | ours p50 | ours p95 | Node p50 | Node p95 | Node / ours (p50) | \
             gap (p50) | shim calls | their time |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n{rows}",
            integration_tests::machine_summary(),
            started.elapsed().as_secs_f64(),
            node_version(),
            call * 1000.0,
            message * 1000.0,
        )
    });
    let path = root().join("tests/benches/results/report.md");
    integration_tests::report::write_section(&path, "hosts", &md)
        .expect("writes section 12 of report.md");
    println!(
        "wrote {} in {:.0} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}

fn node_version() -> String {
    std::process::Command::new("node")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
