//! The commands: each one's work through the backend, and its JSON output.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clickhouse_state_contract::config::{Config, Culprit};
use serde_json::{Map, Value, json};
use state_host::http::policy::AddressAllowance;
use state_host::http::proxy::Proxies;
use state_host::http::tls::TlsOptions;
use state_host::settings::{self, Settings};
use state_host::{Backend, Error, Runtime, RuntimeOptions, State};

use crate::args::{Cli, Command};
use crate::output::{Failure, exit_code, progress, rfc3339};
use crate::serve;
use crate::state_json::{merged_view, parts, read_state, read_stdin, validate_singer_state};

/// The CLI's CPU budget per call (the library's default is 10 s).
const SINGLE_USER_CPU_BUDGET: std::time::Duration = std::time::Duration::from_secs(3600);

/// The `settings` command's output: the component's settings, then the host's options.
fn settings_json() -> Value {
    let mut all: Vec<Value> = clickhouse_state_contract::settings::SETTINGS
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "scope": "component",
                "flag": "--setting",
                "env": s.env,
                "default": s.default_doc,
                "doc": s.doc,
                "kind": s.kind(),
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
            "kind": o.kind(),
        })
    }));
    Value::Array(all)
}

/// The `errors` command's output: every kind of error, as the host's table has it.
fn errors_json() -> Value {
    Value::Array(
        state_host::ERROR_KINDS
            .iter()
            .map(|k| {
                json!({
                    "kind": k.kind,
                    "reason": k.reason,
                    "exit_code": k.exit_code,
                    "meltano": k.meltano,
                    "doc": k.doc,
                })
            })
            .collect(),
    )
}

/// A host option from Meltano's variable for it (`MELTANO_STATE_BACKEND_CLICKHOUSE_<NAME>`), so
/// that the CLI run beside Meltano sees what Meltano's bridge does; the flag and its own
/// variable come first.
fn meltano_option(name: &str) -> Option<String> {
    std::env::var(settings::meltano_variable(name)).ok()
}

fn meltano_path(name: &str) -> Option<PathBuf> {
    meltano_option(name)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// A switch: the flag, or its own variable when that is set (either way, as clap read it),
/// else Meltano's variable.
fn switch(flag: bool, name: &str) -> bool {
    let own_variable = settings::HOST_OPTIONS
        .iter()
        .find(|o| o.name == name)
        .is_some_and(|o| std::env::var_os(o.env).is_some());
    if flag || own_variable {
        return flag;
    }
    meltano_option(name).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "yes" | "on"
        )
    })
}

pub async fn run(cli: Cli) -> Result<Value, Failure> {
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
    if let Command::Methods = cli.command {
        return Ok(json!(crate::request::Request::methods()));
    }
    if let Command::Errors = cli.command {
        return Ok(errors_json());
    }
    let proxies = if cli.ignore_proxy_env {
        Proxies::none()
    } else {
        Proxies::from_lookup(|var| std::env::var(var).ok()).map_err(Error::InvalidConfig)?
    };
    let options = RuntimeOptions {
        proxies: Arc::new(proxies),
        tls: TlsOptions {
            ca_bundle: cli.ca_bundle.clone().or_else(|| meltano_path("ca_bundle")),
            client_cert: cli
                .client_cert
                .clone()
                .or_else(|| meltano_path("client_cert")),
            client_key: cli
                .client_key
                .clone()
                .or_else(|| meltano_path("client_key")),
        },
        addresses: AddressAllowance {
            loopback: switch(cli.allow_loopback, "allow_loopback"),
            private: !switch(cli.refuse_private, "refuse_private"),
            ..AddressAllowance::single_user()
        },
        // One user's own work, with no neighbours to protect: the call deadline bounds it, and
        // a large import is not cut short.
        cpu_budget: SINGLE_USER_CPU_BUDGET,
        cpu_share: None,
        ..RuntimeOptions::default()
    };
    let mut env = settings::from_env(|var| std::env::var(var).ok());
    if cli.uri_from_flag {
        let (kept, dropped) = settings::unstated(env, &cli.uri);
        env = kept;
        for name in dropped {
            tracing::info!("the {name} in the environment is not used: --uri states it");
        }
    }
    let all_settings = settings::layered(env, cli.settings.clone());
    if let Command::Migrate { print: true } = cli.command {
        let config = Config::parse(&cli.uri, &all_settings).map_err(Error::from)?;
        let runtime = Runtime::load(&component, options)?;
        let backend = runtime
            .open_parsed(&config, &cli.uri, all_settings, Default::default())
            .await?;
        return print_migration(&config, backend).await;
    }
    if let Command::Serve { .. } = cli.command {
        let mut all_settings = all_settings;
        for (name, value) in clickhouse_state_contract::settings::served_defaults() {
            if !all_settings.iter().any(|(given, _)| given == name) {
                all_settings.push((name.into(), value.into()));
            }
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
    let mut timings = Timings::new(cli.timings);
    let runtime = Runtime::load(&component, options)?;
    timings.lap("load");
    let mut backend = runtime.open(&cli.uri, all_settings).await?;
    timings.lap("open");
    let output = execute(&mut backend, cli.command).await;
    timings.lap("call");
    let closed = backend.close().await;
    timings.lap("close");
    timings.print();
    let output = output?;
    closed?;
    Ok(output)
}

/// The parts of one command's time (`--timings`), each from the end of the one before.
struct Timings {
    on: bool,
    last: std::time::Instant,
    parts: Map<String, Value>,
}

impl Timings {
    fn new(on: bool) -> Self {
        Timings {
            on,
            last: std::time::Instant::now(),
            parts: Map::new(),
        }
    }

    fn lap(&mut self, part: &str) {
        let now = std::time::Instant::now();
        let ms = (now - self.last).as_secs_f64() * 1000.0;
        self.parts
            .insert(part.into(), json!((ms * 1000.0).round() / 1000.0));
        self.last = now;
    }

    fn print(&self) {
        if self.on {
            eprintln!("{}", json!({ "timings_ms": self.parts }));
        }
    }
}

/// The instance `serve` runs, or why there is none and which setting that is about.
async fn start_serving(
    uri: &str,
    settings: Settings,
    component: &Path,
    options: RuntimeOptions,
) -> Result<Backend, (Error, Option<String>)> {
    let config = Config::parse_blaming(uri, &settings).map_err(|e| {
        let setting = match e.culprit {
            Culprit::Uri => "uri".to_string(),
            Culprit::Setting(name) => name,
        };
        (Error::from(e.error), Some(setting))
    })?;
    // Loading builds the TLS configuration once; a configuration error there is about a file.
    let tls = options.tls.clone();
    let runtime = Runtime::load(component, options).map_err(|e| {
        let setting = match e {
            Error::InvalidConfig(_) => tls.culprit().map(str::to_string),
            _ => None,
        };
        (e, setting)
    })?;
    runtime
        .open_parsed(&config, uri, settings, Default::default())
        .await
        .map_err(|e| (e, None))
}

async fn execute(backend: &mut Backend, command: Command) -> Result<Value, Failure> {
    match command {
        Command::List { pattern } => Ok(json!(backend.state_ids(pattern.as_deref()).await?)),
        Command::Get {
            state_id,
            raw,
            at: Some(at),
        } => crate::versions::get_at(backend, &state_id, &at, raw).await,
        Command::History { state_id, limit } => {
            crate::versions::list(backend, &state_id, limit).await
        }
        Command::Diff { state_id, from, to } => {
            crate::versions::diff(backend, &state_id, &from, &to).await
        }
        Command::Restore { state_id, to } => {
            crate::versions::restore(backend, &state_id, &to).await
        }
        Command::ClearStream { state_id, streams } => {
            crate::versions::clear_streams(backend, &state_id, &streams).await
        }
        Command::Get {
            state_id,
            raw,
            at: None,
        } => {
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
        Command::Compile { .. }
        | Command::Serve { .. }
        | Command::Settings
        | Command::Methods
        | Command::Errors => Err(Failure::Usage(
            "this command does not run as a single operation".into(),
        )),
        Command::Migrate { .. } => {
            backend.migrate().await?;
            Ok(json!({"migrated": true}))
        }
    }
}

/// The DDL `migrate` would run with these settings, as SQL text on stdout: the component's
/// own (the one this command loaded), so that what an operator runs by hand is what it runs.
async fn print_migration(config: &Config, mut backend: Backend) -> Result<Value, Failure> {
    let kind = match &config.cluster {
        Some(cluster) => format!("a self-managed replicated cluster ('{cluster}')"),
        None => "one server or ClickHouse Cloud (which makes each table Shared)".to_string(),
    };
    let statements = backend.schema().await;
    backend.close().await?;
    let text = statements?
        .iter()
        .map(|sql| format!("{sql};\n"))
        .collect::<Vec<_>>()
        .join("\n");
    writeln!(
        std::io::stdout().lock(),
        "-- The schema for {kind}.\n{text}"
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_command_lists_every_setting_and_option_once() {
        let listed = settings_json();
        let names: Vec<&str> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str())
            .collect();
        let expected: Vec<&str> = clickhouse_state_contract::settings::names()
            .chain(settings::HOST_OPTIONS.iter().map(|o| o.name))
            .collect();
        assert_eq!(names, expected);
    }
}
