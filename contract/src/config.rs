//! Where the state lives and how to log in: a `clickhouse://` URI plus settings that override it.
//!
//! ```text
//! clickhouse://user:password@host:port/database[?secure=true]
//! ```
//! User and password are percent-decoded. Settings (`host`, `port`, `database`, `user`,
//! `password`, `secure`, `schema`, `table`, `lock_timeout_seconds`, `lock_retry_seconds`,
//! `cluster`, ...: see [`crate::settings`]) win over the URI. `secure` means https, on port 8443
//! unless a port is given.
//!
//! The host compiles this module natively too, so the authority it allows is exactly the one the
//! guest will call.

use std::fmt;

use crate::error::{Error, Result};
use crate::values::{
    decode, parse_bool, parse_count, parse_port, parse_seconds, validate_identifier,
};

pub const DEFAULT_SCHEMA: &str = "meltano";
pub const DEFAULT_TABLE: &str = "state";
pub const HTTP_PORT: u16 = 8123;
pub const HTTPS_PORT: u16 = 8443;
/// The original backend gives up acquiring a lock after 30 s.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_LOCK_RETRY_MS: u64 = 1_000;
/// A holder that stops renewing loses the lock after this long.
pub const DEFAULT_LOCK_LEASE_MS: u64 = 300_000;
/// The original protocol's settle time.
pub const DEFAULT_LOCK_SETTLE_MS: u64 = 1_000;

/// Which lock protocol to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Generations in an append-only lock log, with fencing tokens and leases (the default).
    Fenced,
    /// The original Python backend's settle-then-decide protocol on its `<table>_lock` table,
    /// for fleets that still run the Python backend.
    Settle,
}

/// How long a call keeps trying again after a transient failure: long enough to ride through a
/// server restart or a failover (ClickHouse Cloud restarts replicas for upgrades and scaling).
pub const DEFAULT_RETRY_BUDGET_MS: u64 = 60_000;
/// The first pause before a retry; it doubles with each try, up to 2 s (see `retry`).
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 200;

/// A password. Its `Debug` and `Display` never show it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// http or https.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// A parsed, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub scheme: Scheme,
    /// Host name or IP address; IPv6 addresses without brackets.
    pub host: String,
    pub port: u16,
    /// The database the connection uses (`database` URL parameter).
    pub database: String,
    pub user: String,
    pub password: Secret,
    /// The database that holds the state tables.
    pub schema: String,
    pub table: String,
    pub lock_timeout_ms: u64,
    pub lock_retry_ms: u64,
    pub lock_mode: LockMode,
    pub lock_lease_ms: u64,
    /// How long an `update` keeps its lock for the next one (fenced mode; 0: released at once).
    pub lock_linger_ms: u64,
    pub lock_settle_ms: u64,
    /// A run holds its state id from its first read until it ends (`hold-run`; fenced mode).
    pub run_lock: bool,
    /// At most this many retries of a request, if set; the budget bounds them anyway.
    pub retries: Option<u32>,
    pub retry_backoff_ms: u64,
    pub retry_budget_ms: u64,
    /// A self-managed replicated cluster (a name in `system.clusters`): the schema is created
    /// `ON CLUSTER` it, with Replicated engines. None on one server and on ClickHouse Cloud.
    pub cluster: Option<String>,
    /// Keep every write of a state in `<table>_history` (see [`Config::history_table`]).
    pub history: bool,
    /// History rows older than this are dropped by the table's TTL (0: kept for ever).
    pub history_days: u32,
    /// The history keeps at most this many versions of each id (0: no limit), by slots that
    /// merges replace (see the guest's `sql::history`).
    pub history_versions: u32,
}

/// How long the history keeps a write by default.
pub const DEFAULT_HISTORY_DAYS: u32 = 90;
/// The longest a history's TTL can be: a `DateTime` (the TTL's type) wraps after 2106, and a
/// TTL past it would come out in the past and drop every row.
pub const MAX_HISTORY_DAYS: u32 = 3650;
/// The most versions per id a history can be set to keep.
pub const MAX_HISTORY_VERSIONS: u32 = 1_000_000;

/// What a configuration error is about: the URI, or one setting (which may also have come
/// from the URI, as the user or the database can). Callers that know their own name for a
/// setting (Meltano's `state_backend.clickhouse.user`) name it in their message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Culprit {
    Uri,
    Setting(String),
}

/// A configuration error and what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub culprit: Culprit,
    pub error: Error,
}

impl ConfigError {
    fn setting(name: &str, error: Error) -> Self {
        ConfigError {
            culprit: Culprit::Setting(name.to_string()),
            error,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        e.error
    }
}

impl Config {
    /// Parses `uri` and applies `settings` over it.
    pub fn parse(uri: &str, settings: &[(String, String)]) -> Result<Config> {
        Ok(Config::parse_blaming(uri, settings)?)
    }

    /// As [`Config::parse`], saying which input an error is about.
    pub fn parse_blaming(
        uri: &str,
        settings: &[(String, String)],
    ) -> std::result::Result<Config, ConfigError> {
        let mut parts = UriParts::parse(uri).map_err(|error| ConfigError {
            culprit: Culprit::Uri,
            error,
        })?;
        for (name, value) in settings {
            parts
                .apply(name, value)
                .map_err(|e| ConfigError::setting(name, e))?;
        }
        parts.finish()
    }

    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `scheme://host:port`, for messages (never with credentials).
    pub fn endpoint(&self) -> String {
        format!("{}://{}", self.scheme.as_str(), self.authority())
    }

    /// The lock table of the original backend: `<table>_lock`.
    pub fn lock_table(&self) -> String {
        format!("{}_lock", self.table)
    }

    /// The append-only lock log of the fenced protocol: `<table>_lock_log`.
    pub fn lock_log_table(&self) -> String {
        format!("{}_lock_log", self.table)
    }

    /// The append-only history of this backend's writes: `<table>_history`. Its materialized
    /// view `<table>_history_to_state` copies each row into the state table.
    pub fn history_table(&self) -> String {
        format!("{}_history", self.table)
    }

    pub fn history_view(&self) -> String {
        format!("{}_history_to_state", self.table)
    }

    /// Who the writing processes were (`store.identify`), one row each: `<table>_writers`.
    pub fn writers_table(&self) -> String {
        format!("{}_writers", self.table)
    }
}

/// What the URI and settings said, before defaults and validation.
#[derive(Default)]
struct UriParts {
    secure: Option<bool>,
    host: Option<String>,
    port: Option<u16>,
    database: Option<String>,
    user: Option<String>,
    password: Option<Secret>,
    schema: Option<String>,
    table: Option<String>,
    lock_timeout_ms: Option<u64>,
    lock_retry_ms: Option<u64>,
    lock_mode: Option<LockMode>,
    lock_lease_ms: Option<u64>,
    lock_linger_ms: Option<u64>,
    lock_settle_ms: Option<u64>,
    run_lock: Option<bool>,
    retries: Option<u32>,
    retry_backoff_ms: Option<u64>,
    retry_budget_ms: Option<u64>,
    cluster: Option<String>,
    history: Option<bool>,
    history_days: Option<u32>,
    history_versions: Option<u32>,
}

impl UriParts {
    fn parse(uri: &str) -> Result<UriParts> {
        // Never echo the URI: it may carry the password.
        let uri = crate::uri::parse(uri).map_err(|e| {
            Error::InvalidConfig(format!(
                "the URI is not valid ({e}); expected clickhouse://user:password@host:port/database"
            ))
        })?;
        let mut parts = UriParts::default();
        match uri.scheme.as_str() {
            "clickhouse" => {}
            "http" => parts.secure = Some(false),
            "https" => parts.secure = Some(true),
            other => {
                return Err(Error::InvalidConfig(format!(
                    "unknown URI scheme '{other}'; expected clickhouse://, http:// or https://"
                )));
            }
        }
        // A name, an IPv4 address, or an IPv6 address normalised and without brackets.
        parts.host = uri.host;
        parts.port = uri.port;
        if !uri.user.is_empty() {
            parts.user = Some(decode(&uri.user, "user")?);
        }
        if let Some(password) = &uri.password {
            parts.password = Some(Secret::new(decode(password, "password")?));
        }
        let path = uri.path.trim_start_matches('/');
        if !path.is_empty() {
            if path.contains('/') {
                return Err(Error::InvalidConfig(
                    "the URI path must be a single database name".into(),
                ));
            }
            parts.database = Some(decode(path, "database")?);
        }
        for (name, value) in form_urlencoded::parse(uri.query.as_deref().unwrap_or("").as_bytes()) {
            match name.as_ref() {
                "secure" => parts.secure = Some(parse_bool("secure", &value)?),
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "unknown URI parameter '{other}'; only 'secure' is accepted (use settings for the rest)"
                    )));
                }
            }
        }
        Ok(parts)
    }

    fn apply(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "host" => self.host = Some(value.to_string()),
            "port" => self.port = Some(parse_port(value)?),
            "database" => self.database = Some(value.to_string()),
            "user" => self.user = Some(value.to_string()),
            "password" => self.password = Some(Secret::new(value)),
            "secure" => self.secure = Some(parse_bool("secure", value)?),
            "schema" => self.schema = Some(value.to_string()),
            "table" => self.table = Some(value.to_string()),
            "lock_timeout_seconds" => {
                self.lock_timeout_ms = Some(parse_seconds(name, value, true)?);
            }
            "lock_retry_seconds" => self.lock_retry_ms = Some(parse_seconds(name, value, false)?),
            "lock_lease_seconds" => self.lock_lease_ms = Some(parse_seconds(name, value, false)?),
            "lock_linger_seconds" => {
                self.lock_linger_ms = Some(parse_seconds(name, value, true)?);
            }
            "lock_settle_seconds" => {
                self.lock_settle_ms = Some(parse_seconds(name, value, true)?);
            }
            "run_lock" => self.run_lock = Some(parse_bool(name, value)?),
            "retries" => {
                self.retries = Some(parse_count(name, value, 1000, "", "")?);
            }
            "retry_backoff_seconds" => {
                self.retry_backoff_ms = Some(parse_seconds(name, value, true)?);
            }
            "retry_budget_seconds" => {
                self.retry_budget_ms = Some(parse_seconds(name, value, true)?);
            }
            "cluster" => self.cluster = Some(value.trim().to_string()),
            "history" => self.history = Some(parse_bool(name, value)?),
            "history_days" => {
                self.history_days = Some(parse_count(
                    name,
                    value,
                    MAX_HISTORY_DAYS,
                    " of days",
                    " (keep for ever)",
                )?);
            }
            "history_versions" => {
                self.history_versions = Some(parse_count(
                    name,
                    value,
                    MAX_HISTORY_VERSIONS,
                    " of versions per id",
                    " (no limit)",
                )?);
            }
            "lock_mode" => {
                self.lock_mode = Some(match value.trim().to_ascii_lowercase().as_str() {
                    "fenced" | "" => LockMode::Fenced,
                    "settle" => LockMode::Settle,
                    _ => {
                        return Err(Error::InvalidConfig(format!(
                            "'lock_mode' must be 'fenced' or 'settle', not '{value}'"
                        )));
                    }
                });
            }
            other => {
                return Err(Error::InvalidConfig(format!(
                    "unknown setting '{other}'; known settings: {}",
                    crate::settings::names().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Ok(())
    }

    fn finish(self) -> std::result::Result<Config, ConfigError> {
        fn blame(name: &'static str) -> impl Fn(Error) -> ConfigError {
            move |e| ConfigError::setting(name, e)
        }
        let scheme = if self.secure.unwrap_or(false) {
            Scheme::Https
        } else {
            Scheme::Http
        };
        let host = self
            .host
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::InvalidConfig("missing host".into()))
            .map_err(blame("host"))?;
        let port = self.port.unwrap_or(match scheme {
            Scheme::Http => HTTP_PORT,
            Scheme::Https => HTTPS_PORT,
        });
        if port == 0 {
            return Err(blame("port")(Error::InvalidConfig("invalid port 0".into())));
        }
        let user = self
            .user
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                Error::InvalidConfig("missing user (in the URI or the 'user' setting)".into())
            })
            .map_err(blame("user"))?;
        let database = self.database.filter(|d| !d.is_empty()).ok_or_else(|| {
            blame("database")(Error::InvalidConfig(
                "missing database (the URI path, e.g. clickhouse://host:8123/default, or the 'database' setting)".into(),
            ))
        })?;
        let schema = self.schema.unwrap_or_else(|| DEFAULT_SCHEMA.into());
        let table = self.table.unwrap_or_else(|| DEFAULT_TABLE.into());
        validate_identifier("schema", &schema).map_err(blame("schema"))?;
        validate_identifier("table", &table).map_err(blame("table"))?;
        if table.len() > 190 {
            return Err(blame("table")(Error::InvalidConfig(
                "table name is too long".into(),
            )));
        }
        let cluster = self.cluster.filter(|c| !c.is_empty());
        if let Some(cluster) = &cluster {
            validate_identifier("cluster", cluster).map_err(blame("cluster"))?;
        }
        Ok(Config {
            scheme,
            host,
            port,
            database,
            user,
            password: self.password.unwrap_or_default(),
            schema,
            table,
            lock_timeout_ms: self.lock_timeout_ms.unwrap_or(DEFAULT_LOCK_TIMEOUT_MS),
            lock_retry_ms: self.lock_retry_ms.unwrap_or(DEFAULT_LOCK_RETRY_MS),
            lock_mode: self.lock_mode.unwrap_or(LockMode::Fenced),
            lock_lease_ms: self.lock_lease_ms.unwrap_or(DEFAULT_LOCK_LEASE_MS),
            run_lock: self.run_lock.unwrap_or(true),
            lock_linger_ms: self.lock_linger_ms.unwrap_or(0),
            lock_settle_ms: self.lock_settle_ms.unwrap_or(DEFAULT_LOCK_SETTLE_MS),
            retries: self.retries,
            retry_backoff_ms: self.retry_backoff_ms.unwrap_or(DEFAULT_RETRY_BACKOFF_MS),
            retry_budget_ms: self.retry_budget_ms.unwrap_or(DEFAULT_RETRY_BUDGET_MS),
            cluster,
            history: self.history.unwrap_or(true),
            history_days: self.history_days.unwrap_or(DEFAULT_HISTORY_DAYS),
            history_versions: self.history_versions.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn err(uri: &str, pairs: &[(&str, &str)]) -> String {
        match Config::parse(uri, &settings(pairs)) {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("expected invalid-config, got {other:?}"),
        }
    }

    #[test]
    fn parses_a_full_uri() {
        let c = Config::parse(
            "clickhouse://bob:s%40cret%2F1@db.example:9000/analytics",
            &[],
        )
        .expect("valid");
        assert_eq!(c.scheme, Scheme::Http);
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 9000);
        assert_eq!(c.user, "bob");
        assert_eq!(c.password.expose(), "s@cret/1");
        assert_eq!(c.database, "analytics");
        assert_eq!(c.schema, "meltano");
        assert_eq!(c.table, "state");
        assert_eq!(c.lock_timeout_ms, 30_000);
        assert_eq!(c.authority(), "db.example:9000");
    }

    #[test]
    fn percent_decodes_user() {
        let c = Config::parse("clickhouse://us%20er:p@h/db", &[]).expect("valid");
        assert_eq!(c.user, "us er");
    }

    #[test]
    fn default_ports_follow_secure() {
        let c = Config::parse("clickhouse://u@h/db", &[]).expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Http, 8123));
        let c = Config::parse("clickhouse://u@h/db?secure=true", &[]).expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Https, 8443));
        let c =
            Config::parse("clickhouse://u@h/db", &settings(&[("secure", "true")])).expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Https, 8443));
        let c = Config::parse("clickhouse://u@h:9443/db?secure=true", &[]).expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Https, 9443));
        let c = Config::parse("https://u@h/db", &[]).expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Https, 8443));
        let c = Config::parse(
            "clickhouse://u@h/db?secure=true",
            &settings(&[("secure", "false")]),
        )
        .expect("valid");
        assert_eq!((c.scheme, c.port), (Scheme::Http, 8123));
    }

    #[test]
    fn settings_override_the_uri() {
        let c = Config::parse(
            "clickhouse://u:p@h:1/db",
            &settings(&[
                ("host", "other"),
                ("port", "2"),
                ("database", "d2"),
                ("user", "u2"),
                ("password", "p2"),
                ("schema", "s2"),
                ("table", "t2"),
                ("lock_timeout_seconds", "2.5"),
                ("lock_retry_seconds", "0.1"),
            ]),
        )
        .expect("valid");
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.database.as_str(),
                c.user.as_str()
            ),
            ("other", 2, "d2", "u2")
        );
        assert_eq!(c.password.expose(), "p2");
        assert_eq!((c.schema.as_str(), c.table.as_str()), ("s2", "t2"));
        assert_eq!((c.lock_timeout_ms, c.lock_retry_ms), (2500, 100));
        let m = Config::parse(
            "clickhouse://u@h/db",
            &settings(&[
                ("lock_mode", "settle"),
                ("lock_lease_seconds", "60"),
                ("lock_settle_seconds", "0"),
            ]),
        )
        .expect("valid");
        assert_eq!(
            (m.lock_mode, m.lock_lease_ms, m.lock_settle_ms),
            (LockMode::Settle, 60_000, 0)
        );
        assert_eq!(
            Config::parse("clickhouse://u@h/db", &[])
                .expect("valid")
                .lock_mode,
            LockMode::Fenced
        );
        assert_eq!(c.lock_table(), "t2_lock");
    }

    #[test]
    fn ipv6_hosts_keep_brackets_in_the_authority() {
        let c = Config::parse("clickhouse://u@[::1]:8123/db", &[]).expect("valid");
        assert_eq!(c.host, "::1");
        assert_eq!(c.authority(), "[::1]:8123");
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert!(err("clickhouse://h:8123/db", &[]).contains("missing user"));
        assert!(err("clickhouse://u@h:8123", &[]).contains("missing database"));
        assert!(err("clickhouse://u@h:8123/", &[]).contains("missing database"));
        assert!(err("clickhouse://u@h:99999/db", &[]).contains("not valid"));
        assert!(err("clickhouse://u@h/db", &[("port", "abc")]).contains("invalid port 'abc'"));
        assert!(err("clickhouse://u@h/db", &[("port", "0")]).contains("invalid port"));
        assert!(err("postgres://u@h/db", &[]).contains("unknown URI scheme 'postgres'"));
        assert!(err("clickhouse://u@h/db?foo=1", &[]).contains("unknown URI parameter 'foo'"));
        assert!(err("clickhouse://u@h/db", &[("nope", "1")]).contains("unknown setting 'nope'"));
        assert!(err("clickhouse://u@h/db", &[("secure", "maybe")]).contains("'secure'"));
        assert!(err("clickhouse://u@h/db", &[("table", "a`b")]).contains("table name"));
        assert!(err("clickhouse://u@h/db", &[("schema", "a.b")]).contains("schema name"));
        assert!(err("clickhouse://u@h/db", &[("table", "a b")]).contains("table name"));
        assert!(err("clickhouse://u@h/db", &[("table", "")]).contains("table name"));
        assert!(
            err("clickhouse://u@h/db", &[("lock_retry_seconds", "0")]).contains("out of range")
        );
        assert!(err("not a uri", &[]).contains("not valid"));
    }

    #[test]
    fn errors_never_echo_the_password() {
        let message = err("clickhouse://u:hunter2-secret@h:99999/db", &[]);
        assert!(!message.contains("hunter2"), "{message}");
        let message = err("foo://u:hunter2-secret@h/db", &[]);
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn debug_output_redacts_the_password() {
        let c = Config::parse("clickhouse://u:hunter2-secret@h/db", &[]).expect("valid");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn an_error_names_what_it_is_about() {
        let culprit = |uri: &str, pairs: &[(&str, &str)]| {
            Config::parse_blaming(uri, &settings(pairs))
                .map(drop)
                .map_err(|e| e.culprit)
        };
        let setting = |name: &str| Err(Culprit::Setting(name.into()));
        let uri = "clickhouse://u@h:8123/db";
        assert_eq!(culprit("clickhouse//nope", &[]), Err(Culprit::Uri));
        assert_eq!(culprit("ftp://u@h/db", &[]), Err(Culprit::Uri));
        assert_eq!(culprit(uri, &[("lock_mode", "x")]), setting("lock_mode"));
        assert_eq!(culprit(uri, &[("port", "70000")]), setting("port"));
        assert_eq!(culprit(uri, &[("nonsense", "1")]), setting("nonsense"));
        assert_eq!(culprit(uri, &[("schema", "a-b")]), setting("schema"));
        assert_eq!(culprit(uri, &[("cluster", "a b")]), setting("cluster"));
        assert_eq!(culprit("clickhouse://h:8123/db", &[]), setting("user"));
        assert_eq!(culprit("clickhouse://u@h:8123", &[]), setting("database"));
        assert_eq!(culprit(uri, &[("host", "")]), setting("host"));
        assert_eq!(culprit(uri, &[("user", "v")]), Ok(()));
        // The plain parse gives the same error, without the culprit.
        let plain = Config::parse("clickhouse://h:8123/db", &[]).map(drop);
        let blamed = Config::parse_blaming("clickhouse://h:8123/db", &[]).map(drop);
        assert_eq!(plain, blamed.map_err(Error::from));
    }
}
