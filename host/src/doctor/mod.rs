//! `state-backend doctor`: the whole path to the store, checked once. The network is the
//! host's (as the sandbox's requests take it); everything about ClickHouse is the guest's
//! (`diagnose`); the lock holders' processes on this machine are the host's again.

use crate::runtime::{Runtime, RuntimeOptions};
use crate::settings::Settings;
use clickhouse_state_contract::config::{Config, Scheme};

pub mod check;
pub mod locks;
pub mod network;

pub use check::{Check, Diagnosis, Outcome, passed, table};

/// Every check, in order: the network, then the store, then the locks. With `fix`, what is
/// safe to fix is fixed first (the schema, with `migrate`), and the checks run after it.
pub async fn run(
    runtime: &Runtime,
    options: &RuntimeOptions,
    uri: &str,
    settings: Settings,
    fix: bool,
) -> Vec<Check> {
    let config = match Config::parse(uri, &settings) {
        Ok(config) => config,
        Err(e) => {
            return vec![Check::fail(
                "configuration",
                crate::Error::from(e).to_string(),
                "fix the URI or the setting it names",
            )];
        }
    };
    let target = network::Target {
        host: config.host.clone(),
        port: config.port,
        secure: config.scheme == Scheme::Https,
    };
    let mut checks = network::checks(&target, options).await;
    let mut backend = match runtime.open(uri, settings).await {
        Ok(backend) => backend,
        Err(e) => {
            checks.push(Check::fail(
                "component",
                e.to_string(),
                "fix what the error names (a setting, the component's path); \
                 `state-backend settings` lists the settings",
            ));
            return checks;
        }
    };
    if fix {
        checks.push(match backend.migrate().await {
            Ok(()) => Check::new(
                "fix",
                Outcome::Pass,
                "migrate: the schema is created and up to date".into(),
                "",
            ),
            Err(e) => Check::fail(
                "fix",
                format!("migrate failed: {e}"),
                "run it as a user allowed to create the tables",
            ),
        });
    }
    match backend.diagnose().await {
        Ok(found) => {
            let server_answered = found
                .checks
                .iter()
                .any(|c| c.name == "tables" && c.outcome != Outcome::Skipped);
            // The guest names the locks check itself when it could not read the grants.
            let locks_read = !found.checks.iter().any(|c| c.name == "locks");
            checks.extend(found.checks);
            if server_answered && locks_read {
                checks.push(locks::check(&found.unreleased, runtime.now_ms()));
            }
        }
        Err(e) => checks.push(Check::fail(
            "component",
            e.to_string(),
            "the component failed (a trap or a deadline): run again with --log debug and report it",
        )),
    }
    backend.close().await.ok();
    checks
}
