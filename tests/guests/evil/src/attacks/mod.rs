//! One module per attack. `get(id)` runs the attack that `id` names, `<name>` or
//! `<name> <argument>`, and returns what it observed as a JSON object.

mod egress;
mod environment;
mod hoard;
mod panic;
mod smuggle;
mod spin;

/// An attack: its argument in, what it observed out (JSON), if it returns at all.
type Attack = fn(&str) -> String;

/// Every attack, by the name a state id gives it.
const ALL: &[(&str, Attack)] = &[
    ("loop", spin::run),
    ("alloc", hoard::run),
    ("panic", panic::run),
    ("env", environment::run),
    ("http", egress::run),
    ("smuggle", smuggle::run),
];

/// Runs the attack `id` names; `None` for any other id.
pub fn run(id: &str) -> Option<String> {
    let (name, argument) = id.split_once(' ').unwrap_or((id, ""));
    ALL.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, attack)| attack(argument))
}

/// `text` as a JSON string.
pub(crate) fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
