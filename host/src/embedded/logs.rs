//! The host's log in the caller's process: each line goes to the sink the caller set
//! (`sb_set_log_sink`: Meltano's bridge passes it to Meltano's logging as it comes, so that a
//! retry shows while the call that retries is still waiting), else to stderr as the CLI's does.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Takes one line of the log (its bytes, without a trailing newline), on whichever thread
/// logged it; it must not call back into the library.
pub type Sink = extern "C" fn(*const u8, usize);

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Sends the log's lines to `sink` from now on; `None`: to stderr.
pub fn set_sink(sink: Option<Sink>) {
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = sink;
}

/// Logs at `level` (as `state-backend --log` takes it) from now on: the level of the instance
/// opened last, as the bridge's logger's level was then.
pub fn init(level: &str) {
    static FILTER: OnceLock<Option<reload::Handle<EnvFilter, Registry>>> = OnceLock::new();
    let handle = FILTER.get_or_init(|| {
        let (filter, handle) = reload::Layer::new(filter(level));
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(|| Line)
            .with_ansi(false);
        // Another global subscriber in the process (an embedding application's) wins.
        tracing_subscriber::registry()
            .with(filter)
            .with(layer)
            .try_init()
            .ok()
            .map(|()| handle)
    });
    if let Some(handle) = handle {
        let _ = handle.reload(filter(level));
    }
}

fn filter(level: &str) -> EnvFilter {
    // wasmtime-wasi-http warns about every refused connection; the error says it already.
    EnvFilter::try_new(format!("{level},wasmtime_wasi_http=error"))
        .unwrap_or_else(|_| EnvFilter::new("warn"))
}

/// One event: the formatter writes each event whole, in one write.
struct Line;

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let sink = *SINK.lock().unwrap_or_else(|e| e.into_inner());
        match sink {
            Some(sink) => {
                let line = buf.strip_suffix(b"\n").unwrap_or(buf);
                sink(line.as_ptr(), line.len());
            }
            None => {
                let _ = std::io::stderr().write_all(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
