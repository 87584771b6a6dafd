//! The server's checks: authentication, its version, the clocks.

use super::check::{Check, Diagnosis, Outcome, first_row, number, text};
use crate::error::Error;
use crate::http::Transport;
use crate::session::{Platform, Session};
use protocol::rows::Observation;

/// The first check's answer.
pub(super) struct Server {
    pub(super) version: String,
    pub(super) user: String,
    /// The server's clock, and the host's before and after it answered.
    pub(super) server_ms: u64,
    pub(super) sent_ms: u64,
    pub(super) answered_ms: u64,
    pub(super) readonly: u64,
}

pub(super) fn server_checks<T: Transport, H: Platform>(
    session: &Session<T, H>,
    found: &mut Diagnosis,
) -> Option<Server> {
    let user = session.config.user.clone();
    let sent_ms = session.host.now_ms();
    let answer = session.read_once(&session.sql.doctor_server());
    let answered_ms = session.host.now_ms();
    let body = match answer {
        Ok(body) => body,
        Err(Error::Unauthorized(e)) => {
            found.push(Check::new(
                "authentication",
                Outcome::Fail,
                format!("the server refused user '{user}': {e}"),
                "check the user and the password (the URI's, or the password setting)",
            ));
            return None;
        }
        Err(e) => {
            found.push(Check::new(
                "authentication",
                Outcome::Fail,
                format!("no answer from the server: {e}"),
                "check that ClickHouse runs at the URI's host and port (the network checks above \
                 say which step fails)",
            ));
            return None;
        }
    };
    let row = first_row(&body).unwrap_or_default();
    if text(&row, "version").is_empty() || number(&row, "now_ms") == 0 {
        found.push(Check::new(
            "authentication",
            Outcome::Fail,
            format!(
                "the answer is not ClickHouse's ({} bytes, no version or time in it)",
                body.len()
            ),
            "check that the URI's port is ClickHouse's HTTP interface (8123, or 8443 with \
             secure=true)",
        ));
        return None;
    }
    let server = Server {
        version: text(&row, "version"),
        user: text(&row, "user"),
        server_ms: number(&row, "now_ms"),
        sent_ms,
        answered_ms,
        readonly: number(&row, "readonly"),
    };
    found.push(Check::new(
        "authentication",
        Outcome::Pass,
        format!("signed in as '{}'", server.user),
        "",
    ));
    Some(server)
}

/// The version, against the settings this backend pins: a server without some of them works,
/// without those safeguards.
pub(super) fn version_check(
    server: &Server,
    observed: Option<&Observation>,
    found: &mut Diagnosis,
) {
    let newer = protocol::pinned::newer_names();
    let check = match observed {
        None => Check::new(
            "server-version",
            Outcome::Warn,
            format!(
                "ClickHouse {}; which pinned settings it knows is unknown (the system tables \
                 cannot be read)",
                server.version
            ),
            "grant SELECT on system.tables, system.settings, system.macros and system.clusters",
        ),
        Some(observed) => {
            let lacks: Vec<&str> = newer
                .iter()
                .copied()
                .filter(|name| !observed.pinnable.iter().any(|n| n == name))
                .collect();
            if lacks.is_empty() {
                Check::new(
                    "server-version",
                    Outcome::Pass,
                    format!(
                        "ClickHouse {}: knows every setting this backend pins",
                        server.version
                    ),
                    "",
                )
            } else {
                Check::new(
                    "server-version",
                    Outcome::Warn,
                    format!(
                        "ClickHouse {} lacks the newer settings {} (they are not sent)",
                        server.version,
                        lacks.join(", ")
                    ),
                    "upgrade ClickHouse to have these safeguards",
                )
            }
        }
    };
    found.push(check);
}

/// The skew between the host's clock and the server's, against the lease's margin (a tenth of
/// the lease): leases are compared across hosts by their clocks.
pub(super) fn clock_check<T: Transport, H: Platform>(
    session: &Session<T, H>,
    server: &Server,
) -> Check {
    let margin = session.config.lock_lease_ms / 10;
    let midpoint = server.sent_ms / 2 + server.answered_ms / 2;
    let round_trip = server.answered_ms.saturating_sub(server.sent_ms);
    let skew = server.server_ms as i64 - midpoint as i64;
    // The server's time is somewhere within the round trip: only what is beyond it counts.
    let beyond = skew.unsigned_abs().saturating_sub(round_trip / 2);
    let detail = format!(
        "the server's clock is {skew:+} ms from this host's (round trip {round_trip} ms); the \
         lease's margin is {margin} ms"
    );
    if beyond > margin {
        Check::new(
            "clock",
            Outcome::Fail,
            detail,
            "synchronize this host's clock (NTP) or the server's; a skew beyond the margin can \
             let two holders overlap",
        )
    } else {
        Check::new("clock", Outcome::Pass, detail, "")
    }
}
