//! The figures the README and the docs quote are the committed results' (`tests/benches/results/`):
//! regenerating the results without updating the pages fails here, and so does a figure typed by
//! hand. Needs no ClickHouse.
//!
//! A page quotes the results in two ways, both checked in README.md and every docs/*.md:
//! - A figure followed at once by a reference, `1131 ms<!-- meltano.md "| the original |" 3 -->`:
//!   the 3rd number after that text on its line of `tests/benches/results/meltano.md` (which
//!   holds the text once), rounded to the digits the page shows.
//!   `<!-- ratio report.md "| 16 |" 1 "| 1 |" 1 -->` is the ratio of two such numbers. A unit
//!   and a closing `**` may stand between the figure and its reference.
//! - A block between `<!-- quote report.md -->` and `<!-- end quote -->`, each of whose lines is
//!   a line of that results file (the tables, copied).
//!
//! On every page, a number with a unit of measure (`UNITS`) that is neither is an error, unless
//! it is a goal written as in `NOT_MEASURED`, or a mark in its block names it:
//! - `<!-- by hand 2026-12-01, COMMAND: 2.6 s, 8.4 s -->`: measured by hand, on that date, by
//!   that command (a photograph: the page says so, and when);
//! - `<!-- not measured, WHY: 60 s, 0.2 s -->`: a setting, a limit or a test's parameter.
//!
//! A mark names figures as the page writes them, and each must be in its block (the paragraph,
//! list or table it ends, up to a blank line; a fenced block is one), so a mark cannot outlive
//! its figure nor excuse one elsewhere.

use std::ops::Range;
use std::path::{Path, PathBuf};

use integration_tests::report::{MEASURED_CODE, STAMP, UNCOMMITTED};

/// Goals, as the pages write them: not measurements, so they need no reference.
const NOT_MEASURED: &[&str] = &[
    "up to 8x",            // a waiter's pause grows up to 8x (lock::wait): a setting
    "at most 1.2x",        // component / raw, per operation and at scale
    "at least 0.8x",       // 16 writers on one id against one
    "at most 450 KB",      // the component's size
    "at most 100 µs",      // instantiate + open, p50 (docs/sandbox.md)
    "within 1.5x",         // noisy neighbours: noisy / quiet, p99 per phase
    "at least 100x",       // the update stream: the original's time per message / ours
    "at most 25 ms",       // the CLI's own cost (docs/meltano.md, by hand)
    "at most 2 MiB",       // an idle instance's memory (just bench-sandbox)
    "within 3x",           // two writers of one id in turn against one (just bench-alternation)
    "at most 1.1x",        // an id's last thousand runs against its first (just bench-year)
    "within 1.10x",        // the update stream, history on against off (just bench-history)
    "no more than 1.15x",  // ours against the original, per Meltano call (just floor-check)
    "10 % either way",     // the bytes an operation sends against its budget (budgets.rs)
    "passes 1.15x",        // an operation against the baseline component's (just bench-ab)
    "failing above 1.4x",  // a call's floor against the original's (just floor-check)
    "more than 1.4x",      // the same bound, as docs/benchmarks.md writes it
    "failing above 1.05x", // exporting traces and metrics against not (just bench-telemetry-check)
    "at most 1.05x",       // the same bound, as docs/behaviour.md writes it
    "passes 1.05x",        // the same bound, as docs/benchmarks.md writes it
];

/// What makes a number a measurement: one of these words after it.
const UNITS: &str = "ms µs s min h x KB MB KiB MiB GiB % updates/s";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and docs/*.md: each page's path from the repository's root, and its text.
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("an entry of docs/").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") {
            names.push(format!("docs/{name}"));
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let text = read(&root().join(&name));
            (name, text)
        })
        .collect()
}

/// A committed results file, by its name in tests/benches/results/.
fn results(file: &str) -> String {
    read(&root().join("tests/benches/results").join(file))
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// A number that stands alone (not the `50` of `p50`), with the unit after it if that is one of
/// `UNITS`; `end` is past the unit and a closing `**`.
struct Number<'a> {
    start: usize,
    end: usize,
    digits: &'a str,
    unit: &'a str,
}

fn numbers(text: &str) -> Vec<Number<'_>> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find(|c: char| c.is_ascii_digit()) {
        let start = at + offset;
        let run = text[start..]
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map_or(&text[start..], |len| &text[start..start + len]);
        // A full stop after a number ends its sentence.
        let digits = run.trim_end_matches('.');
        at = start + digits.len();
        let in_a_word = text[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !in_a_word {
            let (mut unit, end) = unit_after(text, at);
            // The low end of a range, `45–49 ms`, has the high end's unit.
            if let Some(high) = text[at..].strip_prefix('–') {
                let len = high
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(high.len());
                if unit.is_empty() && len > 0 {
                    unit = unit_after(high, len).0;
                }
            }
            found.push(Number {
                start,
                end,
                digits,
                unit,
            });
        }
    }
    found
}

/// The unit of measure at `at` (after one space at most), if any, and where the figure ends.
fn unit_after(text: &str, at: usize) -> (&str, usize) {
    let rest = &text[at..];
    let word = rest.strip_prefix(' ').unwrap_or(rest);
    let len = word
        .find(|c: char| !(c.is_alphabetic() || c == '%' || c == '/'))
        .unwrap_or(word.len());
    let (unit, end) = if UNITS.split(' ').any(|unit| unit == &word[..len]) {
        (&word[..len], text.len() - word.len() + len)
    } else {
        ("", at)
    };
    let end = if text[end..].starts_with("**") {
        end + 2
    } else {
        end
    };
    (unit, end)
}

/// An HTML comment: where it is, and its text.
struct Comment<'a> {
    range: Range<usize>,
    body: &'a str,
}

fn comments(text: &str) -> Vec<Comment<'_>> {
    text.match_indices("<!--")
        .map(|(start, _)| {
            let end = start
                + text[start..]
                    .find("-->")
                    .unwrap_or_else(|| panic!("an unclosed comment at byte {start}"))
                + 3;
            Comment {
                range: start..end,
                body: text[start + 4..end - 3].trim(),
            }
        })
        .collect()
}

/// A block quoted from a results file: the file, the block's lines and where they are.
struct Quote<'a> {
    file: &'a str,
    range: Range<usize>,
    lines: &'a str,
}

fn quotes<'a>(text: &'a str, comments: &[Comment<'a>]) -> Vec<Quote<'a>> {
    let mut found = Vec::new();
    let mut open: Option<&Comment<'a>> = None;
    for comment in comments {
        if let Some(file) = comment.body.strip_prefix("quote ") {
            assert!(open.is_none(), "a quote inside a quote, {file}");
            open = Some(comment);
        } else if comment.body == "end quote" {
            let start = open.take().expect("an end quote without a quote");
            found.push(Quote {
                file: start.body["quote ".len()..].trim(),
                range: start.range.start..comment.range.end,
                lines: &text[start.range.end..comment.range.start],
            });
        }
    }
    assert!(open.is_none(), "a quote without an end quote");
    found
}

/// A figure's source: a results file and a number in it, or two whose ratio the figure is.
/// Each term is a text in the file and which number after it (1 for the first).
struct Reference<'a> {
    file: &'a str,
    terms: Vec<(&'a str, usize)>,
}

/// A reference, `FILE "text" N` or `ratio FILE "text" N "text" N`; `None` for other comments.
fn reference(body: &str) -> Option<Result<Reference<'_>, String>> {
    let mut parts = body.split('"');
    let head = parts.next()?.trim();
    let (ratio, file) = match head.strip_prefix("ratio ") {
        Some(file) => (true, file.trim()),
        None => (false, head),
    };
    if !file.ends_with(".md") || file.contains(' ') {
        return None;
    }
    let parts: Vec<&str> = parts.collect();
    let terms: Option<Vec<(&str, usize)>> = parts
        .chunks(2)
        .map(|pair| match *pair {
            [text, n] => n.trim().parse().ok().map(|n| (text, n)),
            _ => None,
        })
        .collect();
    Some(match terms {
        Some(terms) if terms.len() == if ratio { 2 } else { 1 } => Ok(Reference { file, terms }),
        _ => Err(format!(
            "`{body}`: expected FILE \"text\" N, or ratio FILE \"text\" N \"text\" N"
        )),
    })
}

/// The `n`th number after `text` on its line of `results`, which must hold `text` once.
fn number_after(results: &str, text: &str, n: usize) -> Result<f64, String> {
    let found: Vec<usize> = results.match_indices(text).map(|(at, _)| at).collect();
    let [at] = found[..] else {
        return Err(format!(
            "the results hold \"{text}\" {} times, not once",
            found.len()
        ));
    };
    let from = at + text.len();
    let line = &results[from..results[from..]
        .find('\n')
        .map_or(results.len(), |len| from + len)];
    let number = numbers(line)
        .into_iter()
        .nth(n.saturating_sub(1))
        .ok_or_else(|| format!("no number {n} after \"{text}\" on its line"))?;
    number
        .digits
        .parse()
        .map_err(|e| format!("\"{}\" after \"{text}\": {e}", number.digits))
}

/// The value a reference names, with how it was found.
fn value(reference: &Reference<'_>) -> Result<(f64, String), String> {
    let results = results(reference.file);
    let mut values = Vec::new();
    for &(text, n) in &reference.terms {
        values.push(number_after(&results, text, n)?);
    }
    match values[..] {
        [one] => {
            let (text, n) = reference.terms[0];
            Ok((one, format!("{one}: number {n} after \"{text}\"")))
        }
        [a, b] => Ok((a / b, format!("{a} / {b} = {:.4}", a / b))),
        _ => unreachable!("one or two terms"),
    }
}

/// `value` written with as many decimals as `like`.
fn rounded_like(value: f64, like: &str) -> String {
    let decimals = like
        .split_once('.')
        .map_or(0, |(_, fraction)| fraction.len());
    format!("{value:.decimals$}")
}

/// A page's references and the figures they follow, checked: one line per error.
fn check_references(page: &str, text: &str) -> (usize, Vec<String>) {
    let numbers = numbers(text);
    let (mut checked, mut errors) = (0, Vec::new());
    for comment in comments(text) {
        let Some(parsed) = reference(comment.body) else {
            continue;
        };
        let line = line_of(text, comment.range.start);
        let Some(figure) = numbers.iter().find(|n| n.end == comment.range.start) else {
            errors.push(format!(
                "{page}:{line}: a reference that follows no figure: `{}`",
                comment.body
            ));
            continue;
        };
        let quoted = &text[figure.start..figure.end];
        let checked_value = parsed.and_then(|reference| {
            let (value, how) = value(&reference)?;
            Ok((reference.file, value, how))
        });
        match checked_value {
            Ok((file, value, how)) => {
                checked += 1;
                let expected = rounded_like(value, figure.digits);
                if expected != figure.digits {
                    errors.push(format!(
                        "{page}:{line}: quotes {quoted}, but tests/benches/results/{file} says \
                         {expected} ({how})"
                    ));
                }
            }
            Err(e) => errors.push(format!("{page}:{line}: {quoted}: {e}")),
        }
    }
    (checked, errors)
}

/// A page's quoted blocks, checked: each is one contiguous piece of the results file (no row
/// spliced in, dropped or reordered), and a line it lacks is named with the closest one there.
fn check_quotes(page: &str, text: &str) -> (usize, Vec<String>) {
    let comments = comments(text);
    let (mut checked, mut errors) = (0, Vec::new());
    for quote in quotes(text, &comments) {
        let results = results(quote.file);
        let theirs: Vec<&str> = results.lines().collect();
        let block: Vec<&str> = quote.lines.trim_matches('\n').lines().collect();
        checked += block.iter().filter(|l| !l.is_empty()).count();
        let line = line_of(text, quote.range.start);
        let mut missing = false;
        for (i, ours) in block.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            if !theirs.contains(ours) {
                missing = true;
                let closest = theirs
                    .iter()
                    .max_by_key(|r| common_prefix(r, ours))
                    .unwrap_or(&"(an empty file)");
                errors.push(format!(
                    "{page}:{}: quotes a line that tests/benches/results/{} does not hold:\n    \
                     {ours}\n  the closest line there:\n    {closest}",
                    line + 1 + i,
                    quote.file
                ));
            }
        }
        if !missing && !block.is_empty() && !theirs.windows(block.len()).any(|w| w == block) {
            errors.push(format!(
                "{page}:{line}: the quote of tests/benches/results/{} is not one contiguous piece \
                 of it (a row spliced in, dropped or moved)",
                quote.file
            ));
        }
    }
    (checked, errors)
}

/// How many characters two lines share from their start.
fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// The byte ranges of a page's blocks: runs of lines between blank lines, where a fenced code
/// block never ends one.
fn blocks(text: &str) -> Vec<Range<usize>> {
    let (mut found, mut start, mut at, mut fenced) = (Vec::new(), 0, 0, false);
    for line in text.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.trim().is_empty() {
            if at > start {
                found.push(start..at);
            }
            start = at + line.len();
        }
        at += line.len();
    }
    if at > start {
        found.push(start..at);
    }
    found
}

/// A mark that excuses figures of its block: measured by hand (with a date and a command), or
/// not measured at all (with why).
struct Mark<'a> {
    block: Range<usize>,
    at: usize,
    body: &'a str,
    figures: Vec<(&'a str, &'a str)>,
}

/// The marks of a page, or an error for one that is malformed.
fn marks(text: &str) -> Result<Vec<Mark<'_>>, String> {
    let blocks = blocks(text);
    let mut found = Vec::new();
    for comment in comments(text) {
        let body = comment.body;
        let head = if let Some(rest) = body.strip_prefix("by hand ") {
            let date = rest.get(..10).unwrap_or_default();
            let well_formed = date.len() == 10
                && date.char_indices().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        c == '-'
                    } else {
                        c.is_ascii_digit()
                    }
                });
            let command = rest.get(10..).and_then(|r| r.strip_prefix(", "));
            if !well_formed
                || command.is_none_or(|c| c.split(": ").next().is_none_or(str::is_empty))
            {
                return Err(format!(
                    "`{body}`: expected `by hand YYYY-MM-DD, COMMAND: FIGURES`"
                ));
            }
            rest
        } else if let Some(rest) = body.strip_prefix("not measured") {
            let why = rest.strip_prefix(", ").and_then(|r| r.rsplit_once(": "));
            if why.is_none_or(|(why, _)| why.trim().is_empty()) {
                return Err(format!("`{body}`: expected `not measured, WHY: FIGURES`"));
            }
            rest
        } else {
            continue;
        };
        let Some((_, list)) = head.rsplit_once(": ") else {
            return Err(format!("`{body}`: expected the figures after `: `"));
        };
        let figures: Vec<(&str, &str)> = numbers(list)
            .into_iter()
            .map(|n| (n.digits, n.unit))
            .collect();
        if figures.is_empty() || figures.iter().any(|(_, unit)| unit.is_empty()) {
            return Err(format!(
                "`{body}`: each figure needs its unit, as in `2.6 s, 15 %`"
            ));
        }
        let block = blocks
            .iter()
            .find(|b| b.contains(&comment.range.start))
            .cloned()
            .unwrap_or(0..text.len());
        found.push(Mark {
            block,
            at: comment.range.start,
            body,
            figures,
        });
    }
    Ok(found)
}

/// Where in `text` the goals of `NOT_MEASURED` are written.
fn goals(text: &str) -> Vec<Range<usize>> {
    NOT_MEASURED
        .iter()
        .flat_map(|goal| text.match_indices(goal).map(|(at, g)| at..at + g.len()))
        .collect()
}

/// The measured figures of a page that are neither quoted, nor name their source, nor are
/// named by a mark of their block.
fn unsourced(text: &str) -> Vec<Number<'_>> {
    let comments = comments(text);
    let quoted: Vec<Range<usize>> = quotes(text, &comments)
        .into_iter()
        .map(|q| q.range)
        .collect();
    // Only a comment that is a reference sources a figure (`check_references` checks it).
    let referenced = |n: &Number<'_>| {
        comments
            .iter()
            .any(|c| c.range.start == n.end && reference(c.body).is_some())
    };
    let inside =
        |ranges: &[Range<usize>], n: &Number<'_>| ranges.iter().any(|r| r.contains(&n.start));
    let comment_ranges: Vec<Range<usize>> = comments.iter().map(|c| c.range.clone()).collect();
    let goals = goals(text);
    let marks = marks(text).unwrap_or_default();
    let marked = |n: &Number<'_>| {
        marks
            .iter()
            .any(|m| m.block.contains(&n.start) && m.figures.contains(&(n.digits, n.unit)))
    };
    numbers(text)
        .into_iter()
        .filter(|n| !n.unit.is_empty())
        .filter(|n| !referenced(n) && !inside(&comment_ranges, n) && !inside(&quoted, n))
        .filter(|n| !inside(&goals, n) && !marked(n))
        .collect()
}

#[test]
fn every_referenced_figure_is_the_committed_results_figure() {
    let (mut checked, mut errors) = (0, Vec::new());
    for (page, text) in pages() {
        let (n, e) = check_references(&page, &text);
        checked += n;
        errors.extend(e);
    }
    println!("{checked} figures checked against tests/benches/results/");
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
    assert!(checked > 0, "no page references the results");
}

#[test]
fn every_quoted_line_is_a_line_of_the_committed_results() {
    let (mut checked, mut errors) = (0, Vec::new());
    for (page, text) in pages() {
        let (n, e) = check_quotes(&page, &text);
        checked += n;
        errors.extend(e);
    }
    println!("{checked} quoted lines checked against tests/benches/results/");
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
    assert!(checked > 0, "no page quotes the results");
}

#[test]
fn every_measured_figure_on_every_page_names_its_source() {
    let mut errors = Vec::new();
    for (page, text) in pages() {
        for n in unsourced(&text) {
            errors.push(format!(
                "{page}:{}: `{}` has no reference to tests/benches/results/: add one, or, if it \
                 is a goal, a setting or measured by hand, a mark in its block (see the top of \
                 docs_figures.rs)",
                line_of(&text, n.start),
                &text[n.start..n.end]
            ));
        }
    }
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
}

#[test]
fn every_mark_names_figures_of_its_own_block() {
    let (mut checked, mut errors) = (0, Vec::new());
    for (page, text) in pages() {
        let marks = match marks(&text) {
            Ok(marks) => marks,
            Err(e) => {
                errors.push(format!("{page}: {e}"));
                continue;
            }
        };
        // The page's own figures: not those that a comment (a mark among them) writes.
        let comments: Vec<Range<usize>> = comments(&text).into_iter().map(|c| c.range).collect();
        let figures: Vec<Number<'_>> = numbers(&text)
            .into_iter()
            .filter(|n| !comments.iter().any(|c| c.contains(&n.start)))
            .collect();
        for mark in marks {
            for &(digits, unit) in &mark.figures {
                checked += 1;
                let there = figures
                    .iter()
                    .any(|n| mark.block.contains(&n.start) && (n.digits, n.unit) == (digits, unit));
                if !there {
                    errors.push(format!(
                        "{page}:{}: the mark `{}` names {digits} {unit}, which its block does \
                         not write: remove it from the mark",
                        line_of(&text, mark.at),
                        mark.body
                    ));
                }
            }
        }
    }
    println!("{checked} marked figures checked");
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
    assert!(checked > 0, "no page marks a figure");
}

#[test]
fn every_goal_that_needs_no_reference_is_on_a_page() {
    let texts: Vec<String> = pages().into_iter().map(|(_, text)| text).collect();
    for goal in NOT_MEASURED {
        assert!(
            texts.iter().any(|t| t.contains(goal)),
            "NOT_MEASURED lists `{goal}`, which no page writes: remove it"
        );
    }
}

/// The commit each section of a results file measured (its stamp), by where the section is, and
/// whether that code had uncommitted changes.
fn stamped_sections(results: &str) -> Vec<(Range<usize>, String, bool)> {
    let mut found = Vec::new();
    for (start, _) in results.match_indices("<!-- section ") {
        let end = results[start..]
            .find("<!-- /section ")
            .map_or(results.len(), |len| start + len);
        let (commit, rest) = results[start..end]
            .split_once(STAMP)
            .and_then(|(_, rest)| rest.split_once('`'))
            .unwrap_or_else(|| panic!("a section with no `{STAMP}` line"));
        let line = rest.lines().next().unwrap_or_default();
        found.push((
            start..end,
            commit.to_string(),
            line.starts_with(UNCOMMITTED),
        ));
    }
    found
}

/// Whether the measured code differs between `commit` and the working tree.
fn changed_since(commit: &str) -> bool {
    code_changed_since(commit, MEASURED_CODE)
}

/// Whether `paths` differ between `commit` and the working tree.
fn code_changed_since(commit: &str, paths: &[&str]) -> bool {
    let known = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .expect("git");
    assert!(
        known.success(),
        "a section of the report names commit {commit}, which this clone does not have"
    );
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["diff", "--quiet", commit, "--"])
        .args(paths)
        .status()
        .expect("git");
    !status.success()
}

/// Whether the page says, in the figure's paragraph or above it under the same heading, that it
/// was measured at `commit` (`measured at` and at least 7 digits of it).
fn says_where(text: &str, at: usize, commit: &str) -> bool {
    let heading = text[..at].rfind("\n#").map_or(0, |i| i + 1);
    let paragraph_end = text[at..].find("\n\n").map_or(text.len(), |len| at + len);
    let region = text[heading..paragraph_end].to_lowercase();
    region.match_indices("measured at ").any(|(i, m)| {
        let digits: String = region[i + m.len()..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        digits.len() >= 7 && commit.starts_with(&digits)
    })
}

#[test]
fn every_quote_of_a_section_whose_code_changed_since_says_where_it_was_measured() {
    let mut changed = std::collections::HashMap::new();
    let mut stale = |commit: &str| {
        *changed
            .entry(commit.to_string())
            .or_insert_with(|| changed_since(commit))
    };
    let (mut checked, mut errors) = (0, Vec::new());
    for (page, text) in pages() {
        let comments = comments(&text);
        // Each figure's reference or quote: where it is on the page, the file and a text of it.
        let mut quoted: Vec<(usize, String, String)> = Vec::new();
        for comment in &comments {
            if let Some(Ok(reference)) = reference(comment.body) {
                for (needle, _) in &reference.terms {
                    quoted.push((
                        comment.range.start,
                        reference.file.into(),
                        needle.to_string(),
                    ));
                }
            }
        }
        // A quoted block is found whole (a header repeated in another section cannot stand in).
        for quote in quotes(&text, &comments) {
            let block = quote.lines.trim_matches('\n');
            quoted.push((quote.range.start, quote.file.into(), block.to_string()));
        }
        for (at, file, needle) in quoted {
            let results = results(&file);
            let Some(found) = results.find(&needle) else {
                continue; // the other tests name what is missing
            };
            let Some((_, commit, uncommitted)) = stamped_sections(&results)
                .into_iter()
                .find(|(range, _, _)| range.contains(&found))
            else {
                continue; // a file without sections
            };
            checked += 1;
            if (uncommitted || stale(&commit)) && !says_where(&text, at, &commit) {
                errors.push(format!(
                    "{page}:{}: quotes a section of {file} measured at {commit}, whose measured \
                     code has changed since: rerun its benchmark, or say \"measured at {}\" in \
                     the figure's paragraph or above it under its heading",
                    line_of(&text, at),
                    &commit[..7]
                ));
            }
        }
    }
    println!("{checked} quotes of stamped sections checked");
    errors.dedup();
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
    assert!(checked > 0, "no page quotes a stamped section");
}

/// The justfile's `fenced_io`: the lock's sending functions, which `just mutants` leaves out and
/// `just mutants-engine` mutates.
fn fenced_io(justfile: &str) -> &str {
    justfile
        .lines()
        .find(|l| l.starts_with("fenced_io :="))
        .unwrap_or("")
}

/// The commands of a justfile's recipe (each with its continuation lines) that start with
/// `command`, after the `fenced_io` they share: what decides a mutation run's mutants and oracle.
fn run_recipe(justfile: &str, header: &str, command: &str) -> String {
    let start = justfile
        .find(&format!("\n{header}\n"))
        .map_or(justfile.len(), |at| at + 1);
    let recipe = &justfile[start..];
    let recipe = &recipe[..recipe.find("\n\n").unwrap_or(recipe.len())];
    let mut commands = format!("{}\n", fenced_io(justfile));
    let mut within = false;
    for line in recipe.lines().skip(1) {
        // Whether the recipe goes on after a command fails is not what it mutates.
        let line = line.trim().trim_start_matches(['-', '@']);
        within = within || line.contains(command);
        if within {
            commands.push_str(line);
            commands.push('\n');
            within = line.ends_with('\\');
        }
    }
    commands
}

/// The `cargo mutants` commands of the `mutants` recipe.
fn mutants_recipe(justfile: &str) -> String {
    run_recipe(justfile, "mutants *ARGS:", "cargo mutants")
}

/// The command of the `mutants-engine` recipe.
fn engine_recipe(justfile: &str) -> String {
    run_recipe(
        justfile,
        "mutants-engine: clickhouse-start",
        "tests/mutants/engine.py",
    )
}

/// The files a `mutants` recipe mutates: its every `--file`.
fn mutated_files(recipe: &str) -> Vec<String> {
    let words: Vec<&str> = recipe.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--file")
        .map(|w| w[1].to_string())
        .collect()
}

/// The engine's suites that judge `just mutants-engine` (engine.py's `SUITES`), as test files.
fn engine_suites() -> Vec<String> {
    let script = read(&root().join("tests/mutants/engine.py"));
    let suites = script
        .lines()
        .find_map(|l| l.strip_prefix("SUITES = ("))
        .and_then(|l| l.strip_suffix(')'))
        .expect("tests/mutants/engine.py names its SUITES on one line");
    suites
        .split(',')
        .map(|s| s.trim().trim_matches('"'))
        .filter(|s| !s.is_empty())
        .map(|s| format!("tests/tests/integration/{s}.rs"))
        .collect()
}

#[test]
fn a_mutation_report_is_of_the_code_as_it_is_or_the_lock_page_says_since_when() {
    let justfile = read(&root().join("justfile"));
    let recipe = mutants_recipe(&justfile);
    let files = mutated_files(&recipe);
    assert!(
        !files.is_empty(),
        "the justfile's `mutants` recipe names no --file"
    );
    // What each run's report depends on: the code it mutates and what judges it. The native run:
    // the mutated files and the model's checks. The engine's: the component's code, the host
    // library that runs it (not its CLI, nor the serving of the protocol to another process or
    // to Meltano's, which none of the suites runs), the suites, and the script.
    let mut native: Vec<String> = files.clone();
    native.push("model/".into());
    let mut engine: Vec<String> = [
        "guest/src",
        "host/src",
        ":(exclude)host/src/cli",
        ":(exclude)host/src/serve",
        ":(exclude)host/src/embedded",
        "tests/src",
        "tests/mutants/engine.py",
    ]
    .map(String::from)
    .to_vec();
    for suite in engine_suites() {
        let text = read(&root().join(&suite));
        for (used, part) in [
            ("state_backend_binary", "host/src/cli"),
            ("serve::", "host/src/serve"),
            ("embedded::", "host/src/embedded"),
        ] {
            assert!(
                !text.contains(used),
                "{suite} uses {used}: the engine's report then depends on {part} too"
            );
        }
    }
    engine.extend(engine_suites());
    let lock = read(&root().join("docs/lock.md")).to_lowercase();
    let mut reports = 0;
    for entry in std::fs::read_dir(root().join("docs/mutants")).expect("docs/mutants/") {
        let name = entry.expect("an entry of docs/mutants/").file_name();
        let name = name.to_string_lossy().to_string();
        if name == "sql-guard.txt" {
            continue; // the SQL guard's mutants, which every `just test` runs
        }
        let stem = name.strip_suffix(".txt").unwrap_or("");
        let (commit, engine_run) = match stem.strip_suffix("-engine") {
            Some(commit) => (commit, true),
            None => (stem.strip_suffix("-settle").unwrap_or(stem), false),
        };
        assert!(
            name.ends_with(".txt")
                && commit.len() >= 7
                && commit.chars().all(|c| c.is_ascii_hexdigit()),
            "docs/mutants/{name}: a report of `just mutants` is named COMMIT.txt or \
             COMMIT-settle.txt (`just mutants-report`), of `just mutants-engine` COMMIT-engine.txt"
        );
        reports += 1;
        assert!(
            lock.contains(&format!("docs/mutants/{}", name.to_lowercase())),
            "docs/lock.md does not name docs/mutants/{name}: name it, or remove the report"
        );
        let then = std::process::Command::new("git")
            .arg("-C")
            .arg(root())
            .args(["show", &format!("{commit}:justfile")])
            .output()
            .expect("git");
        let then = String::from_utf8_lossy(&then.stdout);
        let (same_recipe, paths, since) = if engine_run {
            let since = format!("not rerun since {}-engine", &commit[..7]);
            (
                engine_recipe(&then) == engine_recipe(&justfile),
                &engine,
                since,
            )
        } else {
            let since = format!("not rerun since {}", &commit[..7]);
            (mutants_recipe(&then) == recipe, &native, since)
        };
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        if !same_recipe || code_changed_since(commit, &paths) {
            assert!(
                lock.contains(&since),
                "docs/mutants/{name} is of {commit}, and what it measured ({}) or its recipe has \
                 changed since: run it again and commit its report, or say \"{since}\" in \
                 docs/lock.md",
                paths.join(", "),
            );
        }
    }
    assert!(reports > 0, "no report of `just mutants` in docs/mutants/");
}

#[test]
fn the_mutants_left_to_the_engine_are_the_lock_functions_that_send() {
    let justfile = read(&root().join("justfile"));
    let line = fenced_io(&justfile);
    assert!(
        line.contains("'^guest/src/lock/fenced\\.rs:"),
        "the justfile's fenced_io is anchored to fenced.rs's mutants: {line:?}"
    );
    let named: std::collections::BTreeSet<&str> = line
        .split_once("(replace|in) (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(names, _)| names.split('|').collect())
        .unwrap_or_default();
    // A function that sends takes the session's transport and platform.
    let source = read(&root().join("guest/src/lock/fenced.rs"));
    let code = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
    let sending: std::collections::BTreeSet<&str> = code
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = ["pub(crate) ", "pub "]
                .iter()
                .find_map(|vis| line.strip_prefix(vis))
                .unwrap_or(line);
            let (name, generics) = line.strip_prefix("fn ")?.split_once('<')?;
            generics.starts_with("T: Transport").then_some(name)
        })
        .collect();
    assert!(
        !sending.is_empty(),
        "fenced.rs has no function taking a session"
    );
    assert_eq!(
        named, sending,
        "the justfile's fenced_io must name exactly fenced.rs's functions that take a session \
         (left: fenced_io, right: fenced.rs): a sending function left out of it is mutated \
         against an oracle that never runs it, one named that does not send is never mutated"
    );
}
