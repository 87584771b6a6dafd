//! The wasmtime engine: its configuration (one place, so that precompiling and loading agree),
//! the epoch ticker that drives every instance's deadline, and getting the component compiled
//! (from the compile cache, or a `.cwasm` made by `state-backend compile`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Component;
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::cache;
use crate::error::{Error, Result};

/// The wasmtime this host is built with (precompiled components must match it).
pub const WASMTIME_VERSION: &str = "48.0.8";

/// The epoch ticks this often; deadlines are checked (and busy guests yield) on each tick.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The engine, with on-demand instance allocation or `pooled` slots (instances, memory bytes
/// each). Code generation is the same either way, so a `.cwasm` made by one loads in both.
pub fn engine(pooled: Option<(u32, usize)>) -> Result<Engine> {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    if let Some((instances, memory_bytes)) = pooled {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(8))
            .total_memories(instances.saturating_mul(2))
            .total_tables(instances.saturating_mul(8))
            .max_core_instances_per_component(16)
            .max_memories_per_component(2)
            .max_tables_per_component(8)
            .max_memory_size(memory_bytes);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        return Engine::new(&config)
            .map_err(|e| Error::InvalidConfig(format!("pooling allocator: {e:#}")));
    }
    Engine::new(&config).map_err(Error::trap)
}

/// Advances the engine's epoch every tick until dropped.
pub struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    pub fn start(engine: &Engine) -> Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let (engine, stopped) = (engine.clone(), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while !stopped.load(Ordering::SeqCst) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| Error::Component(format!("cannot start the epoch ticker: {e}")))?;
        Ok(Ticker { stop })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The component from its bytes: a component binary is compiled (through the cache in
/// `cache_dir`, if any), a precompiled one deserialized.
pub fn component(
    engine: &Engine,
    bytes: &[u8],
    cache_dir: Option<&Path>,
) -> Result<(Component, cache::Outcome)> {
    if !bytes.starts_with(b"\x7fELF") {
        return cache::load_or_compile(engine, bytes, cache_dir);
    }
    // SAFETY: `deserialize` trusts that the bytes are wasmtime's own output. They come from the
    // operator (the `--component` path or `Runtime::precompile`), never from a guest or a
    // tenant; wasmtime still checks the version and configuration.
    let component = unsafe { Component::deserialize(engine, bytes) }.map_err(|e| {
        Error::Component(format!(
            "cannot load this precompiled component ({e:#}); it was made by another wasmtime \
             version or configuration than this host's (wasmtime {WASMTIME_VERSION}): compile \
             the .wasm again with `state-backend compile`"
        ))
    })?;
    Ok((component, cache::Outcome::Uncached("precompiled".into())))
}
