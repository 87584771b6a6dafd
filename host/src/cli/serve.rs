//! `state-backend serve --stdio`: one long-lived backend instance answering JSON lines
//! ([`state_host::serve`]) on stdin and stdout, so that another process pays the component's
//! start-up once, not per operation.
//!
//! End of input ends the process (held locks are given back first), and so does SIGINT or
//! SIGTERM (Ctrl-C on Windows): the request in hand is answered, held and kept locks are given
//! back, then the process exits; a second signal exits at once. When the instance cannot
//! start, the first line says why and the process exits with code 2.

use std::io::Write;

use state_host::{Backend, Error};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The first line when the instance could not start: what went wrong and, where known, which
/// setting it is about.
pub fn startup_failure(error: &Error, setting: Option<&str>) {
    // Nothing else to do if stdout is gone: the caller sees the exit code.
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        state_host::serve::failure_line(error, setting)
    );
}

/// Serves requests from stdin until it closes or a signal asks it to stop.
pub async fn serve_stdio(backend: Backend) -> Result<(), Error> {
    let stop = stop_on_signal();
    let lines = BufReader::new(tokio::io::stdin()).lines();
    // Answers are written straight to the pipe: a line of a few KB does not block, and tokio's
    // stdout would hand each write and flush to a blocking thread and back.
    let mut stdout = std::io::stdout().lock();
    let mut write = move |mut line: String| {
        line.push('\n');
        stdout.write_all(line.as_bytes()).is_ok() && stdout.flush().is_ok()
    };
    if !write(state_host::serve::ready_line(&backend)) {
        return backend.close().await;
    }
    state_host::serve::serve(backend, lines, write, stop).await
}

/// Becomes true at the first SIGINT or SIGTERM (Ctrl-C on Windows); the second exits the
/// process at once, with 130. A request in hand is not cut off by the first: the component is
/// never dropped in the middle of a call, whose lock state would be lost.
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if let Err(e) = signalled().await {
            tracing::warn!("cannot listen for signals: {e}");
            return;
        }
        tracing::info!("signal: giving back held locks, then exiting (a second signal exits now)");
        let _ = stop.send(true);
        if signalled().await.is_ok() {
            std::process::exit(130);
        }
    });
    stopped
}

#[cfg(unix)]
async fn signalled() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn signalled() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
