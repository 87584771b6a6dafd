//! One invocation: the sandbox's options from the flags and Meltano's variables, the component
//! loaded and opened, the command run (or `serve` started), and `--timings`.

use std::path::PathBuf;

use clickhouse_state_contract::config::Config;
use serde_json::{Map, Value, json};
use state_host::http::tls::TlsOptions;
use state_host::settings;
use state_host::{Error, Runtime};

use crate::args::Cli;
use crate::commands::{self, Command};
use crate::output::{Failure, exit_code};
use crate::serve;

/// A host option from Meltano's variable for it (`MELTANO_STATE_BACKEND_CLICKHOUSE_<NAME>`), so
/// that the CLI run beside Meltano sees what Meltano's bridge does; the flag and its own
/// variable come first.
fn meltano_option(name: &str) -> Option<String> {
    std::env::var(settings::meltano_variable(name)).ok()
}

fn meltano_path(name: &str) -> Option<PathBuf> {
    meltano_option(name)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// A switch: the flag, or its own variable when that is set (either way, as clap read it),
/// else Meltano's variable.
fn switch(flag: bool, name: &str) -> bool {
    let own_variable = settings::HOST_OPTIONS
        .iter()
        .find(|o| o.name == name)
        .is_some_and(|o| std::env::var_os(o.env).is_some());
    if flag || own_variable {
        return flag;
    }
    meltano_option(name).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "yes" | "on"
        )
    })
}

pub async fn run(cli: Cli) -> Result<Value, Failure> {
    let component = cli
        .component
        .clone()
        .unwrap_or_else(state_host::default_component_path);
    if let Command::Compile { output } = &cli.command {
        return commands::compile(&component, output.clone());
    }
    if let Command::Settings = cli.command {
        return Ok(commands::settings_json());
    }
    if let Command::Methods = cli.command {
        return Ok(json!(state_host::serve::Request::methods()));
    }
    if let Command::Errors = cli.command {
        return Ok(commands::errors_json());
    }
    let options = state_host::serve::single_user_options(
        TlsOptions {
            ca_bundle: cli.ca_bundle.clone().or_else(|| meltano_path("ca_bundle")),
            client_cert: cli
                .client_cert
                .clone()
                .or_else(|| meltano_path("client_cert")),
            client_key: cli
                .client_key
                .clone()
                .or_else(|| meltano_path("client_key")),
        },
        switch(cli.allow_loopback, "allow_loopback"),
        switch(cli.refuse_private, "refuse_private"),
        cli.ignore_proxy_env,
    )?;
    let mut env = settings::from_env(|var| std::env::var(var).ok());
    if cli.uri_from_flag {
        let (kept, dropped) = settings::unstated(env, &cli.uri);
        env = kept;
        for name in dropped {
            tracing::info!("the {name} in the environment is not used: --uri states it");
        }
    }
    let all_settings = settings::layered(env, cli.settings.clone());
    if let Command::Migrate { print: true } = cli.command {
        let config = Config::parse(&cli.uri, &all_settings).map_err(Error::from)?;
        let runtime = Runtime::load(&component, options)?;
        let backend = runtime
            .open_parsed(&config, &cli.uri, all_settings, Default::default())
            .await?;
        return commands::print_migration(&config, backend).await;
    }
    if let Command::Doctor { json, fix } = cli.command {
        let runtime = Runtime::load(&component, options.clone())?;
        let checks = state_host::doctor::run(&runtime, &options, &cli.uri, all_settings, fix).await;
        let passed = state_host::doctor::passed(&checks);
        if json {
            println!("{}", json!(checks));
        } else {
            print!("{}", state_host::doctor::table(&checks));
        }
        return if passed {
            Ok(Value::Null)
        } else {
            Err(Failure::Reported(1))
        };
    }
    if let Command::Serve { .. } = cli.command {
        let backend =
            match state_host::serve::start(&cli.uri, all_settings, &component, options).await {
                Ok(backend) => backend,
                Err((error, setting)) => {
                    serve::startup_failure(&error, setting.as_deref());
                    return Err(Failure::Reported(exit_code(&error)));
                }
            };
        serve::serve_stdio(backend).await?;
        return Ok(Value::Null);
    }
    let mut timings = Timings::new(cli.timings);
    let runtime = Runtime::load(&component, options)?;
    timings.lap("load");
    let mut backend = runtime.open(&cli.uri, all_settings).await?;
    let command: &'static str = (&cli.command).into();
    backend
        .identify(&state_host::this_process(&format!("cli {command}"), "", ""))
        .await?;
    timings.lap("open");
    let output = commands::execute(&mut backend, cli.command).await;
    timings.lap("call");
    let closed = backend.close().await;
    timings.lap("close");
    timings.print();
    let output = output?;
    closed?;
    Ok(output)
}

/// The parts of one command's time (`--timings`), each from the end of the one before.
struct Timings {
    on: bool,
    last: std::time::Instant,
    parts: Map<String, Value>,
}

impl Timings {
    fn new(on: bool) -> Self {
        Timings {
            on,
            last: std::time::Instant::now(),
            parts: Map::new(),
        }
    }

    fn lap(&mut self, part: &str) {
        let now = std::time::Instant::now();
        let ms = (now - self.last).as_secs_f64() * 1000.0;
        self.parts
            .insert(part.into(), json!((ms * 1000.0).round() / 1000.0));
        self.last = now;
    }

    fn print(&self) {
        if self.on {
            eprintln!("{}", json!({ "timings_ms": self.parts }));
        }
    }
}
