//! Settings for `open`, from the environment and from the caller.
//!
//! Precedence, highest first: an explicit setting (or CLI flag), then the environment variable
//! the original Python backend documents, then the URI. The guest has no environment, so the
//! host reads these variables and passes them on as settings; the guest applies settings over
//! the URI.

/// Environment variable -> setting name.
pub const ENV_SETTINGS: &[(&str, &str)] = &[
    ("CLICKHOUSE_HOST", "host"),
    ("CLICKHOUSE_PORT", "port"),
    ("CLICKHOUSE_DATABASE", "database"),
    ("CLICKHOUSE_USER", "user"),
    ("CLICKHOUSE_PASSWORD", "password"),
    ("CLICKHOUSE_SECURE", "secure"),
    ("CLICKHOUSE_SCHEMA", "schema"),
    ("CLICKHOUSE_TABLE", "table"),
];

/// Settings as (name, value) pairs; a later pair for the same name wins.
pub type Settings = Vec<(String, String)>;

/// The settings found in an environment (`lookup` is `std::env::var` in production).
pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Settings {
    ENV_SETTINGS
        .iter()
        .filter_map(|(var, name)| lookup(var).map(|value| (name.to_string(), value)))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse_state::config::Config;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

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
}
