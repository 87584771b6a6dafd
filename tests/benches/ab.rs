//! An A/B of the component (not a test, but CI runs it and it fails): the component built from
//! this tree against the baseline, a component built from the commit that
//! `tests/benches/baseline.commit` names, on the same host, the same ClickHouse and tables of the
//! same shape, taking turns call by call (the order flips every call). An operation fails when
//! its median ratio of paired calls (this tree's over the baseline's) passes [`BOUND`] in every
//! one of [`ROUNDS`] rounds; every ratio is printed, and written to target/bench/ab.md.
//!
//! Why rounds: on a loaded machine one side can be slower for a whole round for reasons that are
//! not its code (its tables' parts and merges, which instance the server met first). A round
//! starts on a quiet server (no merge running), with fresh tables, created in the other order
//! than the round before; a further round runs only while some operation is out of bounds. A
//! real slowdown is out of bounds in every round; a round's bad luck is not.
//!
//!   just bench-ab     (builds the baseline first: `just baseline-component`)
//!
//! `BENCH_AB_PAIRS` pairs per operation (default 40); `BENCH_AB_BASELINE` the baseline's path.

use std::fmt::Write as _;
use std::path::PathBuf;

use integration_tests::state_host::{Backend, InstanceOptions, Runtime, State};
use integration_tests::turns::Turns;
use integration_tests::{TestTable, runtime_options};

/// The most an operation may slow down against the baseline.
const BOUND: f64 = 1.15;

/// The most rounds run; an operation fails only when it is out of bounds in each.
const ROUNDS: usize = 3;

/// Each operation's call, as Meltano's runs make them (the lock kept between updates).
const OPERATIONS: [&str; 5] = ["get", "set", "update", "state_ids", "get_all"];

fn bookmark(i: usize) -> String {
    format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#)
}

async fn call(backend: &mut Backend, op: &str, i: usize) {
    match op {
        "get" => drop(backend.get("ab").await.expect("get")),
        "set" => backend
            .set(&State::completed("ab", bookmark(i)))
            .await
            .expect("set"),
        "update" => backend
            .update(&State::partial("ab", bookmark(i)))
            .await
            .expect("update"),
        "state_ids" => drop(backend.state_ids(None).await.expect("state_ids")),
        _ => drop(backend.get_all(None).await.expect("get_all")),
    }
}

/// One instance of `runtime` on a table of its own, with a few states, warmed up.
async fn instance(runtime: &Runtime, label: &str) -> (Backend, std::sync::Arc<TestTable>) {
    let table = TestTable::new(label);
    let mut backend = runtime
        .open_with(
            &table.target.uri(),
            table.with(&[("lock_linger_seconds", "60")]),
            InstanceOptions::default(),
        )
        .await
        .expect("opens");
    for id in 0..20 {
        let state = State::completed(format!("other{id}"), bookmark(id));
        backend.set(&state).await.expect("seeds");
    }
    for op in OPERATIONS {
        for i in 0..3 {
            call(&mut backend, op, i).await;
        }
    }
    (backend, table)
}

/// Waits (at most a minute) until the server runs no merge, so that a round does not start
/// in the wake of whatever ran before it.
fn quiet_server() {
    let target = integration_tests::Target::from_env();
    for _ in 0..600 {
        match target.query("SELECT count() FROM system.merges") {
            Ok(n) if n.trim() == "0" => return,
            _ => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// One operation's figures in one round.
struct Measured {
    mine_ms: f64,
    base_ms: f64,
    ratio: f64,
}

/// One round: both components on fresh tables (ours created first when `ours_first`), each
/// operation's `pairs` calls taking turns.
async fn round(ours: &Runtime, theirs: &Runtime, pairs: usize, ours_first: bool) -> Vec<Measured> {
    quiet_server();
    let ((mut a, _a_table), (mut b, _b_table)) = if ours_first {
        let a = instance(ours, "ab_head").await;
        (a, instance(theirs, "ab_base").await)
    } else {
        let b = instance(theirs, "ab_base").await;
        (instance(ours, "ab_head").await, b)
    };
    let mut out = Vec::new();
    let mut n = 100;
    for op in OPERATIONS {
        let mut turns = Turns::default();
        for pair in 0..pairs {
            n += 1;
            for ours_turn in Turns::order(pair) {
                let side = if ours_turn { &mut a } else { &mut b };
                turns.time(ours_turn, call(side, op, n)).await;
            }
        }
        let paired = turns.medians();
        out.push(Measured {
            mine_ms: paired.first_ms,
            base_ms: paired.second_ms,
            ratio: paired.ratio,
        });
    }
    a.close().await.expect("closes");
    b.close().await.expect("closes");
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let head = integration_tests::state_host::default_component_path();
    let baseline = std::env::var_os("BENCH_AB_BASELINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("BENCH_AB_BASELINE: the baseline component (`just bench-ab` builds it)")
        });
    let pairs: usize = std::env::var("BENCH_AB_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    let commit = std::fs::read_to_string(root.join("tests/benches/baseline.commit"))
        .expect("tests/benches/baseline.commit");
    let load = |path: &PathBuf| {
        Runtime::load(path, runtime_options()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (ours, theirs) = (load(&head), load(&baseline));

    let mut md = format!(
        "A/B: this tree's component ({}) against the baseline's ({}, commit {}), {pairs} pairs \
         per operation taking turns; ratio: the median of this tree's time over the baseline's, \
         pair by pair. Bound: {BOUND}x, in at least one of up to {ROUNDS} rounds (a further \
         round runs only while an operation is out of bounds).\n",
        head.display(),
        baseline.display(),
        commit.trim()
    );
    // Each operation's best ratio so far.
    let mut best = [f64::INFINITY; OPERATIONS.len()];
    for r in 0..ROUNDS {
        let measured = round(&ours, &theirs, pairs, r % 2 == 0).await;
        let _ = write!(
            md,
            "\nRound {} (tables of this tree's component created {}):\n\n| operation | this tree \
             p50 ms | baseline p50 ms | ratio |\n|---|---:|---:|---:|\n",
            r + 1,
            if r % 2 == 0 { "first" } else { "second" }
        );
        for ((op, m), best) in OPERATIONS.iter().zip(&measured).zip(&mut best) {
            let _ = writeln!(
                md,
                "| {op} | {:.2} | {:.2} | {:.2}x |",
                m.mine_ms, m.base_ms, m.ratio
            );
            *best = best.min(m.ratio);
        }
        if best.iter().all(|&ratio| ratio <= BOUND) {
            break;
        }
    }
    let failed: Vec<String> = OPERATIONS
        .iter()
        .zip(best)
        .filter(|(_, ratio)| *ratio > BOUND)
        .map(|(op, ratio)| {
            format!(
                "{op}: at best {ratio:.2}x the baseline's time in {ROUNDS} rounds (bound {BOUND}x)"
            )
        })
        .collect();
    println!("{md}");
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    std::fs::write(out.join("ab.md"), &md).expect("writes ab.md");
    if !failed.is_empty() {
        eprintln!("slower than the baseline:\n{}", failed.join("\n"));
        std::process::exit(1);
    }
}
