//! The ClickHouse state backend for Meltano, as a WebAssembly component.
//!
//! Everything but `component` and `wasi_http` is plain Rust: it compiles natively and
//! unit-tests natively. The configuration, settings, URI, errors and Meltano's merge come from
//! `clickhouse-state-contract`, which the host shares.

pub use clickhouse_state_contract::{config, error, merge, settings, uri};

pub mod deployment;
pub mod glob;
pub mod history;
pub mod http;
pub mod landing;
pub mod lock;
pub mod pinned;
pub mod retry;
pub mod rows;
pub mod session;
pub mod set;
pub mod sql;
pub mod store;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod wasi_http;
