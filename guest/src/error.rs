//! The guest's error type: the WIT `error` variant as plain Rust.

use std::fmt;

/// Who holds a lock, as reported in a `locked` error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub state_id: String,
    pub owner: String,
    pub token: u64,
    pub acquired_at_ms: u64,
    pub expires_at_ms: u64,
}

/// An error from ClickHouse itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub code: i32,
    pub name: String,
    pub message: String,
}

/// Every failure of the backend. Messages never carry a password: the HTTP client redacts it
/// from anything the server sends back, and nothing else ever formats it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    InvalidConfig(String),
    InvalidInput(String),
    Unauthorized(String),
    Unreachable(String),
    Timeout(String),
    Locked(LockInfo),
    LockLost(String),
    Server(ServerError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// ClickHouse's code for "the table or database is not there".
    pub fn is_missing_schema(&self) -> bool {
        matches!(self, Error::Server(e) if e.code == 60 || e.code == 81)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig(m) => write!(f, "invalid configuration: {m}"),
            Error::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Error::Unauthorized(m) => write!(f, "unauthorized: {m}"),
            Error::Unreachable(m) => write!(f, "unreachable: {m}"),
            Error::Timeout(m) => write!(f, "timeout: {m}"),
            Error::Locked(info) => write!(
                f,
                "state '{}' is locked by {} (since {} ms)",
                info.state_id, info.owner, info.acquired_at_ms
            ),
            Error::LockLost(m) => write!(f, "lock lost: {m}"),
            Error::Server(e) => {
                write!(f, "ClickHouse error {} ({}): {}", e.code, e.name, e.message)
            }
        }
    }
}

impl std::error::Error for Error {}
