//! The history commands: `history`, `get --at`, `diff`, `restore` and `clear-stream`.

use serde_json::{Value, json};
use state_host::history;
use state_host::{Backend, State};
use state_host::{HistoryEntry, Point, who_json};

use crate::output::{Failure, rfc3339};
use crate::state_json::{merged_view, parts};

/// One version as `history` lists it: when, how, by whom, and the state as a tap gets it.
fn entry_json(entry: &HistoryEntry) -> Result<Value, Failure> {
    Ok(json!({
        "version": entry.version,
        "time": rfc3339(entry.version),
        "op": entry.op,
        "writer": entry.writer,
        "lock_owner": entry.lock_owner,
        "token": entry.token,
        "state": entry.state.as_ref().map(merged_view).transpose()?,
        "who": entry.who.as_ref().map(who_json),
    }))
}

pub async fn list(backend: &mut Backend, state_id: &str, limit: u32) -> Result<Value, Failure> {
    let entries = backend.history(state_id, limit).await?;
    Ok(Value::Array(
        entries.iter().map(entry_json).collect::<Result<_, _>>()?,
    ))
}

/// The state at `at`, printed as `get` prints one (`{}` when that version deleted it).
pub async fn get_at(
    backend: &mut Backend,
    state_id: &str,
    at: &str,
    raw: bool,
) -> Result<Value, Failure> {
    let entry = backend.get_at(state_id, Point::parse(at)?).await?;
    Ok(match (entry.state, raw) {
        (None, _) => json!({}),
        (Some(state), true) => parts(&state)?,
        (Some(state), false) => merged_view(&state)?,
    })
}

pub async fn diff(
    backend: &mut Backend,
    state_id: &str,
    from: &str,
    to: &str,
) -> Result<Value, Failure> {
    let from = backend.get_at(state_id, Point::parse(from)?).await?;
    let to = backend.get_at(state_id, Point::parse(to)?).await?;
    let mut out = history::diff(from.state.as_ref(), to.state.as_ref())?;
    let side =
        |e: &HistoryEntry| json!({"version": e.version, "time": rfc3339(e.version), "op": e.op});
    if let Value::Object(map) = &mut out {
        map.insert("state_id".into(), json!(state_id));
        map.insert("from".into(), side(&from));
        map.insert("to".into(), side(&to));
    }
    Ok(out)
}

/// A write that landed is reported as done even when giving its lock back failed, so that no
/// one runs it again: the failure is a warning, and the lock frees itself at its lease's end.
pub fn warn_unreleased(state_id: &str, what: &str, released: state_host::Result<()>) {
    if let Err(e) = released {
        eprintln!(
            "warning: the {what} of {state_id:?} was written, but its lock was not given back \
             ({e}); it frees itself when its lease ends"
        );
    }
}

/// Restores under the id's lock, taken and released here.
pub async fn restore(backend: &mut Backend, state_id: &str, to: &str) -> Result<Value, Failure> {
    let to = Point::parse(to)?;
    let lock = backend.acquire_lock(state_id).await?;
    let restored = backend.restore_locked(to, &lock).await;
    let released = backend.release(lock).await;
    let restored = restored?;
    warn_unreleased(state_id, "restore", released);
    let view = |state: Option<&State>| state.map(merged_view).transpose();
    Ok(json!({
        "state_id": state_id,
        "restored": entry_json(&restored.restored)?,
        "replaced": view(restored.replaced.as_ref())?,
    }))
}

/// Clears streams under the id's lock, taken and released here.
pub async fn clear_streams(
    backend: &mut Backend,
    state_id: &str,
    streams: &[String],
) -> Result<Value, Failure> {
    let lock = backend.acquire_lock(state_id).await?;
    let written = backend.clear_streams_locked(streams, &lock).await;
    let released = backend.release(lock).await;
    let written = written?;
    warn_unreleased(state_id, "stream clear", released);
    Ok(json!({
        "state_id": state_id,
        "cleared": streams,
        "state": merged_view(&written)?,
    }))
}
