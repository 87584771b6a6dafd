//! The ClickHouse state backend's protocol, sans IO, as quinn-proto is QUIC's: every decision
//! the lock and the state writes make, with no HTTP, no SQL text and no WebAssembly.
//!
//! Each machine says what to send (a statement, named by what it does), when to pause and when
//! it is done, and takes the answers. The guest (`guest/`) drives them over ClickHouse's HTTP
//! interface, turning each statement into its SQL; the model (`model/`) drives the very same
//! machines through a simulated replicated ClickHouse.
//!
//! - [`update`]: a fenced `update`, in one round trip in steady state, one file per phase.
//! - [`fenced`]: the fenced lock's rules: claims, the log's fold, the fence.
//! - [`settle`]: the original Python backend's lock protocol.
//! - [`set`]: an unlocked `set`, conditional on what is stored.
//! - [`guard`]: what a guarded write requires (the Rust twin of the SQL guard).
//! - [`deployment`], [`pinned`], [`role`]: what each deployment kind requires of reads and
//!   writes.
//! - [`grant`], [`rows`], [`wait`], [`retry`], [`env`](mod@env): what those decide on and with.

pub use clickhouse_state_contract::{config, error, events, merge};

pub mod deployment;
pub mod env;
pub mod fenced;
pub mod grant;
pub mod guard;
pub mod pinned;
pub mod retry;
pub mod role;
pub mod rows;
pub mod set;
pub mod settle;
pub mod update;
pub mod wait;
