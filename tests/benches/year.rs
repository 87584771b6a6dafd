//! A year of runs (not a test): Meltano runs of one pipeline, one after the other, each a new
//! instance that reads the state, sends 20 STATE messages (`update`, the lock kept between them
//! as `serve` keeps it for Meltano) and gives the lock back at its end. Prints the updates' p50
//! per 1,000 runs and the id's lock-log rows after each 1,000, and writes section 13 of
//! `tests/benches/results/report.md`.
//!
//!   cargo bench --profile dev -p integration-tests --bench year      (or `just bench-year`)
//!
//! What it holds: an update costs the same in the id's last thousand runs as in its first (at
//! most 1.1x), and the lock log keeps a bounded number of rows, whatever the id's age. Each
//! thousand also runs 50 runs of a fresh id (a control, taking turns with the aged id's runs), so
//! that the machine's drift shows beside the aged id's figures. `YEAR_RUNS` sets the runs
//! (default 10,000); fewer than 10,000 print the figures and write nothing.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use integration_tests::state_host::State;
use integration_tests::{SCHEMA, TestTable, machine_summary};
use protocol::fenced::{PRUNE_EVERY, PRUNE_KEEP};

#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

#[allow(dead_code)]
#[path = "report/host.rs"]
mod host;
use host::root;

const PER_RUN: usize = 20;
const BLOCK: usize = 1000;
const CONTROL_EVERY: usize = 20;
/// The goal: the last thousand's update p50 against the first's.
const GOAL: f64 = 1.1;

/// One Meltano run of `id`: a new instance, a read, `PER_RUN` updates, the lock given back.
async fn run(table: &TestTable, id: &str, run: usize, updates: &mut Samples) {
    let mut backend = table.open_with(&[("lock_linger_seconds", "5")]).await;
    backend.get(id).await.expect("get");
    for message in 0..PER_RUN {
        let partial = format!(
            r#"{{"singer_state":{{"bookmarks":{{"orders":{{"run":{run},"message":{message}}}}}}}}}"#
        );
        let started = Instant::now();
        backend
            .update(&State::partial(id, partial))
            .await
            .expect("update");
        updates.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    backend.close().await.expect("close");
}

/// The id's rows in the lock log once the pruning ClickHouse was asked for is done.
fn log_rows(table: &TestTable, id: &str) -> u64 {
    let log = format!("{}_lock_log", table.name);
    let pending = format!(
        "SELECT count() FROM system.mutations WHERE database = '{SCHEMA}' AND table = '{log}' \
         AND NOT is_done"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while table.target.must(&pending).trim() != "0" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    table
        .target
        .must(&format!(
            "SELECT count() FROM {SCHEMA}.{log} WHERE state_id = '{id}'"
        ))
        .trim()
        .parse()
        .expect("a count")
}

/// `n` with a comma between thousands.
fn thousands(n: usize) -> String {
    match n {
        0..1000 => n.to_string(),
        _ => format!("{},{:03}", n / 1000, n % 1000),
    }
}

struct Block {
    runs: usize,
    aged: Samples,
    control: Samples,
    rows: u64,
}

fn main() {
    let runs: usize = std::env::var("YEAR_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let started = Instant::now();
    let table = TestTable::new("bench_year");
    let blocks: Vec<Block> = tokio.block_on(async {
        let mut blocks = Vec::new();
        let mut done = 0;
        while done < runs {
            let size = BLOCK.min(runs - done);
            let control_id = format!("control-{}", done / BLOCK);
            let (mut aged, mut control) = (Samples::default(), Samples::default());
            for i in 0..size {
                run(&table, "year", done + i, &mut aged).await;
                if i % CONTROL_EVERY == 0 {
                    run(&table, &control_id, i, &mut control).await;
                }
            }
            done += size;
            let rows = log_rows(&table, "year");
            println!(
                "runs {:>6}: update p50 {:.2} ms (fresh id {:.2} ms), lock-log rows {rows}, {:.0} s",
                done,
                aged.p50(),
                control.p50(),
                started.elapsed().as_secs_f64()
            );
            blocks.push(Block {
                runs: done,
                aged,
                control,
                rows,
            });
        }
        blocks
    });
    let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else {
        return;
    };
    let ratio = last.aged.p50() / first.aged.p50();
    // The same against the fresh id of each thousand, which took turns with it: the machine's
    // drift between the first thousand and the last cancels.
    let relative =
        (last.aged.p50() / last.control.p50()) / (first.aged.p50() / first.control.p50());
    let max_rows = blocks.iter().map(|b| b.rows).max().unwrap_or(0);
    // Each run claims one generation: its acquire and its release, a renewal when a run
    // outlasts half the lease (none here); the log keeps PRUNE_EVERY + PRUNE_KEEP of them.
    let bound = 2 * (PRUNE_EVERY + PRUNE_KEEP);
    println!(
        "last thousand against the first: {ratio:.2}x (goal at most {GOAL}x), {relative:.2}x \
         against a fresh id; lock-log rows at most {max_rows} (bound {bound})"
    );
    let mut md = format!(
        "## 13. A year of runs\n\n`cargo bench --profile dev -p integration-tests --bench year` (`just \
         bench-year`) on {}, the library's host ({} build), {:.0} s.\n\n\
         {runs} Meltano runs of one id, one after the other, as a daily pipeline makes in \
         decades: each a new instance that reads the state, sends {PER_RUN} updates (the lock \
         kept between them, `lock_linger_seconds` 5, as `serve` runs for Meltano) and gives the \
         lock back. Per thousand runs: the updates' p50, the p50 of {} runs of a fresh id taking \
         turns with them (the machine's drift), and the id's lock-log rows at the end.\n\n\
         | runs | update p50 | fresh id p50 | lock-log rows |\n|---:|---:|---:|---:|\n",
        machine_summary(),
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        started.elapsed().as_secs_f64(),
        BLOCK / CONTROL_EVERY,
    );
    for b in &blocks {
        // Runs as a range (`9,001–10,000`): the report's other tables have rows named by a
        // bare count, which the docs quote by.
        let _ = writeln!(
            md,
            "| {}–{} | {:.2} ms | {:.2} ms | {} |",
            thousands(b.runs - b.aged.len() / PER_RUN + 1),
            thousands(b.runs),
            b.aged.p50(),
            b.control.p50(),
            b.rows
        );
    }
    let _ = write!(
        md,
        "\nThe last thousand against the first: **{ratio:.2}x** (goal: at \
         most {GOAL}x); against the fresh id of each thousand, {relative:.2}x. The lock log kept at most **{max_rows}** rows of the id (bound: \
         2 × ({PRUNE_EVERY} + {PRUNE_KEEP}) = {bound}: a claim prunes the generations more than \
         {PRUNE_KEEP} before it once in {PRUNE_EVERY}, and a run's generation has two rows).\n"
    );
    if runs < 10_000 {
        println!("(fewer than 10,000 runs: the report is not written)");
    } else {
        let report = root().join("tests/benches/results/report.md");
        integration_tests::report::write_section(&report, "year", &md).expect("report");
        println!("wrote section 13 of {}", report.display());
    }
    assert!(
        ratio <= GOAL,
        "the last thousand runs cost {ratio:.2}x the first"
    );
    assert!(max_rows <= bound, "{max_rows} lock-log rows, bound {bound}");
}
