//! `diagnose`: the store's side of an operator's `doctor`. Each check is one or two reads; none
//! writes (an INSERT of no row is how the grant to write is tried), none creates the schema,
//! none is retried, and a check that cannot run says why.

mod check;
mod schema;
mod server;

pub use check::{CHECKS, Check, Diagnosis, LOCK_LOG_ROWS_WARN, Outcome};
pub use schema::granted;

use crate::http::Transport;
use crate::session::{Platform, Session};
use protocol::rows::Observation;
use schema::{Tables, deployment_check, grants_check, lock_log_check, tables_check, unreleased};
use server::{clock_check, server_checks, version_check};

/// Runs every check.
pub fn diagnose<T: Transport, H: Platform>(session: &Session<T, H>) -> Diagnosis {
    let mut found = Diagnosis::default();
    let Some(server) = server_checks(session, &mut found) else {
        found.skip_rest("not run: the server did not answer the first check");
        return found;
    };
    let observed = match session.read_once(
        &session
            .sql
            .deployment(&protocol::pinned::newer_names())
            .query,
    ) {
        Ok(body) => crate::rows::first::<Observation>(&body).ok().flatten(),
        Err(_) => None,
    };
    version_check(&server, observed.as_ref(), &mut found);
    found.push(clock_check(session, &server));
    deployment_check(session, observed.as_ref(), &mut found);
    let tables = tables_check(session, &mut found);
    found.push(grants_check(session, &server, tables));
    if tables != Tables::Missing {
        found.push(lock_log_check(session));
        found.unreleased = unreleased(session, &mut found);
    } else {
        found.push(Check::new(
            "lock-log",
            Outcome::Skipped,
            "not run: the tables are missing".into(),
            "",
        ));
    }
    found
}
