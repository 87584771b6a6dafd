//! The records of the contract as the host hands them out: a state, a version of it in the
//! history, a point in the history, and what a restore did.

use crate::bindings::wit;
use crate::error::{Error, Result, WriterInfo};

/// One state: the texts of two JSON objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub state_id: String,
    pub partial: String,
    pub completed: String,
}

impl State {
    pub fn new(
        state_id: impl Into<String>,
        partial: impl Into<String>,
        completed: impl Into<String>,
    ) -> Self {
        State {
            state_id: state_id.into(),
            partial: partial.into(),
            completed: completed.into(),
        }
    }

    /// A complete state (what `meltano state set` writes): `partial` is `{}`.
    pub fn completed(state_id: impl Into<String>, completed: impl Into<String>) -> Self {
        State::new(state_id, "{}", completed)
    }

    /// A partial state (what an incremental STATE message carries): `completed` is `{}`.
    pub fn partial(state_id: impl Into<String>, partial: impl Into<String>) -> Self {
        State::new(state_id, partial, "{}")
    }
}

impl From<wit::State> for State {
    fn from(s: wit::State) -> Self {
        State {
            state_id: s.state_id,
            partial: s.partial,
            completed: s.completed,
        }
    }
}

impl From<&State> for wit::State {
    fn from(s: &State) -> Self {
        wit::State {
            state_id: s.state_id.clone(),
            partial: s.partial.clone(),
            completed: s.completed.clone(),
        }
    }
}

/// One version of a state (see the contract's `history-entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Unix ms: the version the store ordered the write by, and when it was made.
    pub version: u64,
    pub op: String,
    pub writer: String,
    pub lock_owner: String,
    pub token: u64,
    /// None when this write deleted the state.
    pub state: Option<State>,
    /// The writing process, where its host identified it (the backend looks it up,
    /// `store.writers`).
    pub who: Option<WriterInfo>,
}

impl From<wit::HistoryEntry> for HistoryEntry {
    fn from(e: wit::HistoryEntry) -> Self {
        HistoryEntry {
            version: e.version,
            op: e.op,
            writer: e.writer,
            lock_owner: e.lock_owner,
            token: e.token,
            state: e.state.map(State::from),
            who: None,
        }
    }
}

/// This machine's name, as `identify` records it.
pub fn this_host() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// This process as a writer (see the contract's `identify`): `command`, and Meltano's run id
/// and version where there are ones, with this machine's name, this process's id and this
/// backend's version.
pub fn this_process(command: &str, run_id: &str, meltano_version: &str) -> WriterInfo {
    WriterInfo {
        run_id: run_id.to_string(),
        command: command.to_string(),
        host: this_host(),
        pid: std::process::id(),
        meltano_version: meltano_version.to_string(),
        backend_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// A writer as `serve`, the CLI and the Meltano package show it.
pub fn who_json(who: &WriterInfo) -> serde_json::Value {
    serde_json::json!({
        "run_id": who.run_id,
        "command": who.command,
        "host": who.host,
        "pid": who.pid,
        "meltano_version": who.meltano_version,
        "backend_version": who.backend_version,
    })
}

impl From<wit::WriterInfo> for WriterInfo {
    fn from(w: wit::WriterInfo) -> Self {
        WriterInfo {
            run_id: w.run_id,
            command: w.command,
            host: w.host,
            pid: w.pid,
            meltano_version: w.meltano_version,
            backend_version: w.backend_version,
        }
    }
}

impl From<&WriterInfo> for wit::WriterInfo {
    fn from(w: &WriterInfo) -> Self {
        wit::WriterInfo {
            run_id: w.run_id.clone(),
            command: w.command.clone(),
            host: w.host.clone(),
            pid: w.pid,
            meltano_version: w.meltano_version.clone(),
            backend_version: w.backend_version.clone(),
        }
    }
}

/// A point in a state's history: one version, or the newest at or before a time (unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    Version(u64),
    Time(u64),
}

impl Point {
    /// A version number (unix ms, as `history` shows them) or an RFC 3339 time such as
    /// `2026-12-02T10:00:00Z` (UTC when it names no zone).
    pub fn parse(text: &str) -> Result<Point> {
        let text = text.trim();
        if let Ok(version) = text.parse::<u64>() {
            return Ok(Point::Version(version));
        }
        // With an offset (`+02:00`, `Z`), else UTC (`2026-12-02 10:00:00` too).
        let ms: i128 =
            match time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            {
                Ok(time) => time.unix_timestamp_nanos() / 1_000_000,
                Err(_) => {
                    let time = humantime::parse_rfc3339_weak(text).map_err(|e| {
                        Error::InvalidInput(format!(
                            "'{text}' is neither a version (a number, as `history` lists them) nor \
                         a time such as 2026-12-02T10:00:00Z or 2026-12-02T12:00:00+02:00 ({e})"
                        ))
                    })?;
                    time.duration_since(std::time::UNIX_EPOCH)
                        .map_or(-1, |d| i128::try_from(d.as_millis()).unwrap_or(i128::MAX))
                }
            };
        let ms = u64::try_from(ms)
            .map_err(|_| Error::InvalidInput(format!("'{text}' is before 1970")))?;
        Ok(Point::Time(ms))
    }
}

impl From<Point> for wit::Point {
    fn from(p: Point) -> Self {
        match p {
            Point::Version(v) => wit::Point::Version(v),
            Point::Time(t) => wit::Point::Time(t),
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The state it replaced; none when there was none, or it was deleted.
    pub replaced: Option<State>,
    /// The version it wrote (with the restored state).
    pub restored: HistoryEntry,
}

impl From<wit::Restored> for Restored {
    fn from(r: wit::Restored) -> Self {
        Restored {
            replaced: r.replaced.map(State::from),
            restored: r.restored.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_versions_or_times() {
        assert_eq!(
            Point::parse("1764707696789").ok(),
            Some(Point::Version(1_764_707_696_789))
        );
        assert_eq!(
            Point::parse("2025-12-02T20:34:56.789Z").ok(),
            Some(Point::Time(1_764_707_696_789))
        );
        assert_eq!(
            Point::parse("2025-12-02 20:34:56").ok(),
            Some(Point::Time(1_764_707_696_000))
        );
        assert_eq!(
            Point::parse("2025-12-02T22:34:56.789+02:00").ok(),
            Some(Point::Time(1_764_707_696_789))
        );
        for bad in [
            "yesterday",
            "",
            "-5",
            "2025-13-02T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(
                matches!(Point::parse(bad), Err(Error::InvalidInput(_))),
                "{bad}"
            );
        }
    }
}
