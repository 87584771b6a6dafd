//! Where the benchmarks find the repository and the host they measure.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `state-backend` host, release build first.
pub fn host_binary() -> PathBuf {
    ["release", "debug"]
        .iter()
        .map(|profile| root().join("target").join(profile).join("state-backend"))
        .find(|path| path.exists())
        .expect("no state-backend built: run `cargo build --release -p meltano-state-host`")
}
