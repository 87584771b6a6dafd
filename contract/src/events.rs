//! The guest's decisions that a host counts (retries, lock waits, hand-offs), as lines of its
//! log: the guest writes them with these functions and the host reads them back with
//! [`Event::parse`], so that the guest gains no import for them and neither side keeps a copy
//! of the other's wording.

use std::fmt::Display;

use crate::error::LockInfo;

/// A decision of the guest's, read back from its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// A failed statement is sent again after `pause_ms` (its `attempt`th failure).
    Retry {
        attempt: u32,
        pause_ms: u64,
        error: &'a str,
    },
    /// Another instance holds the lock of `state_id`: the call sleeps `pause_ms` and looks again.
    LockWait {
        state_id: &'a str,
        holder: &'a str,
        token: u64,
        pause_ms: u64,
    },
    /// A lock kept between calls is given back (idle for its linger, or wanted by a waiter).
    HandOff { state_id: &'a str },
}

const RETRY: (&str, &str, &str) = ("retry ", " in ", " ms after: ");
const WAIT: (&str, &str, &str, &str) =
    ("waiting ", " ms for the lock of ", ", held by ", " (token ");
const HAND_OFF: &str = "gave back the kept lock of ";

/// The log line of a retry.
pub fn retry(attempt: u32, pause_ms: u64, error: &dyn Display) -> String {
    let (a, b, c) = RETRY;
    format!("{a}{attempt}{b}{pause_ms}{c}{error}")
}

/// The log line of a pause while `holder` has the lock.
pub fn lock_wait(holder: &LockInfo, pause_ms: u64) -> String {
    let (a, b, c, d) = WAIT;
    format!(
        "{a}{pause_ms}{b}{:?}{c}{}{d}{})",
        holder.state_id, holder.owner, holder.token
    )
}

/// The log line of a kept lock given back.
pub fn hand_off(state_id: &str) -> String {
    format!("{HAND_OFF}{state_id:?}")
}

impl<'a> Event<'a> {
    /// The event a log line tells of, if it tells of one.
    pub fn parse(line: &'a str) -> Option<Event<'a>> {
        if let Some(rest) = line.strip_prefix(RETRY.0) {
            let (attempt, rest) = rest.split_once(RETRY.1)?;
            let (pause_ms, error) = rest.split_once(RETRY.2)?;
            return Some(Event::Retry {
                attempt: attempt.parse().ok()?,
                pause_ms: pause_ms.parse().ok()?,
                error,
            });
        }
        if let Some(rest) = line.strip_prefix(WAIT.0) {
            let (pause_ms, rest) = rest.split_once(WAIT.1)?;
            // The id is quoted and may hold anything; the owner and token are the host's.
            let (state_id, rest) = rest.rsplit_once(WAIT.2)?;
            let (holder, token) = rest.rsplit_once(WAIT.3)?;
            return Some(Event::LockWait {
                state_id: unquote(state_id),
                holder,
                token: token.strip_suffix(')')?.parse().ok()?,
                pause_ms: pause_ms.parse().ok()?,
            });
        }
        let state_id = line.strip_prefix(HAND_OFF)?;
        Some(Event::HandOff {
            state_id: unquote(state_id),
        })
    }
}

/// A quoted id without its quotes (escapes, rare in ids, are left as they are).
fn unquote(quoted: &str) -> &str {
    quoted
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_reads_back_as_its_event() {
        assert_eq!(
            Event::parse(&retry(2, 350, &"connection refused: in 3 ms")),
            Some(Event::Retry {
                attempt: 2,
                pause_ms: 350,
                error: "connection refused: in 3 ms"
            })
        );
        let holder = LockInfo {
            state_id: "dev:tap, held by x (token 9)".into(),
            owner: "host-a:41:0f3c".into(),
            token: 17,
            acquired_at_ms: 1,
            expires_at_ms: 2,
        };
        assert_eq!(
            Event::parse(&lock_wait(&holder, 1200)),
            Some(Event::LockWait {
                state_id: "dev:tap, held by x (token 9)",
                holder: "host-a:41:0f3c",
                token: 17,
                pause_ms: 1200
            })
        );
        assert_eq!(
            Event::parse(&hand_off("dev:a")),
            Some(Event::HandOff { state_id: "dev:a" })
        );
    }

    #[test]
    fn other_lines_are_no_event() {
        for line in [
            "lock on \"a\" granted to x (token 3)",
            "retry soon",
            "waiting for nothing",
            "",
        ] {
            assert_eq!(Event::parse(line), None, "{line}");
        }
    }
}
