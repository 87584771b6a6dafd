//! The protocol of a long-lived instance: one JSON request per line, one JSON answer per line.
//! Two hosts serve it: `state-backend serve --stdio` (over a pipe, from another process) and the
//! embedded host in Meltano's own process (`embedded`, a call on the caller's thread). Both
//! start the instance with [`start`]; `serve` runs [`serve`], and the embedded host the same
//! parts of it one call at a time (`answer_line`, `idle`, `finish`).
//!
//! Request: `{"id": 1, "method": "get", "params": {"state_id": "dev:a"}}` (the methods:
//! [`Request`]). Answer: `{"id": 1, "result": ...}` or `{"id": 1, "error": {"kind": "locked",
//! "message": "...", "lock": {...}}}`. Locks are referred to by the number `acquire_lock`
//! returns. The end of the requests ends the session: held locks are given back first.
//!
//! Start-up: the first line says whether the instance is ready ([`ready_line`]: its version
//! and how long one call may take), or why not ([`failure_line`]: the error and, where known,
//! the setting it is about, `uri` for the URI itself), so that the caller can name its own
//! setting for it when it starts, not at the first operation.

mod request;

use std::future::Future;
use std::path::Path;

use clickhouse_state_contract::config::{Config, Culprit};
use serde_json::{Value, json};

pub use request::{Request, Session, info_json};

use crate::clock::Clock;
use crate::http::policy::AddressAllowance;
use crate::http::proxy::Proxies;
use crate::http::tls::TlsOptions;
use crate::settings::Settings;
use crate::{Backend, Error, Runtime, RuntimeOptions};

/// The CPU budget per call of one user's own instance (the library's default is 10 s).
const SINGLE_USER_CPU_BUDGET: std::time::Duration = std::time::Duration::from_secs(3600);

/// The sandbox of one user's own instance (the CLI, `serve`, the embedded host), from the
/// host's options: the TLS files, the address classes it may reach, and whether the proxy
/// variables of the environment are honoured; and the process's traces and metrics, when the
/// `OTEL_*` variables ask for them (see [`crate::telemetry`]).
pub fn single_user_options(
    tls: TlsOptions,
    allow_loopback: bool,
    refuse_private: bool,
    ignore_proxy_env: bool,
) -> Result<RuntimeOptions, Error> {
    let proxies = if ignore_proxy_env {
        Proxies::none()
    } else {
        Proxies::from_lookup(|var| std::env::var(var).ok()).map_err(Error::InvalidConfig)?
    };
    let proxies = std::sync::Arc::new(proxies);
    Ok(RuntimeOptions {
        telemetry: crate::telemetry::from_env(&proxies),
        proxies,
        tls,
        addresses: AddressAllowance {
            loopback: allow_loopback,
            private: !refuse_private,
            ..AddressAllowance::single_user()
        },
        // One user's own work, with no neighbours to protect: the call deadline bounds it, and
        // a large import is not cut short.
        cpu_budget: SINGLE_USER_CPU_BUDGET,
        cpu_share: None,
        ..RuntimeOptions::default()
    })
}

/// Where requests come from, a line at a time; `None` when there are no more. Must be
/// cancellation safe: [`serve`] waits for a line and for a timer at once.
pub trait Requests {
    fn next_line(&mut self) -> impl Future<Output = std::io::Result<Option<String>>>;
}

impl<R: tokio::io::AsyncBufRead + Unpin> Requests for tokio::io::Lines<R> {
    async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        tokio::io::Lines::next_line(self).await
    }
}

impl Requests for tokio::sync::mpsc::Receiver<String> {
    async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        Ok(self.recv().await)
    }
}

/// The instance a session serves, with the settings a served instance gets by default, or why
/// there is none and which setting that is about.
pub async fn start(
    uri: &str,
    mut settings: Settings,
    component: &Path,
    options: RuntimeOptions,
) -> Result<Backend, (Error, Option<String>)> {
    for (name, value) in clickhouse_state_contract::settings::served_defaults() {
        if !settings.iter().any(|(given, _)| given == name) {
            settings.push((name.into(), value.into()));
        }
    }
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

/// The first line of a session whose instance started.
pub fn ready_line(backend: &Backend) -> String {
    let deadline_ms = u64::try_from(backend.call_deadline().as_millis()).unwrap_or(u64::MAX);
    json!({"ready": {"version": env!("CARGO_PKG_VERSION"), "call_deadline_ms": deadline_ms}})
        .to_string()
}

/// The first (and last) line of a session whose instance could not start.
pub fn failure_line(error: &Error, setting: Option<&str>) -> String {
    let mut value = error_json(error);
    if let Some(setting) = setting {
        value["setting"] = json!(setting);
    }
    json!({ "error": value }).to_string()
}

/// Answers requests until they end, `answer` says its reader is gone (returns false), or
/// `stop` becomes true (a sender dropped without sending never stops it). Between requests,
/// calls the store's `idle` when it asked to be called (so a kept lock is given back once
/// idle); at the end gives back held locks and closes the instance.
pub async fn serve(
    mut backend: Backend,
    mut requests: impl Requests,
    mut answer: impl FnMut(String) -> bool,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Error> {
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
            line = requests.next_line() => Some(line),
            () = wait => None,
            // Only a signal stops it: if the sender is gone, this branch (an `Err`) is
            // disabled, not taken.
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
                tracing::error!("reading requests: {e}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        if !answer(answer_line(&mut backend, &mut session, &line).await) {
            break;
        }
        if backend.trapped() {
            // Its answer said why; the instance can answer nothing more, so the session ends
            // and the caller starts another (the bridge does, at its next call).
            tracing::warn!("the instance was stopped and cannot be used again; ending");
            break;
        }
        if *stop.borrow() {
            break;
        }
        due = idle(&mut backend, &*clock).await;
    }
    finish(backend, session).await
}

/// The end of a session: gives back the locks it holds, then closes the instance (which gives
/// back what its store kept).
pub(crate) async fn finish(mut backend: Backend, session: Session) -> Result<(), Error> {
    for lock in session.into_locks() {
        let _ = backend.release(lock).await;
    }
    backend.close().await
}

/// The answer to one request line.
pub(crate) async fn answer_line(
    backend: &mut Backend,
    session: &mut Session,
    line: &str,
) -> String {
    let answer = match serde_json::from_str::<Value>(line) {
        Ok(mut request) => {
            let id = request.get("id").cloned().unwrap_or(Value::Null);
            let params = request.get_mut("params").map(Value::take);
            let method = request.get("method").and_then(Value::as_str).unwrap_or("");
            let result = match Request::parse(method, params) {
                Ok(request) => request.answer(backend, session).await,
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
    answer.to_string()
}

/// Lets the store give back what it kept and idled long enough; returns when to call again. A
/// failure is logged and retried a second later (the store keeps what it could not give back).
pub(crate) async fn idle(backend: &mut Backend, clock: &dyn Clock) -> Option<u64> {
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
