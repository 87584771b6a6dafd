//! No circles: no two source files of a crate import each other, directly or through others.
//!
//! The graph is of files. An edge is a path in a file's non-test code (`crate::a::b`,
//! `super::x`, `self::x`, or a child module's name) resolved to the file that defines it,
//! following a facade's `pub use` to the file behind it. A module and its own ancestors are one
//! unit (a child sees its parent's private items, and the parent declares and re-exports its
//! children), so edges between them are not counted; everything else is. A glob import
//! (`use crate::*`) reaches the module and every module it re-exports with `pub use X::*`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::layout::source_files;

/// A crate's sources: its root file, the directory its modules live in, and the directories
/// under it that belong to another crate (the host's CLI).
struct Sources {
    root: PathBuf,
    dir: PathBuf,
    others: Vec<PathBuf>,
}

impl Sources {
    fn new(root: &Path, others: &[&str]) -> Sources {
        let dir = root.parent().expect("a root's directory").to_path_buf();
        Sources {
            others: others.iter().map(|o| dir.join(o)).collect(),
            root: root.to_path_buf(),
            dir,
        }
    }

    /// The file of the module at `path` (`[]` is the crate root).
    fn file(&self, path: &[String]) -> Option<PathBuf> {
        if path.is_empty() {
            return Some(self.root.clone());
        }
        let base = self.dir.join(path.join("/"));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|f| f.is_file() && f != &self.root)
    }

    /// The module path of `file`.
    fn module(&self, file: &Path) -> Vec<String> {
        if file == self.root {
            return Vec::new();
        }
        let relative = file.strip_prefix(&self.dir).expect("inside the crate");
        let mut path: Vec<String> = relative
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        if path.last().is_some_and(|last| last == "mod") {
            path.pop();
        }
        path
    }

    /// The crate's files and their non-test code.
    fn files(&self) -> Vec<(PathBuf, String)> {
        source_files(&self.dir, "rs")
            .into_iter()
            .filter(|(path, _)| !self.others.iter().any(|o| path.starts_with(o)))
            .filter(|(path, _)| !path.ends_with("tests.rs"))
            .map(|(path, lines)| (path, lines.join("\n")))
            .collect()
    }
}

/// Every path in `code` that starts with an identifier, as its segments; `a::{b, c::d}` gives
/// `a::b` and `a::c::d`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = is_ident(chars[i])
            && !chars[i].is_ascii_digit()
            && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if starts {
            i = path_at(&chars, i, Vec::new(), &mut found);
        } else {
            i += 1;
        }
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Reads the path starting at `i` after `prefix`, into `found`; returns where it ends.
fn path_at(
    chars: &[char],
    mut i: usize,
    prefix: Vec<String>,
    found: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    loop {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if i > start {
            path.push(chars[start..i].iter().collect());
        } else if chars.get(i) == Some(&'*') && !path.is_empty() {
            // A glob: everything the module names.
            path.push("*".into());
            found.push(path);
            return i + 1;
        } else if i < chars.len() && chars[i] == '{' {
            // A group: each element is a path after this prefix.
            i += 1;
            loop {
                i = path_at(chars, i, path.clone(), found);
                while i < chars.len() && chars[i].is_whitespace() {
                    i += 1;
                }
                match chars.get(i) {
                    Some(',') => i += 1,
                    Some('}') => return i + 1,
                    _ => return i,
                }
                while i < chars.len() && chars[i].is_whitespace() {
                    i += 1;
                }
                if chars.get(i) == Some(&'}') {
                    return i + 1;
                }
            }
        }
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            continue;
        }
        if path.len() > 1 {
            found.push(path);
        }
        return i;
    }
}

/// The file that `path`, named in the module `from`, refers to, if it is in the crate.
fn resolve(sources: &Sources, from: &[String], path: &[String], depth: u8) -> Option<PathBuf> {
    let (mut base, mut rest): (Vec<String>, &[String]) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.to_vec(), &path[1..]),
        "super" => {
            let mut base = from.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        child => {
            let mut base = from.to_vec();
            base.push(child.to_string());
            sources.file(&base)?;
            (base, &path[1..])
        }
    };
    while let Some(next) = rest.first() {
        let mut deeper = base.clone();
        deeper.push(next.clone());
        if sources.file(&deeper).is_none() {
            break;
        }
        base = deeper;
        rest = &rest[1..];
    }
    let file = sources.file(&base)?;
    // An item the module re-exports from a child: the child's file.
    if let Some(item) = rest.first()
        && depth < 4
    {
        let text = std::fs::read_to_string(&file).expect("readable");
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("pub use "))
        {
            for exported in paths(line.trim_start_matches("pub use ")) {
                if exported.last() == Some(item)
                    && exported[0] != "crate"
                    && exported[0] != "super"
                    && let Some(behind) = resolve(sources, &base, &exported, depth + 1)
                {
                    return Some(behind);
                }
            }
        }
    }
    Some(file)
}

/// The files a glob import `path` (ending in `*`) reaches: the module's own, and those its
/// `pub use X::*` re-export.
fn globbed(sources: &Sources, from: &[String], path: &[String]) -> Vec<PathBuf> {
    let prefix = &path[..path.len() - 1];
    let module = match prefix {
        [first] if first == "crate" => Vec::new(),
        _ => match resolve(sources, from, prefix, 0) {
            Some(file) => sources.module(&file),
            None => return Vec::new(),
        },
    };
    let Some(file) = sources.file(&module) else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(&file).expect("readable");
    let mut files = vec![file];
    for line in text.lines().map(str::trim) {
        if let Some(child) = line
            .strip_prefix("pub use ")
            .and_then(|rest| rest.strip_suffix("::*;"))
        {
            let mut child_path = module.clone();
            child_path.extend(child.split("::").map(String::from));
            files.extend(sources.file(&child_path));
        }
    }
    files
}

/// File -> the files of the same crate its non-test code names (relative to the crate's
/// directory), leaving out a module's own ancestors and descendants.
fn file_imports(sources: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let name = |file: &Path| {
        file.strip_prefix(&sources.dir)
            .expect("inside")
            .display()
            .to_string()
    };
    let mut graph = BTreeMap::new();
    for (file, code) in sources.files() {
        let module = sources.module(&file);
        let deps: &mut BTreeSet<String> = graph.entry(name(&file)).or_default();
        for path in paths(&code) {
            let targets = if path.last().is_some_and(|s| s == "*") {
                globbed(sources, &module, &path)
            } else {
                resolve(sources, &module, &path, 0).into_iter().collect()
            };
            for target in targets {
                let other = sources.module(&target);
                let related = other.starts_with(&module) || module.starts_with(&other);
                if !related {
                    deps.insert(name(&target));
                }
            }
        }
    }
    graph
}

/// Pairs of nodes that reach each other.
pub(crate) fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            if m == to {
                return true;
            }
            if seen.insert(m.clone()) {
                stack.extend(graph.get(&m).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut found = Vec::new();
    for (module, deps) in graph {
        for dep in deps {
            if module < dep && reaches(dep, module) {
                found.push((module.clone(), dep.clone()));
            }
        }
    }
    found
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The graph of a crate of this workspace, after checking that it saw what it must see.
fn graph_of(
    root_file: &str,
    others: &[&str],
    must: (&str, &str),
) -> BTreeMap<String, BTreeSet<String>> {
    let graph = file_imports(&Sources::new(&root().join(root_file), others));
    assert!(
        graph.get(must.0).is_some_and(|deps| deps.contains(must.1)),
        "the walker did not see {} import {}: {graph:#?}",
        must.0,
        must.1
    );
    graph
}

#[test]
fn no_two_files_of_any_crate_import_each_other() {
    let crates = [
        (
            "protocol/src/lib.rs",
            vec![],
            ("update/grant.rs", "guard.rs"),
        ),
        (
            "guest/src/lib.rs",
            vec![],
            ("lock/drive.rs", "lock/fenced.rs"),
        ),
        ("contract/src/lib.rs", vec![], ("config.rs", "uri.rs")),
        ("model/src/lib.rs", vec![], ("checker.rs", "world.rs")),
        ("host/src/lib.rs", vec!["cli"], ("backend.rs", "records.rs")),
        (
            "host/src/cli/main.rs",
            vec![],
            ("versions.rs", "state_json.rs"),
        ),
    ];
    for (root_file, others, must) in crates {
        let graph = graph_of(root_file, &others, must);
        assert_eq!(
            cycles(&graph),
            Vec::<(String, String)>::new(),
            "{root_file}: {graph:#?}"
        );
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&graph).len(), 2);
}

/// The circles the guest once had, in a crate of their own: siblings through `super::`, cousins
/// through `crate::`, and one behind a facade's re-export; and a child using its parent, which
/// is not one.
#[test]
fn the_walker_finds_the_circles_the_guest_once_had() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        std::fs::write(path, text).expect("written");
    };
    write(
        "lib.rs",
        "pub mod lock;\npub mod sql;\nmod component;\nmod wasi_http;\n",
    );
    write(
        "component.rs",
        "use crate::wasi_http::WasiHttp;\npub mod wasi {}\n",
    );
    write(
        "wasi_http.rs",
        "use crate::component::wasi::http;\npub struct WasiHttp;\n",
    );
    write(
        "lock/mod.rs",
        "pub mod drive;\npub mod fenced;\npub struct Locks;\nfn f() { fenced::renew(); }\n",
    );
    write(
        "lock/drive.rs",
        "use super::{Locks, fenced};\npub fn renew() { fenced::newest(); }\n",
    );
    write(
        "lock/fenced.rs",
        "use super::Locks;\npub fn renew() { super::drive::renew() }\n",
    );
    write(
        "sql/mod.rs",
        "mod history;\nmod state;\npub use state::{GUARDED_MAX_BYTES, StateRow};\n",
    );
    write(
        "sql/state.rs",
        "use super::history::Origin;\npub const GUARDED_MAX_BYTES: usize = 1;\n",
    );
    write(
        "sql/history.rs",
        "pub struct Origin;\nconst MAX: usize = super::GUARDED_MAX_BYTES;\n",
    );
    let graph = file_imports(&Sources::new(&dir.path().join("lib.rs"), &[]));
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        cycles(&graph),
        vec![
            pair("component.rs", "wasi_http.rs"),
            pair("lock/drive.rs", "lock/fenced.rs"),
            pair("sql/history.rs", "sql/state.rs"),
        ],
        "{graph:#?}"
    );
}
