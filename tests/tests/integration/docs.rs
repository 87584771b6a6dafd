//! The documentation says what the code does: the README's settings table is the settings table.

use std::path::Path;

use clickhouse_state::settings::SETTINGS;

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_readme_settings_table_is_the_settings_table() {
    let readme = readme();
    let header = "| setting | env variable | default | meaning |\n|---|---|---|---|\n";
    let start = readme.find(header).expect("the README's settings table") + header.len();
    let documented: Vec<&str> = readme[start..]
        .lines()
        .take_while(|line| line.starts_with('|'))
        .collect();
    let expected: Vec<String> = SETTINGS
        .iter()
        .map(|s| {
            let env = s.env.map(|v| format!("`{v}`")).unwrap_or_default();
            format!("| `{}` | {env} | {} | {} |", s.name, s.default_doc, s.doc)
                .replace("|  |", "| |")
        })
        .collect();
    assert_eq!(
        documented,
        expected,
        "the README's settings table differs from contract/src/settings.rs; expected:\n{}",
        expected.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_that_links_every_page() {
    let readme = readme();
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "the README has {lines} lines; move detail to docs/"
    );
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut pages = 0;
    for entry in std::fs::read_dir(&docs).expect("docs/") {
        let name = entry.expect("entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") {
            pages += 1;
            assert!(
                readme.contains(&format!("](docs/{name})")),
                "docs/{name} is not linked"
            );
        }
    }
    assert!(pages > 0);
}

/// One version for the crates, the wheel, the CLI and the README; the contract keeps its own,
/// which the README names as the WIT package declares it.
#[test]
fn one_version_for_crates_wheel_cli_and_readme() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let version = env!("CARGO_PKG_VERSION");
    let workspace = read("Cargo.toml");
    assert!(
        workspace.contains(&format!("\nversion = \"{version}\"\n")),
        "the workspace's version is this crate's"
    );
    for member in [
        "contract",
        "protocol",
        "seal",
        "host",
        "guest",
        "model",
        "tests",
        "tests/guests/evil",
    ] {
        let manifest = read(&format!("{member}/Cargo.toml"));
        assert!(
            manifest.contains("\nversion.workspace = true\n"),
            "{member}/Cargo.toml takes the workspace's version"
        );
    }
    assert!(workspace.contains(
        r#"members = ["contract", "protocol", "seal", "host", "guest", "model", "tests", "tests/guests/evil"]"#
    ));
    // maturin gives the wheel the host crate's version when the project leaves it dynamic.
    let pyproject = read("python/pyproject.toml");
    assert!(
        pyproject.contains("\ndynamic = [\"version\"]\n"),
        "the wheel's version is dynamic"
    );
    assert!(
        !pyproject.lines().any(|l| l.starts_with("version")),
        "the wheel states no version of its own"
    );
    // `-V`: a test build's `--version` adds that it is one.
    let output = std::process::Command::new(integration_tests::state_backend_binary())
        .arg("-V")
        .output()
        .expect("runs state-backend --version");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(printed.trim(), format!("state-backend {version}"));
    let readme = readme();
    assert!(
        readme.contains(&format!("Version {version}, one for the crates")),
        "the README names the version"
    );
    let wit = read("wit/state-backend.wit");
    let contract = wit
        .lines()
        .find_map(|l| l.strip_prefix("package meltano:state-backend@"))
        .and_then(|l| l.strip_suffix(';'))
        .expect("the WIT package's version");
    assert!(
        readme.contains(&format!("`meltano:state-backend@{contract}`")),
        "the README names the contract's version, {contract}"
    );
}

#[test]
fn every_pinned_setting_is_documented() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deployments.md");
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = page
        .find("### What no profile changes")
        .expect("the section on pinned settings");
    let end = start
        + page[start..]
            .find("**The view and its definer.**")
            .unwrap_or(page.len() - start);
    let section = &page[start..end];
    // Each pin's row: its name in backticks (and the version that added it, for a newer one),
    // its value, and the statements it goes to.
    for pin in protocol::pinned::PINS {
        let columns: Vec<&str> = section
            .lines()
            .filter(|line| line.starts_with('|'))
            .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
            .find(|cols| cols.len() > 3 && cols[1].contains(&format!("`{}`", pin.name)))
            .unwrap_or_else(|| panic!("docs/deployments.md does not list `{}`", pin.name))
            .into_iter()
            .skip(1)
            .collect();
        let value = if pin.value.is_empty() {
            "''"
        } else {
            pin.value
        };
        assert_eq!(columns[1], format!("`{value}`"), "`{}`'s value", pin.name);
        assert_eq!(
            columns[2],
            pin.applies.described(),
            "`{}`'s statements",
            pin.name
        );
        if let Some(since) = pin.since {
            assert!(
                columns[0].contains(&format!("[{since}]")),
                "`{}` since {since}",
                pin.name
            );
        }
    }
}
