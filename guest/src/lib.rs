//! The ClickHouse state backend for Meltano, as a WebAssembly component.
//!
//! The IO of the protocol: the component's binding, the session, the HTTP client, the SQL each
//! statement becomes, and the store. Every decision the lock and the writes make is the
//! protocol's (`clickhouse-state-protocol`, sans IO), which the model runs too; the
//! configuration, settings, URI, errors and Meltano's merge come from
//! `clickhouse-state-contract`, which the host shares.
//!
//! Everything but `component` and `wasi_http` is plain Rust: it compiles natively and
//! unit-tests natively.

pub use clickhouse_state_contract::{config, error, events, merge, settings, uri};

pub mod doctor;
pub mod glob;
pub mod history;
pub mod http;
pub mod landing;
pub mod lock;
pub mod rows;
pub mod session;
pub mod sql;
pub mod store;

#[cfg(target_arch = "wasm32")]
mod bindings;
#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod wasi_http;
