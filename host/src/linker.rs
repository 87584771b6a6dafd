//! The component's imports, linked one interface at a time: this list is everything a guest can
//! call. No filesystem, no sockets, no wall clock: a guest reaches the world through wasi:http
//! (and the policy in `http`) and learns the time from `meltano:state-backend/clock`, which the
//! host controls. A test holds the list to what the component imports.

use wasmtime::Engine;
use wasmtime::component::{HasData, HasSelf, Linker, ResourceTable};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
use wasmtime_wasi::p2::bindings::{cli, clocks, io, random};
use wasmtime_wasi::random::{WasiRandom, WasiRandomView as _};

use crate::bindings::meltano::state_backend::{clock, log};
use crate::error::{Error, Result};
use crate::state::HostState;

/// The interfaces the host links into every instance (without versions).
pub const LINKED: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:http/types",
    "wasi:http/outgoing-handler",
    "meltano:state-backend/types",
    "meltano:state-backend/clock",
    "meltano:state-backend/log",
];

/// wasi:io's resources live in the instance's resource table.
struct Table;

impl HasData for Table {
    type Data<'a> = &'a mut ResourceTable;
}

pub fn linker(engine: &Engine) -> Result<Linker<HostState>> {
    let mut linker: Linker<HostState> = Linker::new(engine);
    link(&mut linker).map_err(Error::trap)?;
    Ok(linker)
}

fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    // The streams and pollables that wasi:http's bodies and futures are made of.
    io::error::add_to_linker::<HostState, Table>(l, |s| s.ctx().table)?;
    io::poll::add_to_linker::<HostState, Table>(l, |s| s.ctx().table)?;
    io::streams::add_to_linker::<HostState, Table>(l, |s| s.ctx().table)?;
    // Timeouts of wasi:http and std's `Instant`: a monotonic clock only.
    clocks::monotonic_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    // Insert tokens and lock owners; std's hash seeds.
    random::random::add_to_linker::<HostState, WasiRandom>(l, HostState::random)?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, HostState::random)?;
    // What Rust's std imports on wasip2: an empty environment, exit, stdio (stdin empty, stdout
    // discarded, stderr a small buffer: see `state`), no terminals.
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    // wasi:http/types and outgoing-handler; every request goes through `http::hook`.
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(l)?;
    // Ours: the host's clock (tests drive it) and its log.
    clock::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    log::add_to_linker::<_, HasSelf<_>>(l, |s| s)?;
    Ok(())
}
