//! Host of the ClickHouse state backend component: load it once, make instances, call the
//! contract as plain async Rust.
//!
//! ```no_run
//! # async fn demo() -> Result<(), state_host::Error> {
//! use state_host::{Runtime, RuntimeOptions, State};
//! let runtime = Runtime::load(&state_host::default_component_path(), RuntimeOptions::default())?;
//! let mut backend = runtime
//!     .open("clickhouse://default:@127.0.0.1:8123/default", vec![])
//!     .await?;
//! backend.set(&State::completed("dev:tap-a-to-target-b", r#"{"singer_state":{}}"#)).await?;
//! # Ok(()) }
//! ```

mod backend;
mod bindings;
pub mod cache;
mod call_end;
pub mod clock;
pub mod doctor;
#[cfg(feature = "embedded")]
pub mod embedded;
mod engine;
mod error;
pub mod history;
pub mod http;
mod limits;
mod linker;
mod records;
mod runtime;
pub mod serve;
pub mod settings;
mod state;
pub mod telemetry;

pub use backend::{Backend, Lock};
pub use engine::WASMTIME_VERSION;
pub use error::{ERROR_KINDS, Error, ErrorKind, LockInfo, Result, WriterInfo};
pub use limits::{CpuShare, HeldBack};
pub use linker::LINKED as LINKED_INTERFACES;
pub use records::{HistoryEntry, Point, Restored, State, this_process, who_json};
pub use runtime::{
    COMPONENT_ENV, COMPONENT_FILE, DEFAULT_CPU_BUDGET, InstanceOptions, Runtime, RuntimeOptions,
    default_component_path,
};
