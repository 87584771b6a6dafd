//! A per-user cache of the component compiled to native code.
//!
//! Compiling the component takes about 300 ms with a release host; loading native code that
//! was compiled before takes a few. Native code is tied to the exact wasmtime version, its
//! configuration and the CPU features of the machine, so nothing precompiled ships (a wheel
//! built on one machine would not load, or worse, on another): the first use compiles, and
//! later uses load the result from a cache keyed by the component's bytes and wasmtime's
//! compatibility hash. Any change to either gives a new key; an entry that still fails to load
//! is compiled again and replaced.
//!
//! Entries are written to a temporary file in the cache directory and renamed into place, so
//! concurrent first uses never see half a file: each writes a whole entry, and the last rename
//! wins with identical content. A cache directory that cannot be created or written is not an
//! error: the component is compiled in memory, as if there were no cache.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::{Error, Result};

/// Environment variable naming the cache directory; empty turns the cache off.
pub const CACHE_ENV: &str = "STATE_BACKEND_CACHE_DIR";

/// The cache directory unless told otherwise: `$STATE_BACKEND_CACHE_DIR` (empty: no cache),
/// else the platform's per-user cache (`$XDG_CACHE_HOME` or `~/.cache` on Linux,
/// `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows) + `meltano-state-backend`.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os(CACHE_ENV) {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => dirs::cache_dir().map(|d| d.join("meltano-state-backend")),
    }
}

/// How the component was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Loaded from the cache without compiling.
    Hit(PathBuf),
    /// Compiled, and written to the cache for next time.
    Stored(PathBuf),
    /// Compiled in memory only: no cache, or it could not be used (the reason).
    Uncached(String),
}

/// The cache file for `wasm` compiled by `engine`: the component's SHA-256 and wasmtime's
/// compatibility hash (version, configuration, target and CPU features).
pub fn entry(dir: &Path, engine: &Engine, wasm: &[u8]) -> PathBuf {
    let digest = Sha256::digest(wasm);
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let component: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{component}-{:016x}.cwasm", hasher.finish()))
}

/// The component for `wasm`: from the cache in `dir` when there, else compiled (and stored).
pub fn load_or_compile(
    engine: &Engine,
    wasm: &[u8],
    dir: Option<&Path>,
) -> Result<(Component, Outcome)> {
    let Some(dir) = dir else {
        return Ok((compile(engine, wasm)?, Outcome::Uncached("no cache".into())));
    };
    let path = entry(dir, engine, wasm);
    match std::fs::read(&path) {
        // Read into memory rather than mapped (`deserialize_file`): under Wine, wasmtime's
        // file mapping fails ("failed change pages to `PAGE_READONLY`: Access denied"), and
        // copying an entry (1.3 MB) costs a fraction of a millisecond.
        // SAFETY: `deserialize` trusts that the bytes are wasmtime's own output for this
        // engine. The entry was written by this code, into the user's own cache, under a name
        // that holds the compatibility hash; wasmtime checks the version and configuration
        // again, and an entry that fails to load is compiled anew below.
        Ok(bytes) => match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => return Ok((component, Outcome::Hit(path))),
            Err(e) => tracing::debug!("the cached {} does not load: {e:#}", path.display()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::debug!("the cached {} cannot be read: {e}", path.display()),
    }
    let component = compile(engine, wasm)?;
    let outcome = match store(dir, &path, &component) {
        Ok(()) => Outcome::Stored(path),
        Err(e) => Outcome::Uncached(format!("cannot write {}: {e}", path.display())),
    };
    Ok((component, outcome))
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Component> {
    Component::from_binary(engine, wasm)
        .map_err(|e| Error::Component(format!("not a loadable component: {e:#}")))
}

/// Writes the entry whole, then renames it into place.
fn store(dir: &Path, path: &Path, component: &Component) -> std::io::Result<()> {
    let bytes = component.serialize().map_err(std::io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::Builder::new()
        .prefix(".entry-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    file.write_all(&bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}
