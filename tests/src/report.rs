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
];

const TITLE: &str = "# Benchmark report\n\nOne report, written by seven benchmarks, each its own \
    section (its first line says when, where and how it ran); `just bench` runs them all, one \
    after the other. Every figure in the README and the docs is quoted from this file, and a \
    test holds them to it.\n";

/// The committed report.
pub fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/report.md")
}

/// Writes `body` as section `name` of the report at `path`, keeping the other sections; a report
/// that is missing or lacks sections gets them empty, in the order of [`SECTIONS`].
pub fn write_section(path: &Path, name: &str, body: &str) -> std::io::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text = String::from(TITLE);
    for (section, _) in SECTIONS {
        let content = if *section == name {
            body.trim().to_string()
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
        assert!(!text.contains("## 8. one"));
        assert!(text.find("## 8.") < text.find("## 10."));
        assert!(write_section(&path, "nonesuch", "x").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
