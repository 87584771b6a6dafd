//! The tripwire under the egress policy works: with the policy's refusal switched off, a
//! private or metadata literal, or a name that would need a DNS query, trips it and nothing
//! leaves the machine. The refusal tests (sandbox, evil, cli, secrets and the Python ones) rely
//! on it: they assert that the policy refused and that the tripwire was not reached.
//!
//! In a binary of its own: the trips below are recorded process-wide, and the other binaries
//! assert that there were none.

use std::process::Command;

use integration_tests::state_host::http::policy::AddressAllowance;
use integration_tests::state_host::http::tripwire::{self, TRIPPED};
use integration_tests::state_host::{Error, Runtime, RuntimeOptions, default_component_path};
use integration_tests::{TripwireLog, state_backend_binary};

/// No address class refused: only the tripwire stands between the guest and the network.
fn refusing_nothing() -> Runtime {
    let options = RuntimeOptions {
        addresses: AddressAllowance {
            loopback: true,
            link_local: true,
            metadata: true,
            private: true,
        },
        ..RuntimeOptions::default()
    };
    Runtime::load(&default_component_path(), options).expect("loads")
}

#[tokio::test]
async fn with_the_refusal_switched_off_a_private_or_metadata_literal_trips_the_wire() {
    assert!(tripwire::armed(), "a test build without the tripwire");
    let runtime = refusing_nothing();
    for host in ["10.255.255.1", "169.254.169.254", "[fd12:3456::1]"] {
        let uri = format!("clickhouse://default:throwaway-pw-0000@{host}:8123/default");
        let settings = vec![("retry_budget_seconds".into(), "0".into())];
        let mut backend = runtime.open(&uri, settings).await.expect("opens");
        match backend.get("x").await {
            Err(Error::Unreachable(m)) => assert!(m.contains(TRIPPED), "{host}: {m}"),
            other => panic!("{host}: expected the tripwire, got {other:?}"),
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        assert!(
            tripwire::trips().iter().any(|t| t.contains(bare)),
            "{host} is not among the trips: {:?}",
            tripwire::trips()
        );
    }
}

#[tokio::test]
async fn with_the_refusal_switched_off_a_name_trips_the_wire_before_any_lookup() {
    let runtime = refusing_nothing();
    let uri = "clickhouse://default:@clickhouse.internal.example:8123/default";
    let settings = vec![("retry_budget_seconds".into(), "0".into())];
    let mut backend = runtime.open(uri, settings).await.expect("opens");
    match backend.get("x").await {
        Err(Error::Unreachable(m)) => {
            assert!(m.contains(TRIPPED), "{m}");
            assert!(
                !m.contains("name resolution failed"),
                "it looked the name up: {m}"
            );
        }
        other => panic!("expected the tripwire, got {other:?}"),
    }
    assert!(
        tripwire::trips()
            .iter()
            .any(|t| t.contains("clickhouse.internal.example"))
    );
}

/// The CLI reaches private networks by default: a private literal reaches the tripwire, which
/// the variable arms and which records the trip in its file.
#[test]
fn the_cli_records_a_trip_in_its_tripwire_file() {
    let log = TripwireLog::new("cli");
    let output = log
        .arm(&mut Command::new(state_backend_binary()))
        .env_remove("MELTANO_STATE_BACKEND_URI")
        .arg("--uri")
        .arg("clickhouse://default:throwaway-pw-0000@10.255.255.1:8123/default")
        .args(["-s", "retry_budget_seconds=0", "get", "x"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(TRIPPED), "{stderr}");
    assert!(log.trips().contains("10.255.255.1"), "{}", log.trips());
}
