//! What a second writer of an id meets (not a test): two `state-backend serve --stdio`
//! processes, as two Meltano runs hold them, update one id in turn, against one process alone.
//! Prints the ratios measured in one run on the ClickHouse at $CLICKHOUSE_URL and writes
//! section 9 of `tests/benches/results/report.md`.
//!
//!   cargo bench -p integration-tests --bench alternation      (or `just bench-alternation`)
//!
//! At serve's default linger (5 s) a process keeps the id's lock after its update; the other's
//! first update says that it waits (a `want` row), and the keeper gives the lock back at its
//! next look, one retry interval idle (`lock::idle`). From then on both know the id is shared
//! and keep nothing (`Memory::shared`), so the hand-offs after the first take and give back the
//! lock. Last, a second writer's update while a stream (an update every 200 ms, as Meltano
//! sends) holds the id: the stream sees the want at its next renewal. Both use Meltano's lock
//! timeout (10 s). `BENCH_TURNS` sets the updates per process (default 10).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use integration_tests::TestTable;

#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

#[path = "report/host.rs"]
mod host;
use host::{host_binary, root};

/// One `serve --stdio` process on the table.
struct Server {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next: u64,
}

impl Server {
    fn start(table: &TestTable, settings: &[(&str, &str)]) -> Server {
        let mut command = Command::new(host_binary());
        command
            .arg("--allow-loopback")
            .arg("--uri")
            .arg(table.target.uri());
        for (name, value) in table.settings() {
            command.args(["-s", &format!("{name}={value}")]);
        }
        for (name, value) in settings {
            command.args(["-s", &format!("{name}={value}")]);
        }
        let mut child = command
            .args(["serve", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starts state-backend serve");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut ready = String::new();
        output.read_line(&mut ready).expect("reads");
        assert!(ready.contains("ready"), "{ready}");
        Server {
            child,
            input,
            output,
            next: 0,
        }
    }

    /// One update of `id`; its time in ms.
    fn update(&mut self, id: &str, n: usize) -> f64 {
        let (ms, answer) = self.try_update(id, n);
        assert!(answer.contains(r#""result":null"#), "{answer}");
        ms
    }

    /// One update of `id`: its time in ms and the answer.
    fn try_update(&mut self, id: &str, n: usize) -> (f64, String) {
        self.next += 1;
        let partial = format!(r#"{{"singer_state":{{"bookmarks":{{"s":{n}}}}}}}"#);
        let request = serde_json::json!({"id": self.next, "method": "update",
            "params": {"state_id": id, "partial": partial}});
        let started = Instant::now();
        writeln!(self.input, "{request}").expect("writes");
        self.input.flush().expect("flushes");
        let mut answer = String::new();
        self.output.read_line(&mut answer).expect("reads");
        (started.elapsed().as_secs_f64() * 1000.0, answer)
    }

    fn stop(mut self) {
        drop(self.input);
        let _ = self.child.wait();
    }
}

/// Updates per process: each of `servers` updates `id` in turn, `turns` times; the times in
/// order.
fn take_turns(servers: &mut [Server], id: &str, turns: usize) -> Vec<f64> {
    let mut times = Vec::new();
    for turn in 0..turns {
        for server in servers.iter_mut() {
            times.push(server.update(id, turn));
        }
    }
    times
}

fn samples(times: &[f64]) -> Samples {
    let mut samples = Samples::default();
    for ms in times {
        samples.push(*ms);
    }
    samples
}

/// Meltano's default lock timeout (serve's own is 30 s), as Meltano's adapter passes it.
const MELTANO: [(&str, &str); 1] = [("lock_timeout_seconds", "10")];

/// A stream holds `id` (an update every 200 ms) while a second process updates it once, both
/// with Meltano's default lock timeout: what the second meets (its answer and its time).
fn second_writer_during_a_stream(table: &TestTable) -> (f64, String) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = Server::start(table, &MELTANO);
    stream.update("streamed", 0);
    let streaming = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                stream.update("streamed", n);
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            stream.stop();
        })
    };
    let mut second = Server::start(table, &MELTANO);
    let (ms, answer) = second.try_update("streamed", 0);
    stop.store(true, Ordering::Relaxed);
    streaming.join().expect("the stream ran");
    second.stop();
    (ms, answer)
}

fn main() {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let table = TestTable::new("alternation");
    let started = Instant::now();
    let mut rows = Vec::new();
    for (label, settings) in [
        ("defaults (linger 5 s)", MELTANO.to_vec()),
        (
            "`lock_linger_seconds=0`",
            [MELTANO.as_slice(), &[("lock_linger_seconds", "0")]].concat(),
        ),
    ] {
        let mut alone = [Server::start(&table, &settings)];
        // the first update claims; the steady state is what a stream pays
        alone[0].update("alone", 0);
        let one = samples(&take_turns(&mut alone, "alone", turns * 2));
        let [server] = alone;
        server.stop();
        let mut pair = [
            Server::start(&table, &settings),
            Server::start(&table, &settings),
        ];
        let id = format!("shared-{}", rows.len());
        // The first process's first update claims a fresh id, as `alone`'s first did.
        pair[0].update(&id, 0);
        let times = take_turns(&mut pair, &id, turns);
        for server in pair {
            server.stop();
        }
        // The second process's first update is the first hand-off.
        let first = times[1];
        let after = samples(&times[2..]);
        println!(
            "{label}: alone p50 {:.1} ms; two in turn: first hand-off {first:.1} ms, then p50 \
             {:.1} ms: {:.1}x",
            one.p50(),
            after.p50(),
            after.p50() / one.p50()
        );
        rows.push(format!(
            "| {label} | {:.1} ms | {first:.1} ms | {:.1} ms | {:.1} ms | {:.1}x |",
            one.p50(),
            after.p50(),
            after.quantile(1.0),
            after.p50() / one.p50()
        ));
    }
    let (waited, answer) = second_writer_during_a_stream(&table);
    let met = if answer.contains(r#""result":null"#) {
        format!("its update went through after {waited:.0} ms")
    } else {
        let kind = serde_json::from_str::<serde_json::Value>(&answer)
            .ok()
            .and_then(|a| a["error"]["kind"].as_str().map(str::to_string))
            .unwrap_or_else(|| answer.trim().to_string());
        format!("its update failed with `{kind}` after {waited:.0} ms")
    };
    println!("a second writer while a stream holds the id: {met}");
    let report = format!(
        "## 9. Two writers of one id\n\n`cargo bench -p integration-tests --bench alternation` on {}, \
         host `{}`, {:.0} s. Two `state-backend serve --stdio` processes update one id in turn, \
         {turns} updates each; one process alone updates its own id {} times (after a first \
         update); all with Meltano's `lock_timeout_seconds` of 10. The first hand-off is the second process's first update; the medians and \
         the slowest are of the updates after it.\n\n\
         | settings | one process | two: first hand-off | two in turn, after it | slowest | two / one |\n\
         |---|---:|---:|---:|---:|---:|\n{}\n\n\
         A second writer while a stream (an update every 200 ms) holds the id, at the \
         defaults: {met}.\n",
        integration_tests::machine_summary(),
        host_binary()
            .strip_prefix(root())
            .unwrap_or(&host_binary())
            .display(),
        started.elapsed().as_secs_f64(),
        turns * 2,
        rows.join("\n")
    );
    let path = root().join("tests/benches/results/report.md");
    integration_tests::report::write_section(&path, "alternation", &report)
        .expect("writes section 9 of report.md");
    println!("wrote {}", path.display());
}
