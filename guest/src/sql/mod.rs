//! Every statement the backend sends, in one place.
//!
//! Identifiers are validated by `config` and backtick-quoted here; every value travels as a
//! bound query parameter (`{name:Type}`), or as rows of JSON in an INSERT body. Nothing is ever
//! spliced into SQL text.
//!
//! One module per concern: `query` (a statement as sent, and escaping), `schema`,
//! `state`, `history`, `guard` (the fenced write's condition), `lock_log` and `settle`.

mod doctor;
mod guard;
mod history;
mod lock_log;
mod query;
mod schema;
mod settle;
mod state;
mod writers;

pub use history::{Op, Origin, Point, SEQ_IDS_MAX_BYTES};
pub use query::PARAMS_MAX_BYTES;
pub use query::{Query, Read, escape_param, quote_identifier};
pub use state::{LIVE, StateRow};
pub use writers::writer_row;

use crate::config::Config;

/// The statements of one configured store.
#[derive(Debug, Clone)]
pub struct Statements {
    schema: String,
    state: String,
    lock: String,
    log: String,
    writers: String,
    /// Days a writer's row is kept: the history's when it is on and keeps its rows for a time.
    writer_days: u32,
    /// ` ON CLUSTER `name`` when the schema lives on a self-managed replicated cluster.
    on_cluster: String,
    replicated: bool,
    /// The history's table and view, when it is on.
    history: Option<history::History>,
    /// The names the deployment check looks up (unquoted).
    schema_name: String,
    /// state, lock, lock log, history, the history's view.
    table_names: [String; 5],
}

impl Statements {
    pub fn new(config: &Config) -> Self {
        let schema = quote_identifier(&config.schema);
        Statements {
            history: history::History::of(config, &schema),
            state: format!("{schema}.{}", quote_identifier(&config.table)),
            lock: format!("{schema}.{}", quote_identifier(&config.lock_table())),
            log: format!("{schema}.{}", quote_identifier(&config.lock_log_table())),
            writers: format!("{schema}.{}", quote_identifier(&config.writers_table())),
            writer_days: match (config.history, config.history_days) {
                (true, days) => days,
                (false, _) => crate::config::DEFAULT_HISTORY_DAYS,
            },
            schema,
            on_cluster: config
                .cluster
                .as_deref()
                .map(|c| format!(" ON CLUSTER {}", quote_identifier(c)))
                .unwrap_or_default(),
            replicated: config.cluster.is_some(),
            schema_name: config.schema.clone(),
            table_names: [
                config.table.clone(),
                config.lock_table(),
                config.lock_log_table(),
                config.history_table(),
                config.history_view(),
            ],
        }
    }
}

#[cfg(test)]
mod tests;
