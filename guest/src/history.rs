//! The operations on a state's history: list it, read a past version, restore one, and clear
//! streams' bookmarks. Restore and the stream clear write under the caller's lock with the
//! guard `update`'s writes carry (`Store::write_guarded_locked`: the grant and the version read
//! are checked by the server as it writes), and are recorded like any write (see
//! `sql::history`).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::http::Transport;
use crate::merge::{or_empty, parse_object};
use crate::rows::{HistoryEntry, HistoryExtent};
use crate::session::Platform;
use crate::sql::{Op, Point};
use crate::store::{State, Store, validate_state_id};
use protocol::grant::LockHandle;

/// The most versions one `history` call lists.
pub const MAX_LIMIT: u32 = 10_000;

/// What `restore` did: the state it replaced (none when there was none or it was deleted) and
/// the version it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub replaced: Option<State>,
    pub restored: HistoryEntry,
}

impl<T: Transport, H: Platform> Store<T, H> {
    /// The newest `limit` versions of `state_id`, newest first; empty when the history has none.
    pub fn history(&self, state_id: &str, limit: u32) -> Result<Vec<HistoryEntry>> {
        validate_state_id(state_id)?;
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::InvalidInput(format!(
                "the limit must be from 1 to {MAX_LIMIT}, not {limit}"
            )));
        }
        let read = self.session.sql.history(state_id, limit).ok_or_else(off)?;
        self.session.fetch(&read)
    }

    /// The version of `state_id` at `point`: that version, or the newest at or before the time.
    /// A time past both now and the newest version is refused as in the future; versions can
    /// be ahead of the clock (a grant after a forced unlock writes above the forced lease), and
    /// those are read as any other.
    pub fn get_at(&self, state_id: &str, point: Point) -> Result<HistoryEntry> {
        validate_state_id(state_id)?;
        if let Point::Time(time) = point {
            let now = self.session.host.now_ms();
            if time > now && time > self.extent(state_id)?.newest {
                return Err(Error::InvalidInput(format!(
                    "{} is in the future (now is {})",
                    show_time(time),
                    show_time(now)
                )));
            }
        }
        let read = self
            .session
            .sql
            .history_at(state_id, point)
            .ok_or_else(off)?;
        if let Some(entry) = self.session.fetch_first(&read)? {
            return Ok(entry);
        }
        Err(Error::InvalidInput(not_found(
            state_id,
            point,
            &self.extent(state_id)?,
        )))
    }

    /// How many versions of `state_id` the history has, and its oldest and newest.
    fn extent(&self, state_id: &str) -> Result<HistoryExtent> {
        let read = self.session.sql.history_extent(state_id).ok_or_else(off)?;
        Ok(self.session.fetch_first(&read)?.unwrap_or(HistoryExtent {
            versions: 0,
            oldest: 0,
            newest: 0,
        }))
    }

    /// Writes the state `state_id` had at `to` as a new version, under `lock`, guarded as
    /// `update`'s writes are: a stale holder gets `lock-lost` and nothing is written.
    pub fn restore_locked(&self, to: Point, lock: &mut LockHandle) -> Result<Restored> {
        let old = self.get_at(&lock.state_id, to)?;
        let (replaced, stored) = self.current(&lock.state_id)?;
        let state = match (&old.partial_state, &old.completed_state) {
            (None, None) => {
                return Err(Error::InvalidInput(format!(
                    "version {} of {:?} is its deletion (by `{}`); `clear` deletes it again",
                    old.version, lock.state_id, old.op
                )));
            }
            (partial, completed) => State {
                state_id: lock.state_id.clone(),
                partial: or_empty(partial.clone()),
                completed: or_empty(completed.clone()),
            },
        };
        let version = self.write_guarded_locked(&state, Op::Restore, lock, stored)?;
        Ok(Restored {
            replaced,
            restored: HistoryEntry {
                version,
                op: Op::Restore.name().to_string(),
                writer: self.session.instance.clone(),
                lock_owner: lock.owner.clone(),
                token: lock.token,
                partial_state: old.partial_state,
                completed_state: old.completed_state,
            },
        })
    }

    /// Removes the bookmarks of `streams` from both parts of the state under `lock` (and
    /// `currently_syncing` where it names one of them), as a new version guarded as `update`'s
    /// writes are; returns the state written. A stream in neither part is an error that lists the streams there are, and
    /// nothing is written.
    pub fn clear_streams_locked(&self, streams: &[String], lock: &mut LockHandle) -> Result<State> {
        if streams.is_empty() {
            return Err(Error::InvalidInput("name at least one stream".into()));
        }
        let (Some(stored), version) = self.current(&lock.state_id)? else {
            return Err(Error::InvalidInput(format!(
                "{:?} has no state, so no stream to clear",
                lock.state_id
            )));
        };
        let (partial, completed) = clear_streams(&stored.partial, &stored.completed, streams)?;
        let state = State {
            state_id: lock.state_id.clone(),
            partial,
            completed,
        };
        self.write_guarded_locked(&state, Op::ClearStream, lock, version)?;
        Ok(state)
    }

    /// The live state of `state_id` (none when none or deleted) and its version (0 when none).
    fn current(&self, state_id: &str) -> Result<(Option<State>, u64)> {
        Ok(match self.stored(state_id)? {
            None => (None, 0),
            Some((None, None, version)) => (None, version),
            Some((partial, completed, version)) => (
                Some(State {
                    state_id: state_id.to_string(),
                    partial: or_empty(partial),
                    completed: or_empty(completed),
                }),
                version,
            ),
        })
    }
}

/// Removes `streams` from `singer_state.bookmarks` of both parts, and `currently_syncing` where
/// it is one of them; an unknown stream is an error naming the known ones.
pub fn clear_streams(
    partial: &str,
    completed: &str,
    streams: &[String],
) -> Result<(String, String)> {
    let mut parts = [
        parse_object(partial, "partial state")?,
        parse_object(completed, "completed state")?,
    ];
    let mut known: Vec<String> = parts
        .iter()
        .flat_map(|part| bookmarks(part).map(|b| b.keys().cloned().collect::<Vec<_>>()))
        .flatten()
        .collect();
    known.sort();
    known.dedup();
    let unknown: Vec<&String> = streams.iter().filter(|s| !known.contains(s)).collect();
    if !unknown.is_empty() {
        return Err(Error::InvalidInput(format!(
            "no bookmarks for {} in this state; its streams are: {}",
            unknown
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    }
    for part in &mut parts {
        let Some(Value::Object(singer)) = part.get_mut("singer_state") else {
            continue;
        };
        if let Some(Value::Object(bookmarks)) = singer.get_mut("bookmarks") {
            for stream in streams {
                bookmarks.remove(stream);
            }
        }
        if let Some(Value::String(syncing)) = singer.get("currently_syncing")
            && streams.contains(syncing)
        {
            singer.insert("currently_syncing".into(), Value::Null);
        }
    }
    let [partial, completed] = parts.map(|part| Value::Object(part).to_string());
    Ok((partial, completed))
}

fn bookmarks(part: &Map<String, Value>) -> Option<&Map<String, Value>> {
    part.get("singer_state")?.get("bookmarks")?.as_object()
}

fn off() -> Error {
    Error::InvalidConfig(
        "the history is off for this store (history=false), so it has no versions to read".into(),
    )
}

fn not_found(state_id: &str, point: Point, extent: &HistoryExtent) -> String {
    let wanted = match point {
        Point::Version(v) => format!("no version {v} of {state_id:?}"),
        Point::Time(t) => format!("no version of {state_id:?} at or before {}", show_time(t)),
    };
    if extent.versions == 0 {
        return format!(
            "{wanted}: the history has none (writes made before the history was on, or by the \
             original Python backend, are not in it)"
        );
    }
    format!(
        "{wanted}: the history has {} version(s), the oldest {} ({}), the newest {} ({})",
        extent.versions,
        extent.oldest,
        show_time(extent.oldest),
        extent.newest,
        show_time(extent.newest)
    )
}

/// A version (unix ms) as an RFC 3339 time in UTC. By hand rather than through `humantime`,
/// whose formatter goes through `SystemTime` and carries its panic path into the component
/// (4 KB); the test below holds the two to the same text.
pub fn show_time(ms: u64) -> String {
    let (days, in_day) = (ms / 86_400_000, ms % 86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01: Howard Hinnant's
/// `civil_from_days`, over 400-year eras of 146,097 days that start on a 1 March.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let march_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * march_month + 2) / 5 + 1;
    let month = if march_month < 10 {
        march_month + 3
    } else {
        march_month - 9
    };
    (year_of_era + era * 400 + u64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = r#"{"singer_state":{"bookmarks":{"users":{"id":5},"orders":{"id":9}},"currently_syncing":"orders"}}"#;

    #[test]
    fn clearing_a_stream_removes_its_bookmark_and_currently_syncing_in_both_parts() {
        let (partial, completed) =
            clear_streams(STATE, STATE, &["orders".to_string()]).expect("cleared");
        for part in [partial, completed] {
            let value: Value = serde_json::from_str(&part).expect("json");
            assert_eq!(
                value["singer_state"]["bookmarks"],
                serde_json::json!({"users": {"id": 5}})
            );
            assert_eq!(value["singer_state"]["currently_syncing"], Value::Null);
        }
    }

    #[test]
    fn currently_syncing_another_stream_stays() {
        let (_, completed) = clear_streams("{}", STATE, &["users".to_string()]).expect("cleared");
        let value: Value = serde_json::from_str(&completed).expect("json");
        assert_eq!(value["singer_state"]["currently_syncing"], "orders");
        assert_eq!(
            value["singer_state"]["bookmarks"],
            serde_json::json!({"orders": {"id": 9}})
        );
    }

    #[test]
    fn an_unknown_stream_is_an_error_that_lists_the_streams() {
        match clear_streams("{}", STATE, &["orders".to_string(), "nope".to_string()]) {
            Err(Error::InvalidInput(m)) => {
                assert!(m.contains("\"nope\""), "{m}");
                assert!(m.contains("orders, users"), "{m}");
                assert!(!m.contains("\"orders\""), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match clear_streams("{}", "{}", &["a".to_string()]) {
            Err(Error::InvalidInput(m)) => assert!(m.ends_with("none"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_are_shown_in_utc() {
        assert_eq!(show_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(show_time(1_764_707_696_789), "2025-12-02T20:34:56.789Z");
        assert_eq!(show_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(show_time(u64::MAX), "584556019-04-03T14:25:51.615Z");
    }

    proptest::proptest! {
        #[test]
        fn times_read_as_humantime_writes_them(ms in 0u64..253_402_300_800_000) {
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            proptest::prop_assert_eq!(
                show_time(ms),
                humantime::format_rfc3339_millis(time).to_string()
            );
        }
    }
}
