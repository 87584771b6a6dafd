//! A known password, through every CLI command and error path: it must appear nowhere in what
//! the CLI prints (at the most verbose log level), nor in the local server's log.

use std::process::Command;

use integration_tests::{LocalServer, printed, state_backend_binary};

/// CLI arguments and environment variables that carry the password one way.
type Way = (Vec<String>, Vec<(&'static str, &'static str)>);

const PASSWORD: &str = "Kn0wn-Secret-pw-5e1f";
/// Everything of ours at the most verbose level (the compiler's own tracing is left out: it
/// sees no request, and at trace level it would print megabytes per run).
const LOG: &str = "debug,state_host=trace,guest=trace,egress=trace,wasmtime_wasi_http=trace,cranelift_codegen=warn,wasmtime_cranelift=warn,wasmtime_internal_cranelift=warn,regalloc2=warn";

#[test]
fn the_password_never_appears_in_cli_output_or_logs() {
    let server = LocalServer::start("meltano", PASSWORD);
    let uri = format!(
        "clickhouse://meltano:{PASSWORD}@127.0.0.1:{}/default",
        server.port
    );
    let no_pw_uri = format!("clickhouse://meltano@127.0.0.1:{}/default", server.port);
    let state = r#"{"singer_state":{"bookmarks":{"a":1}}}"#;
    let export_file = server.dir.join("export.json");
    std::fs::write(
        &export_file,
        r#"{"imported":{"completed":{"singer_state":{}},"partial":{}}}"#,
    )
    .unwrap();
    let export = export_file.to_str().unwrap();
    // Each command with the exit code it must end with: a run that fails early proves nothing
    // about what the command would have printed.
    let commands: Vec<(Vec<&str>, i32)> = vec![
        (vec!["migrate"], 0),
        (vec!["set", "a", state], 0),
        (vec!["get", "a"], 0),
        (vec!["get", "--raw", "a"], 0),
        (vec!["merge", "a", state], 0),
        (vec!["list"], 0),
        (vec!["list", "--pattern", "a*"], 0),
        (vec!["copy", "a", "b"], 0),
        (vec!["move", "b", "c"], 0),
        (vec!["export"], 0),
        (vec!["import", export], 0),
        (vec!["lock", "a", "--hold", "0"], 0),
        (vec!["lock-info", "a"], 0),
        (vec!["unlock", "a"], 0),
        (vec!["clear", "c"], 0),
        (vec!["clear", "--all"], 0),
        // error paths
        (vec!["set", "a", "not json"], 2),
        (vec!["set", "", state], 2),
        (vec!["list", "--pattern", "[oops"], 2),
        (vec!["copy", "missing", "x"], 2),
        (vec!["-s", "port=notaport", "list"], 2),
        (
            vec![
                "--uri",
                "clickhouse://meltano:Kn0wn-Secret-pw-5e1f@127.0.0.1:1/default",
                "-s",
                "retry_budget_seconds=1",
                "list",
            ],
            4,
        ),
        (
            vec![
                "--uri",
                "postgres://meltano:Kn0wn-Secret-pw-5e1f@h/db",
                "list",
            ],
            2,
        ),
        (
            vec![
                "--uri",
                "clickhouse://meltano:Kn0wn-Secret-pw-5e1f@127.0.0.1:99999/default",
                "list",
            ],
            2,
        ),
    ];
    // Precompiled once, so that each of the runs below loads in milliseconds.
    let wasm = std::fs::read(integration_tests::state_host::default_component_path()).unwrap();
    let cwasm = server.dir.join("component.cwasm");
    std::fs::write(
        &cwasm,
        integration_tests::state_host::Runtime::precompile(&wasm).unwrap(),
    )
    .unwrap();
    let component = cwasm.to_str().unwrap().to_string();
    // The password by URI, by setting, and by environment variable.
    let ways: Vec<Way> = vec![
        (vec!["--uri".into(), uri.clone()], vec![]),
        (
            vec![
                "--uri".into(),
                no_pw_uri.clone(),
                "-s".into(),
                format!("password={PASSWORD}"),
            ],
            vec![],
        ),
        (
            vec!["--uri".into(), no_pw_uri.clone()],
            vec![("CLICKHOUSE_PASSWORD", PASSWORD)],
        ),
    ];
    let mut ran = 0;
    for (prefix, env) in &ways {
        for (args, expected) in &commands {
            let mut command = Command::new(state_backend_binary());
            command
                .env_remove("MELTANO_STATE_BACKEND_URI")
                .args(["--allow-loopback", "--log", LOG, "--component", &component])
                .args(prefix)
                .args(args);
            for (k, v) in env {
                command.env(k, v);
            }
            let output = command.output().expect("runs");
            let all = printed(&output);
            assert_eq!(
                output.status.code(),
                Some(*expected),
                "{prefix:?} {args:?} ended unlike expected:\n{all}"
            );
            assert!(
                !all.contains(PASSWORD),
                "{args:?} printed the password:\n{all}"
            );
            ran += 1;
        }
    }
    // and a wrong password, which must not echo either
    let wrong = "Wr0ng-Secret-pw-77aa";
    let output = Command::new(state_backend_binary())
        .args([
            "--allow-loopback",
            "--log",
            LOG,
            "--component",
            &component,
            "--uri",
        ])
        .arg(format!(
            "clickhouse://meltano:{wrong}@127.0.0.1:{}/default",
            server.port
        ))
        .arg("list")
        .output()
        .unwrap();
    let all = printed(&output);
    assert_eq!(output.status.code(), Some(3), "{all}");
    assert!(!all.contains(wrong), "{all}");

    // A refused address (cloud metadata): the refusal's message does not carry the password
    // either. The password is a throwaway one, as a broken refusal would send it there; the
    // tripwire would stop that, and shows it was not reached.
    let throwaway = "throwaway-pw-0000";
    let tripwire = integration_tests::TripwireLog::new("secrets_metadata");
    let output = tripwire
        .arm(&mut Command::new(state_backend_binary()))
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .args(["--allow-loopback", "--log", LOG, "--component", &component])
        .arg("--uri")
        .arg(format!(
            "clickhouse://meltano:{throwaway}@169.254.169.254/default"
        ))
        .arg("list")
        .output()
        .unwrap();
    let all = printed(&output);
    assert_eq!(output.status.code(), Some(4), "{all}");
    assert!(all.contains("its address is refused"), "{all}");
    assert!(!all.contains(throwaway), "{all}");
    tripwire.assert_untouched();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("POST / 200"), "the server saw the requests");
    assert!(!log.contains(PASSWORD) && !log.contains(wrong));
    assert_eq!(ran, commands.len() * 3);
}
