//! What a second writer of an id meets (not a test): two `state-backend serve --stdio`
//! processes, as two Meltano runs hold them, update one id in turn, against one process alone.
//! Prints the ratios measured in one run on the ClickHouse at $CLICKHOUSE_URL and writes
//! `tests/benches/results/alternation.md`.
//!
//!   cargo bench -p integration-tests --bench alternation      (or `just bench-alternation`)
//!
//! At serve's default linger (5 s) each process keeps the id's lock after its update, so the
//! other waits until it is idle that long; with `lock_linger_seconds=0` each update takes and
//! gives back the lock. `BENCH_TURNS` sets the updates per process (default 6).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use integration_tests::TestTable;

#[allow(dead_code)]
#[path = "report/stats.rs"]
mod stats;
use stats::Samples;

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
        self.next += 1;
        let partial = format!(r#"{{"singer_state":{{"bookmarks":{{"s":{n}}}}}}}"#);
        let request = serde_json::json!({"id": self.next, "method": "update",
            "params": {"state_id": id, "partial": partial}});
        let started = Instant::now();
        writeln!(self.input, "{request}").expect("writes");
        self.input.flush().expect("flushes");
        let mut answer = String::new();
        self.output.read_line(&mut answer).expect("reads");
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        assert!(answer.contains(r#""result":null"#), "{answer}");
        ms
    }

    fn stop(mut self) {
        drop(self.input);
        let _ = self.child.wait();
    }
}

/// Updates per process: each of `servers` updates `id` in turn, `turns` times.
fn take_turns(servers: &mut [Server], id: &str, turns: usize) -> Samples {
    let mut samples = Samples::default();
    for turn in 0..turns {
        for server in servers.iter_mut() {
            samples.push(server.update(id, turn));
        }
    }
    samples
}

fn main() {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let table = TestTable::new("alternation");
    let started = Instant::now();
    let mut rows = Vec::new();
    for (label, settings) in [
        ("defaults (linger 5 s)", vec![]),
        (
            "`lock_linger_seconds=0`",
            vec![("lock_linger_seconds", "0")],
        ),
    ] {
        let mut alone = [Server::start(&table, &settings)];
        // the first update claims; the steady state is what a stream pays
        alone[0].update("alone", 0);
        let one = take_turns(&mut alone, "alone", turns * 2);
        let [server] = alone;
        server.stop();
        let mut pair = [
            Server::start(&table, &settings),
            Server::start(&table, &settings),
        ];
        let two = take_turns(&mut pair, "shared", turns);
        for server in pair {
            server.stop();
        }
        println!(
            "{label}: alone p50 {:.1} ms, two in turn p50 {:.1} ms: {:.1}x",
            one.p50(),
            two.p50(),
            two.p50() / one.p50()
        );
        rows.push(format!(
            "| {label} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}x |",
            one.p50(),
            two.p50(),
            two.quantile(1.0),
            two.p50() / one.p50()
        ));
    }
    let report = format!(
        "# Two writers of one id\n\n`cargo bench -p integration-tests --bench alternation` on {}, \
         host `{}`, {:.0} s. Two `state-backend serve --stdio` processes update one id in turn, \
         {turns} updates each; one process alone updates its own id {} times (after a first \
         update). Medians of each update's time.\n\n\
         | settings | one process | two in turn | two, slowest | two / one |\n|---|---:|---:|---:|---:|\n{}\n",
        integration_tests::machine_summary(),
        host_binary()
            .strip_prefix(root())
            .unwrap_or(&host_binary())
            .display(),
        started.elapsed().as_secs_f64(),
        turns * 2,
        rows.join("\n")
    );
    let path = root().join("tests/benches/results/alternation.md");
    std::fs::write(&path, report).expect("writes the results");
    println!("wrote {}", path.display());
}
