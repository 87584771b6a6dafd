//! The integration tests, one binary with a module per concern: the component is compiled once
//! for all of them, the binary linked once, and their waits overlap.
//!
//! Two suites have binaries of their own: `tripwire.rs` trips the host's tripwire on purpose,
//! and the tripwire is process-global, so here it would fail every refusal test's
//! `assert_no_trips`; `outage.rs` stops and restarts ClickHouse servers of its own for minutes,
//! and runs beside this binary (`just test`).

/// After the last test, whichever it was: nothing in this binary tripped the host's tripwire
/// (a refusal test asserts it too, right after its refusal). A trip fails the run, even one in a
/// test that did not look.
#[dtor::dtor(unsafe)]
fn nothing_tripped_the_tripwire() {
    use std::io::Write as _;
    let trips = integration_tests::state_host::http::tripwire::trips();
    if !trips.is_empty() {
        // No eprintln!: the standard library may have shut its stderr down by now.
        let _ = writeln!(
            std::io::stderr(),
            "the tripwire was hit during this run:\n{}",
            trips.join("\n")
        );
        std::process::abort();
    }
}

mod common;

mod bad_input;
mod budgets;
mod cli;
mod clickhouse_crate;
mod compile_cache;
mod conformance;
mod deployment;
mod docs;
mod docs_figures;
mod doctor;
mod embedded;
mod escaping;
mod evil;
mod faults;
mod history;
mod imports;
mod landing;
mod layout;
mod linger;
mod lock;
mod operations;
mod restart;
mod run_hold;
mod sandbox;
mod secrets;
mod settle;
mod statements;
mod telemetry;
mod tls;
mod who;
