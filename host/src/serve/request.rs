//! What `serve` takes and answers: one typed request per line, and its run on the backend. The
//! variants are the operations a caller of `serve` has, in one list: `state-backend methods`
//! prints their names, and a test holds them to the contract's exports and to the Meltano
//! adapter's calls.

use std::collections::HashMap;

use crate::records::who_json;
use crate::{Backend, Error, HistoryEntry, Lock, LockInfo, Point, State, WriterInfo};
use serde::Deserialize;
use serde_json::{Value, json};
use strum::VariantNames;

/// A request: `{"id": …, "method": "<name>", "params": {…}}`, the method a variant's name in
/// snake case. Locks are referred to by the number `acquire_lock` returned.
#[derive(Debug, Deserialize, VariantNames)]
#[serde(tag = "method", content = "params", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Request {
    /// Answers "pong": the host is alive.
    Ping {},
    /// Who the writes that follow come from (the contract's `identify`).
    Identify(WhoParams),
    /// The processes behind instance ids: `[{"writer": id, "who": {...}}]`.
    Writers {
        ids: Vec<String>,
    },
    Get {
        state_id: String,
    },
    Set(StateParams),
    Update(StateParams),
    Delete {
        state_id: String,
    },
    Clear {
        state_id: String,
    },
    StateIds {
        #[serde(default)]
        pattern: Option<String>,
    },
    GetAll {
        #[serde(default)]
        pattern: Option<String>,
    },
    SetAll {
        states: Vec<StateParams>,
    },
    ClearAll {},
    AcquireLock {
        state_id: String,
    },
    Release {
        lock: u64,
    },
    Renew {
        lock: u64,
    },
    SetLocked {
        #[serde(flatten)]
        state: StateParams,
        lock: u64,
    },
    DeleteLocked {
        lock: u64,
    },
    LockInfo {
        state_id: String,
    },
    ForceUnlock {
        state_id: String,
    },
    HoldRun {
        state_id: String,
        #[serde(default)]
        force: bool,
    },
    History {
        state_id: String,
        limit: u32,
    },
    GetAt {
        state_id: String,
        at: PointParams,
    },
    RestoreLocked {
        to: PointParams,
        lock: u64,
    },
    ClearStreamsLocked {
        streams: Vec<String>,
        lock: u64,
    },
    Migrate {},
}

/// Who writes: what the caller knows of itself. An absent host, pid or backend version is this
/// host's own (a caller that runs `serve` as a child gives its own pid).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WhoParams {
    run_id: String,
    command: String,
    host: Option<String>,
    pid: Option<u32>,
    meltano_version: String,
    backend_version: Option<String>,
}

impl From<WhoParams> for WriterInfo {
    fn from(p: WhoParams) -> WriterInfo {
        let mut who = crate::records::this_process(&p.command, &p.run_id, &p.meltano_version);
        who.host = p.host.unwrap_or(who.host);
        who.pid = p.pid.unwrap_or(who.pid);
        who.backend_version = p.backend_version.unwrap_or(who.backend_version);
        who
    }
}

/// A point in a state's history: `{"version": ms}` or `{"time": ms}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PointParams {
    Version(u64),
    Time(u64),
}

impl From<PointParams> for Point {
    fn from(p: PointParams) -> Point {
        match p {
            PointParams::Version(v) => Point::Version(v),
            PointParams::Time(t) => Point::Time(t),
        }
    }
}

/// A state in a request; an absent part is `{}`.
#[derive(Debug, Deserialize)]
pub struct StateParams {
    state_id: String,
    #[serde(default = "empty_object")]
    partial: String,
    #[serde(default = "empty_object")]
    completed: String,
}

fn empty_object() -> String {
    "{}".into()
}

impl From<StateParams> for State {
    fn from(p: StateParams) -> State {
        State::new(&p.state_id, &p.partial, &p.completed)
    }
}

impl Request {
    /// The request named `method` with `params` (absent: none).
    pub fn parse(method: &str, params: Option<Value>) -> Result<Request, Error> {
        let params = params.unwrap_or_else(|| json!({}));
        serde_json::from_value(json!({"method": method, "params": params}))
            .map_err(|e| Error::InvalidInput(format!("request '{method}': {e}")))
    }

    /// Every method's name.
    pub fn methods() -> &'static [&'static str] {
        Request::VARIANTS
    }
}

pub fn info_json(info: &LockInfo) -> Value {
    json!({
        "state_id": info.state_id,
        "owner": info.owner,
        "token": info.token,
        "acquired_at_ms": info.acquired_at_ms,
        "expires_at_ms": info.expires_at_ms,
        "who": info.who.as_deref().map(who_json),
    })
}

fn state_json(state: &State) -> Value {
    json!({"state_id": state.state_id, "partial": state.partial, "completed": state.completed})
}

fn entry_json(entry: &HistoryEntry) -> Value {
    json!({
        "version": entry.version,
        "op": entry.op,
        "writer": entry.writer,
        "lock_owner": entry.lock_owner,
        "token": entry.token,
        "state": entry.state.as_ref().map(state_json),
        "who": entry.who.as_ref().map(who_json),
    })
}

/// What one `serve` session holds between requests: the locks taken by `acquire_lock`, by
/// the numbers it returned.
#[derive(Default)]
pub struct Session {
    locks: HashMap<u64, Lock>,
    next_lock: u64,
}

impl Session {
    fn held(&self, number: u64) -> Result<&Lock, Error> {
        self.locks
            .get(&number)
            .ok_or_else(|| Error::InvalidInput(format!("no held lock number {number}")))
    }

    /// The locks still held (the session is over: `serve` gives them back).
    pub fn into_locks(self) -> impl Iterator<Item = Lock> {
        self.locks.into_values()
    }
}

impl Request {
    /// Runs the request on `backend`; its answer is the JSON `result`.
    pub async fn answer(
        self,
        backend: &mut Backend,
        session: &mut Session,
    ) -> Result<Value, Error> {
        let request = self;
        Ok(match request {
            Request::Ping {} => json!("pong"),
            Request::Identify(who) => {
                backend.identify(&who.into()).await?;
                Value::Null
            }
            Request::Writers { ids } => Value::Array(
                backend
                    .writers(&ids)
                    .await?
                    .iter()
                    .map(|(id, who)| json!({"writer": id, "who": who_json(who)}))
                    .collect(),
            ),
            Request::Get { state_id } => match backend.get(&state_id).await? {
                Some(state) => state_json(&state),
                None => Value::Null,
            },
            Request::Set(state) => {
                backend.set(&state.into()).await?;
                Value::Null
            }
            Request::Update(state) => {
                backend.update(&state.into()).await?;
                Value::Null
            }
            Request::Delete { state_id } => {
                backend.delete(&state_id).await?;
                Value::Null
            }
            Request::Clear { state_id } => {
                backend.clear(&state_id).await?;
                Value::Null
            }
            Request::StateIds { pattern } => json!(backend.state_ids(pattern.as_deref()).await?),
            Request::GetAll { pattern } => Value::Array(
                backend
                    .get_all(pattern.as_deref())
                    .await?
                    .iter()
                    .map(state_json)
                    .collect(),
            ),
            Request::SetAll { states } => {
                let states: Vec<State> = states.into_iter().map(State::from).collect();
                json!(backend.set_all(&states).await?)
            }
            Request::ClearAll {} => json!(backend.clear_all().await?),
            Request::AcquireLock { state_id } => {
                let lock = backend.acquire_lock(&state_id).await?;
                session.next_lock += 1;
                let number = session.next_lock;
                let token = lock.token;
                session.locks.insert(number, lock);
                json!({"lock": number, "token": token})
            }
            Request::Release { lock } => {
                match session.locks.remove(&lock) {
                    Some(held) => backend.release(held).await?,
                    None => return Err(Error::InvalidInput(format!("no held lock number {lock}"))),
                }
                Value::Null
            }
            Request::Renew { lock } => {
                backend.renew(session.held(lock)?).await?;
                Value::Null
            }
            Request::SetLocked { state, lock } => {
                backend
                    .set_locked(&state.into(), session.held(lock)?)
                    .await?;
                Value::Null
            }
            Request::DeleteLocked { lock } => {
                backend.delete_locked(session.held(lock)?).await?;
                Value::Null
            }
            Request::LockInfo { state_id } => match backend.lock_info(&state_id).await? {
                Some(info) => info_json(&info),
                None => Value::Null,
            },
            Request::ForceUnlock { state_id } => json!(backend.force_unlock(&state_id).await?),
            Request::HoldRun { state_id, force } => {
                backend.hold_run(&state_id, force).await?;
                Value::Null
            }
            Request::History { state_id, limit } => Value::Array(
                backend
                    .history(&state_id, limit)
                    .await?
                    .iter()
                    .map(entry_json)
                    .collect(),
            ),
            Request::GetAt { state_id, at } => {
                entry_json(&backend.get_at(&state_id, at.into()).await?)
            }
            Request::RestoreLocked { to, lock } => {
                let restored = backend
                    .restore_locked(to.into(), session.held(lock)?)
                    .await?;
                json!({
                    "replaced": restored.replaced.as_ref().map(state_json),
                    "restored": entry_json(&restored.restored),
                })
            }
            Request::ClearStreamsLocked { streams, lock } => state_json(
                &backend
                    .clear_streams_locked(&streams, session.held(lock)?)
                    .await?,
            ),
            Request::Migrate {} => {
                backend.migrate().await?;
                Value::Null
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_parses_with_its_parameters_and_an_unknown_one_does_not() {
        let ok = [
            ("ping", None),
            ("get", Some(json!({"state_id": "a"}))),
            ("set", Some(json!({"state_id": "a", "partial": "{}"}))),
            ("state_ids", Some(json!({}))),
            ("state_ids", Some(json!({"pattern": "a*"}))),
            ("set_locked", Some(json!({"state_id": "a", "lock": 1}))),
            ("clear_all", Some(json!({}))),
            ("get_at", Some(json!({"state_id": "a", "at": {"time": 5}}))),
            (
                "restore_locked",
                Some(json!({"to": {"version": 5}, "lock": 1})),
            ),
        ];
        for (method, params) in ok {
            assert!(
                Request::parse(method, params.clone()).is_ok(),
                "{method} {params:?}"
            );
        }
        for (method, params) in [
            ("get", Some(json!({}))),
            ("release", Some(json!({"lock": "one"}))),
            ("get_at", Some(json!({"state_id": "a", "at": {"when": 5}}))),
            ("no_such_method", None),
        ] {
            assert!(
                matches!(Request::parse(method, params), Err(Error::InvalidInput(_))),
                "{method}"
            );
        }
        assert!(Request::methods().contains(&"force_unlock"));
    }
}
