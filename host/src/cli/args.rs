//! The command line: the options every command takes, and `--help`'s description.

use std::path::PathBuf;

use clap::Parser;
use state_host::settings;

use crate::commands::Command;

/// `--version`: a test build says so, and the tests check that they run one.
const LONG_VERSION: &str = if cfg!(feature = "tripwire") {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (test build: the tripwire refuses connections off this machine)"
    )
} else {
    env!("CARGO_PKG_VERSION")
};

/// The local ClickHouse that `just clickhouse-start` runs (reaching it needs --allow-loopback).
const DEFAULT_URI: &str = "clickhouse://default:@127.0.0.1:8123/default";

#[derive(Parser)]
#[command(
    name = "state-backend",
    version,
    long_version = LONG_VERSION,
    args_override_self = true,
    about = "Meltano state in ClickHouse, through the sandboxed WebAssembly component",
    long_about = long_about()
)]
pub struct Cli {
    /// Where the state lives: clickhouse://user:password@host:port/database[?secure=true]
    #[arg(long, env = "MELTANO_STATE_BACKEND_URI", default_value = DEFAULT_URI, hide_env_values = true, hide_default_value = true)]
    pub uri: String,

    /// Whether `--uri` was on the command line (not from its variable or the default).
    #[arg(skip)]
    pub uri_from_flag: bool,

    /// A setting that overrides the URI (repeatable; `state-backend settings` lists them)
    #[arg(
        long = "setting",
        short = 's',
        value_name = "NAME=VALUE",
        value_parser = parse_setting,
        long_help = setting_help()
    )]
    pub settings: Vec<(String, String)>,

    /// The component to load [default: the built guest, or $STATE_BACKEND_COMPONENT]
    #[arg(long, value_name = "PATH")]
    pub component: Option<PathBuf>,

    /// PEM file of CA certificates to trust besides the system's (a private CA), for secure=true
    #[arg(long, env = "CLICKHOUSE_CA_BUNDLE", value_name = "PEM")]
    pub ca_bundle: Option<PathBuf>,

    /// PEM file of a client certificate (chain), for mutual TLS
    #[arg(
        long,
        env = "CLICKHOUSE_CLIENT_CERT",
        value_name = "PEM",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,

    /// PEM file of the client certificate's private key, for mutual TLS
    #[arg(
        long,
        env = "CLICKHOUSE_CLIENT_KEY",
        value_name = "PEM",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,

    /// Let the component connect to loopback addresses (a local ClickHouse); refused otherwise,
    /// as are link-local and cloud-metadata addresses
    #[arg(long, env = "STATE_BACKEND_ALLOW_LOOPBACK")]
    pub allow_loopback: bool,

    /// Refuse private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 and other
    /// special-purpose ranges) as a multi-tenant runner does; reachable by default, where a
    /// single user's ClickHouse usually lives
    #[arg(long, env = "STATE_BACKEND_REFUSE_PRIVATE")]
    pub refuse_private: bool,

    /// Connect directly, whatever HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY say; by
    /// default they are honoured (https through an http proxy's CONNECT)
    #[arg(long, env = "STATE_BACKEND_IGNORE_PROXY_ENV")]
    pub ignore_proxy_env: bool,

    /// Log level for host and guest diagnostics on stderr (error, warn, info, debug)
    #[arg(long, default_value = "warn", value_name = "LEVEL")]
    pub log: String,

    /// After the command, print on stderr how long its parts took, in ms, as JSON: `load` (the
    /// component, from the compile cache or compiled), `open` (instantiate and open), `call`
    /// (with the system's TLS roots, loaded on the first https connection) and `close`; the
    /// rest of a run's wall time is the process's start, its output and its exit
    #[arg(long)]
    pub timings: bool,

    #[command(subcommand)]
    pub command: Command,
}

fn parse_setting(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got '{}'", name_only(text)))?;
    Ok((name.trim().to_string(), value.to_string()))
}

/// Never echo a value (it may be a password).
fn name_only(text: &str) -> &str {
    text.split('=').next().unwrap_or("")
}

/// The description `--help` shows; the variables come from the settings table, the exit codes
/// from the table of errors.
fn long_about() -> String {
    let variables: Vec<&str> = settings::env_variables().map(|(var, _)| var).collect();
    format!(
        "Meltano state in ClickHouse, through the sandboxed WebAssembly component.\n\n\
         The commands mirror `meltano state`. Output is JSON on stdout; an error is one line on \
         stderr and a non-zero exit code ({}; `state-backend errors` lists them).\n\n\
         Settings, highest precedence first: --setting flags, Meltano's variables \
         (MELTANO_STATE_BACKEND_CLICKHOUSE_<NAME>, for every setting), the variables {}, then \
         the URI.",
        exit_codes(),
        variables.join(", ")
    )
}

/// "2 invalid-config, invalid-input; 3 unauthorized; …": each exit code with its kinds.
fn exit_codes() -> String {
    let mut codes: Vec<u8> = state_host::ERROR_KINDS
        .iter()
        .map(|k| k.exit_code)
        .collect();
    codes.sort_unstable_by_key(|&code| (code == 1, code));
    codes.dedup();
    let groups: Vec<String> = codes
        .iter()
        .map(|&code| {
            let mut kinds: Vec<&str> = state_host::ERROR_KINDS
                .iter()
                .filter(|k| k.exit_code == code)
                .map(|k| k.kind)
                .collect();
            kinds.dedup();
            format!("{code} {}", kinds.join(", "))
        })
        .collect();
    groups.join("; ")
}

/// The `--setting` help: every name in the settings table.
fn setting_help() -> String {
    let names: Vec<&str> = clickhouse_state_contract::settings::names().collect();
    format!(
        "A setting that overrides the URI (repeatable): {}. `state-backend settings` lists \
         their defaults and meanings",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_host_options_table_matches_the_flags_the_cli_declares() {
        let command = Cli::command();
        for option in settings::HOST_OPTIONS {
            let long = option.flag.trim_start_matches("--");
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .unwrap_or_else(|| panic!("no {} flag", option.flag));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(option.env),
                "{}",
                option.flag
            );
            // A switch takes no value.
            assert_eq!(
                option.switch,
                !arg.get_action().takes_values(),
                "{}",
                option.flag
            );
        }
    }
}
