//! `state-backend serve --stdio`: one long-lived backend instance answering JSON lines, so that
//! a Python process (Meltano) pays the component's start-up once, not per operation.
//!
//! Request, one line: `{"id": 1, "method": "get", "params": {"state_id": "dev:a"}}` (the
//! methods: [`Request`]).
//! Answer, one line: `{"id": 1, "result": ...}` or `{"id": 1, "error": {"kind": "locked",
//! "message": "...", "lock": {...}}}`. Locks are referred to by the number `acquire_lock`
//! returns. End of input ends the process (held locks are released first), and so does SIGINT
//! or SIGTERM (Ctrl-C on Windows): the request in hand is answered, held and kept locks are
//! given back, then the process exits; a second signal exits at once.
//!
//! Start-up: the first line says whether the instance is ready, `{"ready": {"version": "...",
//! "call_deadline_ms": N}}` (how long one call may take; the caller waits that and a grace),
//! or why not, `{"error": {"kind": "invalid-config", "message": "...", "setting": "lock_mode"}}`
//! (then the process exits with code 2). `setting` names the setting a configuration error is
//! about (`uri` for the URI itself), so that the caller can name its own setting for it: the
//! bridge raises Meltano's configuration error naming `state_backend.clickhouse.lock_mode`
//! when it starts, not at the first operation.

use std::io::Write;

use serde_json::{Value, json};
use state_host::clock::Clock;
use state_host::{Backend, Error};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::request::{Request, Session, info_json};

/// The first line when the instance could not start: what went wrong and, where known, which
/// setting it is about.
pub fn startup_failure(error: &Error, setting: Option<&str>) {
    let mut value = error_json(error);
    if let Some(setting) = setting {
        value["setting"] = json!(setting);
    }
    // Nothing else to do if stdout is gone: the caller sees the exit code.
    let _ = writeln!(std::io::stdout(), "{}", json!({ "error": value }));
}

/// Serves requests from stdin until it closes or a signal asks it to stop. Between requests,
/// calls the store's `idle` when it asked to be called (so a kept lock is given back once
/// idle), and `close` at the end.
pub async fn serve_stdio(mut backend: Backend) -> Result<(), Error> {
    let mut stop = stop_on_signal();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    // Answers are written straight to the pipe: a line of a few KB does not block, and tokio's
    // stdout would hand each write and flush to a blocking thread and back.
    let mut stdout = std::io::stdout().lock();
    let deadline_ms = u64::try_from(backend.call_deadline().as_millis()).unwrap_or(u64::MAX);
    let ready =
        json!({"ready": {"version": env!("CARGO_PKG_VERSION"), "call_deadline_ms": deadline_ms}})
            .to_string()
            + "\n";
    if stdout.write_all(ready.as_bytes()).is_err() || stdout.flush().is_err() {
        return backend.close().await;
    }
    let mut session = Session::default();
    let clock = backend.clock();
    let mut due: Option<u64> = None;
    loop {
        let wait = async {
            match due {
                Some(at) => clock.sleep(at.saturating_sub(clock.now_ms())).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            // `next_line` is cancellation safe: a line half read stays buffered.
            line = lines.next_line() => Some(line),
            () = wait => None,
            // Only a signal stops it: if listening failed, the sender is gone and this branch
            // (an `Err`) is disabled, not taken.
            Ok(()) = stop.changed() => break,
        };
        let Some(next) = next else {
            due = idle(&mut backend, &*clock).await;
            continue;
        };
        let line = match next {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                tracing::error!("stdin: {e}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(mut request) => {
                let id = request.get("id").cloned().unwrap_or(Value::Null);
                let params = request.get_mut("params").map(Value::take);
                let method = request.get("method").and_then(Value::as_str).unwrap_or("");
                let result = match Request::parse(method, params) {
                    Ok(request) => request.answer(&mut backend, &mut session).await,
                    Err(error) => Err(error),
                };
                match result {
                    Ok(result) => json!({"id": id, "result": result}),
                    Err(error) => json!({"id": id, "error": error_json(&error)}),
                }
            }
            Err(e) => {
                json!({"id": null, "error": {"kind": "invalid-input", "message": format!("not a JSON request: {e}")}})
            }
        };
        let mut text = answer.to_string();
        text.push('\n');
        if stdout.write_all(text.as_bytes()).is_err() || stdout.flush().is_err() {
            break;
        }
        if *stop.borrow() {
            break;
        }
        due = idle(&mut backend, &*clock).await;
    }
    for lock in session.into_locks() {
        let _ = backend.release(lock).await;
    }
    backend.close().await
}

/// Becomes true at the first SIGINT or SIGTERM (Ctrl-C on Windows); the second exits the
/// process at once, with 130. A request in hand is not cut off by the first: the component is
/// never dropped in the middle of a call, whose lock state would be lost.
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if let Err(e) = signalled().await {
            tracing::warn!("cannot listen for signals: {e}");
            return;
        }
        tracing::info!("signal: giving back held locks, then exiting (a second signal exits now)");
        let _ = stop.send(true);
        if signalled().await.is_ok() {
            std::process::exit(130);
        }
    });
    stopped
}

#[cfg(unix)]
async fn signalled() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn signalled() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

/// Lets the store give back what it kept and idled long enough; returns when to call again. A
/// failure is logged and retried a second later (the store keeps what it could not give back).
async fn idle(backend: &mut Backend, clock: &dyn Clock) -> Option<u64> {
    match backend.idle().await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!("giving back kept locks failed: {e}");
            Some(clock.now_ms().saturating_add(1_000))
        }
    }
}

fn error_json(error: &Error) -> Value {
    let mut value = json!({"kind": error.kind(), "message": error.to_string()});
    if let Error::Locked(info) = error {
        value["lock"] = info_json(info);
    }
    if let Some(reason) = error.reason() {
        value["reason"] = reason.into();
    }
    value
}
