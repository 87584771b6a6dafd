//! How a command's outcome reaches the terminal: JSON on stdout, or one line on stderr and an
//! exit code.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;
use state_host::Error;

/// A failure of the CLI itself, or of the backend.
pub enum Failure {
    Usage(String),
    Backend(Error),
    /// Already reported (on stdout, by `serve`); exit with this code and say nothing more.
    Reported(u8),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Backend(e)
    }
}

/// Prints what `run` gave and says how the process exits.
pub fn finish(result: Result<Value, Failure>) -> ExitCode {
    match result {
        Ok(Value::Null) => ExitCode::SUCCESS,
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            let written = serde_json::to_writer_pretty(&mut stdout, &output)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(stdout));
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Reported(code)) => ExitCode::from(code),
        Err(Failure::Backend(error)) => {
            eprintln!("error: {}{}", one_line(&error.to_string()), hint(&error));
            ExitCode::from(exit_code(&error))
        }
    }
}

pub fn exit_code(error: &Error) -> u8 {
    error.class().exit_code
}

/// What to do about an error, where the CLI knows the flag that fixes it.
fn hint(error: &Error) -> &'static str {
    match error {
        // The sandbox refused a special address (see `http::policy`): a local ClickHouse is loopback.
        Error::AddressRefused(_) => {
            " (to reach a ClickHouse on this machine, pass --allow-loopback; private networks are \
             refused under --refuse-private)"
        }
        _ => "",
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Progress for bulk commands, on stderr, when a person is watching.
pub fn progress(message: &str) {
    if std::io::stderr().is_terminal() {
        eprintln!("{message}");
    }
}
