//! Deployment kinds: what the backend detects at first use, and the DDL it sends.
//!
//! One server is the ClickHouse at `CLICKHOUSE_URL`. A replica of a self-managed cluster is the
//! local ClickHouse started with `tests/clickhouse/config/cluster-replica.xml`: the real engine
//! then lists a two-replica cluster and has a `replica` macro, as a cluster member does. It has
//! no Keeper, so what needs one (Replicated tables, ON CLUSTER DDL) is checked as far as the
//! engine takes it: parsed and refused for want of distributed DDL, never a syntax error.

use integration_tests::state_host::{Error, State};
use integration_tests::{LocalServer, Target, TestTable, runtime};

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
