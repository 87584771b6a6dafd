//! https end to end: a TLS proxy with certificates made at test time sits in front of the
//! ClickHouse under test, and the component reaches it through the host's sender.

use integration_tests::state_host::http::tls::TlsOptions;
use integration_tests::state_host::{
    Error, Runtime, RuntimeOptions, State, default_component_path,
};
use integration_tests::tls::{Pki, TlsProxy};
use integration_tests::{SCHEMA, Target, TestTable, json};

fn runtime_with(tls: TlsOptions) -> Runtime {
    Runtime::load(
        &default_component_path(),
        RuntimeOptions {
            tls,
            ..integration_tests::runtime_options()
        },
    )
    .expect("component loads")
}

fn trusting(pki: &Pki) -> TlsOptions {
    TlsOptions {
        ca_bundle: Some(pki.ca_path()),
        ..TlsOptions::default()
    }
}

fn settings(table: &TestTable) -> Vec<(String, String)> {
    vec![
        ("schema".into(), SCHEMA.into()),
        ("table".into(), table.name.clone()),
    ]
}

async fn unreachable_message(runtime: &Runtime, uri: &str, table: &TestTable) -> String {
    let mut backend = runtime.open(uri, settings(table)).await.expect("opens");
    match backend.get("x").await {
        Err(Error::Unreachable(m)) => m,
        other => panic!("expected unreachable, got {other:?}"),
    }
}

#[tokio::test]
async fn success_with_the_private_ca_configured() {
    let pki = Pki::new("ok");
    let server = pki.server("server", &["localhost", "127.0.0.1"], false);
    let table = TestTable::new("tls_ok");
    let proxy = TlsProxy::start(pki.server_config(&server, false), table.target.clone()).await;
    let runtime = runtime_with(trusting(&pki));
    for host in ["localhost", "127.0.0.1"] {
        let mut b = runtime
            .open(
                &table.target.secure_uri(host, proxy.port()),
                settings(&table),
            )
            .await
            .expect("opens");
        b.set(&State::completed(host, r#"{"over":"tls"}"#))
            .await
            .expect("set over https");
        let got = b.get(host).await.expect("get over https").expect("stored");
        assert_eq!(json(&got.completed), json(r#"{"over":"tls"}"#));
    }
    assert_eq!(table.raw_rows(), 2);
}

/// The error a guest gets from a TLS proxy presenting a certificate for `names` (expired or
/// not), when the host trusts the proxy's CA or not, over https or plain http. Also returns
/// the proxy's port.
async fn failure_against(
    label: &str,
    names: &[&str],
    expired: bool,
    trust_ca: bool,
    https: bool,
) -> (String, u16) {
    let pki = Pki::new(label);
    let server = pki.server("server", names, expired);
    let table = TestTable::new(&format!("tls_{label}"));
    let proxy = TlsProxy::start(pki.server_config(&server, false), table.target.clone()).await;
    let runtime = runtime_with(if trust_ca {
        trusting(&pki)
    } else {
        TlsOptions::default()
    });
    let mut uri = table.target.secure_uri("localhost", proxy.port());
    if !https {
        uri = uri.replace("?secure=true", "");
    }
    (
        unreachable_message(&runtime, &uri, &table).await,
        proxy.port(),
    )
}

#[tokio::test]
async fn an_unknown_ca_is_a_clear_certificate_error() {
    let (message, port) = failure_against("noca", &["localhost"], false, false, true).await;
    assert!(
        message.contains("certificate was rejected") && message.contains("UnknownIssuer"),
        "{message}"
    );
    assert!(
        message.contains(&format!("https://localhost:{port}")),
        "{message}"
    );
}

#[tokio::test]
async fn a_wrong_hostname_is_rejected() {
    let (message, _) =
        failure_against("name", &["clickhouse.internal.example"], false, true, true).await;
    assert!(message.contains("NotValidForName"), "{message}");
}

#[tokio::test]
async fn an_expired_certificate_is_rejected() {
    let (message, _) = failure_against("expired", &["localhost"], true, true, true).await;
    assert!(message.contains("Expired"), "{message}");
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_a_clear_error() {
    let (message, _) = failure_against("plain", &["localhost"], false, true, false).await;
    assert!(message.contains("needs secure=true"), "{message}");
}

#[tokio::test]
async fn https_to_a_plain_http_port_is_a_clear_error() {
    let target = Target::from_env();
    if target.secure {
        return; // the server under test speaks TLS itself; nothing plain to point at
    }
    let table = TestTable::new("tls_toplain");
    let runtime = runtime_with(TlsOptions::default());
    let uri = target.secure_uri(&target.host, target.port);
    let message = unreachable_message(&runtime, &uri, &table).await;
    assert!(message.contains("did not answer with TLS"), "{message}");
}

#[tokio::test]
async fn mutual_tls_with_and_without_a_client_certificate() {
    let pki = Pki::new("mtls");
    let server = pki.server("server", &["localhost"], false);
    let client = pki.client("meltano-runner");
    let table = TestTable::new("tls_mtls");
    let proxy = TlsProxy::start(pki.server_config(&server, true), table.target.clone()).await;
    let uri = table.target.secure_uri("localhost", proxy.port());

    let with_identity = runtime_with(TlsOptions {
        ca_bundle: Some(pki.ca_path()),
        client_cert: Some(client.cert_path.clone()),
        client_key: Some(client.key_path.clone()),
    });
    let mut b = with_identity
        .open(&uri, settings(&table))
        .await
        .expect("opens");
    b.set(&State::completed("m", r#"{"mtls":true}"#))
        .await
        .expect("set with a client certificate");
    assert!(b.get("m").await.expect("get").is_some());

    let without_identity = runtime_with(trusting(&pki));
    let message = unreachable_message(&without_identity, &uri, &table).await;
    assert!(message.contains("TLS"), "{message}");
}

#[tokio::test]
async fn the_egress_policy_applies_to_https_too() {
    use integration_tests::state_host::http::policy::{Authority, EgressPolicy};
    let pki = Pki::new("egress");
    let server = pki.server("server", &["localhost"], false);
    let table = TestTable::new("tls_egress");
    let proxy = TlsProxy::start(pki.server_config(&server, false), table.target.clone()).await;
    let runtime = runtime_with(trusting(&pki));
    // Allowed: the same host and port over plain http, which is not what the guest calls.
    let policy = EgressPolicy::allow_only(vec![Authority::new("http", "localhost", proxy.port())]);
    let mut b = runtime
        .open_with_policy(
            &table.target.secure_uri("localhost", proxy.port()),
            settings(&table),
            policy,
            "egress",
        )
        .await
        .expect("opens");
    match b.get("x").await {
        Err(Error::Unreachable(m)) => assert!(m.contains("denied"), "{m}"),
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_tls_files_are_invalid_config() {
    let result = Runtime::load(
        &default_component_path(),
        RuntimeOptions {
            tls: TlsOptions {
                ca_bundle: Some("/nonexistent/ca.pem".into()),
                ..TlsOptions::default()
            },
            ..RuntimeOptions::default()
        },
    );
    assert!(matches!(result, Err(Error::InvalidConfig(m)) if m.contains("/nonexistent/ca.pem")));
}

/// Keep-alive: an instance's requests share one TLS connection instead of a handshake each;
/// with keep-alive off, every request pays a handshake. Either way each request still goes
/// through the egress policy (a denied authority stays denied after connections are pooled).
#[tokio::test]
async fn keep_alive_saves_a_handshake_per_request() {
    use integration_tests::state_host::http::pool::PoolLimits;
    let pki = Pki::new("keepalive");
    let server = pki.server("server", &["localhost"], false);
    let table = TestTable::new("tls_keepalive");
    let proxy = TlsProxy::start(pki.server_config(&server, false), table.target.clone()).await;
    let uri = table.target.secure_uri("localhost", proxy.port());
    let mut handshakes = Vec::new();
    for keep_alive in [PoolLimits::default(), PoolLimits::off()] {
        let runtime = Runtime::load(
            &default_component_path(),
            RuntimeOptions {
                tls: trusting(&pki),
                keep_alive,
                ..integration_tests::runtime_options()
            },
        )
        .expect("component loads");
        let mut b = runtime.open(&uri, settings(&table)).await.expect("opens");
        b.set(&State::completed("k", r#"{"n":0}"#))
            .await
            .expect("set");
        let before = proxy.handshakes();
        for _ in 0..20 {
            assert!(b.get("k").await.expect("get").is_some());
        }
        handshakes.push(proxy.handshakes() - before);
    }
    // The connection the set opened carries every get: it is back in the pool before the
    // guest has read the end of each answer.
    assert_eq!(handshakes[0], 0, "pooled: {handshakes:?}");
    assert_eq!(
        handshakes[1], 20,
        "a connection per request: {handshakes:?}"
    );
}
