//! A loaded component and the instances made from it: the engine and the component (see
//! `engine`), linked once (see `linker`) into an `InstancePre`, from which every backend
//! instance is made, one `Store` each, under its limits (see `limits`) and its egress policy.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clickhouse_state_contract::config::Config;
use wasmtime::{Engine, Store};

use crate::backend::Backend;
use crate::bindings::ClickhouseStateBackendPre;
use crate::cache;
use crate::clock::{Clock as HostClock, SystemClock};
use crate::engine::{self, Ticker};
use crate::error::{Error, Result};
use crate::http::Exchange;
use crate::http::hook::{Interceptor, OutgoingHook};
use crate::http::policy::{AddressAllowance, Authority, EgressPolicy, TimeoutLimits};
use crate::http::pool::PoolLimits;
use crate::http::proxy::Proxies;
use crate::http::sender::Sender;
use crate::http::tls::{LazyClientConfig, TlsOptions};
use crate::limits::{self, CpuShare, Limits};
use crate::settings::Settings;
use crate::state::HostState;
use crate::telemetry::Telemetry;
use crate::telemetry::recorder::Recorder;

/// File name of the built guest component.
pub const COMPONENT_FILE: &str = "clickhouse_state.wasm";
/// Environment variable that names the component to load.
pub const COMPONENT_ENV: &str = "STATE_BACKEND_COMPONENT";

/// Options of a [`Runtime`].
#[derive(Clone)]
pub struct RuntimeOptions {
    /// The clock every instance sees (now and sleep).
    pub clock: Arc<dyn HostClock>,
    /// Upper bounds on the HTTP timeouts a guest may ask for.
    pub timeouts: TimeoutLimits,
    /// Trust (CA bundle) and identity (client certificate) for https endpoints.
    pub tls: TlsOptions,
    /// Special destination addresses (loopback, link-local, metadata, private networks)
    /// instances may connect to; none by default, the policy for a runner's tenants. A single
    /// user's own tool allows private networks (`AddressAllowance::single_user()`, the CLI's
    /// default); a local ClickHouse needs loopback.
    pub addresses: AddressAllowance,
    /// Linear memory an instance may grow to.
    pub memory_limit_bytes: usize,
    /// How long one call into an instance may take, waits included. By default the instance's
    /// lock timeout plus a minute: a guest still running past it is stopped.
    pub call_deadline: Option<Duration>,
    /// How long one call may run the guest's own code (time waiting in host calls, such as the
    /// lock's sleep or an HTTP request, is not counted): a guest that spins is stopped with a
    /// `timeout` error once past it. [`DEFAULT_CPU_BUDGET`] by default.
    pub cpu_budget: Duration,
    /// How much of a core one call may keep taking once past a first stretch of CPU
    /// ([`CpuShare::TENANT`], a quarter of a core after 100 ms, by default); `None` lets a busy
    /// call take all the CPU it gets, for a single user's own tool.
    pub cpu_share: Option<CpuShare>,
    /// Pre-allocate slots for this many live instances (wasmtime's pooling allocator): faster
    /// instantiation for runners that make many short-lived instances. On-demand by default.
    pub pooled_instances: Option<u32>,
    /// Keep-alive connections per instance and destination (see [`PoolLimits`]); on by
    /// default, `PoolLimits::off()` opens a connection per request.
    pub keep_alive: PoolLimits,
    /// Where a compiled component is kept for the next load (see [`cache`]); the per-user
    /// cache by default, `None` compiles in memory every time.
    pub compile_cache: Option<PathBuf>,
    /// HTTP proxies (see [`crate::http::proxy`]): none by default, whatever the environment
    /// says, so a runner's tenants go through a proxy only when the runner passes one
    /// (`Proxies::explicit`); the CLI reads `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`.
    pub proxies: Arc<Proxies>,
    /// Traces and metrics of every instance's calls (see [`crate::telemetry`]); none by
    /// default. The CLI and the embedded host start it from the `OTEL_*` variables.
    pub telemetry: Option<Arc<Telemetry>>,
}

/// The CPU budget of one call. What a call needs grows with its data: a 100k-state `set-all`
/// in one call counts 4 s on a debug build of the host (lowering the list into the instance
/// is counted with the guest's own work), far less on a release build; a runner that hosts
/// tenants sets its own, a few seconds, to bound what a spinning tenant costs its neighbours.
pub const DEFAULT_CPU_BUDGET: Duration = Duration::from_secs(10);

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            clock: Arc::new(SystemClock),
            timeouts: TimeoutLimits::default(),
            tls: TlsOptions::default(),
            addresses: AddressAllowance::default(),
            memory_limit_bytes: 128 << 20,
            call_deadline: None,
            cpu_budget: DEFAULT_CPU_BUDGET,
            cpu_share: Some(CpuShare::TENANT),
            pooled_instances: None,
            keep_alive: PoolLimits::default(),
            compile_cache: cache::default_dir(),
            proxies: Arc::new(Proxies::none()),
            telemetry: None,
        }
    }
}

/// A loaded component, ready to make backend instances.
pub struct Runtime {
    engine: Engine,
    pre: ClickhouseStateBackendPre<HostState>,
    options: RuntimeOptions,
    sender: Sender,
    /// Stops when the runtime and every instance it opened have gone away: an instance's
    /// deadline, CPU budget and yields all run on its ticks.
    ticker: Arc<Ticker>,
    /// How the component was obtained (compiled, from the cache, precompiled).
    loaded: cache::Outcome,
}

impl Runtime {
    /// Loads the component at `path`: a `.wasm` is compiled once; a `.cwasm` made by
    /// [`Runtime::precompile`] (or `state-backend compile`) loads without compiling.
    pub fn load(path: &Path, options: RuntimeOptions) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Component(format!(
                "cannot read the component {}: {e} (build it with `just guest`)",
                path.display()
            ))
        })?;
        Self::from_bytes(&bytes, options).map_err(|e| match e {
            Error::Component(m) => Error::Component(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Compiles a component (`.wasm`) to this host's native code (`.cwasm`), for
    /// [`Runtime::load`] to load without compiling. Only this wasmtime version and
    /// configuration can load the result.
    pub fn precompile(wasm: &[u8]) -> Result<Vec<u8>> {
        engine::engine(None)?
            .precompile_component(wasm)
            .map_err(|e| Error::Component(format!("cannot compile the component: {e:#}")))
    }

    /// Loads a component from its bytes: a component binary is compiled, a precompiled one
    /// deserialized.
    pub fn from_bytes(bytes: &[u8], options: RuntimeOptions) -> Result<Self> {
        let sender = Sender::new(
            Arc::new(LazyClientConfig::new(&options.tls)?),
            Arc::clone(&options.proxies),
        );
        let pooled = options
            .pooled_instances
            .map(|instances| (instances, options.memory_limit_bytes));
        let engine = engine::engine(pooled)?;
        let ticker = Ticker::start(&engine)?;
        let (component, loaded) =
            engine::component(&engine, bytes, options.compile_cache.as_deref())?;
        tracing::debug!(?loaded, "component loaded");
        let pre = crate::linker::linker(&engine)?
            .instantiate_pre(&component)
            .map_err(|e| {
                Error::Component(format!("the component does not fit this host: {e:#}"))
            })?;
        let pre = ClickhouseStateBackendPre::new(pre).map_err(|e| {
            Error::Component(format!("the component does not export the backend: {e:#}"))
        })?;
        Ok(Runtime {
            engine,
            pre,
            options,
            sender,
            ticker: Arc::new(ticker),
            loaded,
        })
    }

    /// Now, by the clock every instance of this runtime sees.
    pub fn now_ms(&self) -> u64 {
        self.options.clock.now_ms()
    }

    /// How the component was obtained: from the compile cache, compiled (and stored), or
    /// precompiled.
    pub fn loaded(&self) -> &cache::Outcome {
        &self.loaded
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The interfaces the loaded component imports (with their versions).
    pub fn imports(&self) -> Vec<String> {
        let component = self.pre.instance_pre().component();
        component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// A new instance connected to the store at `uri`. `settings` override the URI; the
    /// instance may reach that ClickHouse endpoint and nothing else.
    pub async fn open(&self, uri: &str, settings: Settings) -> Result<Backend> {
        self.open_with(uri, settings, InstanceOptions::default())
            .await
    }

    /// As [`Runtime::open`], with an explicit egress policy (tests use this to point a guest at
    /// an endpoint the policy refuses).
    pub async fn open_with_policy(
        &self,
        uri: &str,
        settings: Settings,
        egress: EgressPolicy,
        label: &str,
    ) -> Result<Backend> {
        let options = InstanceOptions {
            label: label.to_string(),
            egress: Some(egress),
            ..InstanceOptions::default()
        };
        self.open_with(uri, settings, options).await
    }

    /// As [`Runtime::open`], with per-instance options.
    pub async fn open_with(
        &self,
        uri: &str,
        settings: Settings,
        options: InstanceOptions,
    ) -> Result<Backend> {
        // The same parser the guest uses, compiled natively: the policy allows exactly the
        // endpoint the guest will call. A bad configuration fails here, with the guest's own
        // message.
        let config = Config::parse(uri, &settings)?;
        self.open_parsed(&config, uri, settings, options).await
    }

    /// As [`Runtime::open_with`], with the configuration its caller parsed already (from
    /// `uri` and `settings`, which the guest parses again on its side).
    pub async fn open_parsed(
        &self,
        config: &Config,
        uri: &str,
        settings: Settings,
        options: InstanceOptions,
    ) -> Result<Backend> {
        let explicit = options.egress.is_some();
        let egress = match options.egress {
            Some(egress) => egress,
            None => EgressPolicy::allow_only(vec![Authority::new(
                config.scheme.as_str(),
                &config.host,
                config.port,
            )]),
        }
        .with_timeouts(self.options.timeouts);
        // An explicit policy keeps its own address rules; the default one takes the runtime's.
        let egress = if explicit {
            egress
        } else {
            egress.with_addresses(self.options.addresses)
        };
        let clock = Arc::clone(&self.options.clock);
        let sender = self.sender.for_instance(self.options.keep_alive);
        #[cfg(feature = "faults")]
        let exchange: Arc<dyn Exchange> = match options.faults {
            Some(plan) => Arc::new(crate::http::faults::Faulty::new(sender, plan)),
            None => Arc::new(sender),
        };
        #[cfg(not(feature = "faults"))]
        let exchange: Arc<dyn Exchange> = Arc::new(sender);
        let recorder = self
            .options
            .telemetry
            .as_ref()
            .map(|t| Recorder::new(Arc::clone(t)));
        let hook = OutgoingHook::new(egress, exchange, Arc::clone(&clock), options.interceptor)
            .with_recorder(recorder.clone());
        let deadline = self.options.call_deadline.unwrap_or_else(|| {
            Duration::from_millis(config.lock_timeout_ms) + Duration::from_secs(60)
        });
        let limits = Limits::new(
            self.options.memory_limit_bytes,
            deadline,
            self.options.cpu_budget,
            self.options.cpu_share,
        );
        let state = HostState::new(hook, clock, options.label, limits, recorder);
        let mut store = Store::new(&self.engine, state);
        limits::apply(&mut store, |state| &mut state.limits);
        let bindings = self
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(Error::trap)?;
        Backend::open(store, bindings, Arc::clone(&self.ticker), uri, settings).await
    }
}

/// Options of one instance.
#[derive(Clone)]
pub struct InstanceOptions {
    /// Names the instance in the log.
    pub label: String,
    /// What it may reach; by default exactly its configured ClickHouse.
    pub egress: Option<EgressPolicy>,
    /// Sees (and may delay) every request it sends; for tests.
    pub interceptor: Option<Arc<dyn Interceptor>>,
    /// Faults injected into its exchanges; for tests (the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: Option<Arc<dyn crate::http::faults::FaultPlan>>,
}

impl Default for InstanceOptions {
    fn default() -> Self {
        InstanceOptions {
            label: "backend".into(),
            egress: None,
            interceptor: None,
            #[cfg(feature = "faults")]
            faults: None,
        }
    }
}

/// The component a wheel installed beside `scripts`: `../lib/pythonX.Y/site-packages/` (POSIX)
/// or `../Lib/site-packages/` (Windows), in the Meltano package.
fn wheel_component(scripts: &Path) -> Option<PathBuf> {
    let prefix = scripts.parent()?;
    let mut site_packages = vec![prefix.join("Lib").join("site-packages")];
    if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
        site_packages.extend(
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                .map(|e| e.path().join("site-packages")),
        );
    }
    site_packages
        .into_iter()
        .map(|dir| dir.join(WHEEL_PACKAGE).join(COMPONENT_FILE))
        .find(|candidate| candidate.is_file())
}

/// The Python package the wheel installs the component into.
const WHEEL_PACKAGE: &str = "meltano_clickhouse_state";

/// Where the component is, unless `STATE_BACKEND_COMPONENT` says otherwise: beside the running
/// executable (`.cwasm` first, then `.wasm`), in the Python package a wheel installed with the
/// executable, else in the cargo target directory the executable was built in.
pub fn default_component_path() -> PathBuf {
    if let Some(path) = std::env::var_os(COMPONENT_ENV) {
        return PathBuf::from(path);
    }
    // An installed copy: a precompiled component beside the executable loads in milliseconds.
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        let wasm = dir.join(COMPONENT_FILE);
        for candidate in [wasm.with_extension("cwasm"), wasm] {
            if candidate.exists() {
                return candidate;
            }
        }
        // Installed by the Python wheel: this executable is in the environment's scripts
        // directory, the component in the Meltano package of its site-packages.
        if let Some(installed) = wheel_component(&dir) {
            return installed;
        }
    }
    let relative = Path::new("wasm32-wasip2")
        .join("release-guest")
        .join(COMPONENT_FILE);
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/state-backend, or target/<profile>/deps/<test> for tests.
        for dir in exe.ancestors().skip(1).take(3) {
            let candidate = dir.join(&relative);
            if candidate.exists() {
                return candidate;
            }
        }
    }
    Path::new("target").join(relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wheel_installed_component_is_found_from_the_scripts_directory() {
        let prefix = tempfile::tempdir().unwrap();
        let scripts = prefix.path().join("bin");
        std::fs::create_dir_all(&scripts).unwrap();
        assert_eq!(wheel_component(&scripts), None);
        let package = prefix
            .path()
            .join("lib/python3.12/site-packages")
            .join(WHEEL_PACKAGE);
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join(COMPONENT_FILE), b"\0asm").unwrap();
        assert_eq!(
            wheel_component(&scripts),
            Some(package.join(COMPONENT_FILE))
        );
        // Windows: Scripts\ and Lib\site-packages\
        let windows = tempfile::tempdir().unwrap();
        let package = windows.path().join("Lib/site-packages").join(WHEEL_PACKAGE);
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join(COMPONENT_FILE), b"\0asm").unwrap();
        assert_eq!(
            wheel_component(&windows.path().join("Scripts")),
            Some(package.join(COMPONENT_FILE))
        );
    }
}
