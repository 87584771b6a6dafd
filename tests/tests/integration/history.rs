//! The history: every write recorded, read back at a version or a time, restored, and streams
//! cleared; refused writes never in it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use integration_tests::state_host::http::faults::{Fault, FaultPlan};
use integration_tests::state_host::{Backend, Error, InstanceOptions, State};
use integration_tests::state_host::{HistoryEntry, Point};
use integration_tests::{SCHEMA, TestTable, json, runtime};

fn bookmarks(orders: u64) -> String {
    format!(
        r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{orders}}},"users":{{"id":1}}}}}}}}"#
    )
}

/// The history's rows of `state_id` as ClickHouse has them, bypassing the component: (op,
/// completed state) oldest first.
fn raw_history(table: &TestTable, state_id: &str) -> Vec<(String, String)> {
    let text = table.target.must(&format!(
        "SELECT op, ifNull(completed_state, 'NULL') FROM {SCHEMA}.{}_history \
         WHERE state_id = '{state_id}' ORDER BY updated_at FORMAT TSV",
        table.name
    ));
    text.lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(op, completed)| (op.to_string(), completed.replace("\\\\", "\\")))
        .collect()
}

/// The state table's versions of `state_id` that the history lacks, as ClickHouse has them: a
/// write that reached the state table without the history.
fn unrecorded(table: &TestTable, state_id: &str) -> String {
    table.target.must(&format!(
        "SELECT updated_at FROM {SCHEMA}.{name} WHERE state_id = '{state_id}' EXCEPT \
         SELECT updated_at FROM {SCHEMA}.{name}_history WHERE state_id = '{state_id}' FORMAT TSV",
        name = table.name
    ))
}

fn ops(entries: &[HistoryEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.op.as_str()).collect()
}

#[tokio::test]
async fn every_write_is_recorded_with_how_and_by_whom() {
    let table = TestTable::new("hist_ops");
    let mut b = table.open().await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    b.update(&State::partial(
        "s",
        r#"{"singer_state":{"bookmarks":{"orders":{"id":2}}}}"#,
    ))
    .await
    .unwrap();
    b.delete("s").await.unwrap();
    b.set_all(&[
        State::completed("s", bookmarks(3)),
        State::completed("t", "{}"),
    ])
    .await
    .unwrap();
    let lock = b.acquire_lock("s").await.unwrap();
    b.set_locked(&State::completed("s", bookmarks(4)), &lock)
        .await
        .unwrap();
    b.release(lock).await.unwrap();
    b.clear("s").await.unwrap();
    b.set(&State::completed("s", bookmarks(5))).await.unwrap();
    assert_eq!(b.clear_all().await.unwrap(), 2);

    let history = b.history("s", 100).await.unwrap();
    assert_eq!(
        ops(&history),
        [
            "clear-all",
            "set",
            "clear",
            "set",
            "set-all",
            "delete",
            "update",
            "set"
        ]
    );
    // Newest first, each version above the one before it.
    assert!(history.windows(2).all(|w| w[0].version > w[1].version));
    // The same rows as the table has them, and the state table has no version the history
    // lacks: nothing was written beside the history.
    let raw = raw_history(&table, "s");
    assert_eq!(raw.len(), history.len());
    assert_eq!(unrecorded(&table, "s"), "");
    let writer = &history[0].writer;
    assert_eq!(writer.len(), 36, "an instance id: {writer}");
    assert!(history.iter().all(|e| &e.writer == writer), "one instance");
    for entry in &history {
        let locked = matches!(entry.op.as_str(), "update" | "clear")
            || (entry.op == "set"
                && entry
                    .state
                    .as_ref()
                    .is_some_and(|s| s.completed.contains("\"id\":4")));
        assert_eq!(entry.token > 0, locked, "{entry:?}");
        assert_eq!(!entry.lock_owner.is_empty(), locked, "{entry:?}");
    }
    // Deletions have no state; the others carry both parts.
    for (entry, deleted) in history
        .iter()
        .zip([true, false, true, false, false, true, false, false])
    {
        assert_eq!(entry.state.is_none(), deleted, "{entry:?}");
    }
    let merged = history[6].state.as_ref().expect("the update's state");
    assert_eq!(
        json(&merged.partial),
        json(r#"{"singer_state":{"bookmarks":{"orders":{"id":2}}}}"#)
    );
    assert_eq!(json(&merged.completed), json(&bookmarks(1)));
    // The limit keeps the newest.
    assert_eq!(ops(&b.history("s", 2).await.unwrap()), ["clear-all", "set"]);
    assert_eq!(
        ops(&b.history("t", 10).await.unwrap()),
        ["clear-all", "set-all"]
    );
}

#[tokio::test]
async fn a_version_is_read_back_by_its_number_or_by_a_time() {
    let table = TestTable::new("hist_at");
    let mut b = table.open().await;
    for orders in 1..=3 {
        b.set(&State::completed("s", bookmarks(orders)))
            .await
            .unwrap();
    }
    let history = b.history("s", 10).await.unwrap();
    let [third, second, first] = &history[..] else {
        panic!("{history:?}")
    };
    let at = b.get_at("s", Point::Version(second.version)).await.unwrap();
    assert_eq!(&at, second);
    assert_eq!(json(&at.state.unwrap().completed), json(&bookmarks(2)));
    // A time between two versions gives the older one; a time at a version gives it.
    for (time, expected) in [
        (second.version + 1, second),
        (third.version - 1, second),
        (third.version, third),
        (first.version, first),
    ] {
        assert_eq!(
            &b.get_at("s", Point::Time(time)).await.unwrap(),
            expected,
            "at {time}"
        );
    }
}

#[tokio::test]
async fn reading_what_is_not_there_is_a_clear_error() {
    let table = TestTable::new("hist_bad");
    let mut b = table.open().await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    let only = b.history("s", 10).await.unwrap()[0].version;
    let message = |e: Error| match e {
        Error::InvalidInput(m) => m,
        other => panic!("expected invalid input, got {other:?}"),
    };
    // An unknown version names what there is.
    let m = message(b.get_at("s", Point::Version(only - 1)).await.unwrap_err());
    assert!(m.contains(&format!("no version {}", only - 1)), "{m}");
    assert!(
        m.contains(&format!("1 version(s), the oldest {only}")),
        "{m}"
    );
    // A time before the first version.
    let m = message(b.get_at("s", Point::Time(only - 1)).await.unwrap_err());
    assert!(m.contains("at or before"), "{m}");
    // The future.
    let future = only + 3_600_000;
    let m = message(b.get_at("s", Point::Time(future)).await.unwrap_err());
    assert!(m.contains("is in the future"), "{m}");
    // A version no DateTime64 holds is none, not a server error.
    let m = message(b.get_at("s", Point::Version(u64::MAX)).await.unwrap_err());
    assert!(m.contains(&format!("no version {}", u64::MAX)), "{m}");
    // An id with no history.
    assert!(b.history("never", 10).await.unwrap().is_empty());
    let m = message(b.get_at("never", Point::Version(only)).await.unwrap_err());
    assert!(m.contains("the history has none"), "{m}");
    let lock = b.acquire_lock("never").await.unwrap();
    let m = message(
        b.restore_locked(Point::Version(only), &lock)
            .await
            .unwrap_err(),
    );
    assert!(m.contains("the history has none"), "{m}");
    b.release(lock).await.unwrap();
    // A limit out of range, an empty id.
    assert!(matches!(
        b.history("s", 0).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        b.history("", 1).await,
        Err(Error::InvalidInput(_))
    ));
    // Nothing of it wrote anything.
    assert_eq!(raw_history(&table, "s").len(), 1);
    assert!(raw_history(&table, "never").is_empty());
}

/// A version in the history twice (a retry after the server wrote the history's part and
/// failed) is read once: listed once, counted once, and merged into one row.
#[tokio::test]
async fn a_version_written_twice_is_read_once() {
    let table = TestTable::new("hist_twice");
    let mut b = table.open().await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    let history = format!("{SCHEMA}.{}_history", table.name);
    // The same row again, as a retry would write it (its view passes it on to the state table
    // too, where the id's merge keeps one).
    table.target.must(&format!(
        "INSERT INTO {history} SETTINGS insert_deduplicate = 0 \
         SELECT * FROM {history} WHERE state_id = 's'"
    ));
    assert_eq!(raw_history(&table, "s").len(), 2);
    let listed = b.history("s", 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let m = b
        .get_at("s", Point::Version(listed[0].version - 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(m.contains("1 version(s)"), "{m}");
    table
        .target
        .must(&format!("OPTIMIZE TABLE {history} FINAL"));
    assert_eq!(raw_history(&table, "s").len(), 1);
}

#[tokio::test]
async fn restore_writes_the_old_state_as_a_new_version_and_says_what_it_replaced() {
    let table = TestTable::new("hist_restore");
    let mut b = table.open().await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    let good = b.history("s", 1).await.unwrap()[0].version;
    // A bad run moves the bookmark past what it loaded.
    b.update(&State::partial("s", bookmarks(99))).await.unwrap();
    let lock = b.acquire_lock("s").await.unwrap();
    let restored = b.restore_locked(Point::Version(good), &lock).await.unwrap();
    b.release(lock).await.unwrap();
    let replaced = restored.replaced.expect("a state was replaced");
    assert_eq!(json(&replaced.partial), json(&bookmarks(99)));
    assert_eq!(restored.restored.op, "restore");
    // The next run resumes from the restored bookmark.
    let now = b.get("s").await.unwrap().expect("stored");
    assert_eq!(json(&now.completed), json(&bookmarks(1)));
    assert_eq!(json(&now.partial), json("{}"));
    let history = b.history("s", 10).await.unwrap();
    assert_eq!(ops(&history), ["restore", "update", "set"]);
    assert_eq!(history[0], restored.restored);
}

/// Drops the connection once, after the first restore's insert reached the server.
#[derive(Default)]
struct LoseFirstRestoreAnswer(AtomicBool);

impl FaultPlan for LoseFirstRestoreAnswer {
    fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
        let restore = uri.query().unwrap_or("").contains("param_op=restore");
        (restore && !self.0.swap(true, Ordering::SeqCst)).then_some(Fault::ResetBeforeResponse)
    }
}

/// A restore that landed but whose answer was lost is reported as written, once: its resend
/// finds the guard no longer holds (the first send moved the version) and writes nothing, and
/// the version read back says the write is there.
#[tokio::test]
async fn a_restore_whose_answer_was_lost_is_written_once_and_reported_so() {
    let table = TestTable::new("hist_restore_lost");
    let mut b = table.open().await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    let good = b.history("s", 1).await.unwrap()[0].version;
    b.set(&State::completed("s", bookmarks(2))).await.unwrap();
    let lose = Arc::new(LoseFirstRestoreAnswer::default());
    let options = InstanceOptions {
        label: "lost-answer".into(),
        faults: Some(lose.clone()),
        ..InstanceOptions::default()
    };
    let mut faulty = runtime()
        .open_with(&table.target.uri(), table.with(&[]), options)
        .await
        .unwrap();
    let lock = faulty.acquire_lock("s").await.unwrap();
    let restored = faulty
        .restore_locked(Point::Version(good), &lock)
        .await
        .expect("the restore landed");
    faulty.release(lock).await.unwrap();
    assert!(lose.0.load(Ordering::SeqCst), "the answer was lost");
    let history = b.history("s", 10).await.unwrap();
    assert_eq!(ops(&history), ["restore", "set", "set"]);
    assert_eq!(history[0].version, restored.restored.version);
    assert_eq!(raw_history(&table, "s").len(), 3);
}

/// A holder whose lock was forced open and given to another cannot restore or clear streams,
/// even before the new holder writes anything (a version-fenced write would still land then):
/// nothing reaches the state or the history.
#[tokio::test]
async fn a_stale_holders_restore_and_stream_clear_are_refused() {
    let table = TestTable::new("hist_stale");
    let mut old = table.open().await;
    let mut operator = table.open().await;
    let mut new = table.open().await;
    old.set(&State::completed("s", bookmarks(1))).await.unwrap();
    old.update(&State::partial("s", bookmarks(2)))
        .await
        .unwrap();
    let first = old.history("s", 10).await.unwrap().last().unwrap().version;
    let old_lock = old.acquire_lock("s").await.unwrap();
    assert!(operator.force_unlock("s").await.unwrap());
    let new_lock = new.acquire_lock("s").await.unwrap();
    let before = raw_history(&table, "s");

    let refused = old.restore_locked(Point::Version(first), &old_lock).await;
    assert!(matches!(refused, Err(Error::LockLost(_))), "{refused:?}");
    let refused = old
        .clear_streams_locked(&["orders".to_string()], &old_lock)
        .await;
    assert!(matches!(refused, Err(Error::LockLost(_))), "{refused:?}");
    assert_eq!(raw_history(&table, "s"), before);
    let now = new.get("s").await.unwrap().expect("stored");
    assert_eq!(json(&now.partial), json(&bookmarks(2)));

    // The new holder's restore lands, above the forced lease's end: ahead of the clock, and
    // read back by its own time.
    let restored = new
        .restore_locked(Point::Version(first), &new_lock)
        .await
        .unwrap()
        .restored;
    assert_eq!(raw_history(&table, "s").len(), before.len() + 1);
    assert_eq!(unrecorded(&table, "s"), "");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(restored.version > now_ms, "ahead of the clock");
    assert_eq!(
        new.get_at("s", Point::Time(restored.version))
            .await
            .unwrap(),
        restored
    );
    new.release(new_lock).await.unwrap();
    let _ = old.release(old_lock).await;
}

/// Counts the guarded inserts of `update` an instance sends; injects nothing.
#[derive(Default)]
struct CountUpdateWrites(std::sync::atomic::AtomicU64);

impl FaultPlan for CountUpdateWrites {
    fn fault(&self, _: &http::Method, uri: &http::Uri) -> Option<Fault> {
        if uri.query().unwrap_or("").contains("param_op=update") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        None
    }
}

/// An `update` whose guard the server refuses (its grant was forced open and taken meanwhile)
/// writes no row to the history: the guarded INSERT's SELECT gives none.
#[tokio::test]
async fn an_update_the_guard_refuses_is_not_in_the_history() {
    let table = TestTable::new("hist_guard");
    // The update keeps its lock between calls, so the next one is a single guarded insert.
    let sent = Arc::new(CountUpdateWrites::default());
    let options = InstanceOptions {
        label: "counted".into(),
        faults: Some(sent.clone()),
        ..InstanceOptions::default()
    };
    let mut writer = runtime()
        .open_with(
            &table.target.uri(),
            table.with(&[("lock_linger_seconds", "60"), ("lock_timeout_seconds", "2")]),
            options,
        )
        .await
        .unwrap();
    let mut operator = table.open().await;
    writer
        .update(&State::partial("s", bookmarks(1)))
        .await
        .unwrap();
    assert!(operator.force_unlock("s").await.unwrap());
    let taker = operator.acquire_lock("s").await.unwrap();
    let before = raw_history(&table, "s");
    let writes = sent.0.load(Ordering::SeqCst);
    let refused = writer.update(&State::partial("s", bookmarks(2))).await;
    assert!(refused.is_err(), "the kept grant is gone: {refused:?}");
    assert_eq!(
        sent.0.load(Ordering::SeqCst),
        writes + 1,
        "the guarded insert was sent, on the kept grant"
    );
    assert_eq!(raw_history(&table, "s"), before);
    operator.release(taker).await.unwrap();
    // Taken anew, the same update lands, and is recorded once.
    writer
        .update(&State::partial("s", bookmarks(2)))
        .await
        .unwrap();
    let after = raw_history(&table, "s");
    assert_eq!(after.len(), before.len() + 1);
    writer.close().await.unwrap();
}

#[tokio::test]
async fn clearing_streams_removes_their_bookmarks_or_names_the_streams_there_are() {
    let table = TestTable::new("hist_streams");
    let mut b = table.open().await;
    b.set(&State::new(
        "s",
        r#"{"singer_state":{"bookmarks":{"orders":{"id":7}},"currently_syncing":"orders"}}"#,
        bookmarks(5),
    ))
    .await
    .unwrap();
    let lock = b.acquire_lock("s").await.unwrap();
    let before = raw_history(&table, "s");
    match b
        .clear_streams_locked(&["orders".to_string(), "payments".to_string()], &lock)
        .await
    {
        Err(Error::InvalidInput(m)) => {
            assert!(m.contains("\"payments\""), "{m}");
            assert!(m.contains("its streams are: orders, users"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(raw_history(&table, "s"), before, "nothing written");
    let written = b
        .clear_streams_locked(&["orders".to_string()], &lock)
        .await
        .unwrap();
    b.release(lock).await.unwrap();
    let stored = b.get("s").await.unwrap().expect("stored");
    assert_eq!(stored, written);
    assert_eq!(
        json(&stored.partial),
        json(r#"{"singer_state":{"bookmarks":{},"currently_syncing":null}}"#)
    );
    assert_eq!(
        json(&stored.completed),
        json(r#"{"singer_state":{"bookmarks":{"users":{"id":1}}}}"#)
    );
    assert_eq!(b.history("s", 1).await.unwrap()[0].op, "clear-stream");
}

/// With history=false nothing of the history exists and the writes are the original backend's;
/// opened later with the history on, the first write creates it, and reads before then work.
#[tokio::test]
async fn the_history_can_be_off_and_is_created_when_turned_on() {
    let table = TestTable::new("hist_off");
    let mut off = table.open_with(&[("history", "false")]).await;
    off.set(&State::completed("s", bookmarks(1))).await.unwrap();
    off.update(&State::partial("s", bookmarks(2)))
        .await
        .unwrap();
    let tables = |t: &TestTable| {
        t.target.must(&format!(
            "SELECT groupArray(name) FROM (SELECT name FROM system.tables WHERE database = '{SCHEMA}' \
             AND startsWith(name, '{}_history') ORDER BY name)",
            t.name
        ))
    };
    assert_eq!(tables(&table).trim(), "[]");
    assert!(matches!(
        off.history("s", 1).await,
        Err(Error::InvalidConfig(_))
    ));

    let mut on: Backend = table.open().await;
    assert!(on.get("s").await.unwrap().is_some());
    assert_eq!(tables(&table).trim(), "[]", "a read creates nothing");
    on.set(&State::completed("s", bookmarks(3))).await.unwrap();
    assert_eq!(
        tables(&table).trim(),
        format!("['{0}_history','{0}_history_to_state']", table.name)
    );
    assert_eq!(ops(&on.history("s", 10).await.unwrap()), ["set"]);
    assert_eq!(
        json(&on.get("s").await.unwrap().unwrap().completed),
        json(&bookmarks(3))
    );
    // A writer with the history off still writes the state table, unrecorded.
    off.set(&State::completed("s", bookmarks(4))).await.unwrap();
    assert_eq!(ops(&on.history("s", 10).await.unwrap()), ["set"]);
    assert_eq!(
        json(&on.get("s").await.unwrap().unwrap().completed),
        json(&bookmarks(4))
    );
}

/// `history_versions` keeps the newest N versions of each id, whichever way each was written:
/// a one-trip set, a guarded update, and the JSON inserts (set-all, a delete, a set and an
/// update too large for query parameters), whose ordinals are read first. Reads show the
/// newest N before any merge; ClickHouse drops the rest as parts merge.
#[tokio::test]
async fn a_count_per_id_keeps_only_the_newest_versions() {
    let table = TestTable::new("hist_count");
    let mut b = table.open_with(&[("history_versions", "3")]).await;
    // An id whose quote and backslash the ordinals' array parameter must escape.
    let odd = r"it's \ odd";
    let big = |orders: u64| {
        format!(
            r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{orders}}}}}}},"pad":"{}"}}"#,
            "x".repeat(70_000)
        )
    };
    let orders =
        |n: u64| format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{n}}}}}}}}}"#);
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    b.set_all(&[
        State::completed("s", bookmarks(2)),
        State::completed(odd, bookmarks(1)),
    ])
    .await
    .unwrap();
    b.update(&State::partial("s", orders(3))).await.unwrap();
    let third = b.history("s", 1).await.unwrap()[0].version;
    b.set(&State::completed("s", big(4))).await.unwrap();
    b.update(&State::partial("s", big(5))).await.unwrap();
    b.update(&State::partial("s", orders(6))).await.unwrap();
    for n in 2..=3 {
        b.set_all(&[State::completed(odd, bookmarks(n))])
            .await
            .unwrap();
    }
    b.delete(odd).await.unwrap();

    let kept = b.history("s", 100).await.unwrap();
    assert_eq!(ops(&kept), ["update", "update", "set"]);
    assert!(kept.iter().all(|e| e.version > third), "{kept:?}");
    assert_eq!(
        ops(&b.history(odd, 100).await.unwrap()),
        ["delete", "set-all", "set-all"]
    );
    // What ClickHouse keeps once the parts merge: the same three of each.
    table.target.must(&format!(
        "OPTIMIZE TABLE {SCHEMA}.{}_history FINAL",
        table.name
    ));
    assert_eq!(raw_history(&table, "s").len(), 3);
    assert_eq!(
        table
            .target
            .must(&format!(
                "SELECT count() FROM {SCHEMA}.{}_history",
                table.name
            ))
            .trim(),
        "6"
    );
    // A version past the count is gone; the state itself is the newest, untouched.
    let gone = b.get_at("s", Point::Version(third)).await.unwrap_err();
    assert!(gone.to_string().contains("no version"), "{gone}");
    let now = b.get("s").await.unwrap().expect("a state");
    assert_eq!(
        json(&now.partial)["singer_state"]["bookmarks"]["orders"]["id"],
        6
    );
}

/// The longest TTL `history_days` accepts still lies ahead: a version written now outlives
/// ClickHouse applying the TTL (a TTL past 2106 wraps into the past and drops every row). A
/// TTL set later reaches the table through `migrate`.
#[tokio::test]
async fn the_longest_ttl_keeps_what_is_written_now_and_migrate_changes_it() {
    let table = TestTable::new("hist_ttl");
    let longest = clickhouse_state::config::MAX_HISTORY_DAYS.to_string();
    let mut b = table.open_with(&[("history_days", &longest)]).await;
    b.set(&State::completed("s", bookmarks(1))).await.unwrap();
    let history = format!("{SCHEMA}.{}_history", table.name);
    table
        .target
        .must(&format!("OPTIMIZE TABLE {history} FINAL"));
    assert_eq!(raw_history(&table, "s").len(), 1);

    let mut week = table.open_with(&[("history_days", "7")]).await;
    week.migrate().await.unwrap();
    let created = table.target.must(&format!("SHOW CREATE TABLE {history}"));
    assert!(created.contains("toIntervalDay(7)"), "{created}");
    assert_eq!(
        raw_history(&table, "s").len(),
        1,
        "a version of today stays"
    );
}

/// The history's view runs its part of an insert as the inserting user, with the statement's
/// settings (docs/deployments.md, "The view and its definer"): `migrate` gives it no `SQL
/// SECURITY`, and a server that ignores an empty one (the default) stores none. On a server
/// that does not, the view is its definer's, which the docs say how to handle.
#[tokio::test]
async fn the_history_view_runs_as_the_inserting_user() {
    let table = TestTable::new("definer");
    let mut b = table.open().await;
    b.migrate().await.expect("migrate");
    let view = format!("{SCHEMA}.{}_history_to_state", table.name);
    let created = table.target.must(&format!("SHOW CREATE TABLE {view}"));
    let ignored = table
        .target
        .query(
            "SELECT value FROM system.server_settings \
             WHERE name = 'ignore_empty_sql_security_in_create_view_query'",
        )
        .map(|v| v.trim() != "0")
        .unwrap_or(true);
    if ignored {
        assert!(!created.contains("SQL SECURITY"), "{created}");
    } else {
        assert!(created.contains("SQL SECURITY DEFINER"), "{created}");
    }
}
