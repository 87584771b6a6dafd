//! `state-backend`: Meltano's `meltano state` commands, run through the component.

// The doc comments of the CLI's types are its `--help` text, written for a terminal (`[seq]`,
// `{"<id>": ...}`), not rustdoc markdown.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod serve;

use clap::{Args, Parser, Subcommand};
use clickhouse_state::config::{Config, Culprit};
use serde_json::{Map, Value, json};
use state_host::http::policy::AddressAllowance;
use state_host::http::tls::TlsOptions;
use state_host::settings::{self, Settings};
use state_host::{Backend, Error, Runtime, RuntimeOptions, State};

/// The CLI's CPU budget per call (the library's default is 10 s).
const SINGLE_USER_CPU_BUDGET: std::time::Duration = std::time::Duration::from_secs(3600);

/// The local ClickHouse that `just clickhouse-start` runs (reaching it needs --allow-loopback).
const DEFAULT_URI: &str = "clickhouse://default:@127.0.0.1:8123/default";

#[derive(Parser)]
#[command(
    name = "state-backend",
    version,
    args_override_self = true,
    about = "Meltano state in ClickHouse, through the sandboxed WebAssembly component",
    long_about = long_about()
)]
struct Cli {
    /// Where the state lives: clickhouse://user:password@host:port/database[?secure=true]
    #[arg(long, env = "MELTANO_STATE_BACKEND_URI", default_value = DEFAULT_URI, hide_env_values = true, hide_default_value = true)]
    uri: String,

    /// A setting that overrides the URI (repeatable; `state-backend settings` lists them)
    #[arg(
        long = "setting",
        short = 's',
        value_name = "NAME=VALUE",
        value_parser = parse_setting,
        long_help = setting_help()
    )]
    settings: Vec<(String, String)>,

    /// The component to load [default: the built guest, or $STATE_BACKEND_COMPONENT]
    #[arg(long, value_name = "PATH")]
    component: Option<PathBuf>,

    /// PEM file of CA certificates to trust besides the system's (a private CA), for secure=true
    #[arg(long, env = "CLICKHOUSE_CA_BUNDLE", value_name = "PEM")]
    ca_bundle: Option<PathBuf>,

    /// PEM file of a client certificate (chain), for mutual TLS
    #[arg(
        long,
        env = "CLICKHOUSE_CLIENT_CERT",
        value_name = "PEM",
        requires = "client_key"
    )]
    client_cert: Option<PathBuf>,

    /// PEM file of the client certificate's private key, for mutual TLS
    #[arg(
        long,
        env = "CLICKHOUSE_CLIENT_KEY",
        value_name = "PEM",
        requires = "client_cert"
    )]
    client_key: Option<PathBuf>,

    /// Let the component connect to loopback addresses (a local ClickHouse); refused otherwise,
    /// as are link-local and cloud-metadata addresses
    #[arg(long, env = "STATE_BACKEND_ALLOW_LOOPBACK")]
    allow_loopback: bool,

    /// Refuse private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 and other
    /// special-purpose ranges) as a multi-tenant runner does; reachable by default, where a
    /// single user's ClickHouse usually lives
    #[arg(long, env = "STATE_BACKEND_REFUSE_PRIVATE")]
    refuse_private: bool,

    /// Log level for host and guest diagnostics on stderr (error, warn, info, debug)
    #[arg(long, default_value = "warn", value_name = "LEVEL")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    /// Precompile the component (.wasm) to native code (.cwasm) that loads without compiling
    Compile {
        /// Where to write it [default: the component's path with .cwasm]
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

#[derive(Args)]
struct StateInput {
    /// The state as JSON; omit it to read --input-file or stdin
    json: Option<String>,
    /// Read the state from this file
    #[arg(long, conflicts_with = "json")]
    input_file: Option<PathBuf>,
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

/// A failure of the CLI itself, or of the backend.
enum Failure {
    Usage(String),
    Backend(Error),
    /// Already reported (on stdout, by `serve`); exit with this code and say nothing more.
    Reported(u8),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Backend(e)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // wasmtime-wasi-http warns about every refused connection; the error line says it already.
    let filter = format!("{},wasmtime_wasi_http=error", cli.log);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli));
    // Without waiting for the thread that reads stdin: `serve`, stopped by a signal, would
    // otherwise exit only once its input ends.
    runtime.shutdown_background();
    match result {
        Ok(Value::Null) => ExitCode::SUCCESS,
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            let written = serde_json::to_writer_pretty(&mut stdout, &output)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(stdout));
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Reported(code)) => ExitCode::from(code),
        Err(Failure::Backend(error)) => {
            eprintln!("error: {}{}", one_line(&error.to_string()), hint(&error));
            ExitCode::from(exit_code(&error))
        }
    }
}

/// The description `--help` shows; the variables come from the settings table.
fn long_about() -> String {
    let variables: Vec<&str> = settings::env_variables().map(|(var, _)| var).collect();
    format!(
        "Meltano state in ClickHouse, through the sandboxed WebAssembly component.\n\n\
         The commands mirror `meltano state`. Output is JSON on stdout; an error is one line on \
         stderr and a non-zero exit code (2 bad input or configuration, 3 unauthorized, \
         4 unreachable or timeout, 5 locked, 1 anything else).\n\n\
         Settings, highest precedence first: --setting flags, the environment variables {}, \
         then the URI.",
        variables.join(", ")
    )
}

/// The `--setting` help: every name in the settings table.
fn setting_help() -> String {
    let names: Vec<&str> = clickhouse_state::settings::names().collect();
    format!(
        "A setting that overrides the URI (repeatable): {}. `state-backend settings` lists \
         their defaults and meanings",
        names.join(", ")
    )
}

/// The `settings` command's output: the component's settings, then the host's options.
fn settings_json() -> Value {
    let mut all: Vec<Value> = clickhouse_state::settings::SETTINGS
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "scope": "component",
                "flag": "--setting",
                "env": s.env,
                "default": s.default_doc,
                "doc": s.doc,
            })
        })
        .collect();
    all.extend(settings::HOST_OPTIONS.iter().map(|o| {
        json!({
            "name": o.name,
            "scope": "host",
            "flag": o.flag,
            "env": o.env,
            "default": null,
            "doc": o.doc,
        })
    }));
    Value::Array(all)
}

fn exit_code(error: &Error) -> u8 {
    match error {
        Error::InvalidConfig(_) | Error::InvalidInput(_) => 2,
        Error::Unauthorized(_) => 3,
        Error::Unreachable(_) | Error::Timeout(_) => 4,
        Error::Locked(_) | Error::LockLost(_) => 5,
        Error::Server { .. } | Error::Component(_) | Error::Panicked(_) => 1,
    }
}

/// What to do about an error, where the CLI knows the flag that fixes it.
fn hint(error: &Error) -> &'static str {
    match error {
        // The sandbox refused a special address (see `http::policy`): a local ClickHouse is loopback.
        Error::Unreachable(m) if m.contains("its address is refused") => {
            " (to reach a ClickHouse on this machine, pass --allow-loopback; private networks are \
             refused under --refuse-private)"
        }
        _ => "",
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn run(cli: Cli) -> Result<Value, Failure> {
    let component = cli
        .component
        .clone()
        .unwrap_or_else(state_host::default_component_path);
    if let Command::Compile { output } = &cli.command {
        return compile(&component, output.clone());
    }
    if let Command::Settings = cli.command {
        return Ok(settings_json());
    }
    let options = RuntimeOptions {
        tls: TlsOptions {
            ca_bundle: cli.ca_bundle.clone(),
            client_cert: cli.client_cert.clone(),
            client_key: cli.client_key.clone(),
        },
        addresses: AddressAllowance {
            loopback: cli.allow_loopback,
            private: !cli.refuse_private,
            ..AddressAllowance::single_user()
        },
        // One user's own work, with no neighbours to protect: the call deadline bounds it, and
        // a large import is not cut short.
        cpu_budget: SINGLE_USER_CPU_BUDGET,
        cpu_share: None,
        ..RuntimeOptions::default()
    };
    let env = settings::from_env(|var| std::env::var(var).ok());
    let all_settings = settings::layered(env, cli.settings.clone());
    if let Command::Migrate { print: true } = cli.command {
        return print_migration(&cli.uri, &all_settings);
    }
    if let Command::Serve { .. } = cli.command {
        let mut all_settings = all_settings;
        // A long-lived instance keeps the lock of the id it updates for the next update (one
        // round trip each; Meltano's stream of STATE messages), and gives it back when idle.
        if !all_settings
            .iter()
            .any(|(name, _)| name == "lock_linger_seconds")
        {
            all_settings.push((
                "lock_linger_seconds".into(),
                serve::DEFAULT_LINGER_SECONDS.into(),
            ));
        }
        let backend = match start_serving(&cli.uri, all_settings, &component, options).await {
            Ok(backend) => backend,
            Err((error, setting)) => {
                serve::startup_failure(&error, setting.as_deref());
                return Err(Failure::Reported(exit_code(&error)));
            }
        };
        serve::serve_stdio(backend).await?;
        return Ok(Value::Null);
    }
    let runtime = Runtime::load(&component, options)?;
    let mut backend = runtime.open(&cli.uri, all_settings).await?;
    let output = execute(&mut backend, cli.command).await;
    let closed = backend.close().await;
    let output = output?;
    closed?;
    Ok(output)
}

/// The instance `serve` runs, or why there is none and which setting that is about.
async fn start_serving(
    uri: &str,
    settings: Settings,
    component: &Path,
    options: RuntimeOptions,
) -> Result<Backend, (Error, Option<String>)> {
    if let Err(e) = Config::parse_blaming(uri, &settings) {
        let setting = match e.culprit {
            Culprit::Uri => "uri".to_string(),
            Culprit::Setting(name) => name,
        };
        return Err((e.error.into(), Some(setting)));
    }
    // Loading builds the TLS configuration once; a configuration error there is about a file.
    let tls = options.tls.clone();
    let runtime = Runtime::load(component, options).map_err(|e| {
        let setting = match e {
            Error::InvalidConfig(_) => tls.culprit().map(str::to_string),
            _ => None,
        };
        (e, setting)
    })?;
    runtime.open(uri, settings).await.map_err(|e| (e, None))
}

async fn execute(backend: &mut Backend, command: Command) -> Result<Value, Failure> {
    match command {
        Command::List { pattern } => Ok(json!(backend.state_ids(pattern.as_deref()).await?)),
        Command::Get { state_id, raw } => {
            let state = backend.get(&state_id).await?;
            Ok(match (state, raw) {
                (None, _) => json!({}),
                (Some(state), true) => parts(&state)?,
                (Some(state), false) => merged_view(&state)?,
            })
        }
        Command::Set { state_id, input } => {
            let document = read_state(&input)?;
            validate_singer_state(&document)?;
            backend
                .set(&State::completed(&state_id, document.to_string()))
                .await?;
            Ok(json!({"state_id": state_id, "action": "set"}))
        }
        Command::Merge {
            state_id,
            input,
            from_state_id,
        } => {
            let document = match from_state_id {
                Some(src) => match backend.get(&src).await? {
                    Some(state) => merged_view(&state)?,
                    None => return Err(Failure::Usage(format!("no state for '{src}'"))),
                },
                None => read_state(&input)?,
            };
            validate_singer_state(&document)?;
            backend
                .update(&State::partial(&state_id, document.to_string()))
                .await?;
            Ok(json!({"state_id": state_id, "action": "merge"}))
        }
        Command::Copy { src, dst } => {
            copy(backend, &src, &dst).await?;
            Ok(json!({"src": src, "dst": dst, "action": "copy"}))
        }
        Command::Move { src, dst } => {
            copy(backend, &src, &dst).await?;
            backend.clear(&src).await?;
            Ok(json!({"src": src, "dst": dst, "action": "move"}))
        }
        Command::Clear { state_id, all } => {
            if all {
                progress("clearing every state...");
                let count = backend.clear_all().await?;
                Ok(json!({"cleared": count}))
            } else {
                let state_id = state_id.unwrap_or_default();
                backend.clear(&state_id).await?;
                Ok(json!({"cleared": 1, "state_id": state_id}))
            }
        }
        Command::Export { pattern } => {
            progress("reading states...");
            let states = backend.get_all(pattern.as_deref()).await?;
            progress(&format!("exported {} states", states.len()));
            let mut out = Map::new();
            for state in &states {
                out.insert(state.state_id.clone(), parts(state)?);
            }
            Ok(Value::Object(out))
        }
        Command::Import { file } => {
            let text = match file {
                Some(path) => std::fs::read_to_string(&path)
                    .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))?,
                None => read_stdin()?,
            };
            let document: Value = serde_json::from_str(&text)
                .map_err(|e| Failure::Usage(format!("the import is not valid JSON: {e}")))?;
            let Value::Object(entries) = document else {
                return Err(Failure::Usage(
                    "the import must be a JSON object of {\"<id>\": {\"completed\": ..., \"partial\": ...}}".into(),
                ));
            };
            let mut states = Vec::with_capacity(entries.len());
            for (state_id, entry) in entries {
                let part = |name: &str| match entry.get(name) {
                    None | Some(Value::Null) => Ok("{}".to_string()),
                    Some(value @ Value::Object(_)) => Ok(value.to_string()),
                    Some(_) => Err(Failure::Usage(format!(
                        "'{state_id}': \"{name}\" must be a JSON object"
                    ))),
                };
                states.push(State::new(
                    state_id.clone(),
                    part("partial")?,
                    part("completed")?,
                ));
            }
            progress(&format!("writing {} states in one insert...", states.len()));
            let count = backend.set_all(&states).await?;
            Ok(json!({"imported": count}))
        }
        Command::Lock { state_id, hold } => {
            if !(0.0..=86_400.0).contains(&hold) {
                return Err(Failure::Usage(
                    "--hold must be between 0 and 86400 seconds".into(),
                ));
            }
            let lock = backend.acquire_lock(&state_id).await?;
            let token = lock.token;
            let started = std::time::Instant::now();
            eprintln!("locked {state_id:?}; holding for {hold} s (Ctrl-C releases it now)");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs_f64(hold)) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            backend.release(lock).await?;
            let held = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
            Ok(json!({"state_id": state_id, "token": token, "held_seconds": held}))
        }
        Command::LockInfo { state_id } => Ok(match backend.lock_info(&state_id).await? {
            None => json!({"state_id": state_id, "locked": false}),
            Some(info) => json!({
                "state_id": info.state_id,
                "locked": true,
                "owner": info.owner,
                "token": info.token,
                "acquired_at": rfc3339(info.acquired_at_ms),
                "expires_at": rfc3339(info.expires_at_ms),
            }),
        }),
        Command::Unlock { state_id } => {
            let broken = backend.force_unlock(&state_id).await?;
            Ok(json!({"state_id": state_id, "unlocked": broken}))
        }
        Command::Compile { .. } | Command::Serve { .. } | Command::Settings => Err(Failure::Usage(
            "this command does not run as a single operation".into(),
        )),
        Command::Migrate { .. } => {
            backend.migrate().await?;
            Ok(json!({"migrated": true}))
        }
    }
}

/// The DDL `migrate` would run with these settings, as SQL text on stdout.
fn print_migration(uri: &str, settings: &[(String, String)]) -> Result<Value, Failure> {
    let config = Config::parse(uri, settings).map_err(|e| Failure::Usage(e.to_string()))?;
    let kind = match &config.cluster {
        Some(cluster) => format!("a self-managed replicated cluster ('{cluster}')"),
        None => "one server or ClickHouse Cloud (which makes each table Shared)".to_string(),
    };
    let mut out = std::io::stdout().lock();
    let statements = clickhouse_state::sql::Statements::new(&config).migration();
    let text = statements
        .iter()
        .map(|q| format!("{};\n", q.sql))
        .collect::<Vec<_>>()
        .join("\n");
    writeln!(out, "-- The schema for {kind}.\n{text}")
        .map_err(|e| Failure::Usage(format!("cannot write the output: {e}")))?;
    Ok(Value::Null)
}

fn compile(component: &std::path::Path, output: Option<PathBuf>) -> Result<Value, Failure> {
    let wasm = std::fs::read(component)
        .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", component.display())))?;
    let started = std::time::Instant::now();
    let native = Runtime::precompile(&wasm)?;
    let output = output.unwrap_or_else(|| component.with_extension("cwasm"));
    std::fs::write(&output, &native)
        .map_err(|e| Failure::Usage(format!("cannot write {}: {e}", output.display())))?;
    Ok(json!({
        "component": component.display().to_string(),
        "output": output.display().to_string(),
        "bytes": native.len(),
        "compile_ms": started.elapsed().as_millis() as u64,
    }))
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Copies the merged view of `src` onto `dst` as a complete state, as `meltano state copy` does.
async fn copy(backend: &mut Backend, src: &str, dst: &str) -> Result<(), Failure> {
    let Some(state) = backend.get(src).await? else {
        return Err(Failure::Usage(format!("no state for '{src}'")));
    };
    let view = merged_view(&state)?;
    backend
        .set(&State::completed(dst, view.to_string()))
        .await?;
    Ok(())
}

/// What Meltano hands a tap: the partial state merged over the completed one.
fn merged_view(state: &State) -> Result<Value, Failure> {
    let mut completed = object(&state.completed)?;
    clickhouse_state::merge::merge(object(&state.partial)?, &mut completed);
    Ok(Value::Object(completed))
}

fn parts(state: &State) -> Result<Value, Failure> {
    Ok(json!({"completed": object(&state.completed)?, "partial": object(&state.partial)?}))
}

fn object(text: &str) -> Result<Map<String, Value>, Failure> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Failure::Backend(Error::Server {
            code: 0,
            name: "CORRUPT_STATE".into(),
            message: "a stored state part is not a JSON object".into(),
        })),
    }
}

fn read_state(input: &StateInput) -> Result<Value, Failure> {
    let text = match (&input.json, &input.input_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))?,
        (None, None) => read_stdin()?,
    };
    serde_json::from_str(&text).map_err(|e| {
        Failure::Backend(Error::InvalidInput(format!(
            "the state is not valid JSON: {e}"
        )))
    })
}

/// Meltano's own check on `state set` and `state merge`.
fn validate_singer_state(document: &Value) -> Result<(), Failure> {
    match document {
        Value::Object(map) if map.contains_key("singer_state") => Ok(()),
        Value::Object(_) => Err(Failure::Backend(Error::InvalidInput(
            "singer_state not found in top level of provided state".into(),
        ))),
        _ => Err(Failure::Backend(Error::InvalidInput(
            "the state must be a JSON object".into(),
        ))),
    }
}

fn read_stdin() -> Result<String, Failure> {
    if std::io::stdin().is_terminal() {
        eprintln!("reading JSON from stdin (end with Ctrl-D)...");
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| Failure::Usage(format!("cannot read stdin: {e}")))?;
    Ok(text)
}

/// Progress for bulk commands, on stderr, when a person is watching.
fn progress(message: &str) {
    if std::io::stderr().is_terminal() {
        eprintln!("{message}");
    }
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
        }
    }

    #[test]
    fn the_settings_command_lists_every_setting_and_option_once() {
        let listed = settings_json();
        let names: Vec<&str> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str())
            .collect();
        let expected: Vec<&str> = clickhouse_state::settings::names()
            .chain(settings::HOST_OPTIONS.iter().map(|o| o.name))
            .collect();
        assert_eq!(names, expected);
    }
}
