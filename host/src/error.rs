//! Errors of the host API: the contract's error variant, plus failures of the component itself.

use crate::bindings::wit;

/// Who holds a lock: the guest's own type, so both sides speak of it the same way.
pub use clickhouse_state::error::LockInfo;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Unreachable because this host's egress policy refused the destination's address (a
    /// `unreachable` error to the caller, whose `reason` says so): the fix is a setting.
    #[error("unreachable: {0}")]
    AddressRefused(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("{}", locked_message(.0))]
    Locked(LockInfo),
    #[error("lock lost: {0}")]
    LockLost(String),
    #[error("ClickHouse error {code} ({name}): {message}")]
    Server {
        code: i32,
        name: String,
        message: String,
    },
    /// The component panicked; the message is the guest's.
    #[error("the component panicked: {0}")]
    Panicked(String),
    /// The component could not be loaded, or trapped.
    #[error("component failure: {0}")]
    Component(String),
}

fn locked_message(info: &LockInfo) -> String {
    let at = |ms: u64| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
    };
    format!(
        "state '{}' is locked by {} (since {}, lease until {}); waited lock_timeout_seconds. \
         The holder keeps it until it gives it back or its lease ends: in fenced mode an \
         update's lease is lock_timeout_seconds (at least 10 s; renewed by the next update, \
         and given back after lock_linger_seconds idle), an explicit lock's \
         lock_lease_seconds (renewed by its holder)",
        info.state_id,
        info.owner,
        at(info.acquired_at_ms),
        at(info.expires_at_ms)
    )
}

impl Error {
    /// A short name of the kind, for machine-readable output.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidConfig(_) => "invalid-config",
            Error::InvalidInput(_) => "invalid-input",
            Error::Unauthorized(_) => "unauthorized",
            Error::Unreachable(_) | Error::AddressRefused(_) => "unreachable",
            Error::Timeout(_) => "timeout",
            Error::Locked(_) => "locked",
            Error::LockLost(_) => "lock-lost",
            Error::Server { .. } => "server",
            Error::Panicked(_) => "panicked",
            Error::Component(_) => "component",
        }
    }

    /// Why, where the host knows more than the kind: `address-refused` when its own egress
    /// policy refused the address (loopback, link-local, a private network, cloud metadata).
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Error::AddressRefused(_) => Some("address-refused"),
            _ => None,
        }
    }

    /// This error, told apart by what the host saw during the call: `refused` when its egress
    /// policy refused an address.
    pub(crate) fn with_refusal(self, refused: bool) -> Self {
        match self {
            Error::Unreachable(m) if refused => Error::AddressRefused(m),
            other => other,
        }
    }

    /// The host's account of the last request's failure after the guest's message, which names
    /// only its wasi:http code (a certificate's rejection reason, what came back instead of
    /// HTTP). Only an unreachable server's message gets it: the request that failed last is
    /// the one such an error reports.
    pub(crate) fn with_detail(self, detail: Option<String>) -> Self {
        match (self, detail) {
            (Error::Unreachable(m), Some(detail)) => Error::Unreachable(format!("{m}; {detail}")),
            (other, _) => other,
        }
    }

    pub(crate) fn trap(error: wasmtime::Error) -> Self {
        Error::Component(format!("{error:#}"))
    }
}

impl From<wit::Error> for Error {
    fn from(error: wit::Error) -> Self {
        match error {
            wit::Error::InvalidConfig(m) => Error::InvalidConfig(m),
            wit::Error::InvalidInput(m) => Error::InvalidInput(m),
            wit::Error::Unauthorized(m) => Error::Unauthorized(m),
            wit::Error::Unreachable(m) => Error::Unreachable(m),
            wit::Error::Timeout(m) => Error::Timeout(m),
            wit::Error::Locked(info) => Error::Locked(info_from_wit(info)),
            wit::Error::LockLost(m) => Error::LockLost(m),
            wit::Error::Server(e) => Error::Server {
                code: e.code,
                name: e.name,
                message: e.message,
            },
        }
    }
}

impl From<clickhouse_state::error::Error> for Error {
    fn from(error: clickhouse_state::error::Error) -> Self {
        use clickhouse_state::error::Error as G;
        match error {
            G::InvalidConfig(m) => Error::InvalidConfig(m),
            G::InvalidInput(m) => Error::InvalidInput(m),
            G::Unauthorized(m) => Error::Unauthorized(m),
            G::Unreachable(m) | G::Refused(m) => Error::Unreachable(m),
            G::Timeout(m) => Error::Timeout(m),
            G::Locked(info) => Error::Locked(info),
            G::LockLost(m) => Error::LockLost(m),
            G::Server(e) => Error::Server {
                code: e.code,
                name: e.name,
                message: e.message,
            },
        }
    }
}

/// The contract's lock info as the host's.
pub(crate) fn info_from_wit(info: wit::LockInfo) -> LockInfo {
    LockInfo {
        state_id: info.state_id,
        owner: info.owner,
        token: info.token,
        acquired_at_ms: info.acquired_at_ms,
        expires_at_ms: info.expires_at_ms,
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
