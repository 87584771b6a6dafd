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
