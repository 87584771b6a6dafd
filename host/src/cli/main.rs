//! `state-backend`: Meltano's `meltano state` commands, run through the component.

// The doc comments of the CLI's types are its `--help` text, written for a terminal (`[seq]`,
// `{"<id>": ...}`), not rustdoc markdown.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

mod args;
mod commands;
mod output;
mod run;
mod serve;
mod state_json;
mod versions;

fn main() -> ExitCode {
    let matches = args::Cli::command().get_matches();
    let mut cli = match args::Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    cli.uri_from_flag = matches.value_source("uri") == Some(ValueSource::CommandLine);
    // wasmtime-wasi-http warns about every refused connection; the error line says it already.
    let filter = format!("{},wasmtime_wasi_http=error", cli.log);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run::run(cli));
    // Without waiting for the thread that reads stdin: `serve`, stopped by a signal, would
    // otherwise exit only once its input ends.
    runtime.shutdown_background();
    // What the exporter has left goes before the process ends.
    state_host::telemetry::shutdown_process();
    output::finish(result)
}
