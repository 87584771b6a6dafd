//! Errors of the host API: the contract's error variant, plus failures of the component itself.

use crate::bindings::wit;

pub use clickhouse_state_contract::error::WriterInfo;

/// Who holds a lock: the guest's fields, and the holder's process where its host identified it
/// (the backend looks it up, `store.writers`, when a call names a holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub state_id: String,
    pub owner: String,
    pub token: u64,
    pub acquired_at_ms: u64,
    pub expires_at_ms: u64,
    /// Boxed: an error is passed by value everywhere, and most carry no holder.
    pub who: Option<Box<WriterInfo>>,
}

impl LockInfo {
    /// The holder's instance id: its owner's id up to the first `/` (none for an owner that
    /// names no instance, such as the original backend's).
    pub fn instance(&self) -> Option<&str> {
        self.owner.split_once('/').map(|(instance, _)| instance)
    }
}

impl From<clickhouse_state_contract::error::LockInfo> for LockInfo {
    fn from(info: clickhouse_state_contract::error::LockInfo) -> Self {
        LockInfo {
            state_id: info.state_id,
            owner: info.owner,
            token: info.token,
            acquired_at_ms: info.acquired_at_ms,
            expires_at_ms: info.expires_at_ms,
            who: None,
        }
    }
}

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

/// One kind of error as a caller sees it: its name and, where the host knows more, its reason;
/// the CLI's exit code; and what the Meltano adapter raises for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorKind {
    pub kind: &'static str,
    pub reason: Option<&'static str>,
    pub exit_code: u8,
    /// The adapter's exception: `configuration` (Meltano's configuration error, naming the
    /// setting), `locked` (Meltano's `StateIDLockedError`) or `backend` (the adapter's own
    /// `BackendError`, with the kind and the reason).
    pub meltano: &'static str,
    pub doc: &'static str,
}

const fn kind(
    kind: &'static str,
    reason: Option<&'static str>,
    exit_code: u8,
    meltano: &'static str,
    doc: &'static str,
) -> ErrorKind {
    ErrorKind {
        kind,
        reason,
        exit_code,
        meltano,
        doc,
    }
}

const INVALID_CONFIG: ErrorKind = kind(
    "invalid-config",
    None,
    2,
    "configuration",
    "a setting or the URI is wrong (serve's start-up names which)",
);
const INVALID_INPUT: ErrorKind = kind(
    "invalid-input",
    None,
    2,
    "backend",
    "a state id or a state is not what the contract accepts; nothing was written",
);
const UNAUTHORIZED: ErrorKind = kind(
    "unauthorized",
    None,
    3,
    "backend",
    "ClickHouse refused the user or the password",
);
const UNREACHABLE: ErrorKind = kind(
    "unreachable",
    None,
    4,
    "backend",
    "ClickHouse did not answer (after the retries of the retry budget)",
);
const ADDRESS_REFUSED: ErrorKind = kind(
    "unreachable",
    Some("address-refused"),
    4,
    "backend",
    "the sandbox refused the server's address: loopback and private networks are settings",
);
const TIMEOUT: ErrorKind = kind(
    "timeout",
    None,
    4,
    "backend",
    "ClickHouse did not answer in time",
);
const LOCKED: ErrorKind = kind(
    "locked",
    None,
    5,
    "locked",
    "another process held the lock for the whole lock timeout; the error names it",
);
const LOCK_LOST: ErrorKind = kind(
    "lock-lost",
    None,
    5,
    "backend",
    "the lock was forced open or its lease ended before the write",
);
const SERVER: ErrorKind = kind(
    "server",
    None,
    1,
    "backend",
    "ClickHouse answered with an error",
);
const PANICKED: ErrorKind = kind(
    "panicked",
    None,
    1,
    "backend",
    "the component panicked; the instance is replaced",
);
const COMPONENT: ErrorKind = kind(
    "component",
    None,
    1,
    "backend",
    "the component could not be loaded, trapped, or ran out of its limits",
);

/// Every kind of error, once: `state-backend errors` prints it, the CLI's exit codes come from
/// it, and the Meltano adapter's exceptions are generated from it (`just python-tables`).
pub const ERROR_KINDS: &[ErrorKind] = &[
    INVALID_CONFIG,
    INVALID_INPUT,
    UNAUTHORIZED,
    UNREACHABLE,
    ADDRESS_REFUSED,
    TIMEOUT,
    LOCKED,
    LOCK_LOST,
    SERVER,
    PANICKED,
    COMPONENT,
];

fn locked_message(info: &LockInfo) -> String {
    let at = |ms: u64| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
    };
    format!(
        "state '{}' is locked by {} ({}since {}, lease until {}); waited lock_timeout_seconds. \
         The holder keeps it until it gives it back or its lease ends: in fenced mode an \
         update's lease is lock_timeout_seconds (at least 10 s; renewed by the next update, \
         and given back after lock_linger_seconds idle), an explicit lock's \
         lock_lease_seconds (renewed by its holder)",
        info.state_id,
        info.owner,
        // The holder's process, where its host identified it.
        info.who
            .as_ref()
            .map(|who| format!("{who}; "))
            .unwrap_or_default(),
        at(info.acquired_at_ms),
        at(info.expires_at_ms)
    )
}

impl Error {
    /// Its entry in [`ERROR_KINDS`].
    pub fn class(&self) -> &'static ErrorKind {
        match self {
            Error::InvalidConfig(_) => &INVALID_CONFIG,
            Error::InvalidInput(_) => &INVALID_INPUT,
            Error::Unauthorized(_) => &UNAUTHORIZED,
            Error::Unreachable(_) => &UNREACHABLE,
            Error::AddressRefused(_) => &ADDRESS_REFUSED,
            Error::Timeout(_) => &TIMEOUT,
            Error::Locked(_) => &LOCKED,
            Error::LockLost(_) => &LOCK_LOST,
            Error::Server { .. } => &SERVER,
            Error::Panicked(_) => &PANICKED,
            Error::Component(_) => &COMPONENT,
        }
    }

    /// A short name of the kind, for machine-readable output.
    pub fn kind(&self) -> &'static str {
        self.class().kind
    }

    /// Why, where the host knows more than the kind: `address-refused` when its own egress
    /// policy refused the address (loopback, link-local, a private network, cloud metadata).
    pub fn reason(&self) -> Option<&'static str> {
        self.class().reason
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

impl From<clickhouse_state_contract::error::Error> for Error {
    fn from(error: clickhouse_state_contract::error::Error) -> Self {
        use clickhouse_state_contract::error::Error as G;
        match error {
            G::InvalidConfig(m) => Error::InvalidConfig(m),
            G::InvalidInput(m) => Error::InvalidInput(m),
            G::Unauthorized(m) => Error::Unauthorized(m),
            G::Unreachable(m) | G::Refused(m) => Error::Unreachable(m),
            G::Timeout(m) => Error::Timeout(m),
            G::Locked(info) => Error::Locked(info.into()),
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
        who: None,
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant.
    fn every_variant() -> Vec<Error> {
        let info = LockInfo {
            state_id: "s".into(),
            owner: "o".into(),
            token: 1,
            acquired_at_ms: 0,
            expires_at_ms: 0,
            who: None,
        };
        vec![
            Error::InvalidConfig(String::new()),
            Error::InvalidInput(String::new()),
            Error::Unauthorized(String::new()),
            Error::Unreachable(String::new()),
            Error::AddressRefused(String::new()),
            Error::Timeout(String::new()),
            Error::Locked(info),
            Error::LockLost(String::new()),
            Error::Server {
                code: 1,
                name: String::new(),
                message: String::new(),
            },
            Error::Panicked(String::new()),
            Error::Component(String::new()),
        ]
    }

    #[test]
    fn each_error_is_one_row_of_the_table_and_each_row_is_some_error() {
        let classes: Vec<&ErrorKind> = every_variant().iter().map(|e| e.class()).collect();
        assert_eq!(classes.len(), ERROR_KINDS.len());
        for row in ERROR_KINDS {
            assert_eq!(classes.iter().filter(|c| **c == row).count(), 1, "{row:?}");
            assert!(["configuration", "locked", "backend"].contains(&row.meltano));
        }
        // A kind keeps one exit code whatever its reason.
        for a in ERROR_KINDS {
            for b in ERROR_KINDS.iter().filter(|b| b.kind == a.kind) {
                assert_eq!(a.exit_code, b.exit_code, "{}", a.kind);
            }
        }
    }
}
