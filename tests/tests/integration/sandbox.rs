//! The sandbox: what a guest may reach, and what it may not, whatever its configuration says.

use integration_tests::state_host::http::policy::{AddressAllowance, Authority, EgressPolicy};
use integration_tests::state_host::{
    Error, InstanceOptions, Runtime, RuntimeOptions, State, default_component_path,
};
use integration_tests::{Target, TestTable, assert_no_trips, runtime};

fn strict_runtime() -> Runtime {
    Runtime::load(&default_component_path(), RuntimeOptions::default()).expect("loads")
}

/// The message of a refusal of the destination's address by the egress policy, which the
/// host tells apart from other failures to reach (`reason`: `address-refused`).
async fn denial(runtime: &Runtime, uri: &str, options: InstanceOptions) -> String {
    let mut b = runtime
        .open_with(uri, vec![], options)
        .await
        .expect("opens");
    match b.get("x").await {
        Err(e @ Error::AddressRefused(_)) => {
            assert_eq!(
                (e.kind(), e.reason()),
                ("unreachable", Some("address-refused"))
            );
            e.to_string()
        }
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn loopback_is_refused_unless_allowed() {
    let target = Target::from_env();
    if !target.host.starts_with("127.") && target.host != "localhost" {
        return; // nothing on loopback to refuse
    }
    let message = denial(&strict_runtime(), &target.uri(), InstanceOptions::default()).await;
    assert!(
        message.contains("denied") && message.contains("loopback"),
        "{message}"
    );
    assert!(
        message.contains(&format!("{}:{}", target.host, target.port)),
        "{message}"
    );
    assert_no_trips();
    // the same configuration works once the runtime allows loopback
    let table = TestTable::new("loopback_ok");
    let mut b = runtime()
        .open(&target.uri(), table.settings())
        .await
        .unwrap();
    assert_eq!(b.state_ids(None).await.unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn metadata_addresses_are_refused_even_where_loopback_is_allowed() {
    for host in [
        "169.254.169.254",
        "[fd00:ec2::254]",
        "[::ffff:169.254.169.254]",
    ] {
        let uri = format!("clickhouse://default:@{host}:80/default");
        let message = denial(runtime(), &uri, InstanceOptions::default()).await;
        assert!(
            message.contains("denied") && message.contains("refused"),
            "{host}: {message}"
        );
    }
    assert_no_trips();
}

/// A runner's policy (loopback allowed here for the local ClickHouse, nothing else) refuses
/// private networks and every metadata endpoint end to end: the addresses are literals, refused
/// after resolution and before a connection is tried (the tripwire under the policy, which
/// would stop a connection had the policy let one through, was not reached).
#[tokio::test]
async fn private_networks_and_every_metadata_endpoint_are_refused_for_tenants() {
    for host in [
        "10.255.255.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "[fd12:3456::1]",
        "[::ffff:10.0.0.1]",
        "[64:ff9b::a00:1]",
        "100.100.100.200",
        "192.0.0.192",
        "169.254.170.23",
        "[fd00:ec2::23]",
    ] {
        let uri = format!("clickhouse://default:@{host}:8123/default");
        let message = denial(runtime(), &uri, InstanceOptions::default()).await;
        assert!(
            message.contains("denied") && message.contains("refused"),
            "{host}: {message}"
        );
    }
    assert_no_trips();
}

#[tokio::test]
async fn unspecified_and_mapped_loopback_forms_are_loopback() {
    for host in ["0.0.0.0", "[::ffff:127.0.0.1]", "[::1]"] {
        let uri = format!("clickhouse://default:@{host}:8123/default");
        let message = denial(&strict_runtime(), &uri, InstanceOptions::default()).await;
        assert!(message.contains("loopback"), "{host}: {message}");
    }
    assert_no_trips();
}

#[tokio::test]
async fn a_tenant_cannot_reach_another_tenants_clickhouse() {
    // Tenant A's runner allows only A's endpoint; A's guest is configured (maliciously) with
    // B's endpoint, the ClickHouse under test.
    let b_table = TestTable::new("tenant_b");
    let mut tenant_b = b_table.open().await;
    tenant_b
        .set(&State::completed("b-secret-state", r#"{"owner":"b"}"#))
        .await
        .unwrap();
    let a_policy = EgressPolicy::allow_only(vec![Authority::new(
        "https",
        "tenant-a.clickhouse.example",
        8443,
    )])
    .with_addresses(AddressAllowance::loopback());
    let options = InstanceOptions {
        label: "tenant-a".into(),
        egress: Some(a_policy),
        ..InstanceOptions::default()
    };
    let mut tenant_a = runtime()
        .open_with(&b_table.target.uri(), b_table.settings(), options)
        .await
        .unwrap();
    match tenant_a.get("b-secret-state").await {
        Err(Error::Unreachable(m)) => assert!(m.contains("denied"), "{m}"),
        other => panic!("tenant A reached tenant B: {other:?}"),
    }
    assert!(matches!(
        tenant_a.state_ids(None).await,
        Err(Error::Unreachable(_))
    ));
    assert_no_trips();
}

#[tokio::test]
async fn a_precompiled_component_loads_and_one_from_another_version_is_refused() {
    let wasm = std::fs::read(default_component_path()).expect("the built component");
    let native = Runtime::precompile(&wasm).expect("precompiles");
    let dir = std::env::temp_dir().join(format!("cwasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("clickhouse_state.cwasm");
    std::fs::write(&good, &native).unwrap();
    let runtime = Runtime::load(&good, integration_tests::runtime_options())
        .expect("loads without compiling");
    let table = TestTable::new("cwasm");
    let mut b = runtime
        .open(&table.target.uri(), table.settings())
        .await
        .unwrap();
    b.set(&State::completed("precompiled", "{}")).await.unwrap();
    assert!(b.get("precompiled").await.unwrap().is_some());

    // The engine section records the wasmtime version ("48"): pretend another one made it.
    let marker = b"\x0248\x18x86_64";
    let at = native
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("the version in the engine section");
    let mut other = native.clone();
    other[at + 1..at + 3].copy_from_slice(b"47");
    let bad = dir.join("other-version.cwasm");
    std::fs::write(&bad, &other).unwrap();
    match Runtime::load(&bad, RuntimeOptions::default()) {
        Err(Error::Component(m)) => {
            assert!(
                m.contains("another wasmtime version") && m.contains("state-backend compile"),
                "{m}"
            );
            assert!(m.contains("other-version.cwasm"), "{m}");
        }
        Err(other) => panic!("expected a component error, got {other}"),
        Ok(_) => panic!("a .cwasm of another version loaded"),
    }
    std::fs::remove_dir_all(dir).ok();
}
