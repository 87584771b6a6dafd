//! The store's checks: the deployment, the tables, the grants, the lock log.

use super::check::{
    Check, Diagnosis, LOCK_LOG_ROWS_WARN, Outcome, all_rows, first_row, number, text,
};
use super::server::Server;
use crate::error::LockInfo;
use crate::http::Transport;
use crate::session::{Platform, Session};
use protocol::deployment::{self, Consistency, Kind};
use protocol::role::Role;
use protocol::rows::Observation;

pub(super) fn deployment_check<T: Transport, H: Platform>(
    session: &Session<T, H>,
    observed: Option<&Observation>,
    found: &mut Diagnosis,
) {
    let Some(observed) = observed else {
        found.push(Check::new(
            "deployment",
            Outcome::Warn,
            "unknown: the system tables cannot be read, so inserts carry the quorum settings"
                .into(),
            "grant SELECT on system.tables, system.settings, system.macros and system.clusters",
        ));
        return;
    };
    match deployment::check(&session.config, observed) {
        Ok(kind) => {
            let consistency = Consistency::observed(&session.config, kind, observed);
            // The deployment's own settings; the pinned ones are the same everywhere.
            let named = |role| {
                let pins = protocol::pinned::for_role(role, consistency.pinnable).count();
                let mut settings: Vec<String> = consistency
                    .settings(role)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                settings.truncate(settings.len().saturating_sub(pins));
                format!("{} (and {pins} pinned)", settings.join(", "))
            };
            let what = match consistency.kind {
                Kind::SingleServer | Kind::Missing => "one server",
                Kind::Cloud => "ClickHouse Cloud",
                Kind::Replicated => "a replicated cluster",
                Kind::Unknown => "unknown",
            };
            found.push(Check::new(
                "deployment",
                Outcome::Pass,
                format!(
                    "{what}; inserts carry {}; deciding reads carry {}",
                    named(Role::Insert),
                    named(Role::Deciding)
                ),
                "",
            ));
        }
        Err(e) => {
            found.push(Check::new(
                "deployment",
                Outcome::Fail,
                e.to_string(),
                "see docs/deployments.md for the tables each deployment needs",
            ));
        }
    }
}

/// Whether the tables exist, as `system.tables` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tables {
    Exist,
    Missing,
    /// The user may not list them.
    Unknown,
}

/// Every table this store uses, with its engine, rows and active parts; the history's TTL.
pub(super) fn tables_check<T: Transport, H: Platform>(
    session: &Session<T, H>,
    found: &mut Diagnosis,
) -> Tables {
    let config = &session.config;
    let mut wanted = vec![
        config.table.clone(),
        config.lock_log_table(),
        config.writers_table(),
    ];
    if config.history {
        wanted.push(config.history_table());
        wanted.push(config.history_view());
    }
    let row = match session.read_once(&session.sql.doctor_tables(&wanted)) {
        Ok(body) => first_row(&body).unwrap_or_default(),
        Err(e) => {
            found.push(Check::new(
                "tables",
                Outcome::Warn,
                format!("cannot list the tables: {e}"),
                "grant SELECT on system.tables and system.parts",
            ));
            return Tables::Unknown;
        }
    };
    let missing = text(&row, "missing");
    if !missing.is_empty() {
        found.push(Check::new(
            "tables",
            Outcome::Fail,
            format!("missing in {}: {missing}", config.schema),
            "run `state-backend doctor --fix` (or `migrate`) with a user allowed to create them",
        ));
        return Tables::Missing;
    }
    let seen = text(&row, "seen");
    // What `migrate` would change: the history's TTL, and the `want` event a lock log created
    // by an older version lacks (it works without it; a waiter's hint is then not sent).
    let no_ttl = config.history && config.history_days > 0 && number(&row, "no_ttl") > 0;
    let no_want = session
        .read_once(&session.sql.lock_log_lacks_want())
        .is_ok_and(|body| crate::rows::number(&body).is_ok_and(|n| n == 1));
    if no_ttl || no_want {
        let mut detail = seen;
        if no_ttl {
            detail.push_str("; the history has no TTL, though history_days is set");
        }
        if no_want {
            detail.push_str("; the lock log lacks the `want` event (an older version's)");
        }
        found.push(Check::new(
            "tables",
            Outcome::Warn,
            detail,
            "run `state-backend migrate` (or `doctor --fix`) to bring the schema up to date",
        ));
    } else {
        found.push(Check::new("tables", Outcome::Pass, seen, ""));
    }
    Tables::Exist
}

/// Each kind of statement the backend sends, tried on each table without writing: SELECT of no
/// row, INSERT of no row, CREATE of what exists (`IF NOT EXISTS`, on this server only). ALTER
/// (the history's TTL, which `migrate` sets) and DELETE (the pruning of the lock log and the
/// history, a mutation) would change the tables if tried: they are read from the user's own
/// grants.
pub(super) fn grants_check<T: Transport, H: Platform>(
    session: &Session<T, H>,
    server: &Server,
    tables: Tables,
) -> Check {
    if tables != Tables::Exist {
        let why = match tables {
            Tables::Missing => "not run: the tables are missing",
            _ => "not run: the tables could not be listed, and a write to a missing one fails",
        };
        return Check::new("grants", Outcome::Skipped, why.into(), "");
    }
    let mut refused = Vec::new();
    let sql = &session.sql;
    for (kind, table) in sql.doctor_tables_written() {
        if let Err(e) = session.read_once(&sql.doctor_select(&table)) {
            refused.push(format!("SELECT on the {kind} table: {e}"));
        }
        if let Err(e) = session.read_once(&sql.doctor_insert(&table)) {
            refused.push(format!("INSERT into the {kind} table: {e}"));
        }
    }
    if let Err(e) = session.read_once(&sql.doctor_create()) {
        refused.push(format!("CREATE TABLE: {e}"));
    }
    let config = &session.config;
    let shown = if server.readonly > 0 {
        refused.push(format!(
            "ALTER and DELETE: the user is read-only (readonly={})",
            server.readonly
        ));
        None
    } else {
        session
            .read_once(&sql.doctor_grants())
            .ok()
            .map(|body| String::from_utf8_lossy(&body).into_owned())
    };
    if !refused.is_empty() {
        return Check::new(
            "grants",
            Outcome::Fail,
            format!("refused: {}", refused.join("; ")),
            "grant the user SELECT, INSERT, CREATE TABLE, ALTER and DELETE on the schema (see \
             docs/deployments.md)",
        );
    }
    let mut unsure = Vec::new();
    for (what, table, privileges) in [
        ("ALTER TTL", config.history_table(), ALTER_TTL),
        ("DELETE", config.lock_log_table(), DELETE),
    ] {
        match &shown {
            Some(grants) if granted(grants, &config.schema, &table, privileges) => {}
            Some(_) => unsure.push(format!(
                "{what} is not in SHOW GRANTS (a role may grant it)"
            )),
            None => unsure.push(format!("{what} is unknown (SHOW GRANTS failed)")),
        }
    }
    let tried = "SELECT, INSERT and CREATE TABLE tried on each table";
    if unsure.is_empty() {
        Check::new(
            "grants",
            Outcome::Pass,
            format!("{tried}; ALTER TTL and DELETE granted"),
            "",
        )
    } else {
        Check::new(
            "grants",
            Outcome::Warn,
            format!("{tried}; {}", unsure.join("; ")),
            "`migrate` sets the history's TTL with ALTER and the lock log is pruned with DELETE: \
             grant both on the schema, or check the role that grants them",
        )
    }
}

/// The privileges that allow `ALTER TABLE … MODIFY TTL`, and a lightweight `DELETE`.
const ALTER_TTL: &[&str] = &[
    "ALL",
    "ALTER",
    "ALTER TABLE",
    "ALTER TTL",
    "ALTER MODIFY TTL",
];
const DELETE: &[&str] = &["ALL", "ALTER", "ALTER TABLE", "ALTER DELETE", "DELETE"];

/// Whether `SHOW GRANTS` grants one of `privileges` on `schema.table`: on `*.*`, on the schema or
/// on the table, with no REVOKE of any of them on those (a partial revoke is not resolved: it
/// counts as not granted).
pub fn granted(grants: &str, schema: &str, table: &str, privileges: &[&str]) -> bool {
    let targets = [
        "*.*".to_string(),
        format!("{schema}.*"),
        format!("{schema}.{table}"),
    ];
    let names = |line: &str, verb: &str, to: &str| -> bool {
        let Some(rest) = line.trim().strip_prefix(verb) else {
            return false;
        };
        let Some((listed, on)) = rest.split_once(" ON ") else {
            return false;
        };
        let target = on.split(to).next().unwrap_or("").trim().replace('`', "");
        targets.contains(&target) && listed.split(", ").any(|p| privileges.contains(&p.trim()))
    };
    let revoked = grants.lines().any(|l| names(l, "REVOKE ", " FROM "));
    !revoked && grants.lines().any(|l| names(l, "GRANT ", " TO "))
}

/// The ids with the most rows in the lock log.
pub(super) fn lock_log_check<T: Transport, H: Platform>(session: &Session<T, H>) -> Check {
    let row = match session.read_once(&session.sql.doctor_lock_log_rows()) {
        Ok(body) => first_row(&body).unwrap_or_default(),
        Err(e) => {
            return Check::new(
                "lock-log",
                Outcome::Warn,
                format!("cannot read the lock log: {e}"),
                "grant SELECT on the lock log",
            );
        }
    };
    let largest = number(&row, "largest");
    if largest == 0 {
        return Check::new("lock-log", Outcome::Pass, "empty".into(), "");
    }
    let detail = format!("rows per id, largest first: {}", text(&row, "listed"));
    if largest > LOCK_LOG_ROWS_WARN {
        Check::new(
            "lock-log",
            Outcome::Warn,
            detail,
            "old generations are not pruned: check that the user may DELETE from the lock log",
        )
    } else {
        Check::new("lock-log", Outcome::Pass, detail, "")
    }
}

/// The grants of every id that were neither released nor forced open.
pub(super) fn unreleased<T: Transport, H: Platform>(
    session: &Session<T, H>,
    found: &mut Diagnosis,
) -> Vec<LockInfo> {
    let body = match session.read_once(&session.sql.doctor_unreleased()) {
        Ok(body) => body,
        Err(e) => {
            found.push(Check::new(
                "locks",
                Outcome::Warn,
                format!("cannot read the lock log's grants: {e}"),
                "grant SELECT on the lock log",
            ));
            return Vec::new();
        }
    };
    all_rows(&body)
        .iter()
        .map(|row| LockInfo {
            state_id: text(row, "state_id"),
            owner: text(row, "holder"),
            token: number(row, "generation"),
            acquired_at_ms: number(row, "acquired_at"),
            expires_at_ms: number(row, "lease_until"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_privilege_is_granted_on_everything_the_schema_or_the_table_unless_revoked() {
        let table = "state_history";
        for (grants, want) in [
            ("GRANT ALL ON *.* TO u", true),
            ("GRANT SELECT, ALTER, CREATE ON *.* TO u", true),
            ("GRANT ALTER TABLE ON meltano.* TO u", true),
            ("GRANT ALTER TTL ON meltano.state_history TO u", true),
            ("GRANT ALTER TTL ON `meltano`.`state_history` TO u", true),
            ("GRANT SELECT, INSERT ON *.* TO u", false),
            ("GRANT ALTER ON other.* TO u", false),
            ("GRANT ALTER ON meltano.state TO u", false),
            ("REVOKE ALTER ON *.* FROM u", false),
            (
                "GRANT ALL ON *.* TO u\nREVOKE ALTER TTL ON meltano.* FROM u",
                false,
            ),
        ] {
            assert_eq!(
                granted(grants, "meltano", table, ALTER_TTL),
                want,
                "{grants}"
            );
        }
        assert!(granted(
            "GRANT ALTER DELETE ON meltano.* TO u",
            "meltano",
            "l",
            DELETE
        ));
        assert!(!granted(
            "GRANT ALTER TTL ON meltano.* TO u",
            "meltano",
            "l",
            DELETE
        ));
    }
}
