//! The benchmark report, `tests/benches/results/report.md`: one file that several benchmarks
//! write, each its own section between `<!-- section NAME -->` and `<!-- /section NAME -->`.
//! A benchmark replaces its section and leaves the others as they are, so the README and the
//! docs quote one file, whichever benchmark ran last.

use std::path::{Path, PathBuf};

/// The sections, in the order the report shows them, and the benchmark that writes each.
pub const SECTIONS: &[(&str, &str)] = &[
    ("report", "`just bench-report` (sections 1–7)"),
    ("meltano", "`just bench-meltano`"),
    ("alternation", "`just bench-alternation`"),
    ("floor", "`just bench-floor`"),
    ("history", "`just bench-history`"),
    ("hosts", "`just bench-hosts`"),
    ("year", "`just bench-year`"),
    ("telemetry", "`just bench-telemetry`"),
];

const TITLE: &str = "# Benchmark report\n\nOne report, written by eight benchmarks, each its own \
    section: its first line names the commit whose code it measured, its second when, where and \
    how it ran. `just bench` runs them all, one after the other. The figures the README and the \
    docs quote from it are held to it by a test, which also fails when a page quotes a section \
    whose measured code has changed since, unless the page says where it was measured.\n";

/// The code a section measures: a change to it since a section's commit makes that section's
/// figures a photograph of older code (`docs_figures` holds the pages to say so). Git pathspecs.
pub const MEASURED_CODE: &[&str] = &[
    "guest",
    "host",
    "contract",
    "python",
    "hosts",
    "wit",
    "Cargo.toml",
    "Cargo.lock",
    ":(exclude,glob)**/tests/**",
];

/// What a section's stamp adds when the code it measured was not a commit's: such a section
/// is a photograph of code nobody can check out, so every quote of it must say where.
pub const UNCOMMITTED: &str = ", with uncommitted changes to the measured code";

/// The first line of every section: the commit whose code it measured, as `stamp` writes it.
pub const STAMP: &str = "Measured at commit `";

/// Where this run's measured code comes from: HEAD, and whether the measured code differs from
/// it (uncommitted changes), as a section's first line.
pub fn stamp() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let mut status = vec!["status", "--porcelain", "--"];
    status.extend(MEASURED_CODE);
    let dirty = git(&status).is_none_or(|changes| !changes.is_empty());
    format!("{STAMP}{head}`{}.", if dirty { UNCOMMITTED } else { "" })
}

/// The committed report.
pub fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/report.md")
}

/// Writes `body` as section `name` of the report at `path`, under the commit it measured
/// ([`stamp`]), keeping the other sections; a report that is missing or lacks sections gets them
/// empty, in the order of [`SECTIONS`].
pub fn write_section(path: &Path, name: &str, body: &str) -> std::io::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text = String::from(TITLE);
    for (section, _) in SECTIONS {
        let content = if *section == name {
            format!("{}\n{}", stamp(), body.trim())
        } else {
            between(&old, section).unwrap_or_default()
        };
        text += &format!("\n<!-- section {section} -->\n{content}\n<!-- /section {section} -->\n");
    }
    if !SECTIONS.iter().any(|(section, _)| *section == name) {
        return Err(std::io::Error::other(format!(
            "no section {name:?} in the report"
        )));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}

fn between(text: &str, section: &str) -> Option<String> {
    let open = format!("<!-- section {section} -->\n");
    let close = format!("\n<!-- /section {section} -->");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    Some(text[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_replaced_and_the_others_kept() {
        let dir = std::env::temp_dir().join(format!("report-{}", uuid::Uuid::new_v4().simple()));
        let path = dir.join("report.md");
        write_section(&path, "meltano", "## 8. one").expect("writes");
        write_section(&path, "floor", "## 10. two").expect("writes");
        write_section(&path, "meltano", "## 8. three").expect("writes");
        let text = std::fs::read_to_string(&path).expect("reads");
        assert!(text.contains("## 8. three") && text.contains("## 10. two"));
        assert!(
            text.contains(&format!("<!-- section floor -->\n{STAMP}")),
            "{text}"
        );
        assert!(!text.contains("## 8. one"));
        assert!(text.find("## 8.") < text.find("## 10."));
        assert!(write_section(&path, "nonesuch", "x").is_err());
        // The Python benchmark (bench-floor) stamps its section as `stamp` does.
        let floor =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floor.py"))
                .expect("floor.py");
        for path in MEASURED_CODE {
            assert!(
                floor.contains(&format!("\"{path}\"")),
                "floor.py lacks {path}"
            );
        }
        assert!(
            floor.contains(&format!("{STAMP}{{head}}`")),
            "floor.py's stamp"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
