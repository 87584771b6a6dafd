//! Every operation of the contract, through the host into the guest and on to ClickHouse.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use integration_tests::state_host::{Error, State};
use integration_tests::{SCHEMA, Target, TestTable, json, runtime};

// -- the original backend's own suite --------------------------------------------------------

#[tokio::test]
async fn set_overwrites() {
    let table = TestTable::new("overwrite");
    let mut b = table.open().await;
    b.set(&State::completed("s1", r#"{"singer_state":{"v":1}}"#))
        .await
        .unwrap();
    b.set(&State::new(
        "s1",
        r#"{"p":1}"#,
        r#"{"singer_state":{"v":2}}"#,
    ))
    .await
    .unwrap();
    let got = b.get("s1").await.unwrap().expect("stored");
    assert_eq!(json(&got.completed), json(r#"{"singer_state":{"v":2}}"#));
    assert_eq!(json(&got.partial), json(r#"{"p":1}"#));
}

#[tokio::test]
async fn missing_id_gives_none() {
    let table = TestTable::new("missing");
    let mut b = table.open().await;
    assert_eq!(b.get("nope").await.unwrap(), None);
    b.set(&State::completed("other", "{}")).await.unwrap();
    assert_eq!(b.get("nope").await.unwrap(), None);
}

#[tokio::test]
async fn ids_and_pattern() {
    let table = TestTable::new("ids");
    let mut b = table.open().await;
    for id in ["dev:tap-a-to-t", "dev:tap-b-to-t", "prod:tap-a-to-t"] {
        b.set(&State::completed(id, r#"{"x":1}"#)).await.unwrap();
    }
    assert_eq!(
        b.state_ids(None).await.unwrap(),
        vec!["dev:tap-a-to-t", "dev:tap-b-to-t", "prod:tap-a-to-t"]
    );
    assert_eq!(
        b.state_ids(Some("dev:*")).await.unwrap(),
        vec!["dev:tap-a-to-t", "dev:tap-b-to-t"]
    );
    assert_eq!(
        b.state_ids(Some("*:tap-a-*")).await.unwrap(),
        vec!["dev:tap-a-to-t", "prod:tap-a-to-t"]
    );
    assert_eq!(
        b.state_ids(Some("prod:tap-a-to-t")).await.unwrap(),
        vec!["prod:tap-a-to-t"]
    );
    assert!(b.state_ids(Some("staging:*")).await.unwrap().is_empty());
}

#[tokio::test]
async fn delete_and_clear_all() {
    let table = TestTable::new("delete");
    let mut b = table.open().await;
    for id in ["a", "b", "c"] {
        b.set(&State::completed(id, "{}")).await.unwrap();
    }
    b.delete("b").await.unwrap();
    assert_eq!(b.get("b").await.unwrap(), None);
    assert_eq!(b.state_ids(None).await.unwrap(), vec!["a", "c"]);
    b.clear("c").await.unwrap();
    assert_eq!(b.state_ids(None).await.unwrap(), vec!["a"]);
    assert_eq!(b.clear_all().await.unwrap(), 1);
    assert!(b.state_ids(None).await.unwrap().is_empty());
    assert_eq!(b.clear_all().await.unwrap(), 0);
    // a deleted id can be written again, and is visible again
    b.set(&State::completed("b", r#"{"again":true}"#))
        .await
        .unwrap();
    assert_eq!(
        json(&b.get("b").await.unwrap().unwrap().completed),
        json(r#"{"again":true}"#)
    );
}

#[tokio::test]
async fn lock_round_trip_and_update() {
    let table = TestTable::new("lockrt");
    let mut b = table.open().await;
    let lock = b.acquire_lock("s").await.unwrap();
    assert_eq!(lock.state_id, "s");
    b.release(lock).await.unwrap();
    b.update(&State::partial("s", r#"{"singer_state":{"a":1}}"#))
        .await
        .unwrap();
    b.update(&State::partial("s", r#"{"singer_state":{"b":2}}"#))
        .await
        .unwrap();
    let got = b.get("s").await.unwrap().unwrap();
    assert_eq!(
        json(&got.partial),
        json(r#"{"singer_state":{"a":1,"b":2}}"#)
    );
    // The lock log (the table the default lock writes) holds every grant, and every grant of
    // this id was released: none is left open.
    let log = format!("{}_lock_log", table.qualified());
    let grants = table.target.must(&format!(
        "SELECT count() FROM {log} WHERE state_id = 's' AND event = 'acquire'"
    ));
    assert_eq!(
        grants.trim(),
        "3",
        "one grant per acquire_lock and per update"
    );
    let open = table.target.must(&format!(
        "SELECT count() FROM (SELECT generation FROM {log} WHERE state_id = 's' \
         GROUP BY generation HAVING countIf(event = 'release') = 0)"
    ));
    assert_eq!(open.trim(), "0", "a grant was never released");
    assert_eq!(b.lock_info("s").await.unwrap(), None);
}

#[tokio::test]
async fn held_lock_makes_others_wait_then_time_out_naming_the_holder() {
    let table = TestTable::new("held");
    let mut holder = table.open().await;
    let mut other = table
        .open_with(&[
            ("lock_timeout_seconds", "1.5"),
            ("lock_retry_seconds", "0.2"),
        ])
        .await;
    let lock = holder.acquire_lock("s").await.unwrap();
    match other.acquire_lock("s").await {
        Err(Error::Locked(info)) => {
            assert_eq!(info.state_id, "s");
            assert!(!info.owner.is_empty());
            assert!(info.expires_at_ms > info.acquired_at_ms);
        }
        other => panic!("expected locked, got {other:?}"),
    }
    // an update needs the lock too, and fails the same way without writing
    assert!(matches!(
        other.update(&State::partial("s", r#"{"a":1}"#)).await,
        Err(Error::Locked(_))
    ));
    assert_eq!(other.get("s").await.unwrap(), None);
    holder.release(lock).await.unwrap();
    let lock = other.acquire_lock("s").await.unwrap();
    other.release(lock).await.unwrap();
}

#[tokio::test]
async fn stale_lock_is_reclaimed() {
    // The original's case, on the original's table (settle mode).
    let table = TestTable::new("stale");
    let mut b = table
        .open_with(&[("lock_timeout_seconds", "5"), ("lock_mode", "settle")])
        .await;
    b.migrate().await.unwrap();
    // A holder that died 400 s ago (lease: 300 s).
    table.target.must(&format!(
        "INSERT INTO {}_lock (state_id, lock_id, locked_at) VALUES ('s', '00000000-dead', now() - 400)",
        table.qualified()
    ));
    let lock = b
        .acquire_lock("s")
        .await
        .expect("the stale lock is reclaimed");
    b.release(lock).await.unwrap();
}

#[tokio::test]
async fn five_contenders_never_overlap() {
    let table = TestTable::new("contend");
    table.open().await.migrate().await.unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let table = Arc::clone(&table);
        let (inside, violations, entries) = (inside.clone(), violations.clone(), entries.clone());
        tasks.push(tokio::spawn(async move {
            let mut b = table
                .open_with(&[
                    ("lock_timeout_seconds", "120"),
                    ("lock_retry_seconds", "0.2"),
                ])
                .await;
            for _ in 0..2 {
                let lock = b.acquire_lock("shared").await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                entries.fetch_add(1, Ordering::SeqCst);
                // the critical section does real work: a read-modify-write of the state
                let current = b.get("shared").await.unwrap();
                let n = current.map_or(0, |s| json(&s.completed)["n"].as_u64().unwrap_or(0));
                b.set(&State::completed("shared", format!(r#"{{"n":{}}}"#, n + 1)))
                    .await
                    .unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                b.release(lock).await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 10);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    // no increment was lost, which overlapping holders would have caused
    let mut b = table.open().await;
    assert_eq!(
        json(&b.get("shared").await.unwrap().unwrap().completed)["n"],
        10
    );
}

// -- update semantics --------------------------------------------------------------------------

#[tokio::test]
async fn update_merges_nested_objects_and_replaces_arrays() {
    let table = TestTable::new("merge");
    let mut b = table.open_with(&[("lock_retry_seconds", "0.1")]).await;
    b.set(&State::new(
        "s",
        r#"{"singer_state":{"bookmarks":{"a":{"ts":1,"ids":[1,2]},"b":{"ts":1}}}}"#,
        r#"{"singer_state":{"bookmarks":{"z":{"ts":0}}}}"#,
    ))
    .await
    .unwrap();
    b.update(&State::partial(
        "s",
        r#"{"singer_state":{"bookmarks":{"a":{"ts":2,"ids":[3]},"c":{"ts":9}}}}"#,
    ))
    .await
    .unwrap();
    let got = b.get("s").await.unwrap().unwrap();
    assert_eq!(
        json(&got.partial),
        json(
            r#"{"singer_state":{"bookmarks":{"a":{"ts":2,"ids":[3]},"b":{"ts":1},"c":{"ts":9}}}}"#
        )
    );
    // the stored completed state is kept by a partial update
    assert_eq!(
        json(&got.completed),
        json(r#"{"singer_state":{"bookmarks":{"z":{"ts":0}}}}"#)
    );
}

#[tokio::test]
async fn complete_update_resets_the_partial() {
    let table = TestTable::new("complete");
    let mut b = table.open().await;
    b.update(&State::partial("s", r#"{"a":1}"#)).await.unwrap();
    b.update(&State::new(
        "s",
        r#"{"ignored":true}"#,
        r#"{"singer_state":{"done":1}}"#,
    ))
    .await
    .unwrap();
    let got = b.get("s").await.unwrap().unwrap();
    assert_eq!(json(&got.partial), json("{}"));
    assert_eq!(json(&got.completed), json(r#"{"singer_state":{"done":1}}"#));
}

#[tokio::test]
async fn partial_update_of_a_new_id_stores_it() {
    let table = TestTable::new("newpartial");
    let mut b = table.open().await;
    b.update(&State::partial("fresh", r#"{"a":{"b":1}}"#))
        .await
        .unwrap();
    let got = b.get("fresh").await.unwrap().unwrap();
    assert_eq!(
        (json(&got.partial), json(&got.completed)),
        (json(r#"{"a":{"b":1}}"#), json("{}"))
    );
}

#[tokio::test]
async fn update_where_meltano_would_crash_replaces_the_scalar() {
    let table = TestTable::new("crash");
    let mut b = table.open().await;
    b.update(&State::partial("s", r#"{"a":5}"#)).await.unwrap();
    b.update(&State::partial("s", r#"{"a":{"b":1}}"#))
        .await
        .unwrap();
    assert_eq!(
        json(&b.get("s").await.unwrap().unwrap().partial),
        json(r#"{"a":{"b":1}}"#)
    );
}

#[tokio::test]
async fn a_write_with_a_clock_behind_still_wins() {
    // Versions are computed by the client and never go backwards for a state id: a state set
    // "in the future" (another writer's clock ahead) is still overwritten by the next write.
    let table = TestTable::new("skew");
    let mut b = table.open().await;
    b.set(&State::completed("s", r#"{"v":1}"#)).await.unwrap();
    table.target.must(&format!(
        "INSERT INTO {} (state_id, partial_state, completed_state, updated_at) VALUES ('s', '{{}}', '{{\"v\":\"future\"}}', now64(3) + 3600)",
        table.qualified()
    ));
    assert_eq!(
        json(&b.get("s").await.unwrap().unwrap().completed),
        json(r#"{"v":"future"}"#)
    );
    b.set(&State::completed("s", r#"{"v":2}"#)).await.unwrap();
    assert_eq!(
        json(&b.get("s").await.unwrap().unwrap().completed),
        json(r#"{"v":2}"#)
    );
    b.update(&State::completed("s", r#"{"v":3}"#))
        .await
        .unwrap();
    assert_eq!(
        json(&b.get("s").await.unwrap().unwrap().completed),
        json(r#"{"v":3}"#)
    );
}

#[tokio::test]
async fn identical_writes_are_each_stored() {
    // Each logical write is its own row, so insert deduplication can never drop one.
    let table = TestTable::new("identical");
    let mut b = table.open().await;
    for _ in 0..3 {
        b.set(&State::completed("s", r#"{"same":1}"#))
            .await
            .unwrap();
    }
    assert_eq!(table.raw_rows(), 3);
    let versions = table.target.must(&format!(
        "SELECT count(DISTINCT updated_at) FROM {} WHERE state_id = 's'",
        table.qualified()
    ));
    assert_eq!(versions.trim(), "3");
}

// -- patterns --------------------------------------------------------------------------------

#[tokio::test]
async fn patterns_treat_special_characters_literally() {
    let table = TestTable::new("patterns");
    let mut b = table.open().await;
    let ids = [
        "tap_github",
        "tapXgithub",
        "100%",
        "1000",
        "back\\slash",
        "backXslash",
        "[br]",
        "b",
        "star*",
        "starX",
        "q?",
        "qX",
        "it's",
        "say \"hi\"",
        "with space",
        "ünï✓",
        "ünïX",
        "line\nbreak",
    ];
    let states: Vec<State> = ids.iter().map(|id| State::completed(*id, "{}")).collect();
    assert_eq!(b.set_all(&states).await.unwrap(), ids.len() as u64);
    let cases: &[(&str, &[&str])] = &[
        ("tap_*", &["tap_github"]),
        ("100%", &["100%"]),
        ("10*", &["100%", "1000"]),
        ("back\\*", &["back\\slash"]),
        ("[[]br]", &["[br]"]),
        ("star[*]", &["star*"]),
        ("q[?]", &["q?"]),
        ("it's", &["it's"]),
        ("say \"*", &["say \"hi\""]),
        ("with space", &["with space"]),
        ("ünï?", &["ünïX", "ünï✓"]),
        ("ünï[!X]", &["ünï✓"]),
        ("line?break", &["line\nbreak"]),
        (
            "*a*",
            &[
                "back\\slash",
                "backXslash",
                "line\nbreak",
                "say \"hi\"",
                "starX",
                "star*",
                "with space",
                "tap_github",
                "tapXgithub",
            ],
        ),
        ("[!a-z]*", &["100%", "1000", "[br]", "ünï✓", "ünïX"]),
    ];
    for (pattern, expected) in cases {
        let got: BTreeSet<String> = b
            .state_ids(Some(pattern))
            .await
            .unwrap()
            .into_iter()
            .collect();
        let want: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "pattern {pattern:?}");
        let all: BTreeSet<String> = b
            .get_all(Some(pattern))
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.state_id)
            .collect();
        assert_eq!(all, want, "get-all pattern {pattern:?}");
    }
}

#[tokio::test]
async fn unbalanced_bracket_is_invalid_input() {
    let table = TestTable::new("bracket");
    let mut b = table.open().await;
    assert!(
        matches!(b.state_ids(Some("tap-[abc")).await, Err(Error::InvalidInput(m)) if m.contains("unbalanced"))
    );
}

// -- bulk ------------------------------------------------------------------------------------

#[tokio::test]
async fn get_all_and_set_all_counts() {
    let table = TestTable::new("bulk");
    let mut b = table.open().await;
    let states: Vec<State> = (0..250)
        .map(|i| {
            State::new(
                format!("dev:s{i:03}"),
                format!(r#"{{"p":{i}}}"#),
                format!(r#"{{"c":{i}}}"#),
            )
        })
        .collect();
    assert_eq!(b.set_all(&states).await.unwrap(), 250);
    assert_eq!(table.raw_rows(), 250); // one insert of 250 rows
    let all = b.get_all(None).await.unwrap();
    assert_eq!(all.len(), 250);
    assert_eq!(json(&all[7].partial), json(r#"{"p":7}"#));
    assert_eq!(json(&all[7].completed), json(r#"{"c":7}"#));
    assert_eq!(b.get_all(Some("dev:s1*")).await.unwrap().len(), 100);
    // a repeated id is written once, the last one wins
    let dup = vec![
        State::completed("d", r#"{"v":1}"#),
        State::completed("d", r#"{"v":2}"#),
    ];
    assert_eq!(b.set_all(&dup).await.unwrap(), 1);
    assert_eq!(
        json(&b.get("d").await.unwrap().unwrap().completed),
        json(r#"{"v":2}"#)
    );
    assert_eq!(b.set_all(&[]).await.unwrap(), 0);
    assert_eq!(b.clear_all().await.unwrap(), 251);
}

// -- compatibility with the Python backend ---------------------------------------------------

#[tokio::test]
async fn table_created_with_the_original_ddl_works() {
    let table = TestTable::new("orig");
    let target = &table.target;
    target.must(&format!("CREATE DATABASE IF NOT EXISTS {SCHEMA}"));
    target.must(&format!(
        "CREATE TABLE {} (state_id String, partial_state Nullable(String), completed_state Nullable(String), \
         updated_at DateTime64(3) DEFAULT now64(3)) ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id",
        table.qualified()
    ));
    // as the Python backend writes: server-side updated_at, a NULL part
    target.must(&format!(
        "INSERT INTO {} (state_id, partial_state, completed_state) VALUES ('py', NULL, '{{\"singer_state\":{{\"x\":1}}}}')",
        table.qualified()
    ));
    let mut b = table.open().await;
    let got = b.get("py").await.unwrap().unwrap();
    assert_eq!(json(&got.partial), json("{}"));
    assert_eq!(json(&got.completed), json(r#"{"singer_state":{"x":1}}"#));
    b.update(&State::partial("py", r#"{"singer_state":{"y":2}}"#))
        .await
        .unwrap();
    let got = b.get("py").await.unwrap().unwrap();
    assert_eq!(json(&got.partial), json(r#"{"singer_state":{"y":2}}"#));
    // and what we write, the Python backend's query reads
    let row = target.must(&format!(
        "SELECT partial_state, completed_state FROM {} FINAL WHERE state_id = 'py' FORMAT JSONEachRow",
        table.qualified()
    ));
    let row = json(&row);
    assert_eq!(
        json(row["partial_state"].as_str().unwrap()),
        json(r#"{"singer_state":{"y":2}}"#)
    );
}

#[tokio::test]
async fn schema_is_created_on_first_use() {
    let table = TestTable::new("firstuse");
    let mut b = table.open().await;
    assert_eq!(b.get("x").await.unwrap(), None);
    let ddl = table
        .target
        .must(&format!("SHOW CREATE TABLE {}", table.qualified()));
    assert!(ddl.contains("ReplacingMergeTree(updated_at)"), "{ddl}");
    assert!(ddl.contains("ORDER BY state_id"), "{ddl}");
}

// -- configuration and connection errors ----------------------------------------------------

#[tokio::test]
async fn secure_defaults_to_port_8443() {
    let uri = "clickhouse://default:@127.0.0.1/default?secure=true";
    let no_retries = vec![("retry_budget_seconds".into(), "0".into())];
    let mut b = runtime()
        .open(uri, no_retries)
        .await
        .expect("opens without I/O");
    match b.get("x").await {
        Err(Error::Unreachable(m)) => assert!(m.contains("https://127.0.0.1:8443"), "{m}"),
        other => panic!("expected unreachable, got {other:?}"),
    }
}

#[tokio::test]
async fn invalid_configuration_names_the_problem() {
    let target = Target::from_env();
    for (uri, settings, needle) in [
        (
            "clickhouse://127.0.0.1:8123/default",
            vec![],
            "missing user",
        ),
        (
            "clickhouse://default@127.0.0.1:8123",
            vec![],
            "missing database",
        ),
        (
            "clickhouse://default@127.0.0.1:8123/default",
            vec![("port", "http")],
            "invalid port",
        ),
        (
            "mysql://default@127.0.0.1:8123/default",
            vec![],
            "unknown URI scheme 'mysql'",
        ),
        (
            "clickhouse://default@127.0.0.1:8123/default",
            vec![("table", "x`; DROP")],
            "table name",
        ),
    ] {
        let settings = settings
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match runtime().open(uri, settings).await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{m}"),
            Err(other) => panic!("{uri}: expected invalid-config, got {other:?}"),
            Ok(_) => panic!("{uri}: expected invalid-config, got a backend"),
        }
    }
    drop(target);
}

#[tokio::test]
async fn wrong_password_is_unauthorized_and_never_shown() {
    let table = TestTable::new("wrongpw");
    let secret = "wr0ng-Pa55word-7f3a";
    let mut b = runtime()
        .open(&table.target.uri_with_password(secret), table.settings())
        .await
        .expect("opens without I/O");
    let err = b.get("x").await.expect_err("wrong password");
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, Error::Unauthorized(_)), "{shown}");
    assert!(!shown.contains(secret), "{shown}");
}

#[tokio::test]
async fn closed_port_is_unreachable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let uri = format!("clickhouse://default:@127.0.0.1:{port}/default");
    let budget = vec![("retry_budget_seconds".into(), "1".into())];
    let mut b = runtime().open(&uri, budget).await.unwrap();
    let started = std::time::Instant::now();
    match b.state_ids(None).await {
        Err(Error::Unreachable(m)) => {
            // The endpoint, how long it was tried, and the setting that bounds it.
            assert!(m.contains(&format!("127.0.0.1:{port}")), "{m}");
            assert!(m.contains("times over"), "{m}");
            assert!(m.contains("retry_budget_seconds"), "{m}");
        }
        other => panic!("expected unreachable, got {other:?}"),
    }
    // The tries stop when the next pause would pass the budget: before it, never long after.
    let tried = started.elapsed();
    assert!(
        tried < std::time::Duration::from_secs(10),
        "tried for {tried:?} under a budget of 1 s"
    );
}

#[tokio::test]
async fn a_denied_destination_gets_a_clear_error() {
    use integration_tests::state_host::http::policy::{Authority, EgressPolicy};
    let table = TestTable::new("denied");
    // The policy allows some other endpoint, not the configured ClickHouse.
    let policy = EgressPolicy::allow_only(vec![Authority::new("http", "127.0.0.1", 1)]);
    let mut b = runtime()
        .open_with_policy(&table.target.uri(), table.settings(), policy, "denied")
        .await
        .unwrap();
    match b.get("x").await {
        Err(Error::Unreachable(m)) => assert!(m.contains("denied"), "{m}"),
        other => panic!("expected a denial, got {other:?}"),
    }
}

// -- bad input -------------------------------------------------------------------------------

#[tokio::test]
async fn bad_json_is_invalid_input_and_writes_nothing() {
    let table = TestTable::new("badjson");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    let bad = [
        ("{", "{}"),
        ("{}", "not json"),
        ("[]", "{}"),
        ("{}", "1"),
        ("{}", "\"text\""),
        ("null", "{}"),
        ("", "{}"),
    ];
    for (partial, completed) in bad {
        let state = State::new("s", partial, completed);
        assert!(
            matches!(b.set(&state).await, Err(Error::InvalidInput(_))),
            "set {partial} {completed}"
        );
        assert!(
            matches!(b.update(&state).await, Err(Error::InvalidInput(_))),
            "update {partial} {completed}"
        );
        assert!(matches!(
            b.set_all(&[State::completed("ok", "{}"), state.clone()])
                .await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert_eq!(table.raw_rows(), 0);
    // No lock was taken for input that was refused: neither lock table has a row.
    for lock_table in ["_lock_log", "_lock"] {
        let rows = table.target.must(&format!(
            "SELECT count() FROM {}{lock_table}",
            table.qualified()
        ));
        assert_eq!(rows.trim(), "0", "{lock_table}");
    }
}

#[tokio::test]
async fn empty_state_id_is_invalid_input() {
    let table = TestTable::new("emptyid");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    assert!(matches!(b.get("").await, Err(Error::InvalidInput(_))));
    assert!(matches!(
        b.set(&State::completed("", "{}")).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        b.update(&State::completed("", "{}")).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(b.delete("").await, Err(Error::InvalidInput(_))));
    assert!(matches!(
        b.acquire_lock("").await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(table.raw_rows(), 0);
}

#[tokio::test]
async fn odd_state_ids_round_trip() {
    let table = TestTable::new("oddids");
    let mut b = table.open().await;
    let ids = [
        "it's",
        "a\"b",
        "back\\slash",
        "100%_*?[x]",
        "tab\there",
        "new\nline",
        "ü ✓ 雪",
        "\\N",
        "`tick`",
    ];
    for (i, id) in ids.iter().enumerate() {
        b.set(&State::completed(*id, format!(r#"{{"i":{i}}}"#)))
            .await
            .unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let got = b
            .get(id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id:?} missing"));
        assert_eq!(got.state_id, *id);
        assert_eq!(json(&got.completed)["i"], i);
    }
    let mut listed = b.state_ids(None).await.unwrap();
    listed.sort();
    let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(listed, want);
}
