//! Binding glue: the WIT world onto the plain-Rust [`Store`]. Nothing else lives here.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::bindings::exports::meltano::state_backend::backend::{
    self as api, Guest, GuestLock, GuestStore,
};
use crate::bindings::meltano::state_backend::{clock, log, types as wit};
use crate::bindings::wasi;
use crate::error::{Error, WriterInfo};
use crate::session::{Level, Platform};
use crate::store::{State, Store};
use crate::wasi_http::WasiHttp;
use protocol::grant::LockHandle;

/// Time, randomness and logging from the host's imports.
pub struct WasiPlatform;

impl Platform for WasiPlatform {
    fn now_ms(&self) -> u64 {
        clock::now_ms()
    }
    fn sleep_ms(&self, ms: u64) {
        clock::sleep_ms(ms)
    }
    fn random_u128(&self) -> u128 {
        let high = wasi::random::random::get_random_u64() as u128;
        let low = wasi::random::random::get_random_u64() as u128;
        (high << 64) | low
    }
    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        log::log(level, message);
    }
}

type Inner = Store<WasiHttp, WasiPlatform>;

/// A panic reaches the host as a log line it recognises (`panic: ...`), so the trap that
/// follows becomes a typed error with the message instead of "unreachable".
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            log::log(log::Level::Error, &format!("panic: {info}"));
        }));
    });
}

struct Component;

impl Guest for Component {
    type Store = StoreResource;
    type Lock = LockResource;
}

pub struct StoreResource {
    inner: Rc<Inner>,
}

pub struct LockResource {
    store: Rc<Inner>,
    handle: RefCell<LockHandle>,
    released: Cell<bool>,
}

impl GuestStore for StoreResource {
    fn open(uri: String, settings: Vec<(String, String)>) -> Result<api::Store, wit::Error> {
        install_panic_hook();
        let inner = Store::open(&uri, &settings, WasiHttp, WasiPlatform).map_err(to_wit)?;
        Ok(api::Store::new(StoreResource {
            inner: Rc::new(inner),
        }))
    }

    fn identify(&self, who: wit::WriterInfo) {
        let wit::WriterInfo {
            run_id,
            command,
            host,
            pid,
            meltano_version,
            backend_version,
        } = who;
        self.inner.identify(WriterInfo {
            run_id,
            command,
            host,
            pid,
            meltano_version,
            backend_version,
        });
    }

    fn writers(&self, ids: Vec<String>) -> Result<Vec<(String, wit::WriterInfo)>, wit::Error> {
        let found = self.inner.writers(&ids).map_err(to_wit)?;
        Ok(found
            .into_iter()
            .map(|w| {
                let WriterInfo {
                    run_id,
                    command,
                    host,
                    pid,
                    meltano_version,
                    backend_version,
                } = w.who;
                let who = wit::WriterInfo {
                    run_id,
                    command,
                    host,
                    pid,
                    meltano_version,
                    backend_version,
                };
                (w.writer, who)
            })
            .collect())
    }

    fn get(&self, state_id: String) -> Result<Option<wit::State>, wit::Error> {
        self.inner
            .get(&state_id)
            .map(|s| s.map(state_to_wit))
            .map_err(to_wit)
    }

    fn set(&self, state: wit::State) -> Result<(), wit::Error> {
        self.inner.set(&state_from_wit(state)).map_err(to_wit)
    }

    fn update(&self, state: wit::State) -> Result<(), wit::Error> {
        self.inner.update(&state_from_wit(state)).map_err(to_wit)
    }

    fn delete(&self, state_id: String) -> Result<(), wit::Error> {
        self.inner.delete(&state_id).map_err(to_wit)
    }

    fn clear(&self, state_id: String) -> Result<(), wit::Error> {
        self.inner.clear(&state_id).map_err(to_wit)
    }

    fn state_ids(&self, pattern: Option<String>) -> Result<Vec<String>, wit::Error> {
        self.inner.state_ids(pattern.as_deref()).map_err(to_wit)
    }

    fn get_all(&self, pattern: Option<String>) -> Result<Vec<wit::State>, wit::Error> {
        self.inner
            .get_all(pattern.as_deref())
            .map(|all| all.into_iter().map(state_to_wit).collect())
            .map_err(to_wit)
    }

    fn set_all(&self, states: Vec<wit::State>) -> Result<u64, wit::Error> {
        let states: Vec<State> = states.into_iter().map(state_from_wit).collect();
        self.inner.set_all(&states).map_err(to_wit)
    }

    fn clear_all(&self) -> Result<u64, wit::Error> {
        self.inner.clear_all().map_err(to_wit)
    }

    fn acquire_lock(&self, state_id: String) -> Result<api::Lock, wit::Error> {
        let handle = self.inner.acquire_lock(&state_id).map_err(to_wit)?;
        Ok(api::Lock::new(LockResource {
            store: Rc::clone(&self.inner),
            handle: RefCell::new(handle),
            released: Cell::new(false),
        }))
    }

    fn set_locked(&self, state: wit::State, lock: api::LockBorrow<'_>) -> Result<(), wit::Error> {
        let lock = self.own_lock(&lock)?;
        self.inner
            .set_locked(&state_from_wit(state), &mut lock.handle.borrow_mut())
            .map_err(to_wit)
    }

    fn delete_locked(&self, lock: api::LockBorrow<'_>) -> Result<(), wit::Error> {
        let lock = self.own_lock(&lock)?;
        self.inner
            .clear_locked(&mut lock.handle.borrow_mut())
            .map_err(to_wit)
    }

    fn history(&self, state_id: String, limit: u32) -> Result<Vec<wit::HistoryEntry>, wit::Error> {
        self.inner
            .history(&state_id, limit)
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| entry_to_wit(&state_id, e))
                    .collect()
            })
            .map_err(to_wit)
    }

    fn get_at(&self, state_id: String, at: wit::Point) -> Result<wit::HistoryEntry, wit::Error> {
        self.inner
            .get_at(&state_id, point_from_wit(at))
            .map(|e| entry_to_wit(&state_id, e))
            .map_err(to_wit)
    }

    fn restore_locked(
        &self,
        to: wit::Point,
        lock: api::LockBorrow<'_>,
    ) -> Result<wit::Restored, wit::Error> {
        let lock = self.own_lock(&lock)?;
        let mut handle = lock.handle.borrow_mut();
        let restored = self
            .inner
            .restore_locked(point_from_wit(to), &mut handle)
            .map_err(to_wit)?;
        Ok(wit::Restored {
            replaced: restored.replaced.map(state_to_wit),
            restored: entry_to_wit(&handle.state_id, restored.restored),
        })
    }

    fn clear_streams_locked(
        &self,
        streams: Vec<String>,
        lock: api::LockBorrow<'_>,
    ) -> Result<wit::State, wit::Error> {
        let lock = self.own_lock(&lock)?;
        self.inner
            .clear_streams_locked(&streams, &mut lock.handle.borrow_mut())
            .map(state_to_wit)
            .map_err(to_wit)
    }

    fn hold_run(&self, state_id: String, force: bool) -> Result<(), wit::Error> {
        self.inner.hold_run(&state_id, force).map_err(to_wit)
    }

    fn lock_info(&self, state_id: String) -> Result<Option<wit::LockInfo>, wit::Error> {
        self.inner
            .lock_info(&state_id)
            .map(|info| info.map(info_to_wit))
            .map_err(to_wit)
    }

    fn force_unlock(&self, state_id: String) -> Result<bool, wit::Error> {
        self.inner.force_unlock(&state_id).map_err(to_wit)
    }

    fn migrate(&self) -> Result<(), wit::Error> {
        self.inner.migrate().map_err(to_wit)
    }

    fn schema(&self) -> Result<Vec<String>, wit::Error> {
        Ok(self.inner.schema())
    }

    fn diagnose(&self) -> wit::Diagnosis {
        use crate::doctor::Outcome;
        let found = self.inner.diagnose();
        wit::Diagnosis {
            checks: found
                .checks
                .into_iter()
                .map(|c| wit::Check {
                    name: c.name.to_string(),
                    outcome: match c.outcome {
                        Outcome::Pass => wit::Outcome::Pass,
                        Outcome::Warn => wit::Outcome::Warn,
                        Outcome::Fail => wit::Outcome::Fail,
                        Outcome::Skipped => wit::Outcome::Skipped,
                    },
                    detail: c.detail,
                    fix: c.fix,
                })
                .collect(),
            unreleased: found.unreleased.into_iter().map(info_to_wit).collect(),
        }
    }

    fn idle(&self) -> Result<Option<u64>, wit::Error> {
        self.inner.idle().map_err(to_wit)
    }

    fn close(&self) -> Result<(), wit::Error> {
        self.inner.close().map_err(to_wit)
    }
}

impl Drop for StoreResource {
    fn drop(&mut self) {
        // Best effort: kept locks nobody gives back still expire with their lease.
        if let Err(e) = self.inner.close() {
            WasiPlatform.log(
                Level::Warn,
                &format!("giving back kept locks at close failed: {e}"),
            );
        }
    }
}

impl StoreResource {
    /// A lock handed back by the caller, checked to belong to this store and to be held.
    fn own_lock<'a>(&self, lock: &'a api::LockBorrow<'_>) -> Result<&'a LockResource, wit::Error> {
        let lock: &LockResource = lock.get();
        if !Rc::ptr_eq(&lock.store, &self.inner) {
            return Err(wit::Error::InvalidInput(
                "the lock belongs to another store".into(),
            ));
        }
        if lock.released.get() {
            return Err(wit::Error::LockLost("the lock was released".into()));
        }
        Ok(lock)
    }
}

impl GuestLock for LockResource {
    fn state_id(&self) -> String {
        self.handle.borrow().state_id.clone()
    }

    fn token(&self) -> u64 {
        self.handle.borrow().token
    }

    fn info(&self) -> wit::LockInfo {
        let handle = self.handle.borrow();
        wit::LockInfo {
            state_id: handle.state_id.clone(),
            owner: handle.owner.clone(),
            token: handle.token,
            acquired_at_ms: handle.acquired_at_ms,
            expires_at_ms: handle.lease_until_ms,
        }
    }

    fn renew(&self) -> Result<(), wit::Error> {
        if self.released.get() {
            return Err(wit::Error::LockLost("the lock was released".into()));
        }
        self.store
            .renew_lock(&mut self.handle.borrow_mut())
            .map_err(to_wit)
    }

    fn release(&self) -> Result<(), wit::Error> {
        if self.released.replace(true) {
            return Ok(());
        }
        self.store
            .release_lock(&self.handle.borrow())
            .map_err(to_wit)
    }
}

impl Drop for LockResource {
    fn drop(&mut self) {
        if !self.released.get() {
            // Best effort: a lock nobody releases still expires with its lease.
            if let Err(e) = self.store.release_lock(&self.handle.borrow()) {
                WasiPlatform.log(
                    Level::Warn,
                    &format!("releasing a dropped lock failed: {e}"),
                );
            }
        }
    }
}

fn state_to_wit(state: State) -> wit::State {
    wit::State {
        state_id: state.state_id,
        partial: state.partial,
        completed: state.completed,
    }
}

fn state_from_wit(state: wit::State) -> State {
    State {
        state_id: state.state_id,
        partial: state.partial,
        completed: state.completed,
    }
}

fn entry_to_wit(state_id: &str, entry: crate::rows::HistoryEntry) -> wit::HistoryEntry {
    let state = match (entry.partial_state, entry.completed_state) {
        (None, None) => None,
        (partial, completed) => Some(wit::State {
            state_id: state_id.to_string(),
            partial: crate::merge::or_empty(partial),
            completed: crate::merge::or_empty(completed),
        }),
    };
    wit::HistoryEntry {
        version: entry.version,
        op: entry.op,
        writer: entry.writer,
        lock_owner: entry.lock_owner,
        token: entry.token,
        state,
    }
}

fn point_from_wit(point: wit::Point) -> crate::sql::Point {
    match point {
        wit::Point::Version(v) => crate::sql::Point::Version(v),
        wit::Point::Time(t) => crate::sql::Point::Time(t),
    }
}

fn info_to_wit(info: crate::error::LockInfo) -> wit::LockInfo {
    wit::LockInfo {
        state_id: info.state_id,
        owner: info.owner,
        token: info.token,
        acquired_at_ms: info.acquired_at_ms,
        expires_at_ms: info.expires_at_ms,
    }
}

fn to_wit(error: Error) -> wit::Error {
    match error {
        Error::InvalidConfig(m) => wit::Error::InvalidConfig(m),
        Error::InvalidInput(m) => wit::Error::InvalidInput(m),
        Error::Unauthorized(m) => wit::Error::Unauthorized(m),
        Error::Unreachable(m) | Error::Refused(m) => wit::Error::Unreachable(m),
        Error::Timeout(m) => wit::Error::Timeout(m),
        Error::Locked(info) => wit::Error::Locked(info_to_wit(info)),
        Error::LockLost(m) => wit::Error::LockLost(m),
        Error::Server(e) => wit::Error::Server(wit::ServerError {
            code: e.code,
            name: e.name,
            message: e.message,
        }),
    }
}

crate::bindings::export!(Component);
