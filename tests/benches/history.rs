//! What the history costs (not a test): the update stream with the history on and off, in one
//! run, taking turns update by update; and reading an id with 100,000 versions. Prints the
//! ratios and writes section 11 of `tests/benches/results/report.md`.
//!
//!   cargo bench -p integration-tests --bench history      (or `just bench-history`)
//!
//! The stream is Meltano's: `update` with the lock kept between updates (`lock_linger_seconds`
//! 5, as `serve` runs for Meltano), so each update after the first is one guarded insert, into
//! the state table (history off) or into the history and, through its view, the state table
//! (on). `BENCH_UPDATES` sets the updates per side (default 300).

use std::fmt::Write as _;
use std::time::Instant;

use integration_tests::state_host::{Backend, Point, State};
use integration_tests::{SCHEMA, TestTable};

#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

#[allow(dead_code)]
#[path = "report/host.rs"]
mod host;
use host::root;

/// Versions of the id the reads run on.
const VERSIONS: u64 = 100_000;
/// Reads of each kind.
const READS: usize = 50;

fn bookmark(n: usize) -> State {
    State::partial(
        "dev:tap-to-target",
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{n}}}}}}}}}"#),
    )
}

/// Updates from each backend in turn, `updates` each; their samples in the same order.
async fn stream(backends: &mut [Backend], updates: usize) -> Vec<Samples> {
    // The first update of each takes the lock (and creates the tables); not what a stream pays.
    for b in backends.iter_mut() {
        b.update(&bookmark(0)).await.expect("first update");
    }
    let mut samples = vec![Samples::default(); backends.len()];
    for n in 1..=updates {
        // Taking turns, so that the machine's noise falls on all alike.
        for (b, s) in backends.iter_mut().zip(&mut samples) {
            let started = Instant::now();
            b.update(&bookmark(n)).await.expect("update");
            s.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    samples
}

/// Fills the history of one id with `VERSIONS` versions, one a second up to a minute ago (well
/// inside the history's TTL), in one insert (through the view into the state table, as the
/// backend's own writes go); returns the oldest and the newest version.
async fn fill(table: &TestTable, backend: &mut Backend) -> (u64, u64) {
    backend
        .set(&State::completed("big", "{}"))
        .await
        .expect("creates the schema");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let oldest = now_ms - 60_000 - VERSIONS * 1000;
    table.target.must(&format!(
        "INSERT INTO {SCHEMA}.{}_history (state_id, partial_state, completed_state, updated_at, \
         op, writer, lock_owner, token, seq, slot) SELECT 'big', '{{}}', \
         concat('{{\"singer_state\":{{\"bookmarks\":{{\"orders\":{{\"id\":', toString(number), '}}}}}}}}'), \
         fromUnixTimestamp64Milli(toInt64({oldest} + number * 1000)), 'update', 'bench', '', 1, \
         0, {oldest} + number * 1000 FROM numbers({VERSIONS})",
        table.name
    ));
    (oldest, oldest + (VERSIONS - 1) * 1000)
}

/// Where the stream's cost is: one-row inserts sent as raw SQL, taking turns, into the state
/// table alone; into the history, through its view; and into a `StripeLog` table (no parts, no
/// index) through the same view. Returns the samples in that order.
async fn raw_inserts(rounds: usize) -> Vec<(&'static str, Samples)> {
    let plain = TestTable::new("bench_raw_plain");
    let history = TestTable::new("bench_raw_hist");
    let strip = TestTable::new("bench_raw_strip");
    for (table, settings) in [
        (&plain, vec![("history", "false")]),
        (&history, vec![]),
        (&strip, vec![("history", "false")]),
    ] {
        let mut b = table.open_with(&settings).await;
        b.set(&State::completed("raw", "{}")).await.expect("schema");
        b.close().await.expect("close");
    }
    strip.target.must(&format!(
        "CREATE TABLE {SCHEMA}.{0}_history (state_id String, partial_state Nullable(String), \
         completed_state Nullable(String), updated_at DateTime64(3), op String, writer String, \
         lock_owner String, token UInt64) ENGINE = StripeLog",
        strip.name
    ));
    strip.target.must(&format!(
        "CREATE MATERIALIZED VIEW {SCHEMA}.{0}_history_to_state TO {SCHEMA}.{0} AS SELECT \
         state_id, partial_state, completed_state, updated_at FROM {SCHEMA}.{0}_history",
        strip.name
    ));
    let origin = ", 'update', 'bench', '', 1";
    // The history's own columns: no ordinal, the slot the version (the backend's, with no count).
    let slotted = ", 'update', 'bench', '', 1, 0, toUnixTimestamp64Milli(now64(3))";
    let variants = [
        (
            "the state table alone",
            format!("{SCHEMA}.{}", plain.name),
            "",
        ),
        (
            "the history and its view",
            format!("{SCHEMA}.{}_history", history.name),
            slotted,
        ),
        (
            "a `StripeLog` history and the same view",
            format!("{SCHEMA}.{}_history", strip.name),
            origin,
        ),
    ];
    let mut samples: Vec<Samples> = vec![Samples::default(); variants.len()];
    for round in 0..rounds {
        for ((_, table, origin), s) in variants.iter().zip(&mut samples) {
            let sql = format!(
                "INSERT INTO {table} SETTINGS insert_deduplication_token = 'r{round}', \
                 async_insert = 0, deduplicate_blocks_in_dependent_materialized_views = 1 \
                 SELECT 'raw', '{{}}', '{{}}', now64(3){origin}"
            );
            let started = Instant::now();
            plain.target.must(&sql);
            s.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    variants
        .iter()
        .map(|(label, _, _)| *label)
        .zip(samples)
        .collect()
}

/// What a `set` costs with the history on, against the original's: the statement each design
/// would send, as raw SQL with its values inline and none of the guest's settings (the same
/// transport and settings for all, so the differences are the statements'), one of each per
/// round in an order that turns each round. The original's plain insert into the state table;
/// ours with the history off and on, the guest's statement's shape (the version guard reads the
/// id's newest version, the token deduplicates a retry); and the designs that would give
/// something up to come nearer the original: no version guard, no deduplication, and the
/// history alone with no view (the original's table then holds nothing). Every guarded insert
/// must land (each round's version is the clock's, later than the last): checked at the end.
/// Returns each design's label and samples, the original's first.
async fn set_designs(rounds: usize) -> Vec<(&'static str, Samples)> {
    let original = TestTable::new("bench_set_orig");
    let off = TestTable::new("bench_set_off");
    let on = TestTable::new("bench_set_on");
    let unguarded = TestTable::new("bench_set_unguarded");
    let undeduplicated = TestTable::new("bench_set_nodedup");
    let alone = TestTable::new("bench_set_alone");
    for (table, settings) in [
        (&original, vec![("history", "false")]),
        (&off, vec![("history", "false")]),
        (&on, vec![]),
        (&unguarded, vec![]),
        (&undeduplicated, vec![]),
        (&alone, vec![]),
    ] {
        let mut b = table.open_with(&settings).await;
        b.set(&State::completed("other", "{}"))
            .await
            .expect("schema");
        b.close().await.expect("close");
    }
    // No deduplication window: the history table as a single server makes it, without one.
    let history = |t: &TestTable| format!("{SCHEMA}.{}_history", t.name);
    undeduplicated.target.must(&format!(
        "ALTER TABLE {} RESET SETTING non_replicated_deduplication_window",
        history(&undeduplicated)
    ));
    // The history alone: no view into the state table.
    alone.target.must(&format!(
        "DROP VIEW {SCHEMA}.{}_history_to_state",
        alone.name
    ));
    let state = |t: &TestTable| format!("{SCHEMA}.{}", t.name);
    let origin = ", op, writer, lock_owner, token, seq, slot";
    let mut samples: Vec<Samples> = vec![Samples::default(); 6];
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis()
    };
    let mut last_version = 0;
    for round in 0..rounds {
        let partial =
            format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{round}}}}}}}}}"#);
        let values = format!("'{partial}', '{{}}'");
        let version = now_ms();
        last_version = version;
        let at = format!("fromUnixTimestamp64Milli(toInt64({version}))");
        let settings = format!("SETTINGS insert_deduplication_token = 's{round}'");
        let fanned = format!("{settings}, deduplicate_blocks_in_dependent_materialized_views = 1");
        let who = format!(", 'set', 'bench', '', 1, 0, {version}");
        let guarded = |into: String, origin: &str, who: &str, read: String, settings: &str| {
            format!(
                "INSERT INTO {into} (state_id, partial_state, completed_state, updated_at{origin}) \
                 {settings} SELECT 'id', {values}, {at}{who} FROM {read} WHERE state_id = 'id' \
                 HAVING max(updated_at) < {at}"
            )
        };
        let statements = [
            format!(
                "INSERT INTO {} (state_id, partial_state, completed_state) SELECT 'id', {values}",
                state(&original)
            ),
            guarded(state(&off), "", "", state(&off), &settings),
            guarded(history(&on), origin, &who, state(&on), &fanned),
            format!(
                "INSERT INTO {} (state_id, partial_state, completed_state, updated_at{origin}) \
                 {fanned} SELECT 'id', {values}, {at}{who}",
                history(&unguarded)
            ),
            guarded(
                history(&undeduplicated),
                origin,
                &who,
                state(&undeduplicated),
                "",
            ),
            guarded(history(&alone), origin, &who, history(&alone), &settings),
        ];
        let turn = round % statements.len();
        for i in (turn..statements.len()).chain(0..turn) {
            let started = Instant::now();
            original.target.must(&statements[i]);
            samples[i].push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    // Every write landed: the history keeps each version (its slot), the state table the newest.
    for t in [&on, &unguarded, &undeduplicated, &alone] {
        let count = t.target.must(&format!(
            "SELECT count() FROM {} FINAL WHERE state_id = 'id'",
            history(t)
        ));
        assert_eq!(
            count.trim(),
            rounds.to_string(),
            "{}: a write did not land",
            t.name
        );
    }
    // The state table's newest version is the last round's: its guarded write landed.
    for t in [&off, &on] {
        let newest = t.target.must(&format!(
            "SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {} WHERE state_id = 'id'",
            state(t)
        ));
        assert_eq!(
            newest.trim(),
            last_version.to_string(),
            "{}: the last write did not land",
            t.name
        );
    }
    [
        "the original's (a plain insert into the state table)",
        "ours, history off (the version guard, into the state table)",
        "ours, history on (the guard, into the history and its view)",
        "history on, no version guard",
        "history on, no deduplication of a retry",
        "the history alone (the guard reads it; no view, no state table)",
    ]
    .into_iter()
    .zip(samples)
    .collect()
}

fn row(label: &str, s: &Samples) -> String {
    format!(
        "| {label} | {:.2} ms | {:.2} ms | {:.2} ms |",
        s.p50(),
        s.quantile(0.95),
        s.quantile(1.0)
    )
}

fn mean(s: &Samples) -> f64 {
    s.iter().sum::<f64>() / s.len() as f64
}

fn main() {
    let updates: usize = std::env::var("BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let started = Instant::now();
    let md = tokio.block_on(async {
        let linger = ("lock_linger_seconds", "5");
        let on_table = TestTable::new("bench_hist_on");
        let count_table = TestTable::new("bench_hist_count");
        let off_table = TestTable::new("bench_hist_off");
        let mut backends = vec![
            on_table.open_with(&[linger]).await,
            count_table
                .open_with(&[linger, ("history_versions", "1000")])
                .await,
            off_table.open_with(&[linger, ("history", "false")]).await,
        ];
        let streams = stream(&mut backends, updates).await;
        for b in backends {
            b.close().await.expect("close");
        }
        let [with, counted, without] = &streams[..] else {
            unreachable!("three streams")
        };
        let (p50, avg) = (with.p50() / without.p50(), mean(with) / mean(without));
        let counted_p50 = counted.p50() / without.p50();
        println!(
            "stream: history on p50 {:.2} ms, with a count {:.2} ms, off {:.2} ms: {p50:.2}x, \
             with a count {counted_p50:.2}x (means {avg:.2}x)",
            with.p50(),
            counted.p50(),
            without.p50()
        );

        let raw = raw_inserts(updates).await;
        for (label, s) in &raw {
            println!("raw insert into {label}: p50 {:.2} ms", s.p50());
        }

        let sets = set_designs(updates).await;
        let original_p50 = sets[0].1.p50();
        for (label, s) in &sets {
            println!("set, {label}: p50 {:.2} ms, {:.2}x the original's", s.p50(), s.p50() / original_p50);
        }

        let big = TestTable::new("bench_hist_big");
        let mut reader = big.open().await;
        let (oldest, newest) = fill(&big, &mut reader).await;
        let middle = oldest + VERSIONS / 2 * 1000;
        let mut reads: Vec<(&str, Samples)> = Vec::new();
        let mut timed = |label, s| reads.push((label, s));
        let mut s = Samples::default();
        for _ in 0..READS {
            let started = Instant::now();
            let listed = reader.history("big", 20).await.expect("history");
            s.push(started.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(listed.len(), 20);
        }
        timed("`history big --limit 20` (the newest 20)", s);
        for (label, point) in [
            (
                "`get big --at VERSION` (the middle one)",
                Point::Version(middle),
            ),
            (
                "`get big --at TIME` (between two versions)",
                Point::Time(middle + 500),
            ),
            (
                "`get big --at VERSION` (the oldest)",
                Point::Version(oldest),
            ),
        ] {
            let mut s = Samples::default();
            for _ in 0..READS {
                let started = Instant::now();
                let found = reader.get_at("big", point).await.expect("get --at");
                s.push(started.elapsed().as_secs_f64() * 1000.0);
                assert!(found.version == middle || found.version == oldest);
            }
            timed(label, s);
        }
        let mut s = Samples::default();
        for _ in 0..READS {
            let started = Instant::now();
            reader.get("big").await.expect("get");
            s.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        timed("`get big` (the state table, for comparison)", s);
        for (label, s) in &reads {
            println!("{label}: p50 {:.2} ms", s.p50());
        }
        let _ = newest;

        let mut md = format!(
            "## 11. The history\n\n`cargo bench -p integration-tests --bench history` (`just \
             bench-history`) on {}, the library's host, {:.0} s.\n\n\
             ### The update stream, history on and off\n\n\
             Three ids' streams, {updates} updates each, taking turns update by update: the \
             history on, on with `history_versions=1000` (each write reads its ordinal in the \
             same statement), and off, as Meltano's streams run (the lock kept between updates, \
             so each is one guarded insert).\n\n\
             | history | p50 | p95 | slowest |\n|---|---:|---:|---:|\n{}\n{}\n{}\n\n\
             With / without: **{p50:.2}x** at the median, {avg:.2}x in the mean (goal: within \
             1.10x); with a count / without: {counted_p50:.2}x at the median.\n\n\
             Where it goes: {updates} one-row inserts each as raw SQL (a new connection each), \
             taking turns, into:\n\n\
             | target | p50 | p95 | slowest |\n|---|---:|---:|---:|\n{}\n\n\
             ### A `set`, against the original's\n\n\
             The statement each design sends for one `set`, {updates} of each as raw SQL (a new \
             connection each, the same for all), taking turns, each design on tables of its own \
             (the last three each give something up):\n\n\
             | statement | p50 | p95 | slowest | p50 / the original's |\n|---|---:|---:|---:|---:|\n{}\n\n\
             ### Reading an id with {VERSIONS} versions\n\n\
             {READS} reads each, through the library, on the local ClickHouse (goal: under \
             100 ms).\n\n| read | p50 | p95 | slowest |\n|---|---:|---:|---:|\n",
            integration_tests::machine_summary(),
            started.elapsed().as_secs_f64(),
            row("on", with),
            row("on, at most 1000 versions per id", counted),
            row("off", without),
            raw.iter()
                .map(|(label, s)| row(label, s))
                .collect::<Vec<_>>()
                .join("\n"),
            sets.iter()
                .map(|(label, s)| format!("{} {:.2}x |", row(label, s), s.p50() / original_p50))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        for (label, s) in &reads {
            let _ = writeln!(md, "{}", row(label, s));
        }
        reader.close().await.expect("close");
        md
    });
    let path = root().join("tests/benches/results/report.md");
    integration_tests::report::write_section(&path, "history", &md)
        .expect("writes section 11 of report.md");
    println!(
        "wrote {} in {:.0} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}
