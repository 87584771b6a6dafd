//! A tripwire under the policy: when armed, the sender connects to this machine only (loopback
//! or unspecified addresses) and resolves no name but `localhost`, whatever the policy allows.
//!
//! Tests arm it so that a broken refusal shows as a failed test instead of packets leaving the
//! machine: it is always armed in builds with the `tripwire` feature (every test build), and in
//! any build when [`TRIPWIRE_ENV`] names a file, to which each trip appends a line (the CLI and
//! Python tests read it). A trip is an error for the request, and is recorded in [`trips`].
//! A suite pointed at a ClickHouse elsewhere names its host in [`ALLOW_ENV`].

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use wasmtime_wasi_http::Error as HttpError;

/// The variable that arms the tripwire in any build; its value is the file trips are written to.
pub const TRIPWIRE_ENV: &str = "STATE_BACKEND_TRIPWIRE";

/// Host names the tripwire lets through besides this machine (comma-separated): the ClickHouse
/// under test when it is not local.
pub const ALLOW_ENV: &str = "STATE_BACKEND_TRIPWIRE_ALLOW";

/// The text every trip's error starts with.
pub const TRIPPED: &str = "tripwire: refused to leave this machine";

static TRIPS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn log_file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::var_os(TRIPWIRE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

fn allowed(host: &str) -> bool {
    static ALLOWED: OnceLock<Vec<String>> = OnceLock::new();
    ALLOWED
        .get_or_init(|| {
            std::env::var(ALLOW_ENV)
                .unwrap_or_default()
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect()
        })
        .iter()
        .any(|h| h.eq_ignore_ascii_case(host))
}

/// Whether connections off this machine are refused here.
pub fn armed() -> bool {
    cfg!(feature = "tripwire") || log_file().is_some()
}

/// What tripped the wire in this process so far (each entry names the destination).
pub fn trips() -> Vec<String> {
    TRIPS.lock().map(|t| t.clone()).unwrap_or_default()
}

/// Before resolving `host`: only IP literals and `localhost` are looked up.
pub fn check_name(host: &str) -> Result<(), HttpError> {
    // Only `localhost` itself: a resolver may send other names, `*.localhost` included, to DNS.
    let local = host.parse::<IpAddr>().is_ok() || host.eq_ignore_ascii_case("localhost");
    if !armed() || local || allowed(host) {
        return Ok(());
    }
    Err(trip(format!("a lookup of the name {host}")))
}

/// Before connecting to `ip`, an address of `host`: only this machine.
pub fn check_address(host: &str, ip: IpAddr) -> Result<(), HttpError> {
    let ip = ip.to_canonical();
    if !armed() || ip.is_loopback() || ip.is_unspecified() || allowed(host) {
        return Ok(());
    }
    Err(trip(format!("a connection to {ip}")))
}

fn trip(what: String) -> HttpError {
    let line = format!("{TRIPPED}: {what} (the policy allowed it)");
    tracing::error!(target: "egress", "{line}");
    if let Ok(mut trips) = TRIPS.lock() {
        trips.push(line.clone());
    }
    if let Some(path) = log_file() {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            tracing::error!(target: "egress", "cannot record the trip in {}: {e}", path.display());
        }
    }
    HttpError::InternalError(Some(line))
}

#[cfg(all(test, feature = "tripwire"))]
mod tests {
    use super::*;

    #[test]
    fn only_this_machine_passes() {
        for ok in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert!(check_address(ok, ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for off in [
            "10.255.255.1",
            "169.254.169.254",
            "8.8.8.8",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            let before = trips().len();
            assert!(check_address(off, off.parse().unwrap()).is_err(), "{off}");
            assert!(trips().len() > before, "{off} was not recorded");
        }
    }

    #[test]
    fn only_local_names_are_looked_up() {
        for ok in ["localhost", "LocalHost", "10.0.0.1", "::1"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for off in [
            "example.com",
            "clickhouse.internal",
            "localhost.example.com",
        ] {
            assert!(check_name(off).is_err(), "{off}");
        }
    }
}
