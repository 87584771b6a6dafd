//! Every setting `open` accepts, in one table: its name, the environment variable the host reads
//! it from, its default and what it means.
//!
//! [`crate::config`] parses them; the host derives its environment variables, its `--setting`
//! help and its `settings` command from this table; tests hold the README's table and the
//! Meltano settings to it. A unit test below applies every entry's default and example, so the
//! parser and the table cannot disagree on a name or a default.

/// One setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    /// The variable the host reads it from (the original Python backend's names), if any.
    pub env: Option<&'static str>,
    /// The value that means the same as leaving it unset, if there is one (a host, a user, a
    /// database come from the URI instead).
    pub default: Option<&'static str>,
    /// What the default is, for a reader ("from the URI (required)", "8123, or 8443 when
    /// secure").
    pub default_doc: &'static str,
    pub doc: &'static str,
    /// A valid value, other than the default where it can be.
    pub example: &'static str,
    /// The default when a long-lived host serves a caller such as Meltano (`state-backend
    /// serve`), if it differs from `default`.
    pub served_default: Option<&'static str>,
}

const fn setting(
    name: &'static str,
    env: Option<&'static str>,
    default: Option<&'static str>,
    default_doc: &'static str,
    doc: &'static str,
    example: &'static str,
) -> Setting {
    Setting {
        name,
        env,
        default,
        default_doc,
        doc,
        example,
        served_default: None,
    }
}

impl Setting {
    /// How a caller's form shows it: `boolean` (true or false), `secret` (never shown), or
    /// `text` (numbers too: the parser names the setting when one is wrong).
    pub fn kind(&self) -> &'static str {
        match (self.name, self.default) {
            ("password", _) => "secret",
            (_, Some("false" | "true")) => "boolean",
            _ => "text",
        }
    }

    /// This setting with another default when served.
    const fn when_served(mut self, value: &'static str) -> Setting {
        self.served_default = Some(value);
        self
    }
}

/// The defaults a long-lived host applies when serving (`state-backend serve`), where they
/// differ from the component's: `(name, value)`.
pub fn served_defaults() -> impl Iterator<Item = (&'static str, &'static str)> {
    SETTINGS
        .iter()
        .filter_map(|s| s.served_default.map(|value| (s.name, value)))
}

/// The settings, in the order the documentation lists them.
pub const SETTINGS: &[Setting] = &[
    setting(
        "host",
        Some("CLICKHOUSE_HOST"),
        None,
        "from the URI",
        "server host",
        "ch.example.com",
    ),
    setting(
        "port",
        Some("CLICKHOUSE_PORT"),
        None,
        "8123, or 8443 when secure",
        "HTTP(S) port",
        "9000",
    ),
    setting(
        "database",
        Some("CLICKHOUSE_DATABASE"),
        None,
        "from the URI (required)",
        "database of the connection",
        "analytics",
    ),
    setting(
        "user",
        Some("CLICKHOUSE_USER"),
        None,
        "from the URI (required)",
        "user",
        "meltano",
    ),
    setting(
        "password",
        Some("CLICKHOUSE_PASSWORD"),
        None,
        "from the URI, else empty",
        "password (sent only in the `X-ClickHouse-Key` header)",
        "hunter2",
    ),
    setting(
        "secure",
        Some("CLICKHOUSE_SECURE"),
        Some("false"),
        "false",
        "https, certificates verified",
        "true",
    ),
    setting(
        "schema",
        Some("CLICKHOUSE_SCHEMA"),
        Some("meltano"),
        "`meltano`",
        "database that holds the tables",
        "state_db",
    ),
    setting(
        "table",
        Some("CLICKHOUSE_TABLE"),
        Some("state"),
        "`state`",
        "state table; the lock tables are `<table>_lock_log` and `<table>_lock`",
        "bookmarks",
    ),
    setting(
        "lock_timeout_seconds",
        None,
        Some("30"),
        "30",
        "how long taking a lock keeps trying; also the lease of an `update`'s lock (at least 10, \
         at most `lock_lease_seconds`), so a killed holder keeps an id this long at most",
        "5",
    ),
    setting(
        "lock_retry_seconds",
        None,
        Some("1"),
        "1",
        "pause between tries (±20 % jitter; up to 8x while others win the hand-offs); how \
         often a lock kept idle looks whether another process waits for it",
        "0.5",
    ),
    setting(
        "lock_mode",
        None,
        Some("fenced"),
        "`fenced`",
        "`fenced`, or `settle` while any process still runs the original Python backend",
        "settle",
    ),
    setting(
        "lock_lease_seconds",
        None,
        Some("300"),
        "300",
        "an explicit lock (`lock`, Meltano's `acquire_lock`) is lost this long after its holder \
         stops renewing it",
        "60",
    ),
    setting(
        "lock_linger_seconds",
        None,
        Some("0"),
        "0 (5 when served, as for Meltano)",
        "fenced mode: an `update` keeps its lock for the next `update` of the id (one round \
         trip), and gives it back once idle this long, or as soon as another process waits for \
         it; not for a lease after it met another writer of the id",
        "2",
    )
    // A long-lived instance keeps the lock of the id it updates for the next update (one round
    // trip each: Meltano's stream of STATE messages), and gives it back when idle.
    .when_served("5"),
    setting(
        "run_lock",
        None,
        Some("true"),
        "true",
        "fenced mode: a run of a pipeline (`meltano run`, `el`, `elt`) holds its state id from \
         its first read until it ends, so that a second run of it is refused at its start; \
         renewed while the run lives, given back at its end, lapsed after \
         `lock_timeout_seconds` if it dies; no statement per STATE message",
        "false",
    ),
    setting(
        "lock_settle_seconds",
        None,
        Some("1"),
        "1",
        "settle mode's wait before deciding",
        "2",
    ),
    setting(
        "retry_budget_seconds",
        None,
        Some("60"),
        "60",
        "how long a call keeps trying again after transient failures (refused connections, \
         resets, 502/503/504, ClickHouse's transient errors), never past a held lock's lease",
        "120",
    ),
    setting(
        "retries",
        None,
        None,
        "no limit",
        "at most this many retries of a request (0-1000), within the budget",
        "5",
    ),
    setting(
        "retry_backoff_seconds",
        None,
        Some("0.2"),
        "0.2",
        "first pause before a retry; doubles each time, at most 2 s, with jitter",
        "1",
    ),
    setting(
        "cluster",
        None,
        None,
        "none",
        "a self-managed replicated cluster: the schema is created `ON CLUSTER` it, with \
         Replicated engines",
        "prod",
    ),
    setting(
        "history",
        None,
        Some("true"),
        "true",
        "keep every write of a state in `<table>_history`, for `history`, `get --at`, `diff` \
         and `restore`",
        "false",
    ),
    setting(
        "history_days",
        None,
        Some("90"),
        "90",
        "the history drops writes older than this (a TTL; 0 keeps them for ever)",
        "7",
    ),
    setting(
        "history_versions",
        None,
        Some("0"),
        "0",
        "the history keeps at most this many versions of each id, newest first (0: no limit)",
        "1000",
    ),
];

/// The names, in table order.
pub fn names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().copied()
}

/// The names alone, derived from [`SETTINGS`] at compile time: a component that only parses
/// settings refers to these, and so does not carry every setting's documentation.
const NAMES: [&str; SETTINGS.len()] = {
    let mut names = [""; SETTINGS.len()];
    let mut i = 0;
    while i < SETTINGS.len() {
        names[i] = SETTINGS[i].name;
        i += 1;
    }
    names
};

/// The entry for `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const URI: &str = "clickhouse://u:p@h:8123/db";

    fn with(name: &str, value: &str) -> Result<Config, crate::error::Error> {
        Config::parse(URI, &[(name.to_string(), value.to_string())])
    }

    #[test]
    fn the_parser_accepts_every_setting_in_the_table_and_no_other() {
        for s in SETTINGS {
            let config = with(s.name, s.example);
            assert!(config.is_ok(), "{}={}: {config:?}", s.name, s.example);
        }
        assert!(with("no_such_setting", "1").is_err());
    }

    #[test]
    fn each_default_means_what_leaving_it_unset_means() {
        let unset = Config::parse(URI, &[]).expect("valid");
        for s in SETTINGS {
            if let Some(default) = s.default {
                assert_eq!(with(s.name, default).as_ref(), Ok(&unset), "{}", s.name);
                // ...and the example changes something, so the comparison can fail.
                assert_ne!(with(s.name, s.example).as_ref(), Ok(&unset), "{}", s.name);
                assert!(
                    s.default_doc.contains(default),
                    "{}: the documented default does not say {default}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn each_served_default_is_valid_changes_something_and_is_documented() {
        let unset = Config::parse(URI, &[]).expect("valid");
        let served: Vec<_> = served_defaults().collect();
        assert!(!served.is_empty());
        for (name, value) in served {
            assert_ne!(with(name, value).as_ref(), Ok(&unset), "{name}");
            let doc = find(name).map(|s| s.default_doc).unwrap_or_default();
            assert!(
                doc.contains(&format!("{value} when served")),
                "{name}: {doc}"
            );
        }
    }

    #[test]
    fn names_and_variables_are_unique() {
        let mut names: Vec<_> = names().collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
        let mut vars: Vec<_> = SETTINGS.iter().filter_map(|s| s.env).collect();
        let count = vars.len();
        vars.sort_unstable();
        vars.dedup();
        assert_eq!(vars.len(), count);
    }
}
