//! The `state-backend` CLI, run as a user runs it, against ClickHouse.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use integration_tests::{SCHEMA, TestTable, json, printed, state_backend_binary};

struct Cli {
    table: std::sync::Arc<TestTable>,
}

/// What the host reads proxies from: no test inherits them from the shell that runs it.
const PROXY_VARIABLES: [&str; 8] = [
    "ALL_PROXY",
    "all_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
];

impl Cli {
    fn new(label: &str) -> Cli {
        Cli {
            table: TestTable::new(label),
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(state_backend_binary());
        command
            .env_remove("MELTANO_STATE_BACKEND_URI")
            .arg("--allow-loopback")
            .arg("--uri")
            .arg(self.table.target.uri())
            .args(["-s", &format!("schema={SCHEMA}")])
            .args(["-s", &format!("table={}", self.table.name)])
            .args(["-s", "lock_retry_seconds=0.2"]);
        for (var, _) in integration_tests::state_host::settings::env_variables() {
            command.env_remove(var);
        }
        // Meltano's variables for every setting and host option, which the CLI reads too.
        let names = clickhouse_state::settings::names().chain(
            integration_tests::state_host::settings::HOST_OPTIONS
                .iter()
                .map(|o| o.name),
        );
        for name in names {
            command.env_remove(integration_tests::state_host::settings::meltano_variable(
                name,
            ));
        }
        for var in PROXY_VARIABLES {
            command.env_remove(var);
        }
        // A collector of the developer's own hears nothing of the tests.
        for (var, _) in std::env::vars().filter(|(var, _)| var.starts_with("OTEL_")) {
            command.env_remove(var);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("runs")
    }

    fn run_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("writes");
        child.wait_with_output().expect("waits")
    }

    /// Runs a command that must succeed; returns its JSON output.
    fn ok(&self, args: &[&str]) -> serde_json::Value {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        json(&String::from_utf8_lossy(&output.stdout))
    }
}

/// A `lock --hold` child whose stderr is drained by a thread for its whole life: dropping the
/// pipe early would make its next log line fail with EPIPE and the holder exit with an error.
struct Holder {
    child: std::process::Child,
    stderr: std::thread::JoinHandle<String>,
}

impl Holder {
    /// Spawns the holder and waits until it says it holds the lock (it prints that on stderr).
    fn spawn(mut command: Command) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns the holder");
        let err = child.stderr.take().expect("stderr piped");
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if line.starts_with("locked") {
                    locked_tx.send(()).ok();
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let mut holder = Holder { child, stderr };
        if locked_rx.recv().is_err() {
            let status = holder.child.wait().expect("waits");
            let err = holder.stderr.join().unwrap_or_default();
            panic!("holder exited ({status}) before locking: {err}");
        }
        holder
    }

    /// Tells the holder to release now (SIGINT, as Ctrl-C) and waits for it to end; returns
    /// whether it succeeded and all it wrote on stderr.
    fn release(self) -> (bool, String) {
        let Holder { mut child, stderr } = self;
        let signalled = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("runs kill");
        assert!(signalled.success());
        let ok = child.wait().expect("waits").success();
        (ok, stderr.join().unwrap_or_default())
    }

    fn kill(self) {
        let Holder { mut child, stderr } = self;
        child.kill().ok();
        child.wait().ok();
        stderr.join().ok();
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn set_get_merge_list() {
    let cli = Cli::new("cli_basic");
    cli.ok(&[
        "set",
        "dev:tap-a-to-b",
        r#"{"singer_state":{"bookmarks":{"s1":{"ts":1}}}}"#,
    ]);
    cli.ok(&[
        "merge",
        "dev:tap-a-to-b",
        r#"{"singer_state":{"bookmarks":{"s2":{"ts":2}}}}"#,
    ]);
    assert_eq!(
        cli.ok(&["get", "dev:tap-a-to-b"]),
        json(r#"{"singer_state":{"bookmarks":{"s1":{"ts":1},"s2":{"ts":2}}}}"#)
    );
    assert_eq!(
        cli.ok(&["get", "--raw", "dev:tap-a-to-b"]),
        json(
            r#"{"completed":{"singer_state":{"bookmarks":{"s1":{"ts":1}}}},"partial":{"singer_state":{"bookmarks":{"s2":{"ts":2}}}}}"#
        )
    );
    cli.ok(&["set", "prod:tap-a-to-b", r#"{"singer_state":{}}"#]);
    assert_eq!(
        cli.ok(&["list"]),
        json(r#"["dev:tap-a-to-b","prod:tap-a-to-b"]"#)
    );
    assert_eq!(
        cli.ok(&["list", "--pattern", "prod:*"]),
        json(r#"["prod:tap-a-to-b"]"#)
    );
    assert_eq!(cli.ok(&["get", "missing"]), json("{}"));
}

#[test]
fn set_reads_a_file_or_stdin() {
    let cli = Cli::new("cli_input");
    let file = std::env::temp_dir().join(format!("{}.json", cli.table.name));
    std::fs::write(&file, r#"{"singer_state":{"from":"file"}}"#).unwrap();
    cli.ok(&["set", "a", "--input-file", file.to_str().unwrap()]);
    assert_eq!(
        cli.ok(&["get", "a"]),
        json(r#"{"singer_state":{"from":"file"}}"#)
    );
    let output = cli.run_stdin(&["set", "b"], r#"{"singer_state":{"from":"stdin"}}"#);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        cli.ok(&["get", "b"]),
        json(r#"{"singer_state":{"from":"stdin"}}"#)
    );
    std::fs::remove_file(file).ok();
}

#[test]
fn copy_move_clear() {
    let cli = Cli::new("cli_copy");
    cli.ok(&["set", "src", r#"{"singer_state":{"v":1}}"#]);
    cli.ok(&["copy", "src", "copied"]);
    assert_eq!(
        cli.ok(&["get", "copied"]),
        json(r#"{"singer_state":{"v":1}}"#)
    );
    cli.ok(&["move", "src", "moved"]);
    assert_eq!(cli.ok(&["list"]), json(r#"["copied","moved"]"#));
    assert_eq!(cli.ok(&["clear", "copied"])["cleared"], 1);
    assert_eq!(cli.ok(&["list"]), json(r#"["moved"]"#));
    cli.ok(&["set", "other", r#"{"singer_state":{}}"#]);
    assert_eq!(cli.ok(&["clear", "--all"]), json(r#"{"cleared":2}"#));
    assert_eq!(cli.ok(&["list"]), json("[]"));
}

#[test]
fn export_then_import() {
    let cli = Cli::new("cli_export");
    cli.ok(&["set", "a", r#"{"singer_state":{"a":1}}"#]);
    cli.ok(&["merge", "b", r#"{"singer_state":{"b":2}}"#]);
    let exported = cli.ok(&["export"]);
    assert_eq!(
        exported,
        json(
            r#"{"a":{"completed":{"singer_state":{"a":1}},"partial":{}},"b":{"completed":{},"partial":{"singer_state":{"b":2}}}}"#
        )
    );
    cli.ok(&["clear", "--all"]);
    let output = cli.run_stdin(&["import"], &exported.to_string());
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout)),
        json(r#"{"imported":2}"#)
    );
    assert_eq!(cli.ok(&["export"]), exported);
    assert_eq!(
        cli.ok(&["export", "--pattern", "a"])
            .as_object()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn errors_are_one_line_on_stderr_with_an_exit_code() {
    let cli = Cli::new("cli_errors");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["set", "x", "not json"], 2, "not valid JSON"),
        (&["set", "x", "[1]"], 2, "JSON object"),
        (
            &["set", "x", r#"{"no_singer_state":1}"#],
            2,
            "singer_state not found",
        ),
        (
            &["set", "", r#"{"singer_state":{}}"#],
            2,
            "state id is empty",
        ),
        (&["list", "--pattern", "a[b"], 2, "unbalanced"),
        (
            &["copy", "nothing-here", "x"],
            2,
            "no state for 'nothing-here'",
        ),
        (&["-s", "port=abc", "list"], 2, "invalid port 'abc'"),
        (
            &[
                "--uri",
                "clickhouse://default:@127.0.0.1:1/default",
                "-s",
                "retry_budget_seconds=0",
                "list",
            ],
            4,
            "cannot reach http://127.0.0.1:1",
        ),
    ];
    for (args, code, needle) in cases {
        let output = cli.run(args);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(*code), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    // nothing was written by any of them
    assert_eq!(cli.table.raw_rows(), 0);
}

/// `history`, `get --at`, `diff`, `restore` and `clear-stream`, as a user runs them after a bad
/// run; and each one's bad input: an error on stderr, exit code 2, nothing written.
#[test]
fn the_history_commands_read_restore_and_reset_one_stream() {
    let cli = Cli::new("cli_history");
    let id = "dev:tap-to-target";
    let state = |orders: u64| {
        format!(
            r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{orders}}},"users":{{"id":1}}}}}}}}"#
        )
    };
    cli.ok(&["set", id, &state(1)]);
    cli.ok(&["merge", id, &state(99)]);
    let history = cli.ok(&["history", id]);
    // Who wrote each version: the CLI's command, its own process, this machine, this version.
    let this = integration_tests::state_host::this_process("", "", "");
    for (entry, command) in history
        .as_array()
        .expect("a list")
        .iter()
        .zip(["cli merge", "cli set"])
    {
        let who = &entry["who"];
        assert_eq!(who["command"], command, "{entry}");
        assert_eq!(who["host"], this.host.as_str(), "{entry}");
        assert_eq!(
            who["backend_version"],
            this.backend_version.as_str(),
            "{entry}"
        );
        let pid = who["pid"].as_u64().expect("a pid");
        assert!(pid > 0 && pid != u64::from(this.pid), "{entry}");
        assert_eq!(
            (who["run_id"].as_str(), who["meltano_version"].as_str()),
            (Some(""), Some(""))
        );
    }
    let versions: Vec<u64> = history
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| e["version"].as_u64().expect("a version"))
        .collect();
    let [bad, good] = versions[..] else {
        panic!("{history}")
    };
    assert_eq!(history[0]["op"], "update");
    assert_eq!(history[1]["op"], "set");
    assert_eq!(history[1]["state"], json(&state(1)));
    assert!(
        history[0]["time"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    // As it was, by version and by time.
    assert_eq!(
        cli.ok(&["get", id, "--at", &good.to_string()]),
        json(&state(1))
    );
    let time = history[1]["time"].as_str().expect("a time");
    assert_eq!(cli.ok(&["get", id, "--at", time]), json(&state(1)));
    let diff = cli.ok(&["diff", id, &good.to_string(), &bad.to_string()]);
    assert_eq!(
        diff["bookmarks"],
        serde_json::json!({"orders": {"from": {"id": 1}, "to": {"id": 99}}})
    );
    assert_eq!(diff["from"]["version"], good);

    let rows = |cli: &Cli| {
        cli.table
            .target
            .must(&format!(
                "SELECT count() FROM {SCHEMA}.{}_history",
                cli.table.name
            ))
            .trim()
            .to_string()
    };
    let before = rows(&cli);
    let cases: &[(&[&str], &str)] = &[
        (&["get", id, "--at", "5"], "no version 5 of"),
        (
            &["get", id, "--at", "2999-01-01T00:00:00Z"],
            "is in the future",
        ),
        (&["get", id, "--at", "yesterday"], "neither a version"),
        (
            &["get", "never-written", "--at", &good.to_string()],
            "the history has none",
        ),
        (&["history", id, "--limit", "0"], "the limit must be from 1"),
        (&["diff", id, "5", &bad.to_string()], "no version 5 of"),
        (&["restore", id, "--to", "5"], "no version 5 of"),
        (
            &["clear-stream", id, "payments"],
            "its streams are: orders, users",
        ),
        (
            &["-s", "history=false", "history", id],
            "the history is off",
        ),
    ];
    for (args, needle) in cases {
        let output = cli.run(args);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(rows(&cli), before, "no bad input wrote anything");
    assert_eq!(cli.ok(&["history", "never-written"]), serde_json::json!([]));

    let restored = cli.ok(&["restore", id, "--to", &good.to_string()]);
    assert_eq!(restored["replaced"], json(&state(99)));
    assert_eq!(restored["restored"]["op"], "restore");
    assert_eq!(cli.ok(&["get", id]), json(&state(1)));
    let cleared = cli.ok(&["clear-stream", id, "orders"]);
    assert_eq!(cleared["cleared"], serde_json::json!(["orders"]));
    let now = cli.ok(&["get", id]);
    assert_eq!(
        now,
        json(r#"{"singer_state":{"bookmarks":{"users":{"id":1}}}}"#)
    );
    let ops: Vec<String> = cli
        .ok(&["history", id])
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| e["op"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ops, ["clear-stream", "restore", "update", "set"]);
}

/// Beside Meltano, the CLI reads Meltano's variables: the table and the loopback allowance here
/// come only from `MELTANO_STATE_BACKEND_CLICKHOUSE_*`.
#[test]
fn the_cli_reads_meltanos_variables() {
    let cli = Cli::new("cli_meltano_vars");
    cli.ok(&["set", "dev:x", r#"{"singer_state":{}}"#]);
    // The test's command without its flags: the URI, schema, table and allowance from Meltano's
    // variables only.
    let bare = || {
        let template = cli.command();
        let mut command = Command::new(template.get_program());
        for (var, value) in template.get_envs() {
            match value {
                Some(value) => command.env(var, value),
                None => command.env_remove(var),
            };
        }
        command
            .env("MELTANO_STATE_BACKEND_URI", cli.table.target.uri())
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", SCHEMA)
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE", &cli.table.name);
        command
    };
    let output = bare()
        .env("MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK", "true")
        .arg("list")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout)),
        serde_json::json!(["dev:x"])
    );
    // Without Meltano's allowance, or with the CLI's own variable saying no, loopback is
    // refused as ever.
    let refused = |output: std::process::Output| {
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(4), "{err}");
        assert!(err.contains("--allow-loopback"), "{err}");
    };
    refused(
        bare()
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK", "false")
            .arg("list")
            .output()
            .expect("runs"),
    );
    refused(
        bare()
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK", "true")
            .env("STATE_BACKEND_ALLOW_LOOPBACK", "false")
            .arg("list")
            .output()
            .expect("runs"),
    );
}

#[test]
fn a_wrong_password_never_appears_in_any_output() {
    let cli = Cli::new("cli_password");
    let secret = "Sup3r-s3cret-pw-91c2";
    let uri = cli.table.target.uri_with_password(secret);
    let runs: Vec<Output> = vec![
        cli.command()
            .args(["--uri", &uri, "list"])
            .output()
            .unwrap(),
        cli.command()
            .args(["--uri", &uri, "get", "x"])
            .output()
            .unwrap(),
        cli.command()
            .args(["--uri", &uri, "set", "x", r#"{"singer_state":{}}"#])
            .output()
            .unwrap(),
        cli.command()
            .args([
                "--uri",
                &uri,
                "--log",
                "debug",
                "merge",
                "x",
                r#"{"singer_state":{}}"#,
            ])
            .output()
            .unwrap(),
        cli.command()
            .args([
                "-s",
                &format!("password={secret}"),
                "--log",
                "debug",
                "clear",
                "--all",
            ])
            .output()
            .unwrap(),
        cli.command()
            .env("CLICKHOUSE_PASSWORD", secret)
            .args(["--log", "debug", "export"])
            .output()
            .unwrap(),
        // Meltano's variable, read beside Meltano, and the history's commands.
        cli.command()
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", secret)
            .args(["--log", "debug", "history", "x"])
            .output()
            .unwrap(),
        cli.command()
            .env("MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", secret)
            .args(["--log", "debug", "restore", "x", "--to", "1"])
            .output()
            .unwrap(),
    ];
    for output in &runs {
        assert_eq!(output.status.code(), Some(3), "{}", stderr(output));
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            stderr(output)
        );
        assert!(all.contains("unauthorized"), "{all}");
        assert!(!all.contains(secret), "password leaked: {all}");
    }
}

#[test]
fn settings_flag_beats_environment_beats_uri() {
    let cli = Cli::new("cli_precedence");
    let other = TestTable::new("cli_precedence_env");
    // The URI names no table; the environment names `other`; the flag names cli.table.
    let output = cli
        .command()
        .env("CLICKHOUSE_TABLE", &other.name)
        .args(["set", "via-flag", r#"{"singer_state":{}}"#])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(cli.table.raw_rows(), 1);
    // Without the flag, the environment variable wins over the URI's default table.
    let mut command = Command::new(state_backend_binary());
    command
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .arg("--allow-loopback")
        .env("CLICKHOUSE_TABLE", &other.name)
        .env("CLICKHOUSE_SCHEMA", SCHEMA)
        .args([
            "--uri",
            &cli.table.target.uri(),
            "set",
            "via-env",
            r#"{"singer_state":{}}"#,
        ]);
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(other.raw_rows(), 1);
    assert_eq!(cli.table.raw_rows(), 1);
}

#[test]
fn two_processes_contend_for_one_lock() {
    let cli = Cli::new("cli_lock");
    cli.ok(&["migrate"]);
    let mut command = cli.command();
    // Held until told to release (SIGINT), however slow the processes below are to start.
    command.args(["lock", "shared", "--hold", "300"]);
    let holder = Holder::spawn(command);
    let waiter = cli
        .command()
        .args([
            "-s",
            "lock_timeout_seconds=1",
            "merge",
            "shared",
            r#"{"singer_state":{}}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(waiter.status.code(), Some(5), "{}", stderr(&waiter));
    // It names the holder's lease end and the settings that govern the wait and the lease.
    let said = stderr(&waiter);
    for part in [
        "is locked by",
        "lease until",
        "lock_timeout_seconds",
        "lock_lease_seconds",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    let info = cli.ok(&["lock-info", "shared"]);
    assert_eq!(info["locked"], true, "{info}");
    assert!(info["token"].as_u64().unwrap() >= 1);
    assert!(waiter_names_holder(
        &stderr(&waiter),
        info["owner"].as_str().unwrap()
    ));
    let (held_ok, held_err) = holder.release();
    assert!(held_ok, "holder failed: {held_err}");
    assert_eq!(cli.ok(&["lock-info", "shared"])["locked"], false);
    // Once released, the same merge goes through.
    cli.ok(&["merge", "shared", r#"{"singer_state":{"after":1}}"#]);
    assert_eq!(
        cli.ok(&["get", "shared"]),
        json(r#"{"singer_state":{"after":1}}"#)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_flags_reach_a_private_ca_with_mutual_tls() {
    use integration_tests::tls::{Pki, TlsProxy};
    let cli = Cli::new("cli_tls");
    let pki = Pki::new("cli");
    let server = pki.server("server", &["localhost"], false);
    let client = pki.client("cli-client");
    let proxy = TlsProxy::start(pki.server_config(&server, true), cli.table.target.clone()).await;
    let target = &cli.table.target;
    let uri = target.secure_uri("localhost", proxy.port());
    let run = |extra: &[&str]| {
        let mut command = cli.command();
        command.args(["--uri", &uri]).args(extra);
        command
            .args(["set", "tls", r#"{"singer_state":{"tls":true}}"#])
            .output()
            .unwrap()
    };
    let ca = pki.ca_path();
    let (cert, key) = (client.cert_path.clone(), client.key_path.clone());
    let output = run(&[
        "--ca-bundle",
        ca.to_str().unwrap(),
        "--client-cert",
        cert.to_str().unwrap(),
        "--client-key",
        key.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(cli.table.raw_rows(), 1);
    // Without the CA: a certificate error. Without the client identity: refused.
    let output = run(&[]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("certificate was rejected"),
        "{}",
        stderr(&output)
    );
    let output = run(&["--ca-bundle", ca.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(stderr(&output).contains("TLS"), "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_exports_traces_and_metrics_when_the_standard_variables_say_so() {
    let receiver = integration_tests::otlp::Receiver::start().await;
    let cli = Cli::new("cli_otel");
    let mut command = cli.command();
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .args(["set", "dev:otel", r#"{"singer_state":{}}"#]);
    // The exporter's last export happens as the process exits: the receiver has it by then.
    let out = tokio::task::spawn_blocking(move || command.output().expect("runs"))
        .await
        .expect("the CLI's task");
    assert!(out.status.success(), "{}", printed(&out));
    let names: Vec<String> = receiver
        .spans()
        .iter()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect();
    // The CLI's `set` is Meltano's: under the lock.
    for name in ["acquire_lock", "set_locked", "release", "clickhouse INSERT"] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    assert!(
        receiver
            .metrics()
            .iter()
            .any(|m| m["name"] == "state_backend.calls"),
        "{:#?}",
        receiver.exports()
    );
    assert!(
        receiver
            .exports()
            .iter()
            .all(|e| e.content_type == "application/json"),
        "as the variable says"
    );
    // The protocol's default is http/protobuf.
    let protobuf = integration_tests::otlp::Receiver::start().await;
    let mut command = cli.command();
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", protobuf.endpoint())
        .args(["get", "dev:otel"]);
    let out = tokio::task::spawn_blocking(move || command.output().expect("runs"))
        .await
        .expect("the CLI's task");
    assert!(out.status.success(), "{}", printed(&out));
    let exports = protobuf.exports();
    assert!(!exports.is_empty());
    assert!(
        exports
            .iter()
            .all(|e| e.content_type == "application/x-protobuf"),
        "{exports:#?}"
    );
    // A value meant for another tool of the environment (gRPC) is named in a warning, and the
    // state backend works on without traces.
    let unheard = integration_tests::otlp::Receiver::start().await;
    let mut grpc = cli.command();
    grpc.env("OTEL_EXPORTER_OTLP_ENDPOINT", unheard.endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .args(["set", "dev:otel-grpc", r#"{"singer_state":{}}"#]);
    let warned = tokio::task::spawn_blocking(move || grpc.output().expect("runs"))
        .await
        .expect("the CLI's task");
    assert!(warned.status.success(), "{}", printed(&warned));
    let warning = stderr(&warned);
    assert!(
        warning.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && warning.contains("http/protobuf"),
        "{warning}"
    );
    assert!(unheard.exports().is_empty());
    let listed = cli.run(&["list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("dev:otel-grpc"));
}

fn waiter_names_holder(err: &str, owner: &str) -> bool {
    err.contains(owner)
}

#[test]
fn unlock_breaks_a_held_lock() {
    let cli = Cli::new("cli_unlock");
    // A holder that holds for a long time...
    let mut command = cli.command();
    command.args(["lock", "stuck", "--hold", "60"]);
    let holder = Holder::spawn(command);
    assert_eq!(cli.ok(&["lock-info", "stuck"])["locked"], true);
    // ...is broken by an operator, and the next merge goes through at once.
    assert_eq!(cli.ok(&["unlock", "stuck"])["unlocked"], true);
    assert_eq!(cli.ok(&["lock-info", "stuck"])["locked"], false);
    cli.ok(&[
        "-s",
        "lock_timeout_seconds=1",
        "merge",
        "stuck",
        r#"{"singer_state":{"x":1}}"#,
    ]);
    assert_eq!(cli.ok(&["unlock", "stuck"])["unlocked"], false);
    holder.kill();
}

#[test]
fn serve_answers_json_lines_with_one_instance() {
    use std::io::{BufRead, BufReader};
    let cli = Cli::new("cli_serve");
    let mut server = cli
        .command()
        .args(["-s", "lock_timeout_seconds=7", "serve", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = server.stdin.take().unwrap();
    let mut output = BufReader::new(server.stdout.take().unwrap());
    let mut first = String::new();
    output.read_line(&mut first).unwrap();
    assert_eq!(
        json(&first)["ready"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{first}"
    );
    // How long the caller should wait for an answer: the lock timeout and a minute.
    assert_eq!(json(&first)["ready"]["call_deadline_ms"], 67_000, "{first}");
    let mut ask = |request: serde_json::Value| {
        writeln!(input, "{request}").unwrap();
        input.flush().unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        json(&line)
    };
    assert_eq!(
        ask(serde_json::json!({"id": 1, "method": "ping"}))["result"],
        "pong"
    );
    for (i, key) in ["a", "b"].iter().enumerate() {
        let partial = format!(r#"{{"singer_state":{{"{key}":{i}}}}}"#);
        let answer = ask(
            serde_json::json!({"id": 2 + i, "method": "update", "params": {"state_id": "s", "partial": partial}}),
        );
        assert!(answer["error"].is_null(), "{answer}");
    }
    let got = ask(serde_json::json!({"id": 9, "method": "get", "params": {"state_id": "s"}}));
    assert_eq!(
        json(got["result"]["partial"].as_str().unwrap()),
        json(r#"{"singer_state":{"a":0,"b":1}}"#)
    );
    let lock =
        ask(serde_json::json!({"id": 10, "method": "acquire_lock", "params": {"state_id": "s"}}));
    assert_eq!(lock["result"]["lock"], 1);
    // another process cannot take it, and is told who holds it
    let other = cli
        .command()
        .args([
            "-s",
            "lock_timeout_seconds=0.5",
            "merge",
            "s",
            r#"{"singer_state":{}}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(5), "{}", stderr(&other));
    let bad = ask(
        serde_json::json!({"id": 11, "method": "update", "params": {"state_id": "s", "partial": "[1]"}}),
    );
    assert_eq!(bad["error"]["kind"], "invalid-input");
    assert_eq!(bad["id"], 11);
    // closing stdin ends the server and releases what it held
    drop(input);
    assert!(server.wait().unwrap().success());
    assert_eq!(cli.ok(&["lock-info", "s"])["locked"], false);
}

/// SIGTERM or SIGINT to `serve` (its input still open, so the end of input is not what stops
/// it) gives back the lock an `update` kept, then exits cleanly.
#[cfg(unix)]
#[test]
fn a_signal_to_serve_gives_back_the_kept_lock_before_it_exits() {
    use std::io::{BufRead, BufReader};
    for signal in ["TERM", "INT"] {
        let cli = Cli::new(&format!("cli_signal_{}", signal.to_lowercase()));
        let mut server = cli
            .command()
            .args(["serve", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = server.stdin.take().unwrap();
        let mut output = BufReader::new(server.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert!(json(&line)["ready"].is_object(), "{line}");
        let update = serde_json::json!({"id": 1, "method": "update",
            "params": {"state_id": "s", "partial": r#"{"singer_state":{"a":1}}"#}});
        writeln!(input, "{update}").unwrap();
        input.flush().unwrap();
        line.clear();
        output.read_line(&mut line).unwrap();
        assert!(json(&line)["error"].is_null(), "{line}");
        assert_eq!(
            cli.ok(&["lock-info", "s"])["locked"],
            true,
            "serve keeps the lock after an update"
        );
        let killed = Command::new("kill")
            .args([&format!("-{signal}"), &server.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = server.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "SIG{signal}: serve did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "SIG{signal}: {status:?}");
        assert_eq!(
            cli.ok(&["lock-info", "s"])["locked"],
            false,
            "SIG{signal}: the kept lock was given back"
        );
        drop(input);
    }
}

#[test]
fn help_names_every_setting_the_component_accepts() {
    let out = Command::new(state_backend_binary())
        .arg("--help")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let listed = help
        .split("A setting that overrides the URI (repeatable):")
        .nth(1)
        .expect("the --setting help");
    for name in clickhouse_state::settings::names() {
        assert!(
            listed.contains(name),
            "--setting help lacks {name}: {listed}"
        );
    }
}

#[test]
fn serve_ends_its_session_when_a_call_traps_its_instance() {
    // A trapped instance (the evil component's panic here; a deadline or a CPU budget does the
    // same) can answer nothing more: the session ends, so that the caller starts another.
    let cli = Cli::new("cli_serve_trap");
    let evil =
        integration_tests::state_host::default_component_path().with_file_name("evil_guest.wasm");
    let evil = evil.to_string_lossy();
    let requests = concat!(
        r#"{"id": 1, "method": "get", "params": {"state_id": "panic"}}"#,
        "\n",
        r#"{"id": 2, "method": "ping"}"#,
        "\n",
    );
    let out = cli.run_stdin(&["--component", &evil, "serve", "--stdio"], requests);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "the ready line and one answer: {stdout}");
    assert!(json(lines[0])["ready"].is_object(), "{stdout}");
    assert_eq!(json(lines[1])["error"]["kind"], "panicked", "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used again"), "{stderr}");
}

#[test]
fn serve_that_cannot_start_says_which_setting_is_wrong_on_its_first_line() {
    let cli = Cli::new("cli_serve_refused");
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["-s", "lock_mode=sometimes"],
            "lock_mode",
            "'lock_mode' must be",
        ),
        (&["-s", "user="], "user", "missing user"),
        (&["--uri", "ftp://x/y"], "uri", "unknown URI scheme"),
        (
            &["--ca-bundle", "/nonexistent/ca.pem"],
            "ca_bundle",
            "/nonexistent/ca.pem",
        ),
    ];
    for (args, setting, says) in cases {
        let out = cli.run_stdin(&[args, &["serve", "--stdio"]].concat(), "");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let first = String::from_utf8_lossy(&out.stdout);
        let error = &json(first.lines().next().unwrap_or(""))["error"];
        assert_eq!(error["kind"], "invalid-config", "{args:?}: {first}");
        assert_eq!(error["setting"], setting, "{args:?}: {first}");
        let message = error["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{args:?}: {message}");
        // Reported once, on stdout: nothing for the caller's log to repeat.
        assert!(out.stderr.is_empty(), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn migrate_print_shows_the_ddl_for_each_kind_and_sends_nothing() {
    // A name that resolves nowhere, with the tripwire armed: any attempt to resolve or connect
    // is recorded (and refused, so nothing leaves this machine).
    let print = |extra: &[&str]| {
        let trips = integration_tests::TripwireLog::new("migrate-print");
        let output = trips
            .arm(&mut Command::new(state_backend_binary()))
            .env_remove("MELTANO_STATE_BACKEND_URI")
            .args([
                "--uri",
                "clickhouse://u:fake-pw-1@clickhouse.example.invalid/default",
            ])
            .args(extra)
            .args(["migrate", "--print"])
            .output()
            .expect("runs");
        assert!(output.status.success(), "{}", stderr(&output));
        trips.assert_untouched();
        assert!(!stderr(&output).contains("fake-pw-1"));
        let text = String::from_utf8(output.stdout).expect("utf-8");
        assert!(!text.contains("fake-pw-1"));
        text
    };
    let single = print(&[]);
    assert!(single.starts_with("-- The schema for one server or ClickHouse Cloud"));
    // The database, the state table, the two lock tables, the history, its view and its TTL as
    // set now, and who wrote.
    assert_eq!(single.matches(";\n").count(), 8, "{single}");
    assert!(single.contains(
        "CREATE TABLE IF NOT EXISTS `meltano`.`state_writers` (writer String, run_id String, "
    ));
    assert!(single.contains(
        "ALTER TABLE `meltano`.`state_history` MODIFY TTL toDateTime(updated_at) + INTERVAL 90 DAY \
         SETTINGS materialize_ttl_after_modify = 0;"
    ));
    assert!(
        single
            .contains("CREATE MATERIALIZED VIEW IF NOT EXISTS `meltano`.`state_history_to_state`")
    );
    assert!(single.contains("ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id;"));
    assert!(!single.contains("ON CLUSTER"));
    let cluster = print(&["-s", "cluster=prod", "-s", "table=t"]);
    assert!(cluster.contains("a self-managed replicated cluster ('prod')"));
    assert!(cluster.contains("CREATE DATABASE IF NOT EXISTS `meltano` ON CLUSTER `prod`;"));
    assert!(cluster.contains("`meltano`.`t_lock_log` ON CLUSTER `prod`"));
    assert_eq!(
        cluster.matches("ENGINE = Replicated").count(),
        5,
        "{cluster}"
    );
    // Without the history, the original backend's schema, the lock log and who wrote.
    let without = print(&["-s", "history=false"]);
    assert_eq!(without.matches(";\n").count(), 5, "{without}");
    assert!(!without.contains("history"), "{without}");
    // The DDL is the loaded component's: the hostile guest gives none, which is an error.
    let evil =
        integration_tests::state_host::default_component_path().with_file_name("evil_guest.wasm");
    let output = Command::new(state_backend_binary())
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .arg("--component")
        .arg(&evil)
        .args([
            "--uri",
            "clickhouse://u:fake-pw-1@clickhouse.example.invalid/default",
        ])
        .args(["migrate", "--print"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("no schema"), "{}", stderr(&output));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("CREATE"));
    // a bad cluster name is bad input
    let output = Command::new(state_backend_binary())
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .args(["-s", "cluster=a;b", "migrate", "--print"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cluster name"),
        "{}",
        stderr(&output)
    );
}

/// `--refuse-private` refuses a ClickHouse on a private network; the address is a literal in
/// 10/8, refused after "resolution" and before any connection is tried: the tripwire under the
/// policy, which would have stopped the connection, was not reached.
#[test]
fn refuse_private_refuses_a_private_address_before_connecting() {
    let tripwire = integration_tests::TripwireLog::new("refuse_private");
    let output = tripwire
        .arm(&mut Command::new(state_backend_binary()))
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .args(["--refuse-private", "--uri"])
        .arg("clickhouse://default:@10.255.255.1:8123/default")
        .args(["get", "x"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("its address is refused"), "{stderr}");
    assert!(stderr.contains("--refuse-private"), "{stderr}");
    tripwire.assert_untouched();
}

#[test]
fn a_refused_loopback_address_names_the_flag_that_allows_it() {
    let cli = Cli::new("cli_loopback");
    let output = Command::new(state_backend_binary())
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .arg("--uri")
        .arg(cli.table.target.uri())
        .args(["get", "x"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !cli.table.target.host.starts_with("127.") && cli.table.target.host != "localhost" {
        // A ClickHouse elsewhere is not loopback: the call goes through.
        assert!(output.status.success(), "{stderr}");
        return;
    }
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("its address is refused"), "{stderr}");
    assert!(stderr.contains("pass --allow-loopback"), "{stderr}");
}

/// The functions of one resource in the contract, in snake case.
fn wit_functions(wit: &str, resource: &str) -> Vec<String> {
    let start = wit
        .find(&format!("resource {resource} {{"))
        .unwrap_or_else(|| panic!("no resource {resource}"));
    let body = &wit[start..];
    let body = &body[..body.find("\n    }").expect("the resource ends")];
    body.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(':')?;
            (rest.trim_start().starts_with("func(")
                || rest.trim_start().starts_with("static func("))
            .then(|| name.trim().replace('-', "_"))
        })
        .collect()
}

/// Every operation of the contract is in each layer that must carry it: the guest's glue
/// (`component.rs`), the host's `Backend` (the store's operations and what a holder does with a
/// lock), and the hostile guest, which implements the whole contract. With `serve` (the test
/// below) and the compiler, an operation added to the WIT fails the build or a test until each
/// layer has it; the CLI's commands are not one per operation, and Meltano calls only some.
#[test]
fn every_operation_of_the_contract_is_in_each_layer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let wit = read("wit/state-backend.wit");
    let store = wit_functions(&wit, "store");
    let lock = wit_functions(&wit, "lock");
    assert!(store.len() >= 15 && lock.len() >= 4, "{store:?} {lock:?}");
    let backend = read("host/src/backend.rs");
    let glue = read("guest/src/component.rs");
    let evil = read("tests/guests/evil/src/lib.rs");
    for name in store.iter().chain(&lock) {
        assert!(
            glue.contains(&format!("fn {name}(")),
            "component.rs lacks {name}"
        );
        assert!(
            evil.contains(&format!("fn {name}(")),
            "the hostile guest lacks {name}"
        );
    }
    // The lock's accessors are its fields (`Lock::token`) or `lock_details` (`info`).
    let accessors = ["state_id", "token", "info"];
    for name in store.iter().chain(&lock) {
        if !accessors.contains(&name.as_str()) {
            assert!(
                backend.contains(&format!("async fn {name}(")),
                "Backend lacks {name}"
            );
        }
    }
}

/// `serve`'s methods are the contract's operations (the store's, and what a caller does with a
/// lock it holds), and the Meltano adapter calls nothing else.
#[test]
fn the_methods_are_the_contracts_operations_and_the_adapter_calls_only_them() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(state_backend_binary())
        .arg("methods")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let mut methods: Vec<String> = serde_json::from_slice(&output.stdout).unwrap();
    methods.sort();

    let wit = std::fs::read_to_string(root.join("wit/state-backend.wit")).unwrap();
    // `serve` opens its store itself and calls `idle` and `close` itself; a lock's accessors
    // are answered by `acquire_lock` (its token) and `lock_info` (the rest). `schema` is the
    // CLI's `migrate --print`, and `diagnose` its `doctor`: an operator's, printed, never the
    // adapter's.
    let host_managed = [
        "open", "idle", "close", "state_id", "token", "info", "schema", "diagnose",
    ];
    let mut expected: Vec<String> = wit_functions(&wit, "store")
        .into_iter()
        .chain(wit_functions(&wit, "lock"))
        .filter(|f| !host_managed.contains(&f.as_str()))
        .chain(["ping".to_string()])
        .collect();
    expected.sort();
    assert_eq!(methods, expected);

    let manager =
        std::fs::read_to_string(root.join("python/src/meltano_clickhouse_state/manager.py"))
            .unwrap();
    let mut called = 0;
    for quoted in manager.split("call(\"").skip(1) {
        let name = &quoted[..quoted.find('"').expect("a closing quote")];
        assert!(methods.iter().any(|m| m == name), "manager.py calls {name}");
        called += 1;
    }
    assert!(called >= 10, "found {called} calls in manager.py");
}

/// `--timings` names each part of a command's time on stderr, as JSON, and changes nothing
/// else: stdout is the command's own output.
#[test]
fn timings_name_each_part_of_a_call() {
    let cli = Cli::new("cli_timings");
    cli.ok(&["set", "t:1", r#"{"singer_state": {"a": 1}}"#]);
    let started = std::time::Instant::now();
    let output = cli.run(&["--timings", "get", "t:1"]);
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout)),
        serde_json::json!({"singer_state": {"a": 1}})
    );
    let line = stderr(&output)
        .lines()
        .find(|l| l.contains("timings_ms"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no timings: {}", stderr(&output)));
    let timings = json(&line);
    let parts = timings["timings_ms"].as_object().expect("an object");
    let names: Vec<&str> = parts.keys().map(String::as_str).collect();
    assert_eq!(names, ["call", "close", "load", "open"]);
    let ms: Vec<f64> = parts
        .values()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    assert_eq!(ms.len(), 4);
    // Each part is its own lap: none is empty, and together they fit in the process's time.
    assert!(ms.iter().all(|&ms| ms > 0.0), "{parts:?}");
    assert!(
        ms.iter().sum::<f64>() < wall_ms,
        "{parts:?} in {wall_ms} ms"
    );
    // Without the flag, nothing is said.
    let output = cli.run(&["get", "t:1"]);
    assert!(!stderr(&output).contains("timings_ms"));
}

/// A URI given as a flag beats the environment for the parts it states, as clickhouse-client's
/// flags do: a `CLICKHOUSE_PORT` left in a shell does not send it elsewhere. From its variable
/// (as the Meltano adapter passes it), the URI still yields to them, as the original documents.
#[test]
fn a_uri_flag_beats_a_port_variable_and_a_uri_variable_does_not() {
    let cli = Cli::new("cli_uri_flag");
    let uri = cli.table.target.uri();
    let stated = clickhouse_state::uri::parse(&uri).expect("the target's URI");
    assert!(
        stated.port.is_some(),
        "the target's URI states its port: {uri}"
    );
    let out = cli
        .command()
        .env("CLICKHOUSE_PORT", "1")
        .args(["set", "flag-wins", r#"{"singer_state":{"a":1}}"#])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", printed(&out));
    assert_eq!(
        cli.ok(&["get", "flag-wins"]),
        json(r#"{"singer_state":{"a":1}}"#)
    );

    // The same URI from its variable: the port variable wins, and port 1 of this machine
    // refuses (no retry, so the refusal is the answer).
    let mut command = Command::new(state_backend_binary());
    for (var, _) in integration_tests::state_host::settings::env_variables() {
        command.env_remove(var);
    }
    for var in PROXY_VARIABLES {
        command.env_remove(var);
    }
    let out = command
        .env("MELTANO_STATE_BACKEND_URI", &uri)
        .env("CLICKHOUSE_PORT", "1")
        .args(["--allow-loopback", "-s", "retries=0", "get", "flag-wins"])
        .output()
        .expect("runs");
    assert!(!out.status.success(), "{}", printed(&out));
    let text = printed(&out);
    let port_1 = format!("{}:1", cli.table.target.host);
    let at = text.find(&port_1).unwrap_or_else(|| panic!("{text}"));
    assert!(text.contains("unreachable"), "{text}");
    // Port 1, not a port that starts with 1.
    let after = text[at + port_1.len()..].chars().next();
    assert!(!after.is_some_and(|c| c.is_ascii_digit()), "{text}");
}

/// The proxy variables are honoured: plain http goes to the proxy in the absolute form, https
/// through a `CONNECT` tunnel with the proxy's credentials, TLS checked inside it; `NO_PROXY`
/// and `--ignore-proxy-env` go direct. The proxy is on loopback and forwards only there.
#[tokio::test(flavor = "multi_thread")]
async fn proxies_from_the_environment_carry_http_and_https() {
    use integration_tests::proxy::ForwardProxy;
    use integration_tests::tls::{Pki, TlsProxy};
    let cli = Cli::new("cli_proxy");
    let proxy = ForwardProxy::start().await;
    let target = &cli.table.target;
    if !target.host.starts_with("127.") && target.host != "localhost" {
        // The test proxy forwards only to this machine.
        return;
    }
    let out = cli
        .command()
        .env("HTTP_PROXY", proxy.url())
        .args(["set", "via-proxy", r#"{"singer_state":{"p":1}}"#])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", printed(&out));
    let http_target = format!("http://{}:{}/", target.host, target.port);
    let asked = proxy.asked();
    assert!(
        asked.iter().any(|a| a.line.contains(&http_target)),
        "{asked:?}"
    );
    assert_eq!(cli.table.raw_rows(), 1);

    let pki = Pki::new("cli-proxy");
    let server = pki.server("server", &["localhost"], false);
    let tls = TlsProxy::start(pki.server_config(&server, false), target.clone()).await;
    let uri = target.secure_uri("localhost", tls.port());
    let with_credentials = format!("http://me:proxy-pw-0000@{}", proxy.addr);
    let out = cli
        .command()
        .env("HTTPS_PROXY", &with_credentials)
        .args(["--uri", &uri, "--ca-bundle"])
        .arg(pki.ca_path())
        .args(["get", "via-proxy"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", printed(&out));
    assert_eq!(
        json(&String::from_utf8_lossy(&out.stdout)),
        json(r#"{"singer_state":{"p":1}}"#)
    );
    assert!(!printed(&out).contains("proxy-pw-0000"));
    // TLS runs inside the tunnel, checked: without the test CA the certificate is rejected.
    let rejected = cli
        .command()
        .env("HTTPS_PROXY", &with_credentials)
        .args(["--uri", &uri, "-s", "retries=0", "get", "via-proxy"])
        .output()
        .expect("runs");
    let text = printed(&rejected);
    assert!(!rejected.status.success(), "{text}");
    assert!(text.contains("certificate"), "{text}");
    assert!(!text.contains("proxy-pw-0000"), "{text}");
    let tunnel = format!("CONNECT localhost:{} HTTP/1.1", tls.port());
    let asked = proxy.asked();
    let connect = asked
        .iter()
        .find(|a| a.line == tunnel)
        .unwrap_or_else(|| panic!("no {tunnel}: {asked:?}"));
    // me:proxy-pw-0000
    assert_eq!(
        connect.authorization.as_deref(),
        Some("Basic bWU6cHJveHktcHctMDAwMA==")
    );
    assert!(tls.handshakes() >= 1);

    let before = proxy.asked().len();
    let exempt = cli
        .command()
        .env("HTTP_PROXY", proxy.url())
        .env("NO_PROXY", format!("{},localhost", target.host))
        .args(["get", "via-proxy"])
        .output()
        .expect("runs");
    assert!(exempt.status.success(), "{}", printed(&exempt));
    let ignored = cli
        .command()
        .env("HTTP_PROXY", proxy.url())
        .args(["--ignore-proxy-env", "get", "via-proxy"])
        .output()
        .expect("runs");
    assert!(ignored.status.success(), "{}", printed(&ignored));
    assert_eq!(proxy.asked().len(), before, "{:?}", proxy.asked());
}

/// Through a proxy the destination is checked as if connected to directly: the cloud
/// metadata address is refused before the proxy hears of it (and the proxy, on loopback,
/// would forward nothing off this machine if it did).
#[tokio::test(flavor = "multi_thread")]
async fn through_a_proxy_the_destination_is_still_checked() {
    use integration_tests::proxy::ForwardProxy;
    let proxy = ForwardProxy::start().await;
    let cli = Cli::new("cli_proxy_policy");
    let tripwire = integration_tests::TripwireLog::new("proxy_policy");
    let out = tripwire
        .arm(&mut cli.command())
        .env("HTTP_PROXY", proxy.url())
        .args([
            "--uri",
            "clickhouse://default:throwaway-pw-0000@169.254.169.254:8123/default",
        ])
        .args(["-s", "retries=0", "get", "x"])
        .output()
        .expect("runs");
    let text = printed(&out);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("its address is refused"), "{text}");
    assert!(!text.contains("throwaway-pw-0000"), "{text}");
    assert!(proxy.asked().is_empty(), "{:?}", proxy.asked());
    tripwire.assert_untouched();
}

/// A proxy variable that is not an http proxy URL is a configuration error naming the
/// variable, without its value (which may hold a password).
#[test]
fn a_bad_proxy_variable_is_named_without_its_value() {
    let cli = Cli::new("cli_proxy_bad");
    let out = cli
        .command()
        .env("HTTPS_PROXY", "socks5://me:proxy-pw-0000@127.0.0.1:1080")
        .args(["get", "x"])
        .output()
        .expect("runs");
    let text = printed(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("HTTPS_PROXY") && text.contains("only http://"),
        "{text}"
    );
    assert!(!text.contains("proxy-pw-0000"), "{text}");
}

#[test]
fn doctor_prints_a_line_per_check_and_exits_1_on_a_failure_0_once_fixed() {
    let cli = Cli::new("cli_doctor");
    let missing = cli.run(&["doctor"]);
    let table = printed(&missing);
    assert_eq!(missing.status.code(), Some(1), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains(" tables ")),
        "{table}"
    );
    let fixed = cli.run(&["doctor", "--fix", "--json"]);
    assert_eq!(fixed.status.code(), Some(0), "{}", printed(&fixed));
    let checks = json(&String::from_utf8_lossy(&fixed.stdout));
    let names: Vec<&str> = checks
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for name in [
        "tcp",
        "authentication",
        "clock",
        "tables",
        "grants",
        "locks",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }

    // As the wheel's `state-backend` runs beside Meltano: from Meltano's variables alone.
    let meltano = |name: &str| integration_tests::state_host::settings::meltano_variable(name);
    let mut command = Command::new(state_backend_binary());
    for var in PROXY_VARIABLES {
        command.env_remove(var);
    }
    let from_meltano = command
        .env("MELTANO_STATE_BACKEND_URI", cli.table.target.uri())
        .env(meltano("allow_loopback"), "true")
        .env(meltano("schema"), SCHEMA)
        .env(meltano("table"), &cli.table.name)
        .arg("doctor")
        .output()
        .expect("runs");
    let table = printed(&from_meltano);
    assert_eq!(from_meltano.status.code(), Some(0), "{table}");
    assert!(table.contains(&cli.table.name), "{table}");
}
