//! How a call into an instance ends: a trap becomes the error that says why, and the guest's
//! own error takes what the host saw during the call.

use wasmtime::Store;

use crate::bindings::wit;
use crate::error::{Error, Result};
use crate::state::HostState;

/// The guest's answer as the host's, told apart by what the host saw during the call (see
/// [`Error::with_refusal`], [`Error::with_detail`]).
pub(crate) fn guest_result<T>(
    sandbox: &Store<HostState>,
    result: std::result::Result<T, wit::Error>,
) -> Result<T> {
    result.map_err(|e| {
        let data = sandbox.data();
        Error::from(e)
            .with_refusal(data.took_refusal())
            .with_detail(data.took_detail())
    })
}

/// Ends a call: a trap becomes the error that says why (a panic with its message, the memory
/// limit, the CPU budget, the call deadline), or the trap itself.
pub(crate) fn end_call<R>(
    sandbox: &mut Store<HostState>,
    result: wasmtime::Result<R>,
) -> Result<R> {
    let limits = &mut sandbox.data_mut().limits;
    limits.call_started = None;
    result.map_err(|trap| {
        limits.trapped = true;
        if let Some(message) = limits
            .last_panic
            .take()
            .or_else(|| limits.panic_from_stderr())
        {
            Error::Panicked(message)
        } else if std::mem::take(&mut limits.cpu_hit) {
            Error::Timeout(format!(
                "the component ran its code for more than its CPU budget of {:?} in one call \
                 and was stopped",
                limits.cpu_budget
            ))
        } else if std::mem::take(&mut limits.deadline_hit) {
            Error::Timeout(format!(
                "the component ran past its per-call deadline of {:?} and was stopped",
                limits.call_deadline
            ))
        } else if std::mem::take(&mut limits.memory_denied) {
            Error::Component(
                "the component ran out of memory (its instance limit was reached) and was stopped"
                    .into(),
            )
        } else {
            Error::trap(trap)
        }
    })
}
