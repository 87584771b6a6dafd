//! Deployment kinds: what the backend detects at first use, and the DDL it sends.
//!
//! One server is the ClickHouse at `CLICKHOUSE_URL`. A replica of a self-managed cluster is the
//! local ClickHouse started with `tests/clickhouse/config/cluster-replica.xml`: the real engine
//! then lists a two-replica cluster and has a `replica` macro, as a cluster member does. It has
//! no Keeper, so what needs one (Replicated tables, ON CLUSTER DDL) is checked as far as the
//! engine takes it: parsed and refused for want of distributed DDL, never a syntax error.

use std::sync::{Arc, Mutex};

use crate::common::ORIGIN;
use clickhouse_state::config::Config;
use clickhouse_state::glob::Filter;
use clickhouse_state::http::Client;
use clickhouse_state::rows;
use clickhouse_state::sql::{Query, StateRow, Statements};
use integration_tests::state_host::http::faults::{Fault, FaultPlan};
use integration_tests::state_host::http::hook::Interceptor;
use integration_tests::state_host::{Error, InstanceOptions, State};
use integration_tests::{LocalServer, Target, TestTable, runtime};
use protocol::deployment::{Consistency, Kind};
use protocol::guard::Guard;
use protocol::role::Role;

use crate::common;
use common::Ureq;

fn replica_server() -> LocalServer {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clickhouse/config/cluster-replica.xml");
    LocalServer::start_with("default", "", &["--config", config.to_str().unwrap()])
}

fn target(server: &LocalServer) -> Target {
    Target {
        secure: false,
        host: "127.0.0.1".into(),
        port: server.port,
        user: server.user.clone(),
        password: server.password.clone(),
    }
}

fn settings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn plain_tables_on_a_replica_are_refused_naming_the_fix() {
    let server = replica_server();
    let ch = target(&server);
    let mut b = runtime()
        .open(&server.uri(), settings(&[("schema", "meltano")]))
        .await
        .unwrap();
    // First use creates the plain tables (as on one server), then sees a replica and refuses
    // before anything is written.
    match b.set(&State::completed("id", "{}")).await {
        Err(Error::InvalidConfig(m)) => {
            assert!(m.contains("'cluster' setting"), "{m}");
            assert!(m.contains("two_replicas"), "{m}");
            assert!(m.contains("state: ReplacingMergeTree"), "{m}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(ch.must("SELECT count() FROM meltano.state").trim(), "0");
    // A new instance refuses at once, for every operation, reads included.
    let mut b = runtime()
        .open(&server.uri(), settings(&[("schema", "meltano")]))
        .await
        .unwrap();
    assert!(matches!(b.get("id").await, Err(Error::InvalidConfig(_))));
    assert!(matches!(b.migrate().await, Err(Error::InvalidConfig(_))));
    assert_eq!(ch.must("SELECT count() FROM meltano.state").trim(), "0");
}

#[tokio::test]
async fn the_cluster_setting_sends_on_cluster_ddl_with_replicated_engines() {
    let server = replica_server();
    let ch = target(&server);
    let mut b = runtime()
        .open(
            &server.uri(),
            settings(&[("schema", "meltano_c"), ("cluster", "two_replicas")]),
        )
        .await
        .unwrap();
    // The first statement goes to the distributed DDL queue, which needs Keeper.
    match b.migrate().await {
        Err(Error::Server { name, .. }) => assert_eq!(name, "QUERY_IS_PROHIBITED"),
        other => panic!("expected the engine to refuse distributed DDL, got {other:?}"),
    }
    // Every statement of the cluster's schema gets as far: parsed, then refused for Keeper.
    let config = clickhouse_state::config::Config::parse(
        &server.uri(),
        &settings(&[("schema", "meltano_c"), ("cluster", "two_replicas")]),
    )
    .unwrap();
    for statement in clickhouse_state::sql::Statements::new(&config).migration() {
        match ch.query(&statement.sql) {
            // A view's SELECT is analysed before its DDL is queued, so here, where its tables
            // could not be created, it stops at them.
            Err((_, body)) if statement.sql.starts_with("CREATE MATERIALIZED VIEW") => assert!(
                body.contains("(UNKNOWN_DATABASE)") && body.contains("meltano_c"),
                "{}: {body}",
                statement.sql
            ),
            Err((_, body)) => assert!(
                body.contains("(QUERY_IS_PROHIBITED)") && body.contains("Replicated DDL"),
                "{}: {body}",
                statement.sql
            ),
            Ok(_) => panic!("{} ran without Keeper", statement.sql),
        }
    }
    // and nothing was created locally instead
    assert_eq!(
        ch.must("SELECT count() FROM system.databases WHERE name = 'meltano_c'")
            .trim(),
        "0"
    );
}

#[tokio::test]
async fn an_unknown_cluster_is_invalid_config() {
    let table = TestTable::new("nocluster");
    let mut b = table.open_with(&[("cluster", "no_such_cluster")]).await;
    match b.get("x").await {
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.contains("cluster 'no_such_cluster' is not defined"),
                "{m}"
            )
        }
        other => panic!("expected invalid-config, got {other:?}"),
    }
}

#[tokio::test]
async fn one_server_checks_its_tables_and_migrate_validates_them() {
    let table = TestTable::new("single");
    let mut b = table.open().await;
    b.set(&State::completed("id", r#"{"a":1}"#)).await.unwrap();
    b.migrate().await.expect("existing tables validate");
    assert!(b.get("id").await.unwrap().is_some());
}

/// The type of the lock log's `event` column, as the server has it.
fn event_type(table: &TestTable) -> String {
    table
        .target
        .must(&format!(
            "SELECT type FROM system.columns WHERE database = '{}' AND table = '{}_lock_log' \
             AND name = 'event'",
            integration_tests::SCHEMA,
            table.name
        ))
        .trim()
        // TabSeparated escapes the quotes.
        .replace("\\'", "'")
}

/// Creates the table's whole schema as an older version did: a lock log without the `want`
/// event (the key column's type can gain values, never lose them, so it is made old from the
/// start). Nothing else is missing, so nothing else sends the instance to `migrate`.
pub(crate) fn older_schema(table: &TestTable) -> String {
    let config = Config::parse(&table.target.uri(), &table.settings()).unwrap();
    let sql = Statements::new(&config);
    let older = "Enum8('acquire' = 1, 'renew' = 2, 'release' = 3, 'force' = 4)";
    let log = sql.create_lock_log_table().sql;
    assert!(log.contains(", 'want' = 5)"), "{log}");
    for statement in sql.migration() {
        let ddl = if statement.sql == log {
            log.replace(", 'want' = 5)", ")")
        } else {
            statement.sql
        };
        table.target.must(&ddl);
    }
    assert_eq!(event_type(table), older);
    older.to_string()
}

/// A lock log created by an older version, without the `want` event: `migrate` adds it.
#[tokio::test]
async fn migrate_gives_an_older_lock_log_the_want_event() {
    let table = TestTable::new("older_migrated");
    older_schema(&table);
    table.open().await.migrate().await.expect("migrate");
    assert!(
        event_type(&table).ends_with(", 'want' = 5)"),
        "{}",
        event_type(&table)
    );
}

/// And so does the first waiter whose `want` row the older log refuses, so that a keeper can
/// heed it without anyone running `migrate` (Meltano never does).
#[tokio::test]
async fn a_waiter_gives_an_older_lock_log_the_want_event() {
    let table = TestTable::new("older_waited");
    older_schema(&table);
    let mut holder = table.open().await;
    // An older log is read as before: `want` is no value of its `event`.
    holder
        .set(&State::completed("id", "{}"))
        .await
        .expect("set");
    let lock = holder.acquire_lock("id").await.expect("lock");
    assert!(holder.lock_info("id").await.expect("info").is_some());
    let mut waiter = table
        .open_with(&[("lock_timeout_seconds", "1"), ("lock_retry_seconds", "0.2")])
        .await;
    let waited = waiter.update(&State::partial("id", r#"{"a":1}"#)).await;
    assert!(matches!(waited, Err(Error::Locked(_))), "{waited:?}");
    assert!(
        event_type(&table).ends_with(", 'want' = 5)"),
        "{}",
        event_type(&table)
    );
    let wants = table.target.must(&format!(
        "SELECT count() FROM {}_lock_log WHERE event = 'want' AND generation = 0",
        table.qualified()
    ));
    assert_eq!(wants.trim(), "1", "the waiter's want landed, once");
    holder.release(lock).await.expect("release");
}

/// Refuses this instance's first lock-log insert, a `want`, with a permanent error that is not
/// the older log's.
#[derive(Default)]
struct RefuseFirstWant(std::sync::atomic::AtomicBool);

impl FaultPlan for RefuseFirstWant {
    fn fault(&self, _method: &http::Method, uri: &http::Uri) -> Option<Fault> {
        let query = uri.query().unwrap_or("");
        let insert = query.contains("INSERT") && query.contains("_lock_log");
        // Code 62, SYNTAX_ERROR: permanent, and not UNKNOWN_ELEMENT_OF_ENUM.
        (insert && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst))
            .then_some(Fault::Server(62))
    }
}

/// Only the older log's refusal gives it the `want` event: a `want` refused for another reason
/// is a hint lost (one try), not a cue to alter the log and send it again.
#[tokio::test]
async fn a_want_refused_for_another_reason_is_not_sent_again() {
    let table = TestTable::new("want_refused");
    let mut holder = table.open().await;
    holder.migrate().await.expect("migrate");
    let lock = holder.acquire_lock("id").await.expect("lock");
    let refuse = Arc::new(RefuseFirstWant::default());
    let options = InstanceOptions {
        faults: Some(refuse.clone()),
        ..InstanceOptions::default()
    };
    let settings = table.with(&[("lock_timeout_seconds", "1"), ("lock_retry_seconds", "0.2")]);
    let mut waiter = runtime()
        .open_with(&table.target.uri(), settings, options)
        .await
        .expect("open");
    let waited = waiter.acquire_lock("id").await;
    assert!(matches!(waited, Err(Error::Locked(_))), "{waited:?}");
    assert!(
        refuse.0.load(std::sync::atomic::Ordering::SeqCst),
        "the want was refused"
    );
    let wants = table.target.must(&format!(
        "SELECT count() FROM {}_lock_log WHERE event = 'want'",
        table.qualified()
    ));
    assert_eq!(wants.trim(), "0", "the refused want was not sent again");
    holder.release(lock).await.expect("release");
}

// -- the settings each deployment kind sends ------------------------------------------------

/// A row of another id than the one whose version the test checks.
fn state_row(n: u64) -> StateRow<'static> {
    StateRow {
        state_id: "g",
        partial: "{}",
        completed: "{}",
        version_ms: 1_700_000_000_000 + n,
    }
}

fn guard() -> Guard {
    Guard {
        state_id: "g".into(),
        generation: 1,
        owner: "o".into(),
        confirmed: false,
        previous_until: u64::MAX,
        expected_version: 0,
    }
}

/// Every statement the backend sends, with the settings of every kind, runs on the real engine:
/// a misspelt setting or value (an error there, UNKNOWN_SETTING or a bad value) fails here.
/// Settings for replication have no effect on one server, but they must be accepted.
#[test]
fn every_kind_sends_settings_the_engine_accepts() {
    let table = TestTable::new("kinds");
    let config = Config::parse(&table.target.uri(), &table.settings()).unwrap();
    let sql = Statements::new(&config);
    let client = Client::new(&config, Ureq);
    for statement in sql.migration() {
        client.execute(&statement).expect("schema");
    }
    // The newer pinned settings this server knows, as the deployment check finds them.
    let names: Vec<String> = table
        .target
        .must("SELECT name FROM system.settings")
        .lines()
        .map(str::to_string)
        .collect();
    let pinnable = protocol::pinned::known(&names);
    let row = |n: u64| -> Vec<u8> {
        format!(
            r#"{{"state_id":"s","partial_state":"{{}}","completed_state":"{{\"n\":{n}}}","updated_at":"{}.000"}}"#,
            1_700_000_000 + n
        )
        .into_bytes()
    };
    let log_row = br#"{"state_id":"s","generation":1,"event":"acquire","owner":"o","at_ms":1,"until_ms":2,"floor_ms":0}"#;
    for (n, kind) in [
        Kind::SingleServer,
        Kind::Cloud,
        Kind::Replicated,
        Kind::Missing,
        Kind::Unknown,
    ]
    .into_iter()
    .enumerate()
    {
        for deduplicate_insert in [false, true] {
            let consistency = Consistency {
                kind,
                deduplicate_insert,
                pinnable,
            };
            let n = (n as u64 + 1) * 10 + deduplicate_insert as u64;
            let token = format!("t{n}");
            let queries: Vec<Query> = vec![
                sql.insert_states(row(n), &token),
                sql.get("s").query,
                sql.version_of("s"),
                sql.log_insert(log_row.to_vec(), &token),
                sql.log_state("s").query,
                sql.log_claims("s", 1, true).query,
                sql.lock_insert(
                    br#"{"state_id":"s","lock_id":"l","locked_at":1}"#.to_vec(),
                    &token,
                ),
                sql.lock_candidates("s", 0).query,
                sql.lock_delete("s", "l"),
                sql.log_prune("s", 0),
                sql.live_versions().query,
                sql.state_ids(&Filter::Exact("s".into())).query,
                sql.log_outlook("s").query,
                sql.write_guarded(state_row(n), &ORIGIN, &guard(), &token),
                sql.guard_holds(&guard()),
                sql.set_unless_newer(state_row(n), &ORIGIN, &format!("{token}s")),
                sql.server_now(),
                sql.delete_states(&["gone"]),
                sql.history_withdraw("w", &[("gone".to_string(), 1)])
                    .expect("the history is on"),
                sql.deployment(&protocol::pinned::newer_names()).query,
            ];
            let roles: Vec<Role> = queries.iter().map(|q| q.role).collect();
            for role in [
                Role::Read,
                Role::Deciding,
                Role::Insert,
                Role::GuardedInsert,
                Role::Mutation,
            ] {
                assert!(
                    roles.contains(&role) || role == Role::Read,
                    "{role:?} is tried"
                );
            }
            for query in &queries {
                let settings = consistency.settings(query.role);
                if let Err(e) = client.execute_with(query, &settings) {
                    panic!("{consistency:?} {settings:?}: {}: {e}", query.sql);
                }
            }
            // and the insert landed, once, under its version
            let version = client.execute_with(&sql.version_of("s"), &[]).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&version).trim(),
                ((1_700_000_000 + n) * 1000).to_string()
            );
        }
    }
}

/// Records the URL of every request an instance sends.
#[derive(Default)]
struct Urls(Mutex<Vec<String>>);

impl Interceptor for Urls {
    fn before_send(&self, _method: &http::Method, uri: &http::Uri) -> Option<std::time::Duration> {
        let query = uri.query().unwrap_or("").to_string();
        self.0.lock().unwrap().push(query);
        None
    }
}

fn has(url: &str, setting: &str) -> bool {
    url.split('&').any(|pair| pair == setting)
}

#[tokio::test]
async fn one_server_gets_synchronous_deduplicated_inserts_and_consistent_deciding_reads() {
    let table = TestTable::new("one_settings");
    let urls = Arc::new(Urls::default());
    let options = InstanceOptions {
        interceptor: Some(urls.clone() as Arc<dyn Interceptor>),
        ..InstanceOptions::default()
    };
    let mut b = runtime()
        .open_with(&table.target.uri(), table.settings(), options)
        .await
        .unwrap();
    b.update(&State::completed("id", r#"{"a":1}"#))
        .await
        .unwrap();
    b.set(&State::completed("id", r#"{"a":2}"#)).await.unwrap();
    let urls = urls.0.lock().unwrap().clone();
    let inserts: Vec<&String> = urls.iter().filter(|u| u.contains("query=INSERT")).collect();
    // the claim, the state, the release, and the set's state
    assert!(inserts.len() >= 4, "{inserts:?}");
    for url in &inserts {
        assert!(has(url, "async_insert=0"), "{url}");
        assert!(has(url, "insert_deduplicate=1"), "{url}");
        // the engine here knows `deduplicate_insert`, so it is asked for too
        assert!(has(url, "deduplicate_insert=enable"), "{url}");
        assert!(url.contains("insert_deduplication_token="), "{url}");
        // one server has no quorum to wait for
        assert!(!url.contains("insert_quorum"), "{url}");
    }
    let deciding = urls
        .iter()
        .filter(|u| has(u, "select_sequential_consistency=1"))
        .count();
    // the update's log reads, the set's version read
    assert!(deciding >= 3, "{urls:?}");
    assert!(urls.iter().all(|u| !u.contains("insert_quorum")));
}

/// The guarded write's condition, as the server evaluates it (`guard_holds`, and the guarded
/// insert itself: does it write?), against the same rule in Rust (`fenced::admits`, which the
/// model runs) on the log and state the guest's own reads return: equal in every case, and
/// each case decides as it should.
#[test]
fn the_guard_in_sql_decides_as_the_guard_in_rust() {
    let table = TestTable::new("guard");
    let config = Config::parse(&table.target.uri(), &table.settings()).unwrap();
    let sql = Statements::new(&config);
    let client = Client::new(&config, Ureq);
    for statement in sql.migration() {
        client.execute(&statement).expect("schema");
    }
    let log = |id: &str, generation: u64, event: &str, owner: &str, until: u64| {
        let row = format!(
            r#"{{"state_id":"{id}","generation":{generation},"event":"{event}","owner":"{owner}","at_ms":1,"until_ms":{until},"floor_ms":0}}"#
        );
        client
            .execute(&sql.log_insert(
                row.into_bytes(),
                &format!("{id}/{generation}/{event}/{owner}/{until}"),
            ))
            .expect("log row");
    };
    let state = |id: &str, version_ms: u64| {
        let mut data = Vec::new();
        let row = StateRow {
            state_id: id,
            partial: "{}",
            completed: "{}",
            version_ms,
        };
        sql.encode_state(row, &ORIGIN, 0, &mut data).unwrap();
        client
            .execute(&sql.insert_states(data, &format!("{id}/{version_ms}")))
            .expect("state row");
    };
    let guard = |id: &str, confirmed: bool, previous_until: u64, expected_version: u64| Guard {
        state_id: id.into(),
        generation: 2,
        owner: "me".into(),
        confirmed,
        previous_until,
        expected_version,
    };
    // Every case: generation 1 (lease until 1000) was someone's; "me" claimed generation 2.
    // Versions are B + 500 (stored in every case but "none") and B + 600 (a later write).
    const B: u64 = 1_700_000_000_000;
    let mut cases: Vec<(&str, Guard, bool)> = Vec::new();
    for id in [
        "alone", "rival", "released", "forced", "newer", "renewed", "stale", "none",
    ] {
        log(id, 1, "acquire", "before", 1_000);
        log(id, 2, "acquire", "me", 9_000);
        if id != "none" {
            state(id, B + 500);
        }
    }
    cases.push(("alone", guard("alone", false, 1_000, B + 500), true));
    cases.push((
        "alone, confirmed",
        guard("alone", true, u64::MAX, B + 500),
        true,
    ));
    log("rival", 2, "acquire", "rival", 9_000);
    cases.push(("rival", guard("rival", false, 1_000, B + 500), false));
    cases.push((
        "rival, confirmed",
        guard("rival", true, u64::MAX, B + 500),
        true,
    ));
    log("released", 2, "release", "me", 0);
    cases.push((
        "released",
        guard("released", true, u64::MAX, B + 500),
        false,
    ));
    log("forced", 2, "force", "operator", 0);
    cases.push(("forced", guard("forced", true, u64::MAX, B + 500), false));
    log("newer", 3, "acquire", "next", 20_000);
    cases.push(("newer", guard("newer", true, u64::MAX, B + 500), false));
    log("renewed", 1, "renew", "before", 2_000);
    cases.push(("renewed", guard("renewed", false, 1_000, B + 500), false));
    cases.push((
        "renewed, confirmed",
        guard("renewed", true, u64::MAX, B + 500),
        true,
    ));
    state("stale", B + 600);
    cases.push(("stale", guard("stale", true, u64::MAX, B + 500), false));
    cases.push((
        "stale, fresh",
        guard("stale", true, u64::MAX, B + 600),
        true,
    ));
    // A generation nobody claimed: a renewal by "me" whose claim never landed. Unconfirmed,
    // there is no claim of "me" to write under (the SQL guard's `> 0` on its own claims).
    log("unclaimed", 1, "acquire", "before", 1_000);
    log("unclaimed", 2, "renew", "me", 9_000);
    state("unclaimed", B + 500);
    cases.push((
        "unclaimed",
        guard("unclaimed", false, 1_000, B + 500),
        false,
    ));
    cases.push(("none stored", guard("none", false, 1_000, 0), true));
    cases.push((
        "none stored, expected one",
        guard("none", false, 1_000, B + 500),
        false,
    ));
    for (name, guard, expected) in cases {
        let in_sql = rows::number(&client.execute(&sql.guard_holds(&guard)).unwrap()).unwrap();
        let newest = rows::first(
            &client
                .execute(&sql.log_state(&guard.state_id).query)
                .unwrap(),
        )
        .unwrap()
        .unwrap_or_default();
        let claims: Vec<protocol::rows::Claim> = rows::all(
            &client
                .execute(
                    &sql.log_claims(&guard.state_id, guard.generation, false)
                        .query,
                )
                .unwrap(),
        )
        .unwrap();
        let stored =
            rows::number(&client.execute(&sql.version_of(&guard.state_id)).unwrap()).unwrap();
        let in_rust = protocol::guard::admits(&guard, &newest, &claims, stored);
        assert_eq!(in_sql == 1, in_rust, "{name}: SQL and Rust disagree");
        assert_eq!(in_rust, expected, "{name}");
        // The insert, at the version it expects (so a write leaves the next case as it was).
        let row = StateRow {
            state_id: &guard.state_id,
            partial: "{}",
            completed: "{}",
            version_ms: guard.expected_version,
        };
        let write = sql.write_guarded(row, &ORIGIN, &guard, &format!("write/{name}"));
        let written = client
            .answer(&write, &[])
            .expect("guarded insert")
            .written_rows;
        // Each row lands in the history and, through its view, in the state table.
        assert_eq!(
            written,
            Some(u64::from(expected) * write.fanout),
            "{name}: the insert"
        );
    }
}

/// The statements that count on an aggregate over no rows (a `set` of a new id, a guarded
/// write and the outlook of an id never locked) still work where the server's settings say
/// otherwise (`empty_result_for_aggregation_by_empty_set`, `aggregate_functions_null_for_empty`,
/// which a profile may set): the statements pin both, after the defaults in the URL.
#[test]
fn statements_over_no_rows_do_not_depend_on_the_profile() {
    let table = TestTable::new("nothing");
    let config = Config::parse(&table.target.uri(), &table.settings()).unwrap();
    let sql = Statements::new(&config);
    let client = Client::new(&config, Ureq);
    for statement in sql.migration() {
        client.execute(&statement).expect("schema");
    }
    for profile in [
        [("empty_result_for_aggregation_by_empty_set", "1")],
        [("aggregate_functions_null_for_empty", "1")],
    ] {
        let id = format!("new/{}", profile[0].0);
        let row = StateRow {
            state_id: &id,
            partial: "{}",
            completed: "{\"n\":1}",
            version_ms: 1_700_000_000_000,
        };
        let set = sql.set_unless_newer(row, &ORIGIN, &format!("set/{id}"));
        let written = client.answer(&set, &profile).expect("set").written_rows;
        assert_eq!(
            written,
            Some(set.fanout),
            "{profile:?}: a set of a new id writes"
        );
        let stored = rows::number(&client.execute(&sql.version_of(&id)).unwrap()).unwrap();
        assert_eq!(
            stored, 1_700_000_000_000,
            "{profile:?}: at the caller's version"
        );
        let outlook = client
            .answer(&sql.log_outlook(&id).query, &profile)
            .expect("outlook")
            .body;
        let outlook: Option<protocol::rows::Outlook> = rows::first(&outlook).expect("decodes");
        assert_eq!(
            outlook.map(|o| o.newest.generation),
            Some(0),
            "{profile:?}: an id never locked reads as generation 0"
        );
    }
}
