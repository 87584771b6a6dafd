//! Helpers for the integration tests: where ClickHouse is, a shared compiled component, tables
//! of each test's own, and a raw HTTP path to ClickHouse that bypasses the component.
//!
//! Every test reads `CLICKHOUSE_URL` (default `http://default:@127.0.0.1:8123`, the local
//! ClickHouse), so the same suite runs against any ClickHouse, ClickHouse Cloud included.

pub mod otlp;
pub mod proxy;
pub mod report;
pub mod tls;
pub mod turns;

use std::sync::{Arc, OnceLock};

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use state_host::{Backend, Runtime, RuntimeOptions};

pub use state_host;

pub const DEFAULT_URL: &str = "http://default:@127.0.0.1:8123";
/// The schema (database) the tests put their tables in.
pub const SCHEMA: &str = "meltano_test";

/// The ClickHouse under test.
#[derive(Clone)]
pub struct Target {
    pub secure: bool,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
}

impl Target {
    pub fn from_env() -> Target {
        let text = std::env::var("CLICKHOUSE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
        let url = url::Url::parse(&text).expect("CLICKHOUSE_URL is a URL");
        let secure = url.scheme() == "https";
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .expect("utf-8")
                .into_owned()
        };
        Target {
            secure,
            host: url
                .host_str()
                .expect("CLICKHOUSE_URL has a host")
                .to_string(),
            port: url.port().unwrap_or(if secure { 8443 } else { 8123 }),
            user: match url.username() {
                "" => "default".to_string(),
                u => decode(u),
            },
            password: decode(url.password().unwrap_or("")),
        }
    }

    /// The component's URI for this ClickHouse (database `default`).
    pub fn uri(&self) -> String {
        self.uri_with_password(&self.password)
    }

    pub fn uri_with_password(&self, password: &str) -> String {
        format!(
            "clickhouse://{}:{}@{}:{}/default{}",
            utf8_percent_encode(&self.user, NON_ALPHANUMERIC),
            utf8_percent_encode(password, NON_ALPHANUMERIC),
            self.host,
            self.port,
            if self.secure { "?secure=true" } else { "" }
        )
    }

    /// This ClickHouse's credentials, with https to `host:port` instead (a TLS endpoint in front
    /// of it, named as the certificate may or may not say).
    pub fn secure_uri(&self, host: &str, port: u16) -> String {
        format!(
            "clickhouse://{}:{}@{host}:{port}/default?secure=true",
            utf8_percent_encode(&self.user, NON_ALPHANUMERIC),
            utf8_percent_encode(&self.password, NON_ALPHANUMERIC),
        )
    }

    pub fn base_url(&self) -> String {
        format!(
            "{}://{}:{}",
            if self.secure { "https" } else { "http" },
            self.host,
            self.port
        )
    }

    /// Runs SQL over plain HTTP, bypassing the component. Returns the body, or the status and
    /// body of an error.
    pub fn query(&self, sql: &str) -> Result<String, (u16, String)> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent
            .post(&format!("{}/?wait_end_of_query=1", self.base_url()))
            .header("X-ClickHouse-User", &self.user)
            .header("X-ClickHouse-Key", &self.password)
            .send(sql)
            .map_err(|e| (0, e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(|e| (status, e.to_string()))?;
        if status == 200 {
            Ok(body)
        } else {
            Err((status, body))
        }
    }

    pub fn must(&self, sql: &str) -> String {
        match self.query(sql) {
            Ok(body) => body,
            Err((status, body)) => panic!("{sql}: HTTP {status}: {body}"),
        }
    }
}

/// Runtime options for tests: the local ClickHouse (and the local TLS proxies) are on
/// loopback, which the host refuses unless allowed.
pub fn runtime_options() -> RuntimeOptions {
    RuntimeOptions {
        addresses: state_host::http::policy::AddressAllowance::loopback(),
        ..RuntimeOptions::default()
    }
}

/// Fails the test if anything in this process tried to leave the machine (the host's tripwire,
/// armed in every test build): a refusal test shows both that the policy refused and that
/// nothing got as far as a connection.
pub fn assert_no_trips() {
    let trips = state_host::http::tripwire::trips();
    assert!(trips.is_empty(), "the tripwire was hit: {trips:#?}");
}

/// The `state-backend` executable of this build (beside the test binary, or a level up): a
/// test build (its tripwire armed), built since the last change of the sources it is built
/// from. `cargo test --workspace` builds it so (the test features are unified); a build of the
/// host alone (`just lint`'s) is not one.
pub fn state_backend_binary() -> std::path::PathBuf {
    static CHECKED: OnceLock<std::path::PathBuf> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test exe");
            let binary = exe
                .ancestors()
                .skip(1)
                .take(3)
                .map(|dir| dir.join("state-backend"))
                .find(|path| path.is_file())
                .expect("state-backend not built; run `cargo test --workspace --no-run`");
            let rebuild = "rebuild it with the tests' features: `cargo test --workspace --no-run`";
            let version = std::process::Command::new(&binary)
                .arg("--version")
                .output()
                .expect("state-backend --version");
            let version = String::from_utf8_lossy(&version.stdout);
            assert!(
                version.contains("test build"),
                "{} is not a test build (its tripwire is not armed: {version:?}); {rebuild}",
                binary.display()
            );
            let built = modified(&binary);
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            // The sources alone: cargo does not relink the binary when a manifest or the lock
            // file changes for other packages, and this check must not ask for a build that
            // does nothing.
            let sources = ["host/src", "host/wit", "contract/src"].map(|p| root.join(p));
            if let Some(newer) = sources.iter().find_map(|p| newer_than(p, built)) {
                panic!(
                    "{} is older than {}; {rebuild}",
                    binary.display(),
                    newer.display()
                );
            }
            binary
        })
        .clone()
}

fn modified(path: &std::path::Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A file under `path` (itself, or in it) changed after `time`.
fn newer_than(path: &std::path::Path, time: std::time::SystemTime) -> Option<std::path::PathBuf> {
    if path.is_file() {
        return (modified(path) > time).then(|| path.to_path_buf());
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find_map(|p| newer_than(&p, time))
}

/// What a CLI run printed, stdout then stderr.
pub fn printed(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A tripwire file for a CLI run (`STATE_BACKEND_TRIPWIRE`): it arms the tripwire of any build,
/// and records each trip.
pub struct TripwireLog {
    pub path: std::path::PathBuf,
}

impl TripwireLog {
    pub fn new(label: &str) -> TripwireLog {
        let path = std::env::temp_dir().join(format!(
            "tripwire-{label}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        ));
        TripwireLog { path }
    }

    /// Arms the tripwire of `command`'s host.
    pub fn arm<'a>(&self, command: &'a mut std::process::Command) -> &'a mut std::process::Command {
        command.env(state_host::http::tripwire::TRIPWIRE_ENV, &self.path)
    }

    /// What tripped it so far.
    pub fn trips(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }

    pub fn assert_untouched(&self) {
        let trips = self.trips();
        assert!(trips.is_empty(), "the tripwire was hit:\n{trips}");
    }
}

impl Drop for TripwireLog {
    fn drop(&mut self) {
        std::fs::remove_file(&self.path).ok();
    }
}

/// The component, compiled once per test binary.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let path = state_host::default_component_path();
        Runtime::load(&path, runtime_options())
            .unwrap_or_else(|e| panic!("{e}; build the guest first (`just guest`)"))
    })
}

/// A state table of the test's own (and its lock table), dropped at the end.
pub struct TestTable {
    pub target: Target,
    pub name: String,
}

impl TestTable {
    pub fn new(label: &str) -> Arc<TestTable> {
        let target = Target::from_env();
        let name = format!(
            "t_{label}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        );
        Arc::new(TestTable { target, name })
    }

    /// Settings that point a backend at this table.
    pub fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("schema".into(), SCHEMA.into()),
            ("table".into(), self.name.clone()),
        ]
    }

    pub fn with(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut settings = self.settings();
        settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        settings
    }

    pub async fn open(&self) -> Backend {
        self.open_with(&[]).await
    }

    pub async fn open_with(&self, extra: &[(&str, &str)]) -> Backend {
        runtime()
            .open(&self.target.uri(), self.with(extra))
            .await
            .expect("open")
    }

    pub fn qualified(&self) -> String {
        format!("{SCHEMA}.{}", self.name)
    }

    /// Rows physically in the table (all versions), bypassing the component.
    pub fn raw_rows(&self) -> u64 {
        self.target
            .must(&format!("SELECT count() FROM {}", self.qualified()))
            .trim()
            .parse()
            .expect("a count")
    }
}

impl Drop for TestTable {
    fn drop(&mut self) {
        // The history's view before the tables it reads and writes.
        for table in [
            format!("{}_history_to_state", self.name),
            format!("{}_history", self.name),
            self.name.clone(),
            format!("{}_lock", self.name),
            format!("{}_lock_log", self.name),
        ] {
            let _ = self
                .target
                .query(&format!("DROP TABLE IF EXISTS {SCHEMA}.{table}"));
        }
    }
}

/// The `written_rows` an INSERT of one row reports when it lands: two for a write to the
/// history (its row and its view's in the state table), one otherwise.
pub fn rows_a_landing_reports(uri: &http::Uri) -> u64 {
    match insert_target(uri) {
        Some(table) if table.ends_with("_history") => 2,
        _ => 1,
    }
}

/// The table an INSERT request writes to (its name without schema or quotes), or `None` when
/// the request is not an INSERT. Every INSERT the component sends carries its statement in the
/// URL, so an interceptor can tell writes apart by table.
pub fn insert_target(uri: &http::Uri) -> Option<String> {
    let query = uri.query()?;
    let (_, sql) = url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "query")?;
    let table = sql
        .strip_prefix("INSERT INTO ")?
        .split_whitespace()
        .next()?;
    Some(table.rsplit('.').next()?.trim_matches('`').to_string())
}

/// The machine, for benchmark reports: CPU model, cores, memory.
pub fn machine_summary() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("{cpu}, {cores} cores, {memory_gib:.0} GiB")
}

/// Parses JSON text (for comparing states regardless of formatting).
/// The next number of a seeded sequence (splitmix64): random enough for tests and benchmarks,
/// and a seed replays a run.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *state;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A local ClickHouse of a test's own (the project's server on a free port), which the test may
/// stop and start again on the same data. It panics when it cannot start: a test that needs it
/// fails rather than passes without it.
pub struct LocalServer {
    child: Option<std::process::Child>,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub dir: std::path::PathBuf,
    pub log: std::path::PathBuf,
    extra_args: Vec<String>,
}

impl LocalServer {
    pub fn start(user: &str, password: &str) -> LocalServer {
        Self::start_with(user, password, &[])
    }

    /// With more arguments for `server.py`, e.g. `--config cluster.xml`.
    pub fn start_with(user: &str, password: &str, extra_args: &[&str]) -> LocalServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "local-ch-{port}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the server");
        let mut server = LocalServer {
            child: None,
            port,
            user: user.to_string(),
            password: password.to_string(),
            log: dir.join("server.log"),
            dir,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        };
        server.resume();
        server
    }

    fn python() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
    }

    /// Starts (again) on the same port and data; waits until it answers /ping.
    pub fn resume(&mut self) {
        let python = Self::python();
        assert!(
            python.exists(),
            "no Python venv at {}: run tests/bootstrap.sh",
            python.display()
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the server's log file");
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clickhouse/server.py");
        let child = std::process::Command::new(python)
            .arg(script)
            .args(["--port", &self.port.to_string(), "--user", &self.user])
            .arg("--data")
            .arg(self.dir.join("data"))
            .args(&self.extra_args)
            .env("LOCAL_CLICKHOUSE_PASSWORD", &self.password)
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("the local server starts");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        while !self.pings() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || std::time::Instant::now() > deadline {
                panic!(
                    "the local server did not start ({exited:?}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let request = "GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let mut answer = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
            && answer.ends_with("Ok.\n")
    }

    /// Stops it (SIGTERM, as an operator would), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
    }

    /// Stops it and starts it again on the same port and data with other arguments (a profile
    /// that a user's later sessions get, say).
    pub fn restart_with(&mut self, extra_args: &[&str]) {
        self.stop();
        self.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        self.resume();
    }

    /// Kills it (SIGKILL: no shutdown, connections reset), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn uri(&self) -> String {
        format!(
            "clickhouse://{}:{}@127.0.0.1:{}/default",
            utf8_percent_encode(&self.user, NON_ALPHANUMERIC),
            utf8_percent_encode(&self.password, NON_ALPHANUMERIC),
            self.port
        )
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
