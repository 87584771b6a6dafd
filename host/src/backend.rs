//! A typed async API over one guest instance: the contract, as plain Rust.

use std::collections::HashMap;

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use crate::bindings::{ClickhouseStateBackend, wit};
use crate::call_end::{end_call, guest_result};
use crate::error::{Error, LockInfo, Result, WriterInfo, info_from_wit};
use crate::records::{HistoryEntry, Point, Restored, State};
use crate::settings::Settings;
use crate::state::HostState;

/// Instance ids per `writers` read: a thousand ids of 39 bytes fit the guest's 64 KiB bound.
const WRITERS_PER_READ: usize = 1000;

/// A held lock. Give it back with [`Backend::release`].
#[derive(Debug)]
pub struct Lock {
    resource: ResourceAny,
    pub state_id: String,
    pub token: u64,
}

/// One instance of the component, connected to one ClickHouse.
pub struct Backend {
    /// The instance's wasmtime store: its memory, its limits and the host's state for it.
    sandbox: Store<HostState>,
    bindings: ClickhouseStateBackend,
    /// The guest's `store` resource (the contract's word for a connected backend).
    handle: ResourceAny,
    /// Who this instance's writes come from, as told to it (`identify`).
    who: Option<WriterInfo>,
    /// The engine's epoch ticker, kept going while this instance lives, whether or not its
    /// `Runtime` does (`serve` and the embedded host keep only the instance).
    _ticker: std::sync::Arc<crate::engine::Ticker>,
}

/// Calls a method of the `store` resource; a trap becomes `Error::Component`, a contract error
/// becomes the matching `Error`.
macro_rules! call {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {{
        $self.begin_call();
        $self.trace_begin(stringify!($method));
        let guest = $self.bindings.meltano_state_backend_backend().store();
        let result = guest
            .$method(&mut $self.sandbox, $self.handle $(, $arg)*)
            .await;
        let result = end_call(&mut $self.sandbox, result)
            .and_then(|result| guest_result(&$self.sandbox, result));
        let result = $self.explained(result).await;
        $self.trace_end(&result);
        result
    }};
}

impl Backend {
    fn begin_call(&mut self) {
        self.sandbox.data().took_refusal();
        self.sandbox.data().took_detail();
        let limits = &mut self.sandbox.data_mut().limits;
        limits.begin_call();
        limits.last_panic = None;
    }

    /// A call's span begins (`call_set` is the operation `set`), when the host exports them.
    fn trace_begin(&self, method: &'static str) {
        if let Some(recorder) = &self.sandbox.data().recorder {
            recorder.begin(method.strip_prefix("call_").unwrap_or(method));
        }
    }

    /// As [`Backend::trace_begin`] for the host's own calls (who wrote, who is this): a span of
    /// their own unless they are part of a call in progress; whether one began.
    fn trace_begin_unless_in_call(&self, operation: &'static str) -> bool {
        self.sandbox
            .data()
            .recorder
            .as_ref()
            .is_some_and(|recorder| recorder.begin_unless_in_call(operation))
    }

    /// Ends the span [`Backend::trace_begin_unless_in_call`] began, if it began one.
    fn trace_end_if<T>(&self, traced: bool, result: &Result<T>) {
        if traced {
            self.trace_end(result);
        }
    }

    fn trace_end<T>(&self, result: &Result<T>) {
        if let Some(recorder) = &self.sandbox.data().recorder {
            recorder.end(result.as_ref().err());
        }
    }

    pub(crate) async fn open(
        mut sandbox: Store<HostState>,
        bindings: ClickhouseStateBackend,
        ticker: std::sync::Arc<crate::engine::Ticker>,
        uri: &str,
        settings: Settings,
    ) -> Result<Self> {
        sandbox.data_mut().limits.begin_call();
        let recorder = sandbox.data().recorder.clone();
        if let Some(recorder) = &recorder {
            recorder.begin("open");
        }
        let opened = bindings
            .meltano_state_backend_backend()
            .store()
            .call_open(&mut sandbox, uri, &settings)
            .await;
        let opened = end_call(&mut sandbox, opened).and_then(|o| guest_result(&sandbox, o));
        if let Some(recorder) = &recorder {
            recorder.end(opened.as_ref().err());
        }
        let handle = opened?;
        Ok(Backend {
            sandbox,
            bindings,
            handle,
            who: None,
            _ticker: ticker,
        })
    }

    /// Whether a call trapped (stopped at its deadline or CPU budget, a panic, out of memory):
    /// the instance cannot be called again, and whoever serves it should open another.
    pub fn trapped(&self) -> bool {
        self.sandbox.data().limits.trapped
    }

    /// What the CPU share held the last call back by (nothing without a share).
    pub fn held_back(&self) -> crate::limits::HeldBack {
        self.sandbox.data().limits.held_back
    }

    /// The instance's linear memory, in bytes: the most it ever needed, as memory only grows.
    pub fn peak_memory_bytes(&self) -> usize {
        self.sandbox.data().limits.peak_memory_bytes
    }

    /// `result`, with the process of the holder a `locked` error names, where it identified
    /// itself.
    async fn explained<T>(&mut self, result: Result<T>) -> Result<T> {
        match result {
            Err(Error::Locked(info)) => Err(Error::Locked(self.holder(info).await)),
            other => other,
        }
    }

    /// `info` with its holder's process, where the holder identified itself.
    async fn holder(&mut self, mut info: LockInfo) -> LockInfo {
        if let Some(instance) = info.instance() {
            let instance = instance.to_string();
            info.who = self
                .who_of(std::slice::from_ref(&instance))
                .await
                .remove(&instance)
                .map(Box::new);
        }
        info
    }

    /// The processes behind these instance ids (the contract's `writers`), or none when the
    /// store cannot say: who wrote never fails the call it explains.
    async fn who_of(&mut self, ids: &[String]) -> HashMap<String, WriterInfo> {
        let traced = self.trace_begin_unless_in_call("writers");
        let mut all = HashMap::new();
        // A read's parameters are bounded (the guest refuses more than 64 KiB of ids): a long
        // history of short-lived processes takes a read per thousand writers.
        for chunk in ids.chunks(WRITERS_PER_READ) {
            self.begin_call();
            let guest = self.bindings.meltano_state_backend_backend().store();
            let found = guest
                .call_writers(&mut self.sandbox, self.handle, chunk)
                .await;
            let found =
                end_call(&mut self.sandbox, found).and_then(|found| found.map_err(Error::from));
            match found {
                Ok(found) => all.extend(found.into_iter().map(|(id, who)| (id, who.into()))),
                Err(e) => tracing::debug!("who wrote is unknown: {e}"),
            }
        }
        self.trace_end_if(traced, &Ok(()));
        all
    }

    /// The processes behind these instance ids (a history entry's `writer`, a lock owner's
    /// [`LockInfo::instance`]), for those whose host identified them.
    pub async fn writers(&mut self, ids: &[String]) -> Result<Vec<(String, WriterInfo)>> {
        Ok(call!(self.call_writers(ids))?
            .into_iter()
            .map(|(id, who)| (id, who.into()))
            .collect())
    }

    /// `entries` with their writers' processes, in one read.
    async fn with_writers(&mut self, mut entries: Vec<HistoryEntry>) -> Vec<HistoryEntry> {
        let mut ids: Vec<String> = entries.iter().map(|e| e.writer.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        let who = self.who_of(&ids).await;
        for entry in &mut entries {
            entry.who = who.get(&entry.writer).cloned();
        }
        entries
    }

    /// Tells the instance who its writes come from (see the contract's `identify`): it records
    /// the process before its first write, and reads show it.
    pub async fn identify(&mut self, who: &WriterInfo) -> Result<()> {
        self.begin_call();
        let traced = self.trace_begin_unless_in_call("identify");
        let guest = self.bindings.meltano_state_backend_backend().store();
        let result = guest
            .call_identify(&mut self.sandbox, self.handle, &wit::WriterInfo::from(who))
            .await;
        let result = end_call(&mut self.sandbox, result);
        self.trace_end_if(traced, &result);
        result?;
        // The store keeps the first identity it was given (the contract's `identify`).
        self.who.get_or_insert_with(|| who.clone());
        Ok(())
    }

    pub async fn get(&mut self, state_id: &str) -> Result<Option<State>> {
        Ok(call!(self.call_get(state_id))?.map(State::from))
    }

    pub async fn set(&mut self, state: &State) -> Result<()> {
        call!(self.call_set(&wit::State::from(state)))
    }

    pub async fn update(&mut self, state: &State) -> Result<()> {
        call!(self.call_update(&wit::State::from(state)))
    }

    pub async fn delete(&mut self, state_id: &str) -> Result<()> {
        call!(self.call_delete(state_id))
    }

    pub async fn clear(&mut self, state_id: &str) -> Result<()> {
        call!(self.call_clear(state_id))
    }

    pub async fn state_ids(&mut self, pattern: Option<&str>) -> Result<Vec<String>> {
        call!(self.call_state_ids(pattern))
    }

    pub async fn get_all(&mut self, pattern: Option<&str>) -> Result<Vec<State>> {
        Ok(call!(self.call_get_all(pattern))?
            .into_iter()
            .map(State::from)
            .collect())
    }

    pub async fn set_all(&mut self, states: &[State]) -> Result<u64> {
        let states: Vec<wit::State> = states.iter().map(wit::State::from).collect();
        call!(self.call_set_all(&states))
    }

    pub async fn clear_all(&mut self) -> Result<u64> {
        call!(self.call_clear_all())
    }

    pub async fn migrate(&mut self) -> Result<()> {
        call!(self.call_migrate())
    }

    /// The DDL `migrate` runs with this instance's settings, one SQL statement each; sends
    /// nothing. A component that gives none is broken: there is always a table to create.
    pub async fn schema(&mut self) -> Result<Vec<String>> {
        let statements = call!(self.call_schema())?;
        if statements.is_empty() {
            return Err(Error::Component("the component gave no schema".into()));
        }
        Ok(statements)
    }

    /// Takes the lock of `state_id`, waiting up to the configured lock timeout.
    pub async fn acquire_lock(&mut self, state_id: &str) -> Result<Lock> {
        let resource = call!(self.call_acquire_lock(state_id))?;
        self.begin_call();
        let lock_api = self.bindings.meltano_state_backend_backend().lock();
        let token = lock_api.call_token(&mut self.sandbox, resource).await;
        let token = end_call(&mut self.sandbox, token)?;
        Ok(Lock {
            resource,
            state_id: state_id.to_string(),
            token,
        })
    }

    /// Extends a held lock's lease from now; `LockLost` when it is no longer held.
    pub async fn renew(&mut self, lock: &Lock) -> Result<()> {
        self.begin_call();
        self.trace_begin("renew");
        let lock_api = self.bindings.meltano_state_backend_backend().lock();
        let renewed = lock_api.call_renew(&mut self.sandbox, lock.resource).await;
        let renewed =
            end_call(&mut self.sandbox, renewed).and_then(|r| guest_result(&self.sandbox, r));
        self.trace_end(&renewed);
        renewed
    }

    /// Owner, token and lease of a held lock, as the guest sees it.
    pub async fn lock_details(&mut self, lock: &Lock) -> Result<LockInfo> {
        self.begin_call();
        let traced = self.trace_begin_unless_in_call("lock_details");
        let lock_api = self.bindings.meltano_state_backend_backend().lock();
        let info = lock_api.call_info(&mut self.sandbox, lock.resource).await;
        let info = end_call(&mut self.sandbox, info);
        self.trace_end_if(traced, &info);
        let mut info = info_from_wit(info?);
        info.who = self.who.clone().map(Box::new);
        Ok(info)
    }

    /// Overwrites the lock's state, fenced by the lock.
    pub async fn set_locked(&mut self, state: &State, lock: &Lock) -> Result<()> {
        call!(self.call_set_locked(&wit::State::from(state), lock.resource))
    }

    /// Removes the lock's state, fenced by the lock.
    pub async fn delete_locked(&mut self, lock: &Lock) -> Result<()> {
        call!(self.call_delete_locked(lock.resource))
    }

    /// The newest `limit` versions of `state_id` in the history, newest first.
    pub async fn history(&mut self, state_id: &str, limit: u32) -> Result<Vec<HistoryEntry>> {
        let entries = call!(self.call_history(state_id, limit))?
            .into_iter()
            .map(HistoryEntry::from)
            .collect();
        Ok(self.with_writers(entries).await)
    }

    /// The version of `state_id` at `at`.
    pub async fn get_at(&mut self, state_id: &str, at: Point) -> Result<HistoryEntry> {
        let entry = call!(self.call_get_at(state_id, at.into()))?.into();
        Ok(self.with_writers(vec![entry]).await.remove(0))
    }

    /// Writes the state the lock's id had at `to` as a new version, fenced by the lock.
    pub async fn restore_locked(&mut self, to: Point, lock: &Lock) -> Result<Restored> {
        let mut restored: Restored =
            call!(self.call_restore_locked(to.into(), lock.resource))?.into();
        restored.restored.who = self.who.clone();
        Ok(restored)
    }

    /// Removes these streams' bookmarks from the lock's state, fenced by the lock; returns the
    /// state written.
    pub async fn clear_streams_locked(&mut self, streams: &[String], lock: &Lock) -> Result<State> {
        Ok(call!(self.call_clear_streams_locked(streams, lock.resource))?.into())
    }

    /// Who holds the lock of `state_id`, if anyone.
    pub async fn lock_info(&mut self, state_id: &str) -> Result<Option<LockInfo>> {
        match call!(self.call_lock_info(state_id))? {
            Some(info) => Ok(Some(self.holder(info_from_wit(info)).await)),
            None => Ok(None),
        }
    }

    /// Holds `state_id` for this caller's run until `close`; `locked` at once, naming the
    /// holder's process, while another run holds it, unless `force`.
    pub async fn hold_run(&mut self, state_id: &str, force: bool) -> Result<()> {
        call!(self.call_hold_run(state_id, force))
    }

    /// The store's checks for an operator (the contract's `diagnose`), with the processes of
    /// the unreleased grants' holders.
    pub async fn diagnose(&mut self) -> Result<crate::doctor::check::Diagnosis> {
        use crate::doctor::check::{Check, Diagnosis};
        self.begin_call();
        let traced = self.trace_begin_unless_in_call("diagnose");
        let guest = self.bindings.meltano_state_backend_backend().store();
        let found = guest.call_diagnose(&mut self.sandbox, self.handle).await;
        let found = match end_call(&mut self.sandbox, found) {
            Ok(found) => found,
            Err(e) => {
                let failed = Err(e);
                self.trace_end_if(traced, &failed);
                return failed;
            }
        };
        let checks = found.checks.into_iter().map(Check::from).collect();
        let mut unreleased: Vec<LockInfo> =
            found.unreleased.into_iter().map(info_from_wit).collect();
        let mut ids: Vec<String> = unreleased
            .iter()
            .filter_map(|i| i.instance().map(str::to_string))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let who = self.who_of(&ids).await;
        for info in &mut unreleased {
            info.who = info
                .instance()
                .and_then(|i| who.get(i).cloned())
                .map(Box::new);
        }
        self.trace_end_if(traced, &Ok(()));
        Ok(Diagnosis { checks, unreleased })
    }

    /// Breaks the lock of `state_id`; returns whether one was held.
    pub async fn force_unlock(&mut self, state_id: &str) -> Result<bool> {
        call!(self.call_force_unlock(state_id))
    }

    /// Gives a lock back. The resource is dropped whatever the outcome.
    pub async fn release(&mut self, lock: Lock) -> Result<()> {
        self.begin_call();
        self.trace_begin("release");
        let lock_api = self.bindings.meltano_state_backend_backend().lock();
        let released = lock_api
            .call_release(&mut self.sandbox, lock.resource)
            .await;
        let released = end_call(&mut self.sandbox, released).and_then(|r| r.map_err(Error::from));
        self.trace_end(&released);
        let dropped = lock
            .resource
            .resource_drop_async(&mut self.sandbox)
            .await
            .map_err(Error::trap);
        released?;
        dropped
    }

    /// Gives back what the guest's store kept between calls and idled for long enough (a lock kept
    /// after `update`); returns when to call again (unix ms by this instance's clock, see
    /// [`Backend::clock`]), or `None` when nothing is kept.
    pub async fn idle(&mut self) -> Result<Option<u64>> {
        call!(self.call_idle())
    }

    /// The clock this instance runs on (the host's, or a test's virtual one).
    pub fn clock(&self) -> std::sync::Arc<dyn crate::clock::Clock> {
        self.sandbox.data().clock()
    }

    /// How long one call may run before it is stopped (`RuntimeOptions::call_deadline`, or the
    /// lock timeout and a minute): a caller that waits for an answer waits this long.
    pub fn call_deadline(&self) -> std::time::Duration {
        self.sandbox.data().limits.call_deadline
    }

    /// Gives back everything the guest's store kept, then drops the store resource inside the
    /// guest.
    pub async fn close(mut self) -> Result<()> {
        let closed = call!(self.call_close());
        let dropped = self
            .handle
            .resource_drop_async(&mut self.sandbox)
            .await
            .map_err(Error::trap);
        closed.and(dropped)
    }
}
