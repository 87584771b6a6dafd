//! What one instance records: a span per call, a child per statement and per lock wait, events
//! for retries and hand-offs, and the metrics. The host sees the guest's requests (`statement`,
//! from the wasi:http hook) and its log (`log`) and sleeps (`pause`); nothing comes from the
//! guest that it did not send already.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clickhouse_state_contract::events::Event;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;

use super::Telemetry;
use crate::error::Error;

/// The header in which ClickHouse names the query it ran (`system.query_log.query_id`).
const QUERY_ID: &str = "x-clickhouse-query-id";

/// One instance's recorder; its hook and its store share it.
pub struct Recorder {
    telemetry: Arc<Telemetry>,
    call: Mutex<Option<Call>>,
}

/// The call in progress.
struct Call {
    operation: &'static str,
    /// The call's span, as the parent of its statements and waits.
    cx: Context,
    /// What the guest said it would sleep for, until it sleeps.
    pending: Option<Pending>,
}

enum Pending {
    Retry,
    Wait {
        state_id: String,
        holder: String,
        token: u64,
    },
}

impl Recorder {
    pub fn new(telemetry: Arc<Telemetry>) -> Arc<Self> {
        Arc::new(Recorder {
            telemetry,
            call: Mutex::new(None),
        })
    }

    fn with_call<R>(&self, f: impl FnOnce(&mut Option<Call>) -> R) -> R {
        match self.call.lock() {
            Ok(mut call) => f(&mut call),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// A call of the contract's `operation` begins.
    pub fn begin(&self, operation: &'static str) {
        let cx = match self.telemetry.tracer() {
            Some(tracer) => {
                let span = tracer
                    .span_builder(operation)
                    .with_kind(SpanKind::Internal)
                    .with_attributes([KeyValue::new("state_backend.operation", operation)])
                    .start(tracer);
                Context::new().with_span(span)
            }
            None => Context::new(),
        };
        let previous = self.with_call(|call| {
            call.replace(Call {
                operation,
                cx,
                pending: None,
            })
        });
        // A call that trapped before it ended (its instance is dropped): end its span too.
        if let Some(previous) = previous {
            previous.cx.span().end();
        }
    }

    /// A call of its own (`operation`), unless it is part of a call in progress (a writers
    /// read that explains a `locked` error); whether it began, and so is to be ended.
    pub fn begin_unless_in_call(&self, operation: &'static str) -> bool {
        if self.with_call(|call| call.is_some()) {
            return false;
        }
        self.begin(operation);
        true
    }

    /// The call ends, with the error it failed with.
    pub fn end(&self, error: Option<&Error>) {
        let Some(call) = self.with_call(Option::take) else {
            return;
        };
        let kind = error.map_or("ok", Error::kind);
        self.telemetry.instruments.calls.add(
            1,
            &[
                KeyValue::new("state_backend.operation", call.operation),
                KeyValue::new("state_backend.outcome", kind),
            ],
        );
        let span = call.cx.span();
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }

    fn operation(&self) -> &'static str {
        self.with_call(|call| call.as_ref().map_or("none", |c| c.operation))
    }

    /// A line of the guest's log: the decisions it tells of are counted.
    pub fn log(&self, line: &str) {
        let Some(event) = Event::parse(line) else {
            return;
        };
        let operation = self.operation();
        let operation_attribute = [KeyValue::new("state_backend.operation", operation)];
        match event {
            Event::Retry {
                attempt,
                pause_ms,
                error,
            } => {
                self.telemetry
                    .instruments
                    .retries
                    .add(1, &operation_attribute);
                self.with_call(|call| {
                    if let Some(call) = call {
                        call.cx.span().add_event(
                            "retry",
                            vec![
                                KeyValue::new("state_backend.retry.attempt", i64::from(attempt)),
                                KeyValue::new("state_backend.retry.pause_ms", pause_ms as i64),
                                KeyValue::new("error.message", error.to_string()),
                            ],
                        );
                        call.pending = Some(Pending::Retry);
                    }
                });
            }
            Event::LockWait {
                state_id,
                holder,
                token,
                ..
            } => self.with_call(|call| {
                if let Some(call) = call {
                    call.pending = Some(Pending::Wait {
                        state_id: state_id.to_string(),
                        holder: holder.to_string(),
                        token,
                    });
                }
            }),
            Event::HandOff { state_id } => {
                self.telemetry
                    .instruments
                    .handoffs
                    .add(1, &operation_attribute);
                self.with_call(|call| {
                    if let Some(call) = call {
                        call.cx.span().add_event(
                            "lock handed off",
                            vec![KeyValue::new(
                                "state_backend.state_id",
                                state_id.to_string(),
                            )],
                        );
                    }
                });
            }
        }
    }

    /// The guest sleeps `ms` (by `now_ms`, its clock): a lock wait, if the guest said it was
    /// one, is recorded when the returned pause ends.
    pub fn pause(&self, ms: u64, now_ms: u64) -> Option<Pause> {
        let (operation, cx, pending) = self.with_call(|call| {
            let call = call.as_mut()?;
            Some((call.operation, call.cx.clone(), call.pending.take()))
        })?;
        let Some(Pending::Wait {
            state_id,
            holder,
            token,
        }) = pending
        else {
            return None;
        };
        let span = self.telemetry.tracer().map(|tracer| {
            tracer
                .span_builder("lock wait")
                .with_kind(SpanKind::Internal)
                .with_attributes([
                    KeyValue::new("state_backend.state_id", state_id),
                    KeyValue::new("state_backend.lock.holder", holder),
                    KeyValue::new("state_backend.lock.token", token as i64),
                    KeyValue::new("state_backend.lock.pause_ms", ms as i64),
                ])
                .start_with_context(tracer, &cx)
        });
        Some(Pause {
            telemetry: Arc::clone(&self.telemetry),
            operation,
            span,
            started_ms: now_ms,
        })
    }

    /// A statement the guest sends to `uri`; finish it with its answer.
    pub fn statement(&self, uri: &http::Uri) -> Statement {
        let (kind, table, database) = describe(uri);
        let cx = self.with_call(|call| call.as_ref().map(|c| c.cx.clone()));
        let span = self.telemetry.tracer().map(|tracer| {
            let mut attributes = vec![
                KeyValue::new("db.system.name", "clickhouse"),
                KeyValue::new("db.operation.name", kind.clone()),
                KeyValue::new(
                    "state_backend.statement.query_bytes",
                    uri.query().map_or(0, str::len) as i64,
                ),
            ];
            if let Some(table) = table {
                attributes.push(KeyValue::new("db.collection.name", table));
            }
            if let Some(database) = database {
                attributes.push(KeyValue::new("db.namespace", database));
            }
            if let Some(host) = uri.host() {
                attributes.push(KeyValue::new("server.address", host.to_string()));
            }
            if let Some(port) = uri.port_u16() {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
            let builder = tracer
                .span_builder(format!("clickhouse {kind}"))
                .with_kind(SpanKind::Client)
                .with_attributes(attributes);
            match &cx {
                Some(cx) => builder.start_with_context(tracer, cx),
                None => builder.start(tracer),
            }
        });
        Statement {
            telemetry: Arc::clone(&self.telemetry),
            span,
            kind,
            started: Instant::now(),
            body_bytes: Arc::default(),
        }
    }
}

/// A lock wait in progress.
pub struct Pause {
    telemetry: Arc<Telemetry>,
    operation: &'static str,
    span: Option<Span>,
    started_ms: u64,
}

impl Pause {
    pub fn end(self, now_ms: u64) {
        let waited = now_ms.saturating_sub(self.started_ms);
        self.telemetry.instruments.lock_wait.record(
            waited as f64 / 1000.0,
            &[KeyValue::new("state_backend.operation", self.operation)],
        );
        if let Some(mut span) = self.span {
            span.set_attribute(KeyValue::new("state_backend.lock.waited_ms", waited as i64));
            span.end();
        }
    }
}

/// A statement in flight.
pub struct Statement {
    telemetry: Arc<Telemetry>,
    span: Option<Span>,
    kind: String,
    started: Instant,
    body_bytes: Arc<AtomicU64>,
}

impl Statement {
    /// Counts the request body's bytes as they go.
    pub fn body_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.body_bytes)
    }

    /// The answer (its head), or why there was none.
    pub fn finish<B>(self, answer: Result<&http::Response<B>, String>) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.telemetry.instruments.statement_duration.record(
            seconds,
            &[KeyValue::new("db.operation.name", self.kind.clone())],
        );
        let Some(mut span) = self.span else {
            return;
        };
        span.set_attribute(KeyValue::new(
            "http.request.body.size",
            self.body_bytes.load(Ordering::Relaxed) as i64,
        ));
        match answer {
            Ok(head) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(head.status().as_u16()),
                ));
                if let Some(id) = head.headers().get(QUERY_ID).and_then(|v| v.to_str().ok()) {
                    span.set_attribute(KeyValue::new("clickhouse.query_id", id.to_string()));
                }
                if !head.status().is_success() {
                    span.set_status(Status::error(format!("HTTP {}", head.status())));
                }
            }
            Err(why) => span.set_status(Status::error(why)),
        }
        span.end();
    }
}

/// The statement's kind (its first word), its table and its database, from the request's
/// query string (the guest puts the statement in `query`; only an INSERT's data is in the body).
fn describe(uri: &http::Uri) -> (String, Option<String>, Option<String>) {
    let mut sql = None;
    let mut database = None;
    for (name, value) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match name.as_ref() {
            "query" => sql = Some(value.into_owned()),
            "database" => database = Some(value.into_owned()),
            _ => {}
        }
    }
    let sql = sql.unwrap_or_default();
    let words: Vec<&str> = sql.split_whitespace().collect();
    let upper = |w: &&str| w.to_ascii_uppercase();
    let kind = words.first().map_or("UNKNOWN".into(), upper);
    let table = words
        .iter()
        .position(|w| matches!(upper(w).as_str(), "FROM" | "INTO" | "TABLE" | "VIEW"))
        .and_then(|at| {
            words[at + 1..]
                .iter()
                .find(|w| !matches!(upper(w).as_str(), "IF" | "NOT" | "EXISTS"))
        })
        .map(|w| w.trim_end_matches([',', ';', ')']).replace('`', ""))
        .filter(|name| !name.is_empty() && !name.starts_with('('));
    (kind, table, database)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(sql: &str) -> (String, Option<String>) {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("database", "default")
            .append_pair("query", sql)
            .finish();
        let uri: http::Uri = format!("http://127.0.0.1:8123/?{query}").parse().unwrap();
        let (kind, table, database) = describe(&uri);
        assert_eq!(database.as_deref(), Some("default"));
        (kind, table)
    }

    #[test]
    fn a_statement_is_named_by_its_kind_and_table() {
        for (sql, kind, table) in [
            (
                "INSERT INTO `default`.`meltano_state` FORMAT RowBinary",
                "INSERT",
                Some("default.meltano_state"),
            ),
            (
                "SELECT a FROM default.meltano_state_lock_log WHERE id = {id:String}",
                "SELECT",
                Some("default.meltano_state_lock_log"),
            ),
            (
                "CREATE TABLE IF NOT EXISTS default.t (a UInt8) ENGINE = Memory",
                "CREATE",
                Some("default.t"),
            ),
            ("SELECT version(), now64(3)", "SELECT", None),
            ("", "UNKNOWN", None),
        ] {
            assert_eq!(
                described(sql),
                (kind.to_string(), table.map(str::to_string)),
                "{sql}"
            );
        }
    }
}
