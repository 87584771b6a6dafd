//! A session with one ClickHouse: the configuration, the statements, the HTTP client, retries,
//! insert tokens and the [`Platform`] the guest asks for time, randomness and a log. The store's
//! operations and the lock protocols both run their queries through a [`Session`]; neither
//! reaches into the other.

use std::cell::{Cell, RefCell};

use crate::config::Config;
use crate::error::{Error, Result, WriterInfo};
use crate::events;
use crate::http::{Answer, Client, Transport};
use crate::rows::{self, Decode, FromRow};
use crate::sql::{Query, Read, Statements};
use protocol::deployment::{self, Consistency, Kind};
pub use protocol::env::Level;
use protocol::retry::{self, Next};
use protocol::role::Role;
use protocol::rows::Observation;

/// What the guest asks of its host besides HTTP: time, randomness and a log.
pub trait Platform {
    fn now_ms(&self) -> u64;
    fn sleep_ms(&self, ms: u64);
    fn random_u128(&self) -> u128;
    fn log(&self, level: Level, message: &str);
}

/// A store's session with its ClickHouse: runs its queries.
pub struct Session<T, H> {
    pub config: Config,
    pub sql: Statements,
    client: Client<T>,
    pub host: H,
    /// The deployment check passed (see `deployment`); it runs once per instance.
    checked: Cell<bool>,
    /// The settings queries carry on this deployment: assumed from the configuration until the
    /// check has seen the tables.
    consistency: Cell<Consistency>,
    /// While a call writes under a lock: the time its retries must not pass (see
    /// [`Session::retrying_until`]).
    retry_bound_ms: Cell<Option<u64>>,
    /// `add_lock_log_events` ran (or was tried) on this instance.
    events_added: Cell<bool>,
    /// The deployment check found the history's view missing: the first write creates it
    /// (`migrate`), since a write to the history without it would not reach the state table.
    history_view_missing: Cell<bool>,
    /// This instance's id in the history's `writer` column: random per opened store.
    pub instance: String,
    /// Who this instance writes for (`identify`), and whether its row is written.
    who: RefCell<Option<WriterInfo>>,
    who_written: Cell<bool>,
    /// Lock claims made by this instance: each claim's owner is `<instance>/<n>`.
    claims: Cell<u64>,
}

impl<T: Transport, H: Platform> Session<T, H> {
    pub fn open(uri: &str, settings: &[(String, String)], transport: T, host: H) -> Result<Self> {
        let config = Config::parse(uri, settings)?;
        let instance = uuid_of(host.random_u128());
        Ok(Session {
            history_view_missing: Cell::new(false),
            instance,
            sql: Statements::new(&config),
            client: Client::new(&config, transport),
            host,
            checked: Cell::new(false),
            consistency: Cell::new(Consistency::assumed(&config)),
            retry_bound_ms: Cell::new(None),
            events_added: Cell::new(false),
            who: RefCell::new(None),
            who_written: Cell::new(false),
            claims: Cell::new(0),
            config,
        })
    }

    /// Runs a query, retrying transient failures (network, server load, a restart) with
    /// back-off and jitter on the host's clock, for up to the retry budget (see `retry`). Every statement this backend sends is safe to send again:
    /// reads trivially, and each write carries its own deduplication token and version, so a
    /// retry of a write that did land stores the same row again or nothing (see `sql`).
    /// When a table or database is missing, creates the schema (idempotent) and tries once more:
    /// Meltano never calls `migrate` for a new backend, and a table the Python backend created
    /// may lack its lock tables.
    pub fn run(&self, query: &Query) -> Result<Vec<u8>> {
        self.run_answer(query).map(|answer| answer.body)
    }

    /// Runs an INSERT: the `written_rows` its summary gives (`None` when the server did not
    /// say), and whether it was sent more than once (after a failure whose outcome was unknown:
    /// an earlier send may have landed); and, whatever the result, what became of its sends.
    /// `landing` judges them.
    pub(crate) fn run_write(&self, query: &Query) -> (Result<(Option<u64>, bool)>, Sends) {
        if let Err(e) = self.prepare(query) {
            return (Err(e), Sends::default());
        }
        let (result, sends) = self.run_tracked(query);
        let result = result.map(|(answer, failures)| (answer.written_rows, failures > 0));
        (result, sends)
    }

    fn run_answer(&self, query: &Query) -> Result<Answer> {
        self.run_answer_counted(query).map(|(answer, _)| answer)
    }

    /// The answer after the deployment check (once per instance), and how many sends before
    /// it failed transiently.
    fn run_answer_counted(&self, query: &Query) -> Result<(Answer, u32)> {
        self.prepare(query)?;
        self.run_counted(query)
    }

    /// What must be done before `query` is sent: the deployment check (once per instance), and
    /// the history's view created where a write to the history needs it.
    fn prepare(&self, query: &Query) -> Result<()> {
        if !self.checked.get() {
            self.check_deployment()?;
        }
        if query.role != Role::Read && query.role != Role::Deciding {
            self.write_who();
        }
        if query.fanout > 1 && self.history_view_missing.get() {
            self.host.log(
                Level::Info,
                &format!(
                    "creating the history of {}.{} (its view is missing)",
                    self.config.schema, self.config.table
                ),
            );
            self.migrate()?;
            if self.history_view_missing.get() {
                return Err(Error::InvalidConfig(format!(
                    "the history's view {}.{} is still missing after `migrate`; create it (see \
                     `state-backend migrate --print`) or set history=false",
                    self.config.schema,
                    self.config.history_view()
                )));
            }
        }
        Ok(())
    }

    /// The ordinals (`seq`, see `sql::history`) of rows about to be written as JSON, one per id
    /// in order (an id twice gets two): one more than each id's highest, read in a request per
    /// [`crate::sql::SEQ_IDS_MAX_BYTES`] of ids. All 0, with no request, when the history
    /// keeps no count.
    pub fn ordinals(&self, ids: &[&str]) -> Result<Vec<u64>> {
        let mut highest = std::collections::HashMap::new();
        let mut rest = ids;
        while !rest.is_empty() {
            let mut bytes = 0;
            let end = rest
                .iter()
                .position(|id| {
                    bytes += id.len() + 3;
                    bytes > crate::sql::SEQ_IDS_MAX_BYTES
                })
                .unwrap_or(rest.len())
                .max(1);
            let Some(read) = self.sql.history_seqs(&rest[..end]) else {
                return Ok(vec![0; ids.len()]);
            };
            for row in self.fetch(&read)? {
                highest.insert(row.state_id, row.seq);
            }
            rest = &rest[end..];
        }
        // Keyed by the ids given, so that an id not in the history costs no copy of it.
        let mut next: std::collections::HashMap<&str, u64> =
            std::collections::HashMap::with_capacity(ids.len());
        Ok(ids
            .iter()
            .map(|id| {
                let seq = next
                    .entry(id)
                    .or_insert_with(|| highest.get(*id).copied().unwrap_or(0));
                *seq += 1;
                *seq
            })
            .collect())
    }

    /// Runs a read and decodes every row of its answer.
    pub fn fetch<R: Decode>(&self, read: &Read<R>) -> Result<Vec<R>> {
        rows::all(&self.run(&read.query)?)
    }

    /// Runs a read and decodes the first row of its answer, if any.
    pub fn fetch_first<R: FromRow>(&self, read: &Read<R>) -> Result<Option<R>> {
        rows::first(&self.run(&read.query)?)
    }

    /// Runs `f` with no retry starting after `until_ms`: a write under a lock does not try
    /// again once a contender may see the lease ended (nested bounds keep the earliest).
    pub fn retrying_until<R>(&self, until_ms: u64, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let outer = self.retry_bound_ms.get();
        self.retry_bound_ms
            .set(Some(outer.map_or(until_ms, |o| o.min(until_ms))));
        let result = f();
        self.retry_bound_ms.set(outer);
        result
    }

    fn retry_policy(&self) -> retry::Policy {
        retry::Policy {
            first_pause_ms: self.config.retry_backoff_ms,
            budget_ms: self.config.retry_budget_ms,
            max_retries: self.config.retries,
        }
    }

    /// Sends `query` once, without the deployment check or creating the schema: a diagnosis
    /// reports what it finds, and changes nothing.
    pub fn read_once(&self, query: &Query) -> Result<Vec<u8>> {
        self.retrying_until(self.host.now_ms(), || self.run_checked(query))
            .map(|answer| answer.body)
    }

    fn run_checked(&self, query: &Query) -> Result<Answer> {
        self.run_counted(query).map(|(answer, _)| answer)
    }

    /// The answer, and how many sends before it failed transiently.
    fn run_counted(&self, query: &Query) -> Result<(Answer, u32)> {
        self.run_tracked(query).0
    }

    /// As [`Session::run_counted`], and what became of the statement's own sends (the
    /// statements a missing schema makes it run in between are not counted).
    fn run_tracked(&self, query: &Query) -> (Result<(Answer, u32)>, Sends) {
        let mut sends = Sends::default();
        let result = self.run_sends(query, &mut sends);
        (result, sends)
    }

    fn run_sends(&self, query: &Query, sends: &mut Sends) -> Result<(Answer, u32)> {
        let mut migrated = false;
        let mut failures = 0u32;
        let started = self.host.now_ms();
        loop {
            let settings = self.consistency.get().settings(query.role);
            let answer = self.client.answer(query, &settings);
            sends.sent |= self.client.may_have_reached();
            if let Err(e) = &answer
                && !over_on_the_server(e)
                && self.client.may_have_reached()
            {
                sends.in_doubt = true;
            }
            match answer {
                Err(e) if e.is_missing_schema() && !migrated && query.creates_schema => {
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
                Err(e) if e.is_transient() => {
                    failures += 1;
                    let next = self.retry_policy().next(
                        failures,
                        started,
                        self.host.now_ms(),
                        self.retry_bound_ms.get(),
                        self.host.random_u128(),
                    );
                    match next {
                        Next::After(pause) => {
                            self.host
                                .log(Level::Info, &events::retry(failures, pause, &e));
                            self.host.sleep_ms(pause);
                        }
                        Next::GiveUp(why) => return Err(e.gave_up(&why)),
                    }
                }
                other => return other.map(|answer| (answer, failures)),
            }
        }
    }

    /// Creates what is missing of the schema (every statement is `IF NOT EXISTS`), gives a lock
    /// log created by an older version the events it lacks, then checks that the tables suit
    /// the deployment: tables an operator created work as they are.
    pub fn migrate(&self) -> Result<()> {
        for statement in self.sql.migration() {
            self.client.execute(&statement)?;
        }
        self.add_lock_log_events()?;
        // A user without the grants to see the tables in `system.tables` is not refused here.
        self.check_deployment().map(drop)
    }

    /// The statements `migrate` creates the schema with, as SQL text. They carry no
    /// parameters: every name in them is the configuration's, escaped as an identifier.
    pub fn schema(&self) -> Vec<String> {
        self.sql.migration().into_iter().map(|q| q.sql).collect()
    }

    /// Adds the `want` event to a lock log created by an older version (`migrate`, and a waiter
    /// whose `want` the log refused): once per instance, and only when `system.columns` says
    /// the column lacks it, so that a current log is never altered.
    pub fn add_lock_log_events(&self) -> Result<()> {
        if self.events_added.replace(true) {
            return Ok(());
        }
        let lacks = match self.run(&self.sql.lock_log_lacks_want()) {
            Ok(body) => crate::rows::number(&body)? == 1,
            // A user who may not read `system.columns`: the log stays as it is.
            Err(Error::Unauthorized(_)) => false,
            Err(e) => return Err(e),
        };
        if lacks {
            self.host.log(
                Level::Info,
                &format!(
                    "adding the `want` event to {}, created by an older version",
                    self.config.lock_log_table()
                ),
            );
            self.run(&self.sql.lock_log_events())?;
        }
        Ok(())
    }

    /// Looks at what the tables and the server are, once per instance; refuses a deployment
    /// that would split the state (see `deployment`). A user who may not read the system
    /// tables gets a warning, not a refusal.
    fn check_deployment(&self) -> Result<Kind> {
        let body =
            match self.run_checked(&self.sql.deployment(&protocol::pinned::newer_names()).query) {
                Ok(answer) => answer.body,
                // ACCESS_DENIED on the system tables (or a wrong password, which the next query
                // reports again).
                Err(Error::Unauthorized(e)) => {
                    self.host.log(
                        Level::Warn,
                        &format!(
                            "cannot check the deployment (the tables' engines), so inserts carry \
                         the quorum settings, which a replicated table needs: {e}"
                        ),
                    );
                    self.consistency.set(Consistency::unknown());
                    self.checked.set(true);
                    return Ok(Kind::Unknown);
                }
                Err(e) => return Err(e),
            };
        let observed: Observation = rows::first(&body)?.unwrap_or_default();
        let kind = deployment::check(&self.config, &observed)?;
        self.history_view_missing
            .set(self.config.history && kind != Kind::Missing && observed.history_view == 0);
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

    /// The clock a write's version comes from: the host's; in settle mode the server's, read
    /// (one round trip), since the original backend writes at the server's clock and a
    /// version of ours above its next write would hide that write.
    pub fn version_clock_ms(&self) -> Result<u64> {
        if self.config.lock_mode != crate::config::LockMode::Settle {
            return Ok(self.host.now_ms());
        }
        rows::number(&self.run(&self.sql.server_now())?)
    }

    pub fn new_token(&self) -> String {
        uuid_of(self.host.random_u128())
    }

    /// The owner of a new lock claim: this instance's id and a count, so that a reader of the
    /// lock log finds the claimant's process in the writers table (`store.writers`).
    pub fn new_owner(&self) -> String {
        let n = self.claims.get() + 1;
        self.claims.set(n);
        format!("{}/{n}", self.instance)
    }

    /// Records who this instance writes for; its row goes before its first write. An instance
    /// has one identity, the first it was given: the rows it writes name this instance, so
    /// another would rename them (a later one is ignored, with a warning).
    pub fn identify(&self, who: WriterInfo) {
        let mut mine = self.who.borrow_mut();
        match mine.as_ref() {
            None => *mine = Some(who),
            Some(first) if *first == who => {}
            Some(_) => self.host.log(
                Level::Warn,
                "this store was identified as another caller: the new identity is ignored \
                 (open a store for each caller)",
            ),
        }
    }

    /// The identified instance's row, before its first write. Who wrote never fails a write:
    /// the row is one try (no retry eats the write's budget), and one that fails is logged and
    /// tried again before the next write if it failed for a passing reason (the network, a
    /// loaded server), not if it was refused (no grant on the table, a table that cannot be
    /// made), which it would be again.
    fn write_who(&self) {
        if self.who_written.get() {
            return;
        }
        let Some(who) = self.who.borrow().clone() else {
            return;
        };
        // Set first: the row's own INSERT comes through here.
        self.who_written.set(true);
        let token = format!("writer/{}", self.instance);
        let written =
            crate::sql::writer_row(&self.instance, &who, self.host.now_ms()).and_then(|data| {
                let insert = self.sql.writer_insert(data, &token);
                self.retrying_until(self.host.now_ms(), || self.run(&insert))
            });
        if let Err(e) = written {
            self.who_written.set(!e.is_transient());
            self.host.log(
                Level::Warn,
                &format!("who writes is not recorded (the write goes on): {e}"),
            );
        }
    }

    /// The processes behind these instance ids, from the writers table, in one read. Never
    /// fails the call it serves: a table that is missing or unreadable (an older schema, a user
    /// without the grant) leaves them unknown, with a note in the log.
    pub fn writers(&self, ids: &[&str]) -> Vec<rows::Writer> {
        let mut unique: Vec<&str> = Vec::with_capacity(ids.len());
        for id in ids {
            if !id.is_empty() && !unique.contains(id) {
                unique.push(id);
            }
        }
        if unique.is_empty() {
            return Vec::new();
        }
        // One try: it only explains a call, whose own answer must not wait on it.
        let read = self.sql.writers_of(&unique);
        self.retrying_until(self.host.now_ms(), || self.fetch(&read))
            .unwrap_or_else(|e| {
                self.host
                    .log(Level::Debug, &format!("who wrote is unknown: {e}"));
                Vec::new()
            })
    }
}

/// What became of a statement's sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sends {
    /// At least one may have reached the server (one refused before it left does not count).
    pub sent: bool,
    /// One may have reached the server and failed in a way that leaves it possibly still
    /// running there, or landing later (see `over_on_the_server`).
    pub in_doubt: bool,
}

/// Whether a failed send is over on the server: the server answered with an error of its own,
/// other than those that say the work may still be done (an insert whose status is unknown,
/// Keeper or the network failing under it, an HTTP status of a proxy's). A connection that
/// failed, a timeout (the client's, or the server's `TIMEOUT_EXCEEDED` and `SOCKET_TIMEOUT`,
/// which `http` reports as timeouts), or a refusal before sending are not.
fn over_on_the_server(e: &Error) -> bool {
    match e {
        Error::Server(e) => {
            !matches!(e.code, 210 | 279 | 319 | 999) && !e.name.starts_with("HTTP_")
        }
        _ => false,
    }
}

fn uuid_of(random: u128) -> String {
    uuid::Builder::from_random_bytes(random.to_le_bytes())
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Request, Response, TransportError};

    /// A server that is down: every request is refused. Remembers when each was sent.
    struct Down<'a>(&'a VirtualClock);

    impl Transport for Down<'_> {
        fn send(&self, _: Request) -> std::result::Result<Response, TransportError> {
            self.0.sent.borrow_mut().push(self.0.now.get());
            self.0.now.set(self.0.now.get() + 3); // a refusal takes a few ms
            Err(TransportError::Unreachable(
                "cannot reach http://ch.example:8123: connection refused".into(),
            ))
        }
    }

    /// The host's clock, driven by the guest's own sleeps.
    #[derive(Default)]
    struct VirtualClock {
        now: Cell<u64>,
        sent: std::cell::RefCell<Vec<u64>>,
        urls: std::cell::RefCell<Vec<String>>,
    }

    impl Platform for &VirtualClock {
        fn now_ms(&self) -> u64 {
            self.now.get()
        }
        fn sleep_ms(&self, ms: u64) {
            self.now.set(self.now.get() + ms);
        }
        fn random_u128(&self) -> u128 {
            u128::from(self.now.get()).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
        fn log(&self, _: Level, _: &str) {}
    }

    fn session<'a>(
        clock: &'a VirtualClock,
        settings: &[(&str, &str)],
    ) -> Session<Down<'a>, &'a VirtualClock> {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Session::open(
            "clickhouse://u@ch.example/db",
            &settings,
            Down(clock),
            clock,
        )
        .expect("opens")
    }

    /// A server whose user may not read the system tables: the deployment check is denied,
    /// every other query answers `1`. Remembers each query's URL.
    struct Denied<'a>(&'a VirtualClock);

    impl Transport for Denied<'_> {
        fn send(&self, request: Request) -> std::result::Result<Response, TransportError> {
            let url = request.path_and_query.clone();
            let body = String::from_utf8_lossy(&request.body).into_owned();
            self.0.urls.borrow_mut().push(url.clone());
            if url.contains("system.tables") || body.contains("system.tables") {
                return Ok(Response {
                    status: 403,
                    headers: vec![("X-ClickHouse-Exception-Code".into(), "497".into())],
                    body:
                        b"Code: 497. DB::Exception: default: Not enough privileges. (ACCESS_DENIED)"
                            .to_vec(),
                });
            }
            Ok(Response {
                status: 200,
                headers: vec![],
                body: b"1\n".to_vec(),
            })
        }
    }

    #[test]
    fn when_the_deployment_check_is_denied_inserts_carry_the_quorum_settings() {
        let clock = VirtualClock::default();
        let session = Session::open("clickhouse://u@ch.example/db", &[], Denied(&clock), &clock)
            .expect("opens");
        session
            .run(&session.sql.log_insert(b"{}\n".to_vec(), "t"))
            .expect("the insert runs");
        let urls = clock.urls.borrow();
        let insert = urls.last().expect("sent");
        assert!(urls.len() == 2, "the check, then the insert: {urls:?}");
        // Replicated tables need them; plain and Shared tables ignore them.
        assert!(
            insert.contains("insert_quorum=auto") && insert.contains("insert_quorum_parallel=0"),
            "{insert}"
        );
    }

    #[test]
    fn a_down_server_is_tried_for_the_whole_budget_then_named() {
        let clock = VirtualClock::default();
        let session = session(&clock, &[]);
        let error = session
            .run(&session.sql.version_of("s"))
            .expect_err("the server is down");
        let sent = clock.sent.borrow();
        let last = *sent.last().expect("tried");
        assert!(
            (58_000..=60_000).contains(&last),
            "the last try at {last} ms of a 60 s budget"
        );
        assert!(sent.len() >= 30, "{} tries", sent.len());
        match error {
            Error::Unreachable(m) => {
                assert!(m.contains("http://ch.example:8123"), "{m}");
                assert!(m.contains(&format!("tried {} times", sent.len())), "{m}");
                assert!(m.contains("the retry budget is 60 s"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_retry_of_a_write_under_a_lock_starts_after_its_lease() {
        let clock = VirtualClock::default();
        let session = session(&clock, &[]);
        let error = session
            .retrying_until(5_000, || {
                // A nested, later bound does not extend the outer one.
                session.retrying_until(50_000, || session.run(&session.sql.version_of("s")))
            })
            .expect_err("the server is down");
        let last = *clock.sent.borrow().last().expect("tried");
        assert!(last <= 5_000, "a try at {last} ms, the lease ends at 5000");
        assert!(last >= 3_000, "gave up early, at {last} ms");
        assert!(format!("{error}").contains("lease"), "{error}");
        // Outside the bound, the budget applies again.
        clock.sent.borrow_mut().clear();
        let started = clock.now.get();
        let _ = session.run(&session.sql.version_of("s"));
        let last = *clock.sent.borrow().last().expect("tried");
        assert!(last - started > 50_000, "{}", last - started);
    }

    #[test]
    fn a_count_limit_still_holds_within_the_budget() {
        let clock = VirtualClock::default();
        let session = session(&clock, &[("retries", "2")]);
        let error = session.run(&session.sql.version_of("s")).expect_err("down");
        assert_eq!(clock.sent.borrow().len(), 3, "one try and two retries");
        assert!(format!("{error}").contains("retries allows 2"), "{error}");
    }
}
