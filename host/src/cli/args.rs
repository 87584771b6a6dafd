//! The command line: what `state-backend` takes, and its help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use state_host::settings;

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

/// The most versions `history` lists by default.
const DEFAULT_HISTORY_LIMIT: u32 = 20;

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

#[derive(Subcommand)]
pub enum Command {
    /// List state ids, all or those matching a glob (*, ?, [seq], [!seq])
    List {
        #[arg(long)]
        pattern: Option<String>,
    },
    /// Print the state of an id as Meltano hands it to a tap (partial over completed)
    Get {
        state_id: String,
        /// Print the stored parts instead: {"completed": ..., "partial": ...}
        #[arg(long)]
        raw: bool,
        /// Print the state as it was: at a version (a number `history` lists) or a time
        /// (2026-12-02T10:00:00Z; the newest version at or before it)
        #[arg(long, value_name = "VERSION|TIME")]
        at: Option<String>,
    },
    /// List the versions of an id's state, newest first: time, operation, writer, lock and
    /// state (writes made with history=false, or by the original Python backend, are not in it)
    History {
        state_id: String,
        /// At most this many versions (1-10000)
        #[arg(long, default_value_t = DEFAULT_HISTORY_LIMIT)]
        limit: u32,
    },
    /// Show the bookmarks that differ between two versions (or times) of an id's state
    Diff {
        state_id: String,
        #[arg(value_name = "FROM")]
        from: String,
        #[arg(value_name = "TO")]
        to: String,
    },
    /// Write an earlier version of an id's state as its newest, under its lock; prints what it
    /// replaced
    Restore {
        state_id: String,
        /// The version (a number `history` lists) or time (the newest version at or before it)
        #[arg(long, value_name = "VERSION|TIME")]
        to: String,
    },
    /// Remove streams' bookmarks (and `currently_syncing` when it names one) from an id's
    /// state, under its lock, so that the next run syncs those streams from the start
    ClearStream {
        state_id: String,
        #[arg(required = true, value_name = "STREAM")]
        streams: Vec<String>,
    },
    /// Replace the state of an id with a complete state ({"singer_state": ...})
    Set {
        state_id: String,
        #[command(flatten)]
        input: StateInput,
    },
    /// Merge a partial state into the stored one, under the lock (Meltano's update)
    Merge {
        state_id: String,
        #[command(flatten)]
        input: StateInput,
        /// Merge the state of another id instead of a JSON document
        #[arg(long, conflicts_with_all = ["json", "input_file"])]
        from_state_id: Option<String>,
    },
    /// Copy the state of one id onto another
    Copy { src: String, dst: String },
    /// Move the state of one id to another
    Move { src: String, dst: String },
    /// Clear the state of an id (under its lock), or of every id with --all
    Clear {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        state_id: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Print states as {"<id>": {"completed": ..., "partial": ...}, ...}
    Export {
        #[arg(long)]
        pattern: Option<String>,
    },
    /// Write states from `export` output (a file, or stdin), in one insert
    Import {
        /// The file to read [default: stdin]
        file: Option<PathBuf>,
    },
    /// Take the lock of an id, hold it, release it (for scripts and demos); Ctrl-C (SIGINT)
    /// releases it early
    Lock {
        state_id: String,
        /// How long to hold it at most, in seconds
        #[arg(long, default_value = "0")]
        hold: f64,
    },
    /// Show who holds the lock of an id: owner, token, since, lease end (null when free)
    LockInfo { state_id: String },
    /// Break the lock of an id, whoever holds it (for operators); its holder's fenced writes
    /// can no longer overwrite newer state
    Unlock { state_id: String },
    /// Create the schema if it is missing (runs on first use anyway), then check that its
    /// tables suit the deployment (one server, ClickHouse Cloud, or a cluster: `-s cluster=NAME`)
    Migrate {
        /// Print the DDL for these settings instead of running it (nothing is sent), e.g. for
        /// an operator who creates the schema: `state-backend -s cluster=prod migrate --print`
        #[arg(long)]
        print: bool,
    },
    /// Serve requests as JSON lines on stdin/stdout with one long-lived instance (the bridge
    /// for Meltano's Python process)
    Serve {
        /// Read requests from stdin, answer on stdout (the only transport for now)
        #[arg(long, required = true)]
        stdio: bool,
    },
    /// List every setting and host option as JSON: name, variable, default, meaning
    Settings,
    /// List the methods `serve` answers, as JSON
    Methods,
    /// List the kinds of error as JSON: kind, reason, exit code, the Meltano exception, meaning
    Errors,
    /// Precompile the component (.wasm) to native code (.cwasm) that loads without compiling
    Compile {
        /// Where to write it [default: the component's path with .cwasm]
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

#[derive(Args)]
pub struct StateInput {
    /// The state as JSON; omit it to read --input-file or stdin
    pub json: Option<String>,
    /// Read the state from this file
    #[arg(long, conflicts_with = "json")]
    pub input_file: Option<PathBuf>,
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
