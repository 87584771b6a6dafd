//! The CLI's help is there for every command and says what a user needs.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_state-backend"))
        .args(args)
        .arg("--help")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn top_level_help_lists_the_commands_and_precedence() {
    let text = help(&[]);
    for command in [
        "list",
        "get",
        "set",
        "merge",
        "copy",
        "move",
        "clear",
        "export",
        "import",
        "lock",
        "migrate",
        "history",
        "diff",
        "restore",
        "clear-stream",
    ] {
        assert!(text.contains(command), "{command} missing from:\n{text}");
    }
    assert!(text.contains("--uri"));
    assert!(text.contains("CLICKHOUSE_HOST"));
    assert!(text.contains("exit code"));
}

#[test]
fn every_command_has_help() {
    for command in [
        "list",
        "get",
        "set",
        "merge",
        "copy",
        "move",
        "clear",
        "export",
        "import",
        "lock",
        "migrate",
        "history",
        "diff",
        "restore",
        "clear-stream",
    ] {
        let text = help(&[command]);
        assert!(text.contains("Usage:"), "{command}:\n{text}");
    }
    assert!(help(&["set"]).contains("--input-file"));
    assert!(help(&["clear"]).contains("--all"));
    assert!(help(&["list"]).contains("--pattern"));
    assert!(help(&["migrate"]).contains("--print"));
    assert!(help(&["get"]).contains("--at <VERSION|TIME>"));
    assert!(help(&["history"]).contains("--limit"));
    assert!(help(&["restore"]).contains("--to <VERSION|TIME>"));
}

#[test]
fn help_never_shows_the_uri_from_the_environment() {
    let output = Command::new(env!("CARGO_BIN_EXE_state-backend"))
        .arg("--help")
        .env(
            "MELTANO_STATE_BACKEND_URI",
            "clickhouse://u:topsecret-pw@h/db",
        )
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("topsecret-pw"), "{text}");
}
