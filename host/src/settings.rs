//! Settings for `open`, from the environment and from the caller, and the host's own options.
//!
//! Precedence, highest first: an explicit setting (or CLI flag), then Meltano's variable for it
//! (`MELTANO_STATE_BACKEND_CLICKHOUSE_<NAME>`, so that the CLI run beside Meltano sees what
//! Meltano sees), then the environment variable the original Python backend documents, then the
//! URI. A URI given as a flag (`--uri`) is
//! explicit too: a variable does not override a part it states ([`unstated`]), as
//! clickhouse-client lets its flags beat the environment; a `CLICKHOUSE_PORT` left in a shell
//! would otherwise send a flag's URI elsewhere. The guest has no environment, so the host reads
//! these variables and passes them on as settings; the guest applies settings over the URI.

use clickhouse_state_contract::settings::SETTINGS;

/// Settings as (name, value) pairs; a later pair for the same name wins.
pub type Settings = Vec<(String, String)>;

/// (environment variable, setting name) for the settings that have a variable.
pub fn env_variables() -> impl Iterator<Item = (&'static str, &'static str)> {
    SETTINGS
        .iter()
        .filter_map(|s| s.env.map(|var| (var, s.name)))
}

/// Meltano's variable for a setting: `MELTANO_STATE_BACKEND_CLICKHOUSE_<NAME>`.
pub fn meltano_variable(name: &str) -> String {
    format!(
        "MELTANO_STATE_BACKEND_CLICKHOUSE_{}",
        name.to_ascii_uppercase()
    )
}

/// The settings found in an environment (`lookup` is `std::env::var` in production): Meltano's
/// variable for each, else the original backend's.
pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Settings {
    SETTINGS
        .iter()
        .filter_map(|s| {
            let value = lookup(&meltano_variable(s.name)).or_else(|| s.env.and_then(&lookup))?;
            Some((s.name.to_string(), value))
        })
        .collect()
}

/// An option of the host itself rather than of the component (TLS files, the sandbox's
/// loopback allowance): a CLI flag, its variable, and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostOption {
    pub name: &'static str,
    pub flag: &'static str,
    pub env: &'static str,
    pub doc: &'static str,
    /// A switch (on when given), not a flag with a value.
    pub switch: bool,
}

impl HostOption {
    /// How a caller's form shows it, as [`clickhouse_state_contract::settings::Setting::kind`] says.
    pub fn kind(&self) -> &'static str {
        if self.switch { "boolean" } else { "text" }
    }
}

/// The host's options (the CLI declares the same flags and variables; a test holds them to
/// this table).
pub const HOST_OPTIONS: &[HostOption] = &[
    HostOption {
        name: "ca_bundle",
        flag: "--ca-bundle",
        env: "CLICKHOUSE_CA_BUNDLE",
        doc: "PEM file of CA certificates to trust besides the system's (a private CA)",
        switch: false,
    },
    HostOption {
        name: "client_cert",
        flag: "--client-cert",
        env: "CLICKHOUSE_CLIENT_CERT",
        doc: "PEM file of a client certificate (chain), for mutual TLS",
        switch: false,
    },
    HostOption {
        name: "client_key",
        flag: "--client-key",
        env: "CLICKHOUSE_CLIENT_KEY",
        doc: "PEM file of the client certificate's private key, for mutual TLS",
        switch: false,
    },
    HostOption {
        name: "allow_loopback",
        flag: "--allow-loopback",
        env: "STATE_BACKEND_ALLOW_LOOPBACK",
        doc: "let the component connect to loopback addresses (a ClickHouse on this machine)",
        switch: true,
    },
    HostOption {
        name: "refuse_private",
        flag: "--refuse-private",
        env: "STATE_BACKEND_REFUSE_PRIVATE",
        doc: "refuse private networks (10/8, 172.16/12, 192.168/16, fc00::/7, ...), as for a \
              runner's tenants; reachable by default",
        switch: true,
    },
    HostOption {
        name: "ignore_proxy_env",
        flag: "--ignore-proxy-env",
        env: "STATE_BACKEND_IGNORE_PROXY_ENV",
        doc: "connect directly, whatever `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and \
              `NO_PROXY` say (honoured by default: https through an http proxy's CONNECT)",
        switch: true,
    },
];

/// The settings of `env` that override no part `uri` states, and the names of those dropped.
/// For a URI given explicitly; a URI that does not parse keeps them all (its own error says
/// what is wrong with it).
pub fn unstated(env: Settings, uri: &str) -> (Settings, Vec<String>) {
    let Ok(parts) = clickhouse_state_contract::uri::parse(uri) else {
        return (env, Vec::new());
    };
    let query = parts.query.as_deref().unwrap_or("");
    let stated = |name: &str| match name {
        "host" => parts.host.as_deref().is_some_and(|h| !h.is_empty()),
        "port" => parts.port.is_some(),
        "user" => !parts.user.is_empty(),
        "password" => parts.password.is_some(),
        "database" => !parts.path.is_empty(),
        "secure" => {
            matches!(parts.scheme.as_str(), "http" | "https")
                || query.split('&').any(|p| p.starts_with("secure="))
        }
        _ => false,
    };
    let (dropped, kept): (Settings, Settings) = env.into_iter().partition(|(n, _)| stated(n));
    (kept, dropped.into_iter().map(|(name, _)| name).collect())
}

/// `explicit` over `env`: one pair per name, the explicit one where both have it.
pub fn layered(env: Settings, explicit: Settings) -> Settings {
    let mut out: Settings = Vec::new();
    for (name, value) in env.into_iter().chain(explicit) {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => out.push((name, value)),
        }
    }
    out
}

/// An environment of `pairs` for the functions that take a lookup, in tests.
#[cfg(test)]
pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse_state_contract::config::Config;

    #[test]
    fn reads_the_documented_variables() {
        let found = from_env(env(&[
            ("CLICKHOUSE_HOST", "h"),
            ("CLICKHOUSE_SECURE", "true"),
            ("OTHER", "x"),
        ]));
        assert_eq!(
            found,
            vec![
                ("host".into(), "h".into()),
                ("secure".into(), "true".into())
            ]
        );
    }

    #[test]
    fn meltanos_variables_are_read_too_and_win_over_the_originals() {
        let found = from_env(env(&[
            ("CLICKHOUSE_HOST", "h"),
            ("MELTANO_STATE_BACKEND_CLICKHOUSE_HOST", "meltano-host"),
            ("MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS", "7"),
            ("CLICKHOUSE_SCHEMA", "s"),
        ]));
        assert_eq!(
            found,
            vec![
                ("host".into(), "meltano-host".into()),
                ("schema".into(), "s".into()),
                ("history_days".into(), "7".into()),
            ]
        );
    }

    #[test]
    fn explicit_beats_env_beats_uri() {
        let uri = "clickhouse://uri_user:uri_pw@uri-host:1111/uri_db";
        let env_settings = from_env(env(&[
            ("CLICKHOUSE_HOST", "env-host"),
            ("CLICKHOUSE_DATABASE", "env_db"),
            ("CLICKHOUSE_USER", "env_user"),
        ]));
        let explicit = vec![("database".to_string(), "flag_db".to_string())];
        let config = Config::parse(uri, &layered(env_settings, explicit)).expect("valid");
        assert_eq!(config.database, "flag_db"); // explicit wins over env and URI
        assert_eq!(config.host, "env-host"); // env wins over URI
        assert_eq!(config.user, "env_user");
        assert_eq!(config.port, 1111); // URI where nothing overrides it
        assert_eq!(config.password.expose(), "uri_pw");
    }

    #[test]
    fn a_flags_uri_beats_the_variables_for_the_parts_it_states() {
        let env_settings = || {
            from_env(env(&[
                ("CLICKHOUSE_HOST", "env-host"),
                ("CLICKHOUSE_PORT", "1"),
                ("CLICKHOUSE_PASSWORD", "env_pw"),
                ("CLICKHOUSE_SECURE", "true"),
                ("CLICKHOUSE_TABLE", "env_table"),
            ]))
        };
        let uri = "clickhouse://u@uri-host:18123/db";
        let (kept, dropped) = unstated(env_settings(), uri);
        assert_eq!(dropped, ["host", "port"]);
        let config = Config::parse(uri, &kept).expect("valid");
        assert_eq!((config.host.as_str(), config.port), ("uri-host", 18123));
        // What the URI leaves out still comes from the environment.
        assert_eq!(config.password.expose(), "env_pw");
        assert_eq!(
            config.scheme,
            clickhouse_state_contract::config::Scheme::Https
        );
        assert_eq!(config.table, "env_table");

        let (_, dropped) = unstated(env_settings(), "https://u:pw@h/db");
        assert_eq!(dropped, ["host", "password", "secure"]);
        let (_, dropped) = unstated(env_settings(), "clickhouse://u@h/db?secure=false");
        assert_eq!(dropped, ["host", "secure"]);
        // Not a URI: nothing dropped, the URI's own error comes later.
        let (kept, dropped) = unstated(env_settings(), "not a uri");
        assert!(dropped.is_empty());
        assert_eq!(kept.len(), 5);
    }
}
