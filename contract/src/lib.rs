//! What a caller hands the component, and what it gets back when that is wrong: the settings
//! (one table), the URI, the configuration parsed from both, and the contract's errors. And
//! what the contract's `update` means: Meltano's merge of a state's parts.
//!
//! The guest and the host share it: the host parses the configuration once (to allow exactly
//! the endpoint the guest will call, and to name a bad setting at start-up), the guest once on
//! its side, and neither carries a copy of the other's rules.

pub mod config;
pub mod error;
pub mod events;
pub mod merge;
pub mod settings;
pub mod uri;
mod values;
