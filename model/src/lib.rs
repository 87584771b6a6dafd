//! A model of the lock and state protocol on ClickHouse, checked exhaustively by `stateright`.
//!
//! The clients run the protocol crate's machines, the very ones the guest drives: each
//! `update` is a `protocol::update::Update`, the sans-IO state machine the component drives
//! over HTTP, and every statement it asks for is answered here by a simulated ClickHouse. Reads
//! of the lock log are folded by `fenced::fold` and `fenced::claims_on` (the Rust twins of the
//! guest's SQL), guarded writes are admitted by `guard::admits`, and whether inserts reach every
//! deciding read comes from the deployment's settings (`deployment::Consistency`). Unlocked
//! `set`s are `set::Set`, and settle mode's tries `settle::Try`. The model depends on the
//! protocol crate alone, not on the guest. The model owns only the world:
//!
//! - **Time.** One global time; each client reads it through its own clock, off by up to
//!   `skew`. Time advances by a step of its own, between any two other steps, so any client can
//!   stall anywhere for any length of time (up to the horizon).
//! - **Inserts.** An insert is sent, lands (becomes visible), and is acknowledged, as three
//!   steps, with anything in between. A response can be lost after the insert landed: the
//!   client sends the identical insert again under the same token, as the guest's retries do,
//!   unless its retry bound has passed. A client can also give up on an insert (its retries
//!   ran out) while the server still finishes it: the insert may land later.
//! - **Guarded writes.** The guard is evaluated when the write is sent (and again when a lost
//!   response makes the client send it again); the row lands later, so a contender can act in
//!   between, as on a real server.
//! - **Deduplication.** Keeper's token set, cluster-wide and atomic: an insert whose token is in
//!   the window is dropped and still acknowledged. The window can pass (its tokens are
//!   forgotten), so that a retry lands twice.
//! - **Replicas.** With quorum inserts and sequentially consistent deciding reads (the
//!   settings of a replicated deployment), a landed insert is visible to every deciding read.
//!   Without them an insert lands on one replica, reaches the others later, and each read is
//!   answered by any one replica.
//! - **Merges.** State is read with `FINAL` (highest version; equal versions, the last
//!   inserted), which is what a merge keeps, so merges change no answer.
//!   The lock log is a plain MergeTree: merges never drop its rows.
//!
//! Each client makes `updates` updates; with more than one, the grant is kept between them
//! (linger) and given back at the end, as the host's `close` does.
//!
//! One module per part: [`bounds`] (what one check explores), [`world`] (the rows, inserts in
//! flight, clients and the facts properties read), `clients` (the guest's update and settle
//! machines, driven), `setters` (unlocked `set`s), `merges`, `checker` (stateright's `Model`:
//! actions and their effects) and [`properties`] (what each check holds to).

pub mod bounds;
mod checker;
mod clients;
mod merges;
pub mod properties;
mod setters;
pub mod world;

pub use bounds::*;
pub use properties::*;
pub use world::*;
