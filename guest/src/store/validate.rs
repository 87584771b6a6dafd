//! What a state id and a state may be: checked before anything is sent.

use super::State;
use crate::error::{Error, Result};
use crate::merge::parse_object;

/// Longest state id accepted, in bytes.
pub const MAX_STATE_ID_BYTES: usize = 4096;

/// Largest state accepted (partial and completed together), in bytes. A Singer state is
/// bookmarks; megabytes of it are a bug upstream, and the cap keeps every copy well inside the
/// instance's memory limit.
pub const MAX_STATE_BYTES: usize = 8 << 20;

pub(super) fn validate_size(state: &State) -> Result<()> {
    let size = state.partial.len() + state.completed.len();
    if size > MAX_STATE_BYTES {
        return Err(Error::InvalidInput(format!(
            "the state of {:?} is {size} bytes; at most {MAX_STATE_BYTES} are accepted",
            state.state_id
        )));
    }
    Ok(())
}

pub fn validate_state_id(state_id: &str) -> Result<()> {
    if state_id.is_empty() {
        return Err(Error::InvalidInput("the state id is empty".into()));
    }
    if state_id.len() > MAX_STATE_ID_BYTES {
        return Err(Error::InvalidInput(format!(
            "the state id is {} bytes long; at most {MAX_STATE_ID_BYTES} are allowed",
            state_id.len()
        )));
    }
    Ok(())
}

pub(super) fn validate_state(state: &State) -> Result<()> {
    validate_state_id(&state.state_id)?;
    validate_size(state)?;
    parse_object(&state.partial, "partial state")?;
    parse_object(&state.completed, "completed state")?;
    Ok(())
}
