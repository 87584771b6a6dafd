//! Who wrote: an identified instance's process (Meltano's run id and command, the host, the pid,
//! the versions) named by every history row it wrote, by the lock it holds and by the `locked`
//! error a contender gets; an unidentified one's named by none; and a read never failing for it.

use integration_tests::state_host::{Error, State, WriterInfo, this_process};
use integration_tests::{SCHEMA, TestTable};

fn bookmark(i: u32) -> State {
    State::partial(
        "s",
        format!(r#"{{"singer_state":{{"bookmarks":{{"orders":{{"id":{i}}}}}}}}}"#),
    )
}

fn run(run_id: &str) -> WriterInfo {
    this_process("run", run_id, "4.4.1")
}

#[tokio::test]
async fn an_identified_writer_is_named_by_its_history_rows_its_lock_and_a_contenders_error() {
    let table = TestTable::new("who_named");
    // Meltano's instance: it keeps the lock between a run's updates.
    let mut runner = table.open_with(&[("lock_linger_seconds", "60")]).await;
    let who = run("run-42");
    runner.identify(&who).await.expect("identify");
    runner.update(&bookmark(1)).await.expect("update");
    runner.update(&bookmark(2)).await.expect("update");

    // Another process, not identified: the CLI of an operator who looks.
    let mut other = table
        .open_with(&[("lock_timeout_seconds", "1"), ("lock_retry_seconds", "0.2")])
        .await;
    other.set(&State::completed("t", "{}")).await.expect("set");

    let history = other.history("s", 10).await.expect("history");
    assert_eq!(history.len(), 2, "{history:?}");
    for entry in &history {
        assert_eq!(entry.who.as_ref(), Some(&who), "{entry:?}");
    }
    // What the table holds: this process (the test's own), as its host told it.
    let row = table.target.must(&format!(
        "SELECT run_id, command, pid FROM {SCHEMA}.{}_writers FORMAT TSV",
        table.name
    ));
    assert_eq!(row.trim(), format!("run-42\trun\t{}", std::process::id()));
    // The unidentified instance's write names nobody.
    let theirs = other.history("t", 10).await.expect("history");
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].who, None, "{:?}", theirs[0]);

    let info = other
        .lock_info("s")
        .await
        .expect("lock_info")
        .expect("held");
    assert_eq!(info.who.as_deref(), Some(&who), "{info:?}");
    assert!(info.owner.starts_with(&history[0].writer), "{info:?}");

    let refused = other.update(&bookmark(3)).await;
    let Err(error @ Error::Locked(_)) = refused else {
        panic!("the contender was not refused: {refused:?}");
    };
    let Error::Locked(holder) = &error else {
        unreachable!()
    };
    assert_eq!(holder.who.as_deref(), Some(&who));
    let message = error.to_string();
    for part in [
        "run run-42".to_string(),
        format!("pid {}", who.pid),
        format!("host {}", who.host),
    ] {
        assert!(message.contains(&part), "{part:?} is not in {message}");
    }
    runner.close().await.expect("close");
}

#[tokio::test]
async fn an_instance_keeps_the_first_identity_it_was_given() {
    let table = TestTable::new("who_first");
    let mut b = table.open().await;
    let first = run("run-1");
    b.identify(&first).await.expect("identify");
    b.set(&State::completed("s", "{}")).await.expect("set");
    // Its rows name this instance: another identity now would rename what it wrote.
    b.identify(&run("run-2")).await.expect("identify");
    b.set(&State::completed("s", r#"{"a":1}"#))
        .await
        .expect("set");
    let lock = b.acquire_lock("s").await.expect("acquire_lock");
    let held = b.lock_details(&lock).await.expect("lock_details");
    b.release(lock).await.expect("release");
    let history = b.history("s", 10).await.expect("history");
    assert_eq!(history.len(), 2);
    for entry in &history {
        assert_eq!(entry.who.as_ref(), Some(&first), "{entry:?}");
    }
    // The host says what the store kept, not what it was told last.
    assert_eq!(held.who.as_deref(), Some(&first));
    // One row, written once (no FINAL: a second insert would show before a merge).
    let rows = table.target.must(&format!(
        "SELECT run_id FROM {SCHEMA}.{}_writers FORMAT TSV",
        table.name
    ));
    assert_eq!(rows.trim(), "run-1", "one row per instance");
}

#[tokio::test]
async fn a_writers_table_that_refuses_the_row_fails_no_write() {
    let table = TestTable::new("who_refused");
    let mut setup = table.open().await;
    setup.migrate().await.expect("migrate");
    // A table of that name the row cannot go into (an operator's, or one this user may not
    // insert into): the server refuses the row, every time.
    let name = &table.name;
    table
        .target
        .must(&format!("DROP TABLE {SCHEMA}.{name}_writers"));
    table.target.must(&format!(
        "CREATE TABLE {SCHEMA}.{name}_writers (x UInt8) ENGINE = MergeTree ORDER BY x"
    ));
    let mut b = table.open().await;
    b.identify(&run("run-9")).await.expect("identify");
    b.set(&State::completed("s", "{}"))
        .await
        .expect("the write goes on");
    b.update(&bookmark(1)).await.expect("and the next");
    let history = setup.history("s", 10).await.expect("history");
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|e| e.who.is_none()), "{history:?}");
}

#[tokio::test]
async fn who_wrote_missing_never_fails_a_read_and_the_next_write_brings_it_back() {
    let table = TestTable::new("who_gone");
    let mut b = table.open().await;
    let who = run("run-7");
    b.identify(&who).await.expect("identify");
    b.set(&State::completed("s", "{}")).await.expect("set");
    // An operator drops the table (or the schema predates it): reads go on, naming nobody.
    let name = &table.name;
    table
        .target
        .must(&format!("DROP TABLE {SCHEMA}.{name}_writers"));
    let mut reader = table.open().await;
    let history = reader.history("s", 10).await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].who, None);
    // A read that names nobody creates nothing.
    let exists = format!("EXISTS TABLE {SCHEMA}.{name}_writers FORMAT TSV");
    assert_eq!(table.target.must(&exists).trim(), "0");
    // A new identified instance's first write creates it again, before the write.
    let mut next = table.open().await;
    next.identify(&who).await.expect("identify");
    next.set(&State::completed("s", r#"{"a":1}"#))
        .await
        .expect("set");
    let history = reader.history("s", 10).await.expect("history");
    assert_eq!(history[0].who.as_ref(), Some(&who), "{:?}", history[0]);
}
