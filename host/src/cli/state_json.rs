//! A state as the CLI reads it from the user and prints it.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use clap::Args;
use serde_json::{Map, Value, json};
use state_host::{Error, State};

use crate::output::Failure;

#[derive(Args)]
pub struct StateInput {
    /// The state as JSON; omit it to read --input-file or stdin
    pub json: Option<String>,
    /// Read the state from this file
    #[arg(long, conflicts_with = "json")]
    pub input_file: Option<PathBuf>,
}

/// What Meltano hands a tap: the partial state merged over the completed one.
pub fn merged_view(state: &State) -> Result<Value, Failure> {
    let mut completed = object(&state.completed)?;
    clickhouse_state_contract::merge::merge(object(&state.partial)?, &mut completed);
    Ok(Value::Object(completed))
}

pub fn parts(state: &State) -> Result<Value, Failure> {
    Ok(json!({"completed": object(&state.completed)?, "partial": object(&state.partial)?}))
}

pub fn object(text: &str) -> Result<Map<String, Value>, Failure> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Failure::Backend(Error::Server {
            code: 0,
            name: "CORRUPT_STATE".into(),
            message: "a stored state part is not a JSON object".into(),
        })),
    }
}

pub fn read_state(input: &StateInput) -> Result<Value, Failure> {
    let text = match (&input.json, &input.input_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))?,
        (None, None) => read_stdin()?,
    };
    serde_json::from_str(&text).map_err(|e| {
        Failure::Backend(Error::InvalidInput(format!(
            "the state is not valid JSON: {e}"
        )))
    })
}

/// Meltano's own check on `state set` and `state merge`.
pub fn validate_singer_state(document: &Value) -> Result<(), Failure> {
    match document {
        Value::Object(map) if map.contains_key("singer_state") => Ok(()),
        Value::Object(_) => Err(Failure::Backend(Error::InvalidInput(
            "singer_state not found in top level of provided state".into(),
        ))),
        _ => Err(Failure::Backend(Error::InvalidInput(
            "the state must be a JSON object".into(),
        ))),
    }
}

pub fn read_stdin() -> Result<String, Failure> {
    if std::io::stdin().is_terminal() {
        eprintln!("reading JSON from stdin (end with Ctrl-D)...");
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| Failure::Usage(format!("cannot read stdin: {e}")))?;
    Ok(text)
}
