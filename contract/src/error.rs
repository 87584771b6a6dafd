//! The guest's error type: the WIT `error` variant as plain Rust.

use std::fmt;

/// Who holds a lock, as reported in a `locked` error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockInfo {
    pub state_id: String,
    pub owner: String,
    pub token: u64,
    pub acquired_at_ms: u64,
    pub expires_at_ms: u64,
}

/// Who a writing process is, as its host identified it (WIT `writer-info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterInfo {
    pub run_id: String,
    pub command: String,
    pub host: String,
    pub pid: u32,
    pub meltano_version: String,
    pub backend_version: String,
}

impl fmt::Display for WriterInfo {
    /// `host NAME, pid N, run ID (COMMAND)`, leaving out what is unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.host.is_empty() {
            parts.push(format!("host {}", self.host));
        }
        if self.pid != 0 {
            parts.push(format!("pid {}", self.pid));
        }
        if !self.run_id.is_empty() {
            parts.push(format!("run {}", self.run_id));
        }
        if !self.command.is_empty() {
            parts.push(format!("`{}`", self.command));
        }
        f.write_str(&parts.join(", "))
    }
}

/// An error from ClickHouse itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerError {
    pub code: i32,
    pub name: String,
    pub message: String,
}

/// Every failure of the backend. Messages never carry a password: the HTTP client redacts it
/// from anything the server sends back, and nothing else ever formats it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Error {
    InvalidConfig(String),
    InvalidInput(String),
    Unauthorized(String),
    Unreachable(String),
    /// Unreachable, and trying again will not help: the host's policy refused the request, or
    /// TLS or HTTP failed with the peer (reported as `unreachable` through the contract, but
    /// never retried).
    Refused(String),
    Timeout(String),
    Locked(LockInfo),
    LockLost(String),
    Server(ServerError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// ClickHouse error codes worth another try: TOO_MANY_SIMULTANEOUS_QUERIES, SOCKET_TIMEOUT,
/// TABLE_IS_READ_ONLY, TOO_MANY_PARTS, UNKNOWN_STATUS_OF_INSERT, TIMEOUT_EXCEEDED,
/// KEEPER_EXCEPTION, ALL_CONNECTION_TRIES_FAILED, NETWORK_ERROR, MEMORY_LIMIT_EXCEEDED, and the
/// quorum's: TOO_FEW_LIVE_REPLICAS, UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE (another quorum
/// insert is pending), REPLICA_IS_NOT_IN_QUORUM (this replica lacks the last quorum insert yet).
const TRANSIENT_CODES: &[i32] = &[
    202, 209, 242, 252, 319, 159, 999, 279, 210, 241, 285, 286, 289,
];

impl Error {
    /// Failures that another try may not see: the network, the server's load, a restart.
    /// Denials, bad input, authentication and SQL errors are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable(_) | Error::Timeout(_) => true,
            Error::Server(e) => {
                TRANSIENT_CODES.contains(&e.code)
                    || matches!(
                        e.name.as_str(),
                        "HTTP_429" | "HTTP_502" | "HTTP_503" | "HTTP_504"
                    )
            }
            _ => false,
        }
    }

    /// The same error, saying how long it was tried and why the tries stopped.
    pub fn gave_up(self, why: &str) -> Error {
        match self {
            Error::Unreachable(m) => Error::Unreachable(format!("{m} ({why})")),
            Error::Timeout(m) => Error::Timeout(format!("{m} ({why})")),
            Error::Server(mut e) => {
                e.message = format!("{} ({why})", e.message);
                Error::Server(e)
            }
            other => other,
        }
    }

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
            Error::Unreachable(m) | Error::Refused(m) => write!(f, "unreachable: {m}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: i32, name: &str) -> Error {
        Error::Server(ServerError {
            code,
            name: name.into(),
            message: String::new(),
        })
    }

    #[test]
    fn transient_and_permanent_failures() {
        assert!(Error::Unreachable("refused".into()).is_transient());
        assert!(Error::Timeout("slow".into()).is_transient());
        for code in [202, 209, 242, 252, 319, 285, 286, 289] {
            assert!(server(code, "X").is_transient(), "{code}");
        }
        assert!(server(0, "HTTP_503").is_transient());
        assert!(!server(62, "SYNTAX_ERROR").is_transient());
        assert!(!server(60, "UNKNOWN_TABLE").is_transient());
        assert!(!Error::Unauthorized("no".into()).is_transient());
        assert!(!Error::Refused("no".into()).is_transient());
        assert!(!Error::InvalidInput("bad".into()).is_transient());
    }
}
