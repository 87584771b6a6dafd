//! A known password, through every CLI command and error path: it must appear nowhere in what
//! the CLI prints (at the most verbose log level), nor in the local server's log.

use std::path::PathBuf;
use std::process::Command;

use integration_tests::LocalServer;

/// CLI arguments and environment variables that carry the password one way.
type Way = (Vec<String>, Vec<(&'static str, &'static str)>);

const PASSWORD: &str = "Kn0wn-Secret-pw-5e1f";
/// Everything of ours at the most verbose level (the compiler's own tracing is left out: it
/// sees no request, and at trace level it would print megabytes per run).
const LOG: &str = "debug,state_host=trace,guest=trace,egress=trace,wasmtime_wasi_http=trace,cranelift_codegen=warn,wasmtime_cranelift=warn,wasmtime_internal_cranelift=warn,regalloc2=warn";

fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("state-backend"))
        .find(|p| p.is_file())
        .expect("state-backend is built")
}

#[test]
fn the_password_never_appears_in_cli_output_or_logs() {
    let Some(server) = LocalServer::start("meltano", PASSWORD) else {
        return;
    };
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
    let commands: Vec<Vec<&str>> = vec![
        vec!["migrate"],
        vec!["set", "a", state],
        vec!["get", "a"],
        vec!["get", "--raw", "a"],
        vec!["merge", "a", state],
        vec!["list"],
        vec!["list", "--pattern", "a*"],
        vec!["copy", "a", "b"],
        vec!["move", "b", "c"],
        vec!["export"],
        vec!["import", export],
        vec!["lock", "a", "--hold", "0"],
        vec!["lock-info", "a"],
        vec!["unlock", "a"],
        vec!["clear", "c"],
        vec!["clear", "--all"],
        // error paths
        vec!["set", "a", "not json"],
        vec!["set", "", state],
        vec!["list", "--pattern", "[oops"],
        vec!["copy", "missing", "x"],
        vec!["-s", "port=notaport", "list"],
        vec![
            "--uri",
            "clickhouse://meltano:Kn0wn-Secret-pw-5e1f@127.0.0.1:1/default",
            "list",
        ],
        vec![
            "--uri",
            "postgres://meltano:Kn0wn-Secret-pw-5e1f@h/db",
            "list",
        ],
        vec![
            "--uri",
            "clickhouse://meltano:Kn0wn-Secret-pw-5e1f@127.0.0.1:99999/default",
            "list",
        ],
        vec![
            "--uri",
            "clickhouse://meltano:Kn0wn-Secret-pw-5e1f@169.254.169.254/default",
            "list",
        ],
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
    let mut ran = 0;
    for args in &commands {
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
        for (prefix, env) in ways {
            let mut command = Command::new(binary());
            command
                .env_remove("MELTANO_STATE_BACKEND_URI")
                .args(["--allow-loopback", "--log", LOG, "--component", &component])
                .args(&prefix)
                .args(args);
            for (k, v) in env {
                command.env(k, v);
            }
            let output = command.output().expect("runs");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
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
    let output = Command::new(binary())
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
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(3), "{all}");
    assert!(!all.contains(wrong), "{all}");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("POST / 200"), "the server saw the requests");
    assert!(!log.contains(PASSWORD) && !log.contains(wrong));
    assert_eq!(ran, commands.len() * 3);
}
