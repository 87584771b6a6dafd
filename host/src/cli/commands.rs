//! The commands: each one's arguments and `--help` (clap's derive), and its work through the
//! backend, with its JSON output.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use clickhouse_state_contract::config::Config;
use serde_json::{Map, Value, json};
use state_host::settings;
use state_host::{Backend, Runtime, State};

use crate::output::{Failure, progress, rfc3339};
use crate::state_json::{
    StateInput, merged_view, parts, read_state, read_stdin, validate_singer_state,
};

/// The most versions `history` lists by default.
const DEFAULT_HISTORY_LIMIT: u32 = 20;

/// A command's name (`set`, `lock-info`) is clap's: what `identify` records it as.
#[derive(Subcommand, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
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
    /// Replace the state of an id with a complete state ({"singer_state": ...}), under its lock
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
    /// Check the whole path to the store once and print a table (or JSON): the network as the
    /// sandbox takes it (proxy, DNS, the address under the policy, TCP, TLS and the
    /// certificate's days), the server (authentication, version, deployment), the clocks
    /// against the lease's margin, the tables, the grants, the lock log and stuck locks. Writes
    /// nothing unless --fix. Exits 0 when no check fails, 1 otherwise
    Doctor {
        /// Print JSON: [{"name", "outcome", "detail", "fix"}]
        #[arg(long)]
        json: bool,
        /// Fix what is safe to fix first: create or upgrade the schema (`migrate`)
        #[arg(long)]
        fix: bool,
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

/// The `settings` command's output: the component's settings, then the host's options.
pub fn settings_json() -> Value {
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
pub fn errors_json() -> Value {
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

pub async fn execute(backend: &mut Backend, command: Command) -> Result<Value, Failure> {
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
            // Under the id's lock, as Meltano's `state set` takes it: refused, naming the
            // holder, while a run holds the id.
            let lock = backend.acquire_lock(&state_id).await?;
            let state = State::completed(&state_id, document.to_string());
            let written = backend.set_locked(&state, &lock).await;
            let released = backend.release(lock).await;
            written?;
            crate::versions::warn_unreleased(&state_id, "set", released);
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
                "who": info.who.as_deref().map(state_host::who_json),
            }),
        }),
        Command::Unlock { state_id } => {
            let broken = backend.force_unlock(&state_id).await?;
            Ok(json!({"state_id": state_id, "unlocked": broken}))
        }
        Command::Compile { .. }
        | Command::Serve { .. }
        | Command::Doctor { .. }
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
pub async fn print_migration(config: &Config, mut backend: Backend) -> Result<Value, Failure> {
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

pub fn compile(component: &std::path::Path, output: Option<PathBuf>) -> Result<Value, Failure> {
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
