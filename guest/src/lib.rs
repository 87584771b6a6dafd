//! The ClickHouse state backend for Meltano, as a WebAssembly component.
//!
//! Everything but `component` and `wasi_http` is plain Rust: it compiles natively, unit-tests
//! natively, and the host reuses `config` to decide which authority the guest may reach.

pub mod config;
pub mod deployment;
pub mod error;
pub mod glob;
pub mod http;
pub mod lock;
pub mod merge;
pub mod retry;
pub mod rows;
pub mod session;
pub mod set;
pub mod settings;
pub mod sql;
pub mod store;
pub mod uri;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod wasi_http;
