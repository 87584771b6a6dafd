//! The house stays easy to change: each crate depends only on what its place allows (the
//! circles between files: `imports`); and no code reads meaning out of a message's text.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every file under `dir` with extension `ext`, and its non-test code (what precedes its first
/// `#[cfg(test)]`) as trimmed lines, comment lines left out.
pub(crate) fn source_files(dir: &Path, ext: &str) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source dir") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != ext) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let lines = code
                .lines()
                .map(str::trim_start)
                .filter(|line| !line.starts_with("//"))
                .map(str::to_string)
                .collect();
            files.push((path, lines));
        }
    }
    files
}

/// The packages `name` depends on, directly or not, by Cargo.lock.
fn dependencies(lock: &str, name: &str) -> BTreeSet<String> {
    let mut direct: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            package
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key} = \"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let Some(package_name) = field("name") else {
            continue;
        };
        let deps = package
            .split("dependencies = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .unwrap_or("")
            .lines()
            .filter_map(|l| {
                l.trim()
                    .trim_matches(|c| c == '"' || c == ',')
                    .split(' ')
                    .next()
            })
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .collect();
        direct.insert(package_name, deps);
    }
    let mut seen = BTreeSet::new();
    let mut pending = vec![name.to_string()];
    while let Some(next) = pending.pop() {
        for dep in direct.get(&next).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                pending.push(dep.clone());
            }
        }
    }
    seen
}

/// The host, library and CLI, shares the contract crate with the guest and nothing else of it:
/// every ClickHouse decision, the DDL included, comes from the component it loads.
#[test]
fn the_host_does_not_depend_on_the_guest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let host = dependencies(&lock, "meltano-state-host");
    assert!(host.contains("clickhouse-state-contract") && host.contains("wasmtime"));
    assert!(!host.contains("clickhouse-state-guest"), "{host:?}");
    // The finder sees dependencies of dependencies (wasmtime's compiler).
    assert!(host.contains("cranelift-codegen"), "{host:?}");
}

/// The model checks the protocol, not the guest: it reaches the machines through the protocol
/// crate alone, so the protocol's boundary is a fact the compiler checks.
#[test]
fn the_model_depends_on_the_protocol_not_the_guest() {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
        .expect("Cargo.lock");
    let model = dependencies(&lock, "lock-model");
    assert!(model.contains("clickhouse-state-protocol") && model.contains("stateright"));
    assert!(!model.contains("clickhouse-state-guest"), "{model:?}");
}

/// The protocol does no IO: no WebAssembly bindings, no runtime, no HTTP, no TLS.
#[test]
fn the_protocol_depends_on_no_io() {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
        .expect("Cargo.lock");
    let protocol = dependencies(&lock, "clickhouse-state-protocol");
    assert!(
        protocol.contains("clickhouse-state-contract"),
        "{protocol:?}"
    );
    for io in [
        "wit-bindgen",
        "wasmtime",
        "hyper",
        "tokio",
        "rustls",
        "clickhouse-state-guest",
    ] {
        assert!(
            !protocol.contains(io),
            "the protocol depends on {io}: {protocol:?}"
        );
    }
    let guest = dependencies(&lock, "clickhouse-state-guest");
    assert!(guest.contains("wit-bindgen") && guest.contains("clickhouse-state-protocol"));
}

/// The non-test code of every source file under `dir` with extension `ext`, attributes and the
/// test-only `tests.rs` files left out: (path, line).
fn code_lines(dir: &Path, ext: &str) -> Vec<(String, String)> {
    source_files(dir, ext)
        .into_iter()
        .filter(|(path, _)| !path.ends_with("tests.rs"))
        .flat_map(|(path, lines)| {
            lines
                .into_iter()
                .filter(|line| !line.starts_with('#'))
                .map(move |line| (path.display().to_string(), line))
        })
        .collect()
}

/// Whether a line of code tests a message's text: a string literal matched against something
/// named like a message or an error.
fn matches_message_text(line: &str) -> bool {
    let messages = [
        "m.", "message", "msg", "err", "error", "reason", "why", "stderr",
    ];
    let rust = [
        ".contains(\"",
        ".starts_with(\"",
        ".ends_with(\"",
        ".find(\"",
    ];
    let python = [
        "\" in ",
        ".startswith(",
        ".endswith(",
        "re.search(",
        "re.match(",
    ];
    // The names are looked for outside string literals (`"error" in reply` tests a key).
    let mut outside = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in line.chars() {
        match c {
            '\\' if quoted => escaped = !escaped,
            '"' if !escaped => quoted = !quoted,
            _ if !quoted => outside.push(c),
            _ => escaped = false,
        }
    }
    (rust.iter().any(|p| line.contains(p)) || python.iter().any(|p| line.contains(p)))
        && messages.iter().any(|m| outside.contains(m))
}

/// Errors travel as kinds and reasons (`Error::AddressRefused`, `"reason"` in `serve`'s
/// answers, `BackendError.reason`), never as text one side writes and another reads: no code
/// of the guest, the host or the Meltano package matches a message's text.
#[test]
fn no_message_text_is_matched() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for (dir, ext) in [
        ("contract/src", "rs"),
        ("guest/src", "rs"),
        ("host/src", "rs"),
        ("python/src", "py"),
    ] {
        for (path, line) in code_lines(&root.join(dir), ext) {
            if matches_message_text(&line) {
                found.push(format!("{path}: {line}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "message text matched:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_message_matcher_finds_a_match() {
    // What the guest once did with the host's TLS errors, and the adapter with a refusal.
    assert!(matches_message_text(
        "ErrorCode::InternalError(Some(m)) if m.starts_with(\"TLS\") =>"
    ));
    assert!(matches_message_text(
        "if \"its address is refused\" in error.message:"
    ));
    assert!(!matches_message_text(
        "if error.reason == \"address-refused\":"
    ));
}

/// Each source file reads top to bottom: at most 500 lines before its tests (a `tests.rs` is
/// all tests).
#[test]
fn no_source_file_is_over_500_lines_before_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut long = Vec::new();
    let mut files = 0;
    for dir in [
        "contract/src",
        "protocol/src",
        "seal/src",
        "guest/src",
        "host/src",
        "model/src",
    ] {
        let mut pending = vec![root.join(dir)];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("a source dir") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs")
                {
                    files += 1;
                    let text = std::fs::read_to_string(&path).expect("readable");
                    let lines = text.lines().take_while(|l| *l != "#[cfg(test)]").count();
                    if lines > 500 {
                        long.push(format!("{}: {lines}", path.display()));
                    }
                }
            }
        }
    }
    assert!(files > 50, "{files} files");
    assert!(
        long.is_empty(),
        "over 500 lines before the tests:\n{}",
        long.join("\n")
    );
}
