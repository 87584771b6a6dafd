//! Section 7, long streams: the latency of each thousand updates, and the tables' active parts
//! as they grow, over one id and over many ids interleaved (what long Meltano runs do to a
//! server).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use integration_tests::state_host::{Backend, State};
use integration_tests::{SCHEMA, TestTable, runtime};

use crate::bookmark;
use crate::stats::Samples;

/// How long the streams are.
pub struct Plan {
    /// Updates of one id, by one instance.
    pub one_id: usize,
    /// Ids of the interleaved streams, and updates of each (in rounds: every id once a round).
    pub ids: usize,
    pub per_id: usize,
    /// Instances that share the interleaved ids (pipelines running at once), each taking its
    /// ids in turn.
    pub instances: usize,
    /// Updates per row of the table (the "thousand").
    pub bucket: usize,
    /// How long to watch the parts after the streams end (do merges catch up?).
    pub watch: Duration,
}

/// One row: a bucket of updates (in the order they ended), and the parts when it ended.
struct Row {
    updates: usize,
    samples: Samples,
    per_second: f64,
    parts: Parts,
}

/// Active parts of a table family: the state table, the lock table and the lock log; and the
/// lock log's rows.
#[derive(Clone, Copy, Default)]
struct Parts {
    state: u64,
    lock: u64,
    log: u64,
    log_rows: u64,
}

impl Parts {
    fn of(table: &TestTable) -> Parts {
        let text = table.target.must(&format!(
            "SELECT table, count(), sum(rows) FROM system.parts WHERE active \
             AND database = '{SCHEMA}' \
             AND table IN ('{name}', '{name}_lock', '{name}_lock_log') GROUP BY table \
             FORMAT TSV",
            name = table.name
        ));
        let mut parts = Parts::default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [name, count, rows] = fields[..] else {
                continue;
            };
            let count = count.trim().parse().unwrap_or(0);
            match name.strip_prefix(table.name.as_str()) {
                Some("") => parts.state = count,
                Some("_lock") => parts.lock = count,
                Some("_lock_log") => {
                    parts.log = count;
                    parts.log_rows = rows.trim().parse().unwrap_or(0);
                }
                _ => {}
            }
        }
        parts
    }
}

/// Samples the parts every second, on a thread of its own, until dropped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(f64, Parts)>>>,
}

impl Sampler {
    fn start(table: &Arc<TestTable>, started: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, table) = (Arc::clone(&stop), Arc::clone(table));
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    seen.push((ms_since(started), Parts::of(&table)));
                    std::thread::sleep(Duration::from_secs(1));
                }
                seen
            })
        };
        Sampler {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Sampled {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .map(|t| t.join().expect("the sampler"))
            .unwrap_or_default()
    }
}

fn ms_since(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// Each update's end and latency (ms from the start), in the order they ended.
type Ended = Vec<(f64, f64)>;

/// Parts sampled, with when (ms from the start).
type Sampled = Vec<(f64, Parts)>;

/// Runs `per_instance` updates on each instance at once (instance `w`'s `i`th update is of
/// `id_of(w, i)`); returns each update's end and latency, in ms, and the parts sampled.
fn stream(
    tokio: &tokio::runtime::Runtime,
    table: &Arc<TestTable>,
    instances: usize,
    per_instance: usize,
    id_of: impl Fn(usize, usize) -> String + Send + Copy + 'static,
) -> (Ended, Sampled) {
    let linger = [("lock_linger_seconds", LINGER)];
    let backends: Vec<Backend> = (0..instances)
        .map(|_| {
            tokio
                .block_on(runtime().open(&table.target.uri(), table.with(&linger)))
                .expect("opens")
        })
        .collect();
    let started = Instant::now();
    let sampler = Sampler::start(table, started);
    let tasks: Vec<_> = backends
        .into_iter()
        .enumerate()
        .map(|(w, mut backend)| {
            tokio.spawn(async move {
                let mut done = Vec::with_capacity(per_instance);
                for i in 0..per_instance {
                    let state = State::partial(id_of(w, i), bookmark(i));
                    let before = ms_since(started);
                    backend.update(&state).await.expect("update");
                    let end = ms_since(started);
                    done.push((end, end - before));
                }
                backend.close().await.expect("closes");
                done
            })
        })
        .collect();
    let mut done: Ended = tasks
        .into_iter()
        .flat_map(|task| tokio.block_on(task).expect("an instance"))
        .collect();
    done.sort_by(|a, b| a.0.total_cmp(&b.0));
    (done, sampler.finish())
}

/// The updates in buckets of `bucket`, each with the parts last sampled before it ended.
fn rows(done: &[(f64, f64)], sampled: &[(f64, Parts)], bucket: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut previous_end = 0.0;
    for (n, chunk) in done.chunks(bucket).enumerate() {
        let end = chunk.last().map_or(previous_end, |u| u.0);
        let parts = sampled
            .iter()
            .take_while(|(at, _)| *at <= end)
            .last()
            .or(sampled.first())
            .map(|(_, p)| *p)
            .unwrap_or_default();
        rows.push(Row {
            updates: n * bucket + chunk.len(),
            samples: chunk.iter().map(|u| u.1).collect(),
            per_second: chunk.len() as f64 / ((end - previous_end) / 1000.0),
            parts,
        });
        previous_end = end;
    }
    rows
}

/// The parts a while after the streams ended, sampled every few seconds.
fn watch(table: &TestTable, how_long: Duration) -> Vec<(u64, Parts)> {
    let started = Instant::now();
    let mut seen = vec![(0, Parts::of(table))];
    let step = Duration::from_secs(5).min(how_long);
    while started.elapsed() < how_long {
        std::thread::sleep(step);
        seen.push((started.elapsed().as_secs(), Parts::of(table)));
    }
    seen
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn table_of(md: &mut String, rows: &[Row], after: &[(u64, Parts)]) -> f64 {
    let _ = writeln!(
        md,
        "\n| updates | p50 ms | p99 ms | updates/s | active parts: state / lock / lock log | lock log rows |\n\
         |---:|---:|---:|---:|---:|---:|"
    );
    // Units in the cells, and thousands with a separator, so that no cell reads like another
    // section's row label (the pages quote figures by such labels).
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.0}/s | {} / {} / {} | {} rows |",
            thousands(row.updates),
            row.samples.p50(),
            row.samples.p99(),
            row.per_second,
            row.parts.state,
            row.parts.lock,
            row.parts.log,
            row.parts.log_rows
        );
    }
    let watched: Vec<String> = after
        .iter()
        .map(|(s, p)| format!("{s} s: {} / {} / {}", p.state, p.lock, p.log))
        .collect();
    let _ = writeln!(
        md,
        "\nActive parts after the streams ended: {}.",
        watched.join("; ")
    );
    match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => last.samples.p50() / first.samples.p50(),
        _ => f64::NAN,
    }
}

/// `serve`'s default: the lock kept between the updates of a run, one round trip each.
const LINGER: &str = "5";

pub fn section(tokio: &tokio::runtime::Runtime, plan: &Plan, md: &mut String) {
    let _ = writeln!(
        md,
        "\n## 7. Long streams\n\n`update` after `update` with the lock kept \
         (`lock_linger_seconds={LINGER}`, `serve`'s default), each a STATE message of one of 17 \
         streams. Per {} updates, in the order they ended: latency, rate, and the active parts \
         of the state table, the lock table and the lock log, and the lock log's rows, as last \
         sampled (`system.parts`, every second). Goal: the last bucket's p50 within 1.2x of the \
         first's, and part counts bounded.",
        plan.bucket
    );

    let table = TestTable::new("bench_stream");
    eprintln!("streams: {} updates of one id", plan.one_id);
    let (done, sampled) = stream(tokio, &table, 1, plan.one_id, |_, _| "stream:one".into());
    let _ = writeln!(md, "\n### {} updates of one id, one instance", plan.one_id);
    let after = watch(&table, plan.watch);
    let one_rows = rows(&done, &sampled, plan.bucket);
    let one = table_of(md, &one_rows, &after);
    // One update is one insert: the rate a single stream puts on the server.
    let mut counted = 0;
    let mut seconds = 0.0;
    for row in &one_rows {
        seconds += (row.updates - counted) as f64 / row.per_second;
        counted = row.updates;
    }
    let rate = counted as f64 / seconds;

    let table = TestTable::new("bench_streams");
    assert_eq!(
        plan.ids % plan.instances,
        0,
        "the ids split evenly among the instances"
    );
    let per_instance = plan.ids * plan.per_id / plan.instances;
    eprintln!(
        "streams: {} ids x {} updates on {} instances",
        plan.ids, plan.per_id, plan.instances
    );
    // Instance `w` takes every `instances`th id, each once a round.
    let (instances, share) = (plan.instances, plan.ids / plan.instances);
    let (done, sampled) = stream(tokio, &table, instances, per_instance, move |w, i| {
        format!("stream:{:03}", w + instances * (i % share))
    });
    let _ = writeln!(
        md,
        "\n### {} ids x {} updates, {} instances at once, each taking its {} ids in turn",
        plan.ids,
        plan.per_id,
        plan.instances,
        plan.ids / plan.instances
    );
    let after = watch(&table, plan.watch);
    let many = table_of(md, &rows(&done, &sampled, plan.bucket), &after);
    let _ = writeln!(
        md,
        "\nLast bucket / first at p50: one id **{one:.2}x**, {} ids **{many:.2}x** (goal <= 1.2). \
         One stream of one id, one insert per update: **{rate:.0} inserts/s** on average.",
        plan.ids
    );
}
