//! Meltano's state-id patterns (Python `fnmatch`) as a ClickHouse filter.
//!
//! `*` matches any run of characters, `?` one character, `[seq]` one of seq (ranges allowed),
//! `[!seq]` one character not in seq. Every other character is literal, `_`, `%` and `\`
//! included: the original backend turned patterns into `LIKE` and so let `_` match anything.
//!
//! The pattern becomes an RE2 regular expression for ClickHouse's `match()`, plus the literal
//! prefix before the first wildcard so that the primary key (`state_id`) narrows the scan.

use crate::error::{Error, Result};

/// How to select state ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// No pattern, or `*`: every id.
    All,
    /// A pattern without wildcards: this one id.
    Exact(String),
    /// Ids that start with `prefix` and match `regex` (anchored, RE2 syntax).
    Match { prefix: String, regex: String },
}

enum Token {
    Literal(char),
    AnyRun,
    AnyOne,
    Class {
        negated: bool,
        items: Vec<(char, char)>,
    },
}

/// Translates an optional pattern into a filter. An unbalanced `[` is an error (fnmatch would
/// read it as a literal `[`, which hides typos such as `tap-[abc`).
pub fn filter(pattern: Option<&str>) -> Result<Filter> {
    let Some(pattern) = pattern else {
        return Ok(Filter::All);
    };
    let tokens = tokenize(pattern)?;
    if tokens.iter().all(|t| matches!(t, Token::AnyRun)) && !tokens.is_empty() {
        return Ok(Filter::All);
    }
    if tokens.iter().all(|t| matches!(t, Token::Literal(_))) {
        return Ok(Filter::Exact(pattern.to_string()));
    }
    let prefix: String = tokens
        .iter()
        .map_while(|t| match t {
            Token::Literal(c) => Some(*c),
            _ => None,
        })
        .collect();
    let mut regex = String::from("(?s)^");
    for token in &tokens {
        match token {
            Token::Literal(c) => push_escaped(&mut regex, *c),
            Token::AnyRun => regex.push_str(".*"),
            Token::AnyOne => regex.push('.'),
            Token::Class { negated, items } => push_class(&mut regex, *negated, items),
        }
    }
    regex.push('$');
    Ok(Filter::Match { prefix, regex })
}

fn tokenize(pattern: &str) -> Result<Vec<Token>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                // `**` is the same as `*`.
                if !matches!(tokens.last(), Some(Token::AnyRun)) {
                    tokens.push(Token::AnyRun);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::AnyOne);
                i += 1;
            }
            '[' => {
                let (token, next) = class(&chars, i).ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "pattern {pattern:?} has an unbalanced '[' at character {}",
                        i + 1
                    ))
                })?;
                tokens.push(token);
                i = next;
            }
            c => {
                tokens.push(Token::Literal(c));
                i += 1;
            }
        }
    }
    Ok(tokens)
}

/// Parses `[...]` starting at `start`; returns the token and the index after `]`.
fn class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut j = start + 1;
    let negated = chars.get(j) == Some(&'!');
    if negated {
        j += 1;
    }
    let body_start = j;
    // A `]` right after `[` or `[!` is a member, as in fnmatch.
    if chars.get(j) == Some(&']') {
        j += 1;
    }
    while j < chars.len() && chars[j] != ']' {
        j += 1;
    }
    if j >= chars.len() {
        return None;
    }
    let body = &chars[body_start..j];
    let mut items = Vec::new();
    let mut k = 0;
    while k < body.len() {
        if k + 2 < body.len() && body[k + 1] == '-' {
            // fnmatch drops empty ranges such as `z-a`.
            if body[k] <= body[k + 2] {
                items.push((body[k], body[k + 2]));
            }
            k += 3;
        } else {
            items.push((body[k], body[k]));
            k += 1;
        }
    }
    Some((Token::Class { negated, items }, j + 1))
}

/// One character, literal in RE2 both outside and inside a class: punctuation escaped, control
/// characters as `\x{..}`.
fn push_escaped(out: &mut String, c: char) {
    if c.is_ascii_punctuation() {
        out.push('\\');
        out.push(c);
    } else if c.is_control() {
        out.push_str(&format!("\\x{{{:x}}}", c as u32));
    } else {
        out.push(c);
    }
}

fn push_class(out: &mut String, negated: bool, items: &[(char, char)]) {
    if items.is_empty() {
        // `[!]`-style leftovers: a negated empty set matches any one character, an empty set
        // matches nothing.
        out.push_str(if negated {
            "."
        } else {
            "[^\\x{0}-\\x{10ffff}]"
        });
        return;
    }
    out.push('[');
    if negated {
        out.push('^');
    }
    for &(lo, hi) in items {
        push_escaped(out, lo);
        if lo != hi {
            out.push('-');
            push_escaped(out, hi);
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Does `id` pass the filter? Uses the `regex` crate, whose syntax for what we emit matches
    /// RE2's; the integration tests check the same cases against ClickHouse.
    fn passes(pattern: &str, id: &str) -> bool {
        match filter(Some(pattern)).expect("valid pattern") {
            Filter::All => true,
            Filter::Exact(p) => p == id,
            Filter::Match { prefix, regex } => {
                id.starts_with(&prefix)
                    && regex::Regex::new(&regex).expect("valid regex").is_match(id)
            }
        }
    }

    #[test]
    fn no_pattern_or_star_is_all() {
        assert_eq!(filter(None).unwrap(), Filter::All);
        assert_eq!(filter(Some("*")).unwrap(), Filter::All);
        assert_eq!(filter(Some("**")).unwrap(), Filter::All);
    }

    #[test]
    fn a_plain_pattern_is_exact() {
        assert_eq!(
            filter(Some("dev:tap_x-to-target%")).unwrap(),
            Filter::Exact("dev:tap_x-to-target%".into())
        );
    }

    #[test]
    fn the_literal_prefix_is_extracted() {
        match filter(Some("dev:tap-*")).unwrap() {
            Filter::Match { prefix, .. } => assert_eq!(prefix, "dev:tap-"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn star_and_question_mark() {
        assert!(passes("dev:*", "dev:tap-a-to-b"));
        assert!(passes("dev:*", "dev:"));
        assert!(!passes("dev:*", "prod:tap"));
        assert!(passes("*-to-*", "dev:a-to-b"));
        assert!(passes("a?c", "abc"));
        assert!(!passes("a?c", "ac"));
        assert!(passes("a?c", "a✓c"));
        assert!(passes("*", "line\nbreak"));
        assert!(passes("line?break", "line\nbreak"));
    }

    #[test]
    fn underscore_percent_and_backslash_are_literal() {
        assert!(passes("tap_*", "tap_github"));
        assert!(!passes("tap_*", "tapXgithub"));
        assert!(passes("100%*", "100%done"));
        assert!(!passes("100%*", "100done"));
        assert!(passes("a\\*", "a\\b"));
        assert!(!passes("a\\*", "ab"));
    }

    #[test]
    fn regex_metacharacters_are_literal() {
        for id in [
            "a.b", "a+b", "a(b)", "a|b", "a{1}", "a^b$", "a'b\"c", "a b", "ü✓",
        ] {
            let pattern = format!("{id}*");
            assert!(passes(&pattern, id), "{pattern} should match {id}");
            assert!(passes(&pattern, &format!("{id}tail")));
        }
        assert!(!passes("a.b*", "axb"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        assert!(passes("v[0-9]", "v7"));
        assert!(!passes("v[0-9]", "vx"));
        assert!(passes("v[!0-9]", "vx"));
        assert!(!passes("v[!0-9]", "v7"));
        assert!(passes("[]]x", "]x"));
        assert!(passes("[!]]x", "ax"));
        assert!(!passes("[!]]x", "]x"));
        assert!(passes("[a-]", "-"));
        assert!(passes("[\\]", "\\"));
        assert!(passes("[*?]*", "*x"));
        assert!(passes("[^]", "^"));
        assert!(!passes("[z-a]", "m"));
        assert!(passes("[[]x", "[x"));
        assert!(passes("[ü✓]", "✓"));
    }

    #[test]
    fn unbalanced_bracket_is_an_error() {
        for pattern in ["tap-[abc", "[", "[!", "[]", "a[!]"] {
            match filter(Some(pattern)) {
                Err(Error::InvalidInput(m)) => assert!(m.contains("unbalanced"), "{m}"),
                other => panic!("{pattern}: {other:?}"),
            }
        }
    }
}
