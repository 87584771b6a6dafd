//! Whether a state write landed in the state table: what an INSERT's summary says it wrote,
//! checked against what it sent, and, where the count cannot tell, what the state table holds.
//!
//! With the history on, a write lands in two parts: ClickHouse writes the history's part first,
//! then its view's in the state table (`sql::history`). A server can acknowledge the first
//! alone: a replica whose view is missing (its DDL queue is late) writes the history only, and
//! so would a profile's `materialized_views_ignore_errors` (which every insert pins off, see
//! `pinned::PINS`). A send can also fail between the two, and its resend be refused by its
//! guard. So every state write is checked here, and a write found to have reached the history
//! and not the state table is withdrawn from the history (`history_withdraw`), so that the
//! history lists no version that no reader of the state saw.
//!
//! The count decides what it can: rows × tables is every row everywhere, and 0 on a first send
//! of a conditional write is its condition refusing. Otherwise (a part of the rows, a resend
//! whose first send may have landed in part, no summary, a failure) the state table's versions
//! decide, row by row: an older version stored than the row's means the row is not in the
//! state table (versions only grow); its own version or a newer one, that it may be. A row
//! found absent is withdrawn from the history only when no send of it can still land: every
//! send that failed was answered by the server as over (`session::Sends`), and versions
//! only grow (not in settle mode, where a `DELETE` removes them). A conditional write is never
//! reported landed from its version alone: another write of the same version may be there, so
//! its machine compares the stored row with its own (`Landed::Unknown`).

use crate::config::LockMode;
use crate::error::{Error, Result};
use crate::http::Transport;
use crate::rows;
use crate::session::{Level, Platform, Session};
use crate::sql::Query;
use protocol::role::Role;

/// What an INSERT's `written_rows` says of `rows` rows that each land in `fanout` tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Every row in every table.
    All,
    /// Nothing at all.
    Nothing,
    /// Some, not all: on a first send, rows that reached the history and not the state table.
    Part,
    /// The server did not say (no summary header).
    Unsaid,
}

pub fn count(written: Option<u64>, rows: u64, fanout: u64) -> Count {
    match written {
        None => Count::Unsaid,
        Some(0) => Count::Nothing,
        Some(w) if w == rows.saturating_mul(fanout.max(1)) => Count::All,
        Some(_) => Count::Part,
    }
}

/// Where a row is, by the state table's newest version of its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Its own version is the newest: it landed, or another write of that version did.
    Version,
    /// An older version is the newest: it is not in the state table.
    Absent,
    /// A newer version is the newest: whether it landed before that one cannot be told.
    Overtaken,
}

pub fn found(stored: u64, version: u64) -> Found {
    match stored.cmp(&version) {
        std::cmp::Ordering::Equal => Found::Version,
        std::cmp::Ordering::Less => Found::Absent,
        std::cmp::Ordering::Greater => Found::Overtaken,
    }
}

/// What a state write did, as far as can be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed {
    /// Every row is in the state table (the count says so; for a plain insert, its version is
    /// stored or a newer one).
    All,
    /// No row is, and none will be: the write's condition refused it, or it was found absent
    /// with no send of it left that could still land.
    Nothing,
    /// Cannot be told from the count and the versions: the caller compares what is stored.
    Unknown,
}

impl Landed {
    /// A one-row conditional write's outcome as the rows it wrote, as the machines take it
    /// (`None`: cannot be told, read what is stored).
    pub fn rows(self) -> Option<u64> {
        match self {
            Landed::All => Some(1),
            Landed::Nothing => Some(0),
            Landed::Unknown => None,
        }
    }
}

/// What the versions say of a write's rows, and what was done about the absent ones.
struct Settled {
    absent: usize,
    /// Rows stored at their own version or above.
    present: usize,
    /// No send of the write can still land, and versions only grow: an absent row stays so.
    certain: bool,
    /// The absent rows were withdrawn from the history.
    withdrawn: bool,
}

/// What a failed write says when an answer to it was lost: the server may have done it.
pub const MAY_HAVE_LANDED: &str =
    "an answer to the write was lost, so it may have been stored: read the state to see";

impl<T: Transport, H: Platform> Session<T, H> {
    /// Runs a state write (an INSERT naming its rows with `Query::landing`) and checks what
    /// landed; and whether it was sent more than once. A write found in the history alone
    /// fails with `invalid-config` (a deployment fault: a view missing on a replica), withdrawn
    /// from the history where nothing of it can still land; so is a failed write, whose error
    /// is returned.
    pub fn write(&self, query: &Query) -> Result<(Landed, bool)> {
        let rows = query.lands.len() as u64;
        let (sent, sends) = self.run_write(query);
        let doubt = sends.in_doubt;
        let conditional = query.role == Role::GuardedInsert;
        let (written, resent) = match sent {
            Ok(answer) => answer,
            Err(e) => {
                // Best effort, one try each: the server may be what failed.
                if query.fanout > 1
                    && sends.sent
                    && let Err(settling) = self.settle(query, true, doubt)
                {
                    self.host.log(
                        Level::Warn,
                        &format!(
                            "could not tell whether a failed write reached the state table: \
                             {settling}"
                        ),
                    );
                }
                // The caller must not read a failure as "nothing written" when a send of it
                // may have been done on the server before its answer was lost.
                return Err(match doubt {
                    true => e.gave_up(MAY_HAVE_LANDED),
                    false => e,
                });
            }
        };
        let counted = count(written, rows, query.fanout);
        match counted {
            Count::All => return Ok((Landed::All, resent)),
            Count::Nothing if conditional && !resent => return Ok((Landed::Nothing, false)),
            // A part on a first send is a deployment's fault, not a refusal: the next write
            // would meet it again. One row is then in the history alone, by the count itself
            // (its answer came, nothing else of it can land); of several, the absent ones are.
            Count::Part if !resent && rows == 1 => {
                self.withdraw(query, &query.lands)?;
                let settled = Settled {
                    absent: 1,
                    present: 0,
                    certain: true,
                    withdrawn: query.fanout > 1,
                };
                return Err(self.history_only(query, &settled));
            }
            Count::Part if !resent => {
                let settled = self.settle(query, false, doubt)?;
                return Err(self.history_only(query, &settled));
            }
            _ => {}
        }
        let settled = self.settle(query, false, doubt)?;
        let none_absent = settled.absent == 0;
        // A plain insert with a row absent after its answer: the view did not pass it on.
        if !conditional && !none_absent {
            return Err(self.history_only(query, &settled));
        }
        let landed = match (conditional, none_absent) {
            (false, _) => Landed::All,
            (true, true) => Landed::Unknown,
            // Absent, and no earlier send can still land: refused, truly.
            (true, false) if settled.certain => Landed::Nothing,
            (true, false) => Landed::Unknown,
        };
        Ok((landed, resent))
    }

    /// Runs a plain INSERT of state rows: every row landed (or was overtaken by a newer write
    /// of its id), or an error.
    pub fn insert(&self, query: &Query) -> Result<()> {
        self.write(query).map(drop)
    }

    /// Reads the state table's version of each row's id, and withdraws the absent rows from
    /// the history when none can still land (see the module's comment); `once`: no retries
    /// (after a failure).
    fn settle(&self, query: &Query, once: bool, doubt: bool) -> Result<Settled> {
        let read = || self.stored_versions(&query.lands);
        let stored = if once {
            self.retrying_until(self.host.now_ms(), read)?
        } else {
            read()?
        };
        let mut absent = Vec::new();
        for ((id, version), stored) in query.lands.iter().zip(stored) {
            if found(stored, *version) == Found::Absent {
                absent.push((id.clone(), *version));
            }
        }
        let certain = !doubt && self.config.lock_mode != LockMode::Settle;
        let withdrawn = !absent.is_empty() && certain && query.fanout > 1;
        if withdrawn {
            if once {
                self.retrying_until(self.host.now_ms(), || self.withdraw(query, &absent))?;
            } else {
                self.withdraw(query, &absent)?;
            }
        }
        Ok(Settled {
            absent: absent.len(),
            present: query.lands.len() - absent.len(),
            certain,
            withdrawn,
        })
    }

    /// The state table's newest version of each row's id, in order (0: none).
    fn stored_versions(&self, lands: &[(String, u64)]) -> Result<Vec<u64>> {
        if let [(id, _)] = lands {
            return Ok(vec![rows::number(&self.run(&self.sql.version_of(id))?)?]);
        }
        let all: std::collections::HashMap<String, u64> = self
            .fetch(&self.sql.versions())?
            .into_iter()
            .map(|row| (row.state_id, row.version))
            .collect();
        Ok(lands
            .iter()
            .map(|(id, _)| all.get(id).copied().unwrap_or(0))
            .collect())
    }

    /// Removes this instance's history rows of `rows` (none with no history).
    fn withdraw(&self, query: &Query, rows: &[(String, u64)]) -> Result<()> {
        if query.fanout < 2 {
            return Ok(());
        }
        let Some(delete) = self.sql.history_withdraw(&self.instance, rows) else {
            return Ok(());
        };
        self.host.log(
            Level::Warn,
            &format!(
                "{} of {} rows reached the history and not the state table; withdrawing them \
                 from the history",
                rows.len(),
                query.lands.len()
            ),
        );
        self.run(&delete).map(drop)
    }

    fn history_only(&self, query: &Query, settled: &Settled) -> Error {
        let config = &self.config;
        let what = format!(
            "a write of {} state row(s): {} not in {}.{}{}",
            query.lands.len(),
            settled.absent,
            config.schema,
            config.table,
            match settled.present {
                0 => String::new(),
                n => format!(" ({n} are, at their version or a newer one)"),
            }
        );
        let why = if query.fanout > 1 {
            format!(
                "; they reached {schema}.{history} and the view {schema}.{view} did not pass \
                 them on (it is missing on the replica that answered, or failed and its error \
                 was ignored). {withdrawn}Create the view on every replica (`state-backend \
                 migrate`, or `migrate --print` for the DDL)",
                schema = config.schema,
                history = config.history_table(),
                view = config.history_view(),
                withdrawn = if settled.withdrawn {
                    "Their history rows were withdrawn. "
                } else {
                    ""
                },
            )
        } else {
            "; the server acknowledged them".to_string()
        };
        Error::InvalidConfig(format!("{what}{why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_judged_against_rows_times_tables() {
        assert_eq!(count(Some(2), 1, 2), Count::All);
        assert_eq!(count(Some(1), 1, 2), Count::Part);
        assert_eq!(count(Some(0), 1, 2), Count::Nothing);
        assert_eq!(count(None, 1, 2), Count::Unsaid);
        assert_eq!(count(Some(3), 3, 1), Count::All);
        assert_eq!(count(Some(3), 3, 2), Count::Part);
        assert_eq!(count(Some(6), 3, 2), Count::All);
        assert_eq!(count(Some(7), 3, 2), Count::Part);
    }

    #[test]
    fn the_stored_version_says_where_a_row_is() {
        assert_eq!(found(5, 5), Found::Version);
        assert_eq!(found(4, 5), Found::Absent);
        assert_eq!(found(0, 5), Found::Absent);
        assert_eq!(found(6, 5), Found::Overtaken);
    }
}
