//! Query execution: the configuration, the statements, the HTTP client, retries, insert tokens
//! and the [`Host`] the guest asks for time, randomness and a log. The store's operations and the
//! lock protocols both run their queries through an [`Exec`]; neither reaches into the other.

use std::cell::Cell;

use crate::config::Config;
use crate::deployment::{self, Consistency, Kind, Observed};
use crate::error::{Error, Result};
use crate::http::{Answer, Client, Transport};
use crate::rows::{self, Decode, FromRow};
use crate::sql::{Query, Read, Statements};

/// What the guest asks of its host besides HTTP: time, randomness and a log.
pub trait Host {
    fn now_ms(&self) -> u64;
    fn sleep_ms(&self, ms: u64);
    fn random_u128(&self) -> u128;
    fn log(&self, level: Level, message: &str);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Runs this store's queries against its ClickHouse.
pub struct Exec<T, H> {
    pub config: Config,
    pub sql: Statements,
    client: Client<T>,
    pub host: H,
    /// The deployment check passed (see `deployment`); it runs once per instance.
    checked: Cell<bool>,
    /// The settings queries carry on this deployment: assumed from the configuration until the
    /// check has seen the tables.
    consistency: Cell<Consistency>,
}

impl<T: Transport, H: Host> Exec<T, H> {
    pub fn open(uri: &str, settings: &[(String, String)], transport: T, host: H) -> Result<Self> {
        let config = Config::parse(uri, settings)?;
        Ok(Exec {
            sql: Statements::new(&config),
            client: Client::new(&config, transport),
            host,
            checked: Cell::new(false),
            consistency: Cell::new(Consistency::assumed(&config)),
            config,
        })
    }

    /// Runs a query, retrying transient failures (network, server load, a restart) with
    /// back-off on the host's clock. Every statement this backend sends is safe to send again:
    /// reads trivially, and each write carries its own deduplication token and version, so a
    /// retry of a write that did land stores the same row again or nothing (see `sql`).
    /// When a table or database is missing, creates the schema (idempotent) and tries once more:
    /// Meltano never calls `migrate` for a new backend, and a table the Python backend created
    /// may lack its lock tables.
    pub fn run(&self, query: &Query) -> Result<Vec<u8>> {
        self.run_answer(query).map(|answer| answer.body)
    }

    /// Runs an `INSERT ... SELECT ... WHERE` and returns how many rows it wrote: `None` when
    /// the server did not say (no summary header), which callers treat as "find out".
    pub fn run_written(&self, query: &Query) -> Result<Option<u64>> {
        self.run_answer(query).map(|answer| answer.written_rows)
    }

    fn run_answer(&self, query: &Query) -> Result<Answer> {
        if !self.checked.get() {
            self.check_deployment()?;
        }
        self.run_checked(query)
    }

    /// Runs a read and decodes every row of its answer.
    pub fn fetch<R: Decode>(&self, read: &Read<R>) -> Result<Vec<R>> {
        rows::all(&self.run(&read.query)?)
    }

    /// Runs a read and decodes the first row of its answer, if any.
    pub fn fetch_first<R: FromRow>(&self, read: &Read<R>) -> Result<Option<R>> {
        rows::first(&self.run(&read.query)?)
    }

    fn run_checked(&self, query: &Query) -> Result<Answer> {
        let mut migrated = false;
        let mut attempt = 0u32;
        loop {
            let settings = self.consistency.get().settings(query.role);
            match self.client.answer(query, &settings) {
                Err(e) if e.is_missing_schema() && !migrated => {
                    self.host.log(
                        Level::Info,
                        &format!(
                            "creating the schema {}.{} (missing: {e})",
                            self.config.schema, self.config.table
                        ),
                    );
                    self.migrate()?;
                    migrated = true;
                }
                Err(e) if e.is_transient() && attempt < self.config.retries => {
                    attempt += 1;
                    let pause = self
                        .config
                        .retry_backoff_ms
                        .saturating_mul(1 << (attempt - 1).min(10))
                        .min(5_000);
                    self.host.log(
                        Level::Info,
                        &format!(
                            "retry {attempt}/{} in {pause} ms after: {e}",
                            self.config.retries
                        ),
                    );
                    self.host.sleep_ms(pause);
                }
                other => return other,
            }
        }
    }

    /// Creates what is missing of the schema (every statement is `IF NOT EXISTS`), then checks
    /// that the tables suit the deployment: tables an operator created work as they are.
    pub fn migrate(&self) -> Result<()> {
        for statement in self.sql.migration() {
            self.client.execute(&statement)?;
        }
        // A user without the grants to see the tables in `system.tables` is not refused here.
        self.check_deployment().map(drop)
    }

    /// Looks at what the tables and the server are, once per instance; refuses a deployment
    /// that would split the state (see `deployment`). A user who may not read the system
    /// tables gets a warning, not a refusal.
    fn check_deployment(&self) -> Result<Kind> {
        let body = match self.run_checked(&self.sql.deployment().query) {
            Ok(answer) => answer.body,
            // ACCESS_DENIED on the system tables (or a wrong password, which the next query
            // reports again).
            Err(Error::Unauthorized(e)) => {
                self.host.log(
                    Level::Warn,
                    &format!("cannot check the deployment (the tables' engines): {e}"),
                );
                self.checked.set(true);
                return Ok(Kind::Missing);
            }
            Err(e) => return Err(e),
        };
        let observed: Observed = rows::first(&body)?.unwrap_or_default();
        let kind = deployment::check(&self.config, &observed)?;
        self.consistency
            .set(Consistency::observed(&self.config, kind, &observed));
        self.host.log(
            Level::Debug,
            &format!(
                "deployment of {}.{}: {kind:?}",
                self.config.schema, self.config.table
            ),
        );
        // Missing tables are created on first use, and `migrate` checks them then.
        self.checked.set(true);
        Ok(kind)
    }

    pub fn new_token(&self) -> String {
        uuid::Builder::from_random_bytes(self.host.random_u128().to_le_bytes())
            .into_uuid()
            .to_string()
    }
}
