//! Sandbox benchmark (not a test): instantiation, memory per idle instance, and precompiled
//! loading, from one run.
//!
//!   cargo bench -p integration-tests --bench sandbox        (or `just bench-sandbox`)

use std::time::{Duration, Instant};

use integration_tests::runtime_options;
use integration_tests::state_host::{Runtime, RuntimeOptions, default_component_path};

/// An endpoint for `open`, which does no I/O: instances here never call out.
const URI: &str = "clickhouse://default:@127.0.0.1:8123/default";

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn p(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn instantiate(runtime: &Runtime, n: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let backend = runtime.open(URI, vec![]).await.expect("open");
        times.push(started.elapsed());
        backend.close().await.expect("close");
    }
    times.sort();
    times
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let alive = if quick { 50 } else { 1000 };
    let wasm = std::fs::read(default_component_path()).expect("the built component");

    // Compile the .wasm vs load the .cwasm (each includes making the engine and InstancePre).
    let started = Instant::now();
    let compiled = Runtime::from_bytes(&wasm, runtime_options()).expect("compiles");
    let compile = started.elapsed();
    let native = Runtime::precompile(&wasm).expect("precompiles");
    let started = Instant::now();
    let loaded = Runtime::from_bytes(&native, runtime_options()).expect("loads");
    let load = started.elapsed();
    drop(compiled);

    // Instantiate from the InstancePre (plus the guest's `open`, which does no I/O).
    let on_demand = instantiate(&loaded, if quick { 50 } else { 500 }).await;
    let pooled_runtime = Runtime::from_bytes(
        &native,
        RuntimeOptions {
            pooled_instances: Some(alive as u32 + 16),
            ..runtime_options()
        },
    )
    .expect("pooled");
    let pooled = instantiate(&pooled_runtime, if quick { 50 } else { 500 }).await;

    // Resident memory per idle instance, with `alive` instances alive at once.
    let before = rss_kib();
    let mut instances = Vec::with_capacity(alive);
    for _ in 0..alive {
        instances.push(loaded.open(URI, vec![]).await.expect("open"));
    }
    let after = rss_kib();
    let per_instance_kib = (after.saturating_sub(before)) as f64 / alive as f64;
    drop(instances);

    let mut report = String::new();
    report.push_str("| measure | value |\n|---|---|\n");
    report.push_str(&format!(
        "| instantiate + `open`, on demand | p50 {:.0} µs, p99 {:.0} µs |\n",
        us(p(&on_demand, 0.5)),
        us(p(&on_demand, 0.99))
    ));
    report.push_str(&format!(
        "| instantiate + `open`, pooling allocator | p50 {:.0} µs, p99 {:.0} µs |\n",
        us(p(&pooled, 0.5)),
        us(p(&pooled, 0.99))
    ));
    report.push_str(&format!(
        "| resident memory per idle instance ({alive} alive) | {:.0} KiB |\n",
        per_instance_kib
    ));
    report.push_str(&format!(
        "| load: compile `.wasm` ({} KB) vs load `.cwasm` ({} KB) | {:.0} ms vs {:.1} ms ({:.0}x) |\n",
        wasm.len() / 1000,
        native.len() / 1000,
        compile.as_secs_f64() * 1000.0,
        load.as_secs_f64() * 1000.0,
        compile.as_secs_f64() / load.as_secs_f64()
    ));
    println!("{report}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("sandbox.md"), &report);
    }
}
