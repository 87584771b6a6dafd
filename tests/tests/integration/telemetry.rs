//! Traces and metrics, exported through OTLP/HTTP to a receiver on loopback written here: a
//! `set`, a merge under contention (a lock wait naming its holder, and the keeper's hand-off)
//! and a failed call (its retries), each with the attributes an operator joins on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::state_host::telemetry::{LOCK_WAIT_BUCKETS, STATEMENT_BUCKETS};

use integration_tests::otlp::{Receiver, attribute};
use integration_tests::state_host::http::proxy::Proxies;
use integration_tests::state_host::telemetry::{Protocol, Telemetry, TelemetryConfig};
use integration_tests::state_host::{Runtime, RuntimeOptions, State};
use integration_tests::{TestTable, json, runtime_options};
use serde_json::Value;

fn exporting_to(receiver: &Receiver) -> Arc<Telemetry> {
    let config = TelemetryConfig {
        endpoint: Some(receiver.endpoint()),
        traces: Some(Protocol::HttpJson),
        metrics: Some(Protocol::HttpJson),
        ..TelemetryConfig::default()
    };
    Telemetry::start(&config, Arc::new(Proxies::none())).expect("the exporter starts")
}

fn runtime_with(telemetry: Option<Arc<Telemetry>>) -> Runtime {
    Runtime::load(
        &integration_tests::state_host::default_component_path(),
        RuntimeOptions {
            telemetry,
            ..runtime_options()
        },
    )
    .expect("load")
}

fn bookmark(stream: &str, value: u64) -> State {
    State::partial(
        "dev:telemetry",
        format!(r#"{{"singer_state":{{"bookmarks":{{"{stream}":{value}}}}}}}"#),
    )
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["parentSpanId"] == parent["spanId"] && s["traceId"] == parent["traceId"])
        .collect()
}

/// The data points of a metric, whatever its kind.
fn points<'a>(metrics: &'a [Value], name: &str) -> Vec<&'a Value> {
    metrics
        .iter()
        .filter(|m| m["name"] == name)
        .flat_map(|m| {
            ["sum", "histogram", "gauge"]
                .iter()
                .filter_map(move |kind| m[*kind]["dataPoints"].as_array())
                .flatten()
        })
        .collect()
}

/// A counter's or a histogram's total over the points whose attribute `key` is `value`.
fn total(metrics: &[Value], name: &str, key: &str, value: &str) -> u64 {
    points(metrics, name)
        .into_iter()
        .filter(|p| attribute(p, key).as_deref() == Some(value))
        .map(|p| {
            let count = if p["count"].is_null() {
                &p["asInt"]
            } else {
                &p["count"]
            };
            match count {
                Value::String(s) => s.parse().unwrap_or(0),
                other => other.as_u64().unwrap_or(0),
            }
        })
        .sum()
}

async fn wants(table: &TestTable) -> u64 {
    let sql = format!(
        "SELECT count() FROM {}_lock_log WHERE event = 'want'",
        table.qualified()
    );
    table.target.must(&sql).trim().parse().expect("a count")
}

#[tokio::test]
async fn a_set_a_merge_under_contention_and_a_failed_call_reach_the_receiver() {
    let receiver = Receiver::start().await;
    let telemetry = exporting_to(&receiver);
    let runtime = runtime_with(Some(Arc::clone(&telemetry)));
    let table = TestTable::new("telemetry");
    let uri = table.target.uri();
    let lock_settings = table.with(&[
        ("lock_retry_seconds", "0.2"),
        ("lock_timeout_seconds", "60"),
        ("lock_linger_seconds", "30"),
    ]);

    // A set.
    let mut keeper = runtime
        .open(&uri, lock_settings.clone())
        .await
        .expect("open");
    keeper
        .set(&State::completed(
            "dev:telemetry-set",
            r#"{"singer_state":{}}"#,
        ))
        .await
        .expect("set");

    // A merge under contention: the keeper's update keeps the lock (the linger), the waiter's
    // update waits for it, says so in the lock log, and gets it at the keeper's next look.
    keeper.update(&bookmark("a", 1)).await.expect("update");
    let holder = keeper
        .lock_info("dev:telemetry")
        .await
        .expect("lock info")
        .expect("the keeper holds the lock");
    let mut waiter = runtime.open(&uri, lock_settings).await.expect("open");
    let waiting = tokio::spawn(async move {
        let merged = waiter.update(&bookmark("b", 2)).await;
        (waiter, merged)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while wants(&table).await == 0 {
        assert!(Instant::now() < deadline, "the waiter never said it waits");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(next) = keeper.idle().await.expect("idle") {
        assert!(
            Instant::now() < deadline,
            "the keeper never gave the lock back"
        );
        let now = keeper.clock().now_ms();
        tokio::time::sleep(Duration::from_millis(next.saturating_sub(now).max(10))).await;
    }
    let (mut waiter, merged) = waiting.await.expect("the waiter's task");
    merged.expect("the merge under contention");
    let state = waiter
        .get("dev:telemetry")
        .await
        .expect("get")
        .expect("a state");
    assert_eq!(
        json(&state.partial)["singer_state"]["bookmarks"],
        json(r#"{"a":1,"b":2}"#)
    );
    waiter.close().await.expect("close");
    keeper.close().await.expect("close");

    // A failed call: nothing listens at the port, and the call retries until its budget ends.
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let nowhere = format!("clickhouse://default:@127.0.0.1:{closed_port}/default");
    let failed_settings = table.with(&[
        ("retry_budget_seconds", "1"),
        ("retry_backoff_seconds", "0.1"),
    ]);
    let failure = match runtime.open(&nowhere, failed_settings).await {
        Ok(mut backend) => backend.get("dev:telemetry").await.map(|_| ()),
        Err(e) => Err(e),
    }
    .expect_err("nothing listens there");
    assert_eq!(failure.kind(), "unreachable", "{failure}");

    // The shutdown blocks until the receiver, a task of this runtime, has answered.
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .expect("shutdown");
    let spans = receiver.spans();
    let metrics = receiver.metrics();

    // The set: its span, and a child per statement with its kind, table, bytes and query id.
    let set = named(&spans, "set");
    assert_eq!(set.len(), 1, "{spans:#?}");
    let statements = children(&spans, set[0]);
    // The first write finds no tables (404), creates them and is sent again: the one that
    // landed is a 200, into the history (whose view fills the state table).
    let insert = statements
        .iter()
        .find(|s| {
            attribute(s, "db.operation.name").as_deref() == Some("INSERT")
                && attribute(s, "http.response.status_code").as_deref() == Some("200")
        })
        .unwrap_or_else(|| panic!("no INSERT landed under the set: {statements:#?}"));
    assert_eq!(insert["name"], "clickhouse INSERT");
    assert_eq!(
        attribute(insert, "db.collection.name"),
        Some(format!("{}_history", table.qualified())),
        "{insert:#}"
    );
    assert!(
        statements
            .iter()
            .any(|s| attribute(s, "db.operation.name").as_deref() == Some("CREATE")),
        "the tables' creation is part of the first set: {statements:#?}"
    );
    assert_eq!(
        attribute(insert, "db.system.name").as_deref(),
        Some("clickhouse")
    );
    // What it sent: the statement and its parameters in the query string, data in the body.
    let sent = |key: &str| -> u64 {
        attribute(insert, key)
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("no {key}: {insert:#}"))
    };
    assert!(
        sent("state_backend.statement.query_bytes") + sent("http.request.body.size") > 100,
        "the INSERT's bytes counted: {insert:#}"
    );
    // The query id joins the span to the server's own record of the statement: one per
    // statement. The local engine keeps no query log; a server that does has the id in it.
    let query_id = attribute(insert, "clickhouse.query_id").expect("a query id");
    let answered: Vec<String> = spans
        .iter()
        .filter(|s| attribute(s, "http.response.status_code").is_some())
        .map(|s| attribute(s, "clickhouse.query_id").expect("each answer's query id"))
        .collect();
    let distinct: std::collections::HashSet<&String> = answered.iter().collect();
    assert_eq!(distinct.len(), answered.len(), "{answered:?}");
    if table.target.must("EXISTS TABLE system.query_log").trim() == "1" {
        table.target.must("SYSTEM FLUSH LOGS");
        let logged = table.target.must(&format!(
            "SELECT count() FROM system.query_log WHERE query_id = '{}' AND type = 'QueryFinish'",
            query_id.replace('\'', "")
        ));
        assert_eq!(logged.trim(), "1", "query {query_id} in system.query_log");
    }

    // A body's bytes are counted as they go: the lock log's rows travel in the body.
    let appended = spans
        .iter()
        .filter(|s| {
            attribute(s, "db.collection.name") == Some(format!("{}_lock_log", table.qualified()))
                && attribute(s, "db.operation.name").as_deref() == Some("INSERT")
        })
        .map(|s| {
            attribute(s, "http.request.body.size")
                .and_then(|b| b.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .collect::<Vec<_>>();
    assert!(
        !appended.is_empty() && appended.iter().all(|&b| b > 20 && b < 4096),
        "{appended:?}"
    );

    // The merge: the waiter's update waited, naming the keeper's grant, and succeeded.
    let waits = named(&spans, "lock wait");
    assert!(!waits.is_empty(), "no lock wait: {spans:#?}");
    for wait in &waits {
        assert_eq!(
            attribute(wait, "state_backend.lock.holder"),
            Some(holder.owner.clone())
        );
        assert_eq!(
            attribute(wait, "state_backend.lock.token"),
            Some(holder.token.to_string())
        );
        assert_eq!(
            attribute(wait, "state_backend.state_id").as_deref(),
            Some("dev:telemetry")
        );
    }
    let waited_update = named(&spans, "update")
        .into_iter()
        .find(|u| children(&spans, u).iter().any(|c| c["name"] == "lock wait"))
        .expect("the lock waits are children of an update");
    assert!(
        attribute(waited_update, "error.type").is_none(),
        "{waited_update:#}"
    );
    // The keeper's hand-off is an event of its idle call.
    let handed_off = named(&spans, "idle").into_iter().any(|span| {
        span["events"]
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e["name"] == "lock handed off"))
    });
    assert!(handed_off, "no hand-off event: {spans:#?}");

    // The failed call: its error kind, and its retries as events.
    let failed: Vec<&Value> = spans
        .iter()
        .filter(|s| attribute(s, "error.type").as_deref() == Some("unreachable"))
        .collect();
    assert_eq!(failed.len(), 1, "{spans:#?}");
    let retries = failed[0]["events"].as_array().map_or(0, |events| {
        events.iter().filter(|e| e["name"] == "retry").count()
    });
    assert!(retries >= 1, "{:#}", failed[0]);
    let attempts = children(&spans, failed[0]);
    assert_eq!(
        attempts.len(),
        retries + 1,
        "a statement per try: {attempts:#?}"
    );
    assert!(
        attempts.iter().all(
            |s| s["status"]["code"] == 2 && attribute(s, "http.response.status_code").is_none()
        ),
        "each try failed without an answer: {attempts:#?}"
    );

    // The metrics; the histograms in seconds, with buckets that tell statements apart.
    let operation = "state_backend.operation";
    for (name, buckets) in [
        ("state_backend.statement.duration", &STATEMENT_BUCKETS[..]),
        ("state_backend.lock.wait.duration", &LOCK_WAIT_BUCKETS[..]),
    ] {
        for point in points(&metrics, name) {
            let bounds: Vec<f64> = point["explicitBounds"]
                .as_array()
                .map(|b| b.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            assert_eq!(bounds, buckets, "{name}: {point:#}");
        }
    }
    assert_eq!(total(&metrics, "state_backend.calls", operation, "set"), 1);
    assert!(
        total(
            &metrics,
            "state_backend.calls",
            "state_backend.outcome",
            "unreachable"
        ) >= 1
    );
    assert!(
        total(
            &metrics,
            "state_backend.statement.duration",
            "db.operation.name",
            "INSERT"
        ) >= 3
    );
    assert_eq!(
        total(
            &metrics,
            "state_backend.lock.wait.duration",
            operation,
            "update"
        ),
        waits.len() as u64
    );
    assert!(
        total(&metrics, "state_backend.retries", operation, "open")
            + total(&metrics, "state_backend.retries", operation, "get")
            >= retries as u64
    );
    assert!(total(&metrics, "state_backend.lock.handoffs", operation, "idle") >= 1);
}
