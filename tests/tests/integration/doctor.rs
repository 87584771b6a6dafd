//! `doctor` on the engine: every check passes on the local ClickHouse, and each failure an
//! operator meets is named by its own check: a stopped server, a wrong password, a user who may
//! not write, a clock off the server's, a lock held by a process that is gone.

use std::sync::Arc;

use integration_tests::state_host::clock::{Clock, SystemClock};
use integration_tests::state_host::doctor::{self, Check, Outcome};
use integration_tests::state_host::{Runtime, RuntimeOptions, State, this_process};
use integration_tests::{LocalServer, SCHEMA, TestTable, runtime, runtime_options};

fn outcome<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {checks:#?}"))
}

fn settings(table: &str) -> Vec<(String, String)> {
    vec![
        ("schema".into(), SCHEMA.into()),
        ("table".into(), table.into()),
    ]
}

async fn diagnose(uri: &str, settings: Vec<(String, String)>) -> Vec<Check> {
    doctor::run(runtime(), &runtime_options(), uri, settings, false).await
}

/// `doctor` through a runtime of its own, with these options (a clock, the TLS trust).
async fn diagnose_with(
    options: RuntimeOptions,
    uri: &str,
    settings: Vec<(String, String)>,
) -> Vec<Check> {
    let runtime = Runtime::load(
        &integration_tests::state_host::default_component_path(),
        options.clone(),
    )
    .expect("load");
    doctor::run(&runtime, &options, uri, settings, false).await
}

#[tokio::test]
async fn every_check_passes_against_the_local_clickhouse_once_fix_made_the_tables() {
    let table = TestTable::new("doctor");
    let uri = table.target.uri();
    let before = diagnose(&uri, table.settings()).await;
    assert_eq!(
        outcome(&before, "tables").outcome,
        Outcome::Fail,
        "{before:#?}"
    );
    assert!(!doctor::passed(&before));
    let exists = format!(
        "SELECT count() FROM system.tables WHERE database = '{SCHEMA}' AND name LIKE '{}%'",
        table.name
    );
    assert_eq!(
        table.target.must(&exists).trim(),
        "0",
        "doctor without --fix created nothing"
    );

    let fixed = doctor::run(runtime(), &runtime_options(), &uri, table.settings(), true).await;
    assert_eq!(outcome(&fixed, "fix").outcome, Outcome::Pass, "{fixed:#?}");
    let mut backend = table.open().await;
    backend
        .set(&State::partial(
            "a",
            r#"{"singer_state":{"n":1}}"#.to_string(),
        ))
        .await
        .expect("set");
    backend
        .update(&State::partial(
            "a",
            r#"{"singer_state":{"m":2}}"#.to_string(),
        ))
        .await
        .expect("update");
    backend.close().await.expect("close");
    // What the tables hold, as the engine counts it: rows and active parts of each, and the
    // mutations (a DELETE or an ALTER would add one).
    let holdings = || {
        table.target.must(&format!(
            "SELECT table, sum(rows), count() FROM system.parts WHERE database = '{SCHEMA}' \
             AND startsWith(table, '{name}') AND active GROUP BY table ORDER BY table \
             UNION ALL SELECT 'mutations', count(), 0 FROM system.mutations \
             WHERE database = '{SCHEMA}' AND startsWith(table, '{name}')",
            name = table.name
        ))
    };
    let before = holdings();
    assert!(before.contains("_lock_log"), "{before}");
    let after = diagnose(&uri, table.settings()).await;
    assert_eq!(holdings(), before, "doctor wrote nothing: {after:#?}");
    for check in &after {
        assert!(
            matches!(check.outcome, Outcome::Pass) || check.name == "tls",
            "{check:#?}"
        );
    }
    for name in ["proxy", "dns", "address", "tcp", "locks"]
        .into_iter()
        .chain(["authentication", "server-version", "clock", "deployment"])
        .chain(["tables", "grants", "lock-log"])
    {
        outcome(&after, name);
    }
    assert!(
        outcome(&after, "grants")
            .detail
            .contains("ALTER TTL and DELETE granted")
    );
    assert!(outcome(&after, "tables").detail.contains(&table.name));
}

#[tokio::test]
async fn a_stopped_server_fails_the_tcp_check_and_the_first_call() {
    let mut server = LocalServer::start("default", "");
    server.stop();
    let checks = diagnose(&server.uri(), settings("t_doctor_stopped")).await;
    assert_eq!(
        outcome(&checks, "tcp").outcome,
        Outcome::Fail,
        "{checks:#?}"
    );
    assert!(outcome(&checks, "tcp").detail.contains("refused"));
    assert_eq!(outcome(&checks, "authentication").outcome, Outcome::Fail);
    assert_eq!(outcome(&checks, "grants").outcome, Outcome::Skipped);
    assert!(!doctor::passed(&checks));
}

#[tokio::test]
async fn a_wrong_password_fails_authentication_and_is_never_shown() {
    let password = "doctorPa55right";
    let server = LocalServer::start("meltano", password);
    let wrong = "doctorPa55wrong";
    let uri = server.uri().replace(password, wrong);
    let checks = diagnose(&uri, settings("t_doctor_password")).await;
    assert_eq!(
        outcome(&checks, "tcp").outcome,
        Outcome::Pass,
        "{checks:#?}"
    );
    let auth = outcome(&checks, "authentication");
    assert_eq!(auth.outcome, Outcome::Fail);
    assert!(auth.detail.contains("refused user 'meltano'"), "{auth:#?}");
    let printed = format!("{}{}", doctor::table(&checks), serde_json::json!(checks));
    assert!(!printed.contains(wrong) && !printed.contains(password));
}

#[tokio::test]
async fn a_user_who_may_not_write_fails_the_grants_check() {
    let mut server = LocalServer::start("default", "");
    let table = settings("t_doctor_readonly");
    let made = doctor::run(
        runtime(),
        &runtime_options(),
        &server.uri(),
        table.clone(),
        true,
    )
    .await;
    assert_eq!(outcome(&made, "grants").outcome, Outcome::Pass, "{made:#?}");
    // Every later session of the user is read-only, as a readonly profile makes it.
    server.restart_with(&["--profile-setting", "readonly=2"]);
    let checks = diagnose(&server.uri(), table).await;
    let grants = outcome(&checks, "grants");
    assert_eq!(grants.outcome, Outcome::Fail, "{checks:#?}");
    assert!(
        grants.detail.contains("INSERT into the state table"),
        "{grants:#?}"
    );
    assert_eq!(outcome(&checks, "authentication").outcome, Outcome::Pass);
}

/// The host's clock, this far from the system's.
struct Offset(i64);

impl Clock for Offset {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms().saturating_add_signed(self.0)
    }
    fn sleep(
        &self,
        ms: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>> {
        SystemClock.sleep(ms)
    }
}

#[tokio::test]
async fn a_host_clock_off_by_more_than_the_lease_margin_fails_the_clock_check() {
    let table = TestTable::new("doctor_clock");
    let lease_s = 20; // a margin of 2 s
    let with_lease = table.with(&[("lock_lease_seconds", &lease_s.to_string())]);
    for (ahead_ms, fails) in [(0, false), (5_000, true), (-5_000, true)] {
        let options = RuntimeOptions {
            clock: Arc::new(Offset(ahead_ms)),
            ..runtime_options()
        };
        let checks = diagnose_with(options, &table.target.uri(), with_lease.clone()).await;
        let clock = outcome(&checks, "clock");
        let want = if fails { Outcome::Fail } else { Outcome::Pass };
        assert_eq!(clock.outcome, want, "{ahead_ms} ms ahead: {clock:#?}");
        assert!(clock.detail.contains("margin is 2000 ms"), "{clock:#?}");
    }
}

#[tokio::test]
async fn a_lock_held_by_a_process_of_this_host_that_is_gone_is_listed_as_stuck() {
    let table = TestTable::new("doctor_stuck");
    let mut dead = std::process::Command::new("true").spawn().expect("true");
    dead.wait().expect("exits");
    let dead_pid = dead.id();
    let mut backend = table.open().await;
    backend
        .identify(&integration_tests::state_host::WriterInfo {
            pid: dead_pid,
            ..this_process("lock", "", "")
        })
        .await
        .expect("identify");
    let lock = backend.acquire_lock("stuck-id").await.expect("lock");
    // Its holder vanishes without a release: neither the lock nor the store is closed.
    std::mem::forget(lock);
    std::mem::forget(backend);
    // A lock this live process holds is held, not stuck.
    let mut live = table.open().await;
    live.identify(&this_process("lock", "", ""))
        .await
        .expect("identify");
    let held = live.acquire_lock("live-id").await.expect("lock");

    let checks = diagnose(&table.target.uri(), table.settings()).await;
    let locks = outcome(&checks, "locks");
    assert_eq!(locks.outcome, Outcome::Fail, "{checks:#?}");
    assert!(
        locks.detail.contains("stuck-id") && locks.detail.contains(&format!("pid {dead_pid}")),
        "{locks:#?}"
    );
    assert!(locks.fix.contains("force-unlock"));
    assert!(locks.detail.contains("2 held"), "{locks:#?}");
    assert!(!locks.detail.contains("live-id"), "{locks:#?}");
    live.release(held).await.expect("release");
    live.close().await.ok();

    // Once freed, nothing is stuck.
    let mut operator = table.open().await;
    assert!(
        operator
            .force_unlock("stuck-id")
            .await
            .expect("force-unlock")
    );
    operator.close().await.ok();
    let checks = diagnose(&table.target.uri(), table.settings()).await;
    assert_eq!(
        outcome(&checks, "locks").outcome,
        Outcome::Pass,
        "{checks:#?}"
    );
}

#[tokio::test]
async fn over_tls_the_certificate_is_checked_with_the_hosts_trust_and_its_days_are_named() {
    use integration_tests::state_host::http::tls::TlsOptions;
    use integration_tests::tls::{Pki, TlsProxy};
    let pki = Pki::new("doctor");
    let server = pki.server("server", &["localhost"], false);
    let table = TestTable::new("doctor_tls");
    let proxy = TlsProxy::start(pki.server_config(&server, false), table.target.clone()).await;
    let uri = table.target.secure_uri("localhost", proxy.port());
    for trusted in [true, false] {
        let options = RuntimeOptions {
            tls: TlsOptions {
                ca_bundle: trusted.then(|| pki.ca_path()),
                ..TlsOptions::default()
            },
            ..runtime_options()
        };
        let checks = diagnose_with(options, &uri, table.settings()).await;
        let tls = outcome(&checks, "tls");
        if trusted {
            assert_eq!(tls.outcome, Outcome::Pass, "{checks:#?}");
            assert!(tls.detail.contains(" days)"), "{tls:#?}");
            assert_eq!(outcome(&checks, "authentication").outcome, Outcome::Pass);
        } else {
            assert_eq!(tls.outcome, Outcome::Fail, "{checks:#?}");
            assert!(tls.fix.contains("--ca-bundle"), "{tls:#?}");
        }
    }
}

#[tokio::test]
async fn a_lock_log_of_an_older_version_is_named_and_fix_brings_it_up_to_date() {
    let table = TestTable::new("doctor_older");
    crate::deployment::older_schema(&table);
    let uri = table.target.uri();
    let older = diagnose(&uri, table.settings()).await;
    let tables = outcome(&older, "tables");
    assert_eq!(tables.outcome, Outcome::Warn, "{older:#?}");
    assert!(tables.detail.contains("`want` event"), "{tables:#?}");
    assert!(doctor::passed(&older), "a warning does not fail the doctor");
    let fixed = doctor::run(runtime(), &runtime_options(), &uri, table.settings(), true).await;
    assert_eq!(
        outcome(&fixed, "tables").outcome,
        Outcome::Pass,
        "{fixed:#?}"
    );
}
