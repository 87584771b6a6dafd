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
        "the README's settings table differs from guest/src/settings.rs; expected:\n{}",
        expected.join("\n")
    );
}
