//! A state write is acknowledged only once it is in the state table, and a write that reached
//! the history alone leaves no version there (`guest/src/landing.rs`): a view whose error a
//! profile would ignore, a replica whose view is missing, a send that failed between the
//! history's part and the view's and whose resend the guard refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::{Backend, Error, InstanceOptions, State};
use integration_tests::{LocalServer, SCHEMA, Target, TestTable, insert_target, runtime};

fn bookmark(id: &str, n: u64) -> State {
    State::partial(
        id,
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{n}}}}}}}}}"#),
    )
}

fn count(target: &Target, sql: &str) -> u64 {
    target.must(sql).trim().parse().expect("a count")
}

/// The history's rows whose state contains `needle`.
fn history_rows_with(target: &Target, table: &str, needle: &str) -> u64 {
    count(
        target,
        &format!(
            "SELECT count() FROM {SCHEMA}.{table}_history WHERE position(concat(\
             ifNull(partial_state, ''), ifNull(completed_state, '')), '{needle}') > 0"
        ),
    )
}

fn state_rows_with(target: &Target, table: &str, needle: &str) -> u64 {
    count(
        target,
        &format!(
            "SELECT count() FROM {SCHEMA}.{table} WHERE position(concat(\
             ifNull(partial_state, ''), ifNull(completed_state, '')), '{needle}') > 0"
        ),
    )
}

fn is_history_only(error: &Error, view: &str) -> bool {
    matches!(error, Error::InvalidConfig(m) if m.contains(view) && m.contains("withdrawn"))
}

#[tokio::test]
async fn a_replica_without_the_history_view_acknowledges_no_write() {
    let table = TestTable::new("no_view");
    let mut b = table.open_with(&[("lock_linger_seconds", "60")]).await;
    // The deployment check runs now, and finds the view; the grant is kept for the next update.
    b.update(&bookmark("kept", 1)).await.expect("first update");
    b.set(&State::completed("other", r#"{"n":1}"#))
        .await
        .expect("set");
    // The view goes missing, as on a replica whose DDL queue is late.
    let view = format!("{}_history_to_state", table.name);
    table.target.must(&format!("DROP VIEW {SCHEMA}.{view}"));
    let big = format!(r#"{{"blob":"{}","lost":1}}"#, "x".repeat(70 * 1024));
    let attempts: Vec<(&str, Result<(), Error>)> = vec![
        (
            "update (guarded, kept grant)",
            b.update(&State::partial("kept", r#"{"lost":1}"#)).await,
        ),
        (
            "set (one trip)",
            b.set(&State::completed("other", r#"{"lost":1}"#)).await,
        ),
        (
            "set (over 64 KiB)",
            b.set(&State::completed("other", big)).await,
        ),
        (
            "set_all",
            b.set_all(&[State::completed("new", r#"{"lost":1}"#)])
                .await
                .map(drop),
        ),
        ("delete", b.delete("other").await),
    ];
    for (what, result) in attempts {
        let error = result.expect_err(what);
        assert!(is_history_only(&error, &view), "{what}: {error}");
    }
    // Nothing reached the state table, and the history lists none of them.
    assert_eq!(state_rows_with(&table.target, &table.name, "lost"), 0);
    assert_eq!(history_rows_with(&table.target, &table.name, "lost"), 0);
    assert_eq!(
        count(
            &table.target,
            &format!(
                "SELECT count() FROM {SCHEMA}.{}_history WHERE state_id = 'other' \
                 AND partial_state IS NULL AND completed_state IS NULL",
                table.name
            )
        ),
        0,
        "the failed delete's tombstone"
    );
    let other = b.get("other").await.unwrap().expect("still there");
    assert_eq!(other.completed, r#"{"n":1}"#);
    b.close().await.ok();
}

/// A server whose every user has `profile` as their settings profile's defaults.
fn server_with_profile(profile: &[&str]) -> (LocalServer, Target) {
    let mut args = Vec::new();
    for setting in profile {
        args.push("--profile-setting");
        args.push(*setting);
    }
    let server = LocalServer::start_with("default", "", &args);
    let target = Target {
        secure: false,
        host: "127.0.0.1".into(),
        port: server.port,
        user: server.user.clone(),
        password: server.password.clone(),
    };
    (server, target)
}

async fn open(server: &LocalServer, table: &str, extra: &[(&str, &str)]) -> Backend {
    let mut settings = vec![
        ("schema".to_string(), SCHEMA.to_string()),
        ("table".to_string(), table.to_string()),
    ];
    settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    runtime().open(&server.uri(), settings).await.expect("open")
}

#[tokio::test]
async fn a_view_error_that_a_profile_would_ignore_fails_the_write() {
    let (server, target) = server_with_profile(&["materialized_views_ignore_errors=1"]);
    target.must(&format!("CREATE DATABASE IF NOT EXISTS {SCHEMA}"));
    let mut b = open(&server, "poisoned", &[]).await;
    b.migrate().await.expect("migrate");
    // The state table refuses one value, so the view's part of a write of it fails.
    target.must(&format!(
        "ALTER TABLE {SCHEMA}.poisoned ADD CONSTRAINT no_poison CHECK \
         position(concat(ifNull(partial_state, ''), ifNull(completed_state, '')), 'poison') = 0"
    ));
    b.set(&State::completed("s", r#"{"ok":1}"#))
        .await
        .expect("a write the view takes");
    let attempts: Vec<(&str, Result<(), Error>)> = vec![
        (
            "set",
            b.set(&State::completed("s", r#"{"poison":1}"#)).await,
        ),
        (
            "update",
            b.update(&State::partial("s", r#"{"poison":2}"#)).await,
        ),
        (
            "set_all",
            b.set_all(&[State::completed("t", r#"{"poison":3}"#)])
                .await
                .map(drop),
        ),
    ];
    for (what, result) in attempts {
        let error = result.expect_err(what);
        // The view's own error: the profile's default did not swallow it.
        assert!(
            matches!(&error, Error::Server { name, .. } if name == "VIOLATED_CONSTRAINT"),
            "{what}: {error}"
        );
    }
    assert_eq!(state_rows_with(&target, "poisoned", "poison"), 0);
    assert_eq!(
        history_rows_with(&target, "poisoned", "poison"),
        0,
        "a write that failed left a version in the history"
    );
    let s = b.get("s").await.unwrap().expect("stored");
    assert_eq!(s.completed, r#"{"ok":1}"#);
    b.close().await.ok();
}

/// Before the second send of the flaky guarded write into the history: lets the view take the
/// write again, and forces the writer's lock open (as an operator's `force-unlock` does), so
/// that the resend's guard refuses.
struct ForceBeforeResend {
    target: Target,
    table: String,
    sends: AtomicUsize,
    /// The history's rows of the flaky write when it was sent again: the first send's.
    history_at_resend: AtomicUsize,
}

impl Interceptor for ForceBeforeResend {
    fn before_send(&self, _: &http::Method, uri: &http::Uri) -> Option<Duration> {
        let history = format!("{}_history", self.table);
        // The flaky state travels in the URL, as a guarded write's parameters do.
        let guarded = insert_target(uri).as_deref() == Some(history.as_str())
            && uri
                .query()
                .is_some_and(|q| q.contains("HAVING") && q.contains("flaky"));
        if guarded && self.sends.fetch_add(1, Ordering::SeqCst) == 1 {
            let t = &self.target;
            let rows = history_rows_with(t, &self.table, "flaky") as usize;
            self.history_at_resend.store(rows, Ordering::SeqCst);
            t.must(&format!(
                "ALTER TABLE {SCHEMA}.{} DROP CONSTRAINT flaky",
                self.table
            ));
            t.must(&format!(
                "INSERT INTO {SCHEMA}.{0}_lock_log (state_id, generation, event, owner, at_ms, \
                 until_ms, floor_ms) SELECT 's', max(generation), 'force', 'operator', 0, 0, 0 \
                 FROM {SCHEMA}.{0}_lock_log WHERE state_id = 's'",
                self.table
            ));
        }
        None
    }
}

#[tokio::test]
async fn a_resend_the_guard_refuses_leaves_no_version_in_the_history() {
    // A view whose part fails once with an error worth another try (MEMORY_LIMIT_EXCEEDED,
    // 241), after the history's part was written.
    let (server, target) = server_with_profile(&["allow_custom_error_code_in_throwif=1"]);
    target.must(&format!("CREATE DATABASE IF NOT EXISTS {SCHEMA}"));
    let table = "refused";
    let mut writer = open(&server, table, &[("lock_linger_seconds", "60")]).await;
    writer
        .update(&bookmark("s", 1))
        .await
        .expect("first update");
    target.must(&format!(
        "ALTER TABLE {SCHEMA}.{table} ADD CONSTRAINT flaky CHECK throwIf(position(\
         ifNull(partial_state, ''), 'flaky') > 0, 'the view fails this once', toInt32(241)) = 0"
    ));
    let interceptor = Arc::new(ForceBeforeResend {
        target: target.clone(),
        table: table.to_string(),
        sends: AtomicUsize::new(0),
        history_at_resend: AtomicUsize::new(0),
    });
    writer.close().await.expect("close");
    let mut settings = vec![
        ("schema".to_string(), SCHEMA.to_string()),
        ("table".to_string(), table.to_string()),
        ("lock_linger_seconds".to_string(), "60".to_string()),
        ("retry_backoff_seconds".to_string(), "0.01".to_string()),
    ];
    settings.push(("lock_timeout_seconds".to_string(), "10".to_string()));
    let options = InstanceOptions {
        interceptor: Some(interceptor.clone()),
        ..InstanceOptions::default()
    };
    let mut writer = runtime()
        .open_with(&server.uri(), settings, options)
        .await
        .expect("open");
    writer
        .update(&bookmark("s", 2))
        .await
        .expect("an update that takes the lock");
    // The first send of this write reaches the history and fails in the view; its resend finds
    // the lock forced open. The writer then takes the lock anew and writes above what is stored.
    let result = writer.update(&State::partial("s", r#"{"flaky":1}"#)).await;
    assert!(
        interceptor.sends.load(Ordering::SeqCst) >= 2,
        "the guarded write was not sent again"
    );
    assert_eq!(
        interceptor.history_at_resend.load(Ordering::SeqCst),
        1,
        "the first send did not leave its row in the history (the case this test is about)"
    );
    let stored_version = count(
        &target,
        &format!(
            "SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {SCHEMA}.{table} WHERE state_id = 's'"
        ),
    );
    // Every version the history lists of `s` after the first is one the state table has had:
    // the flaky write appears at most once, and then as the stored version.
    let flaky: Vec<u64> = target
        .must(&format!(
            "SELECT toUnixTimestamp64Milli(updated_at) FROM {SCHEMA}.{table}_history \
             WHERE state_id = 's' AND position(ifNull(partial_state, ''), 'flaky') > 0"
        ))
        .lines()
        .map(|l| l.trim().parse().expect("a version"))
        .collect();
    match result {
        Ok(()) => assert_eq!(flaky, vec![stored_version], "{flaky:?}"),
        Err(e) => assert!(flaky.is_empty(), "{e}: the history lists {flaky:?}"),
    }
    writer.close().await.ok();
}
