//! A hostile guest. It implements the `clickhouse-state-backend` world, and `get(id)` runs the
//! attack `id` names instead of reading a state, one module each in `attacks`: spin, hoard
//! memory, panic, read the environment, send a request anywhere, smuggle headers. What it
//! observed comes back as the `completed` part of the returned state (a JSON object).

#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({
    path: "../../../wit",
    world: "clickhouse-state-backend",
    generate_all,
});

use exports::meltano::state_backend::backend::{self as api, Guest, GuestLock, GuestStore};
use meltano::state_backend::types as wit;

mod attacks;

struct Evil;

impl Guest for Evil {
    type Store = EvilStore;
    type Lock = EvilLock;
}

struct EvilStore;
struct EvilLock;

impl GuestStore for EvilStore {
    fn open(_uri: String, _settings: Vec<(String, String)>) -> Result<api::Store, wit::Error> {
        Ok(api::Store::new(EvilStore))
    }

    fn get(&self, id: String) -> Result<Option<wit::State>, wit::Error> {
        Ok(attacks::run(&id).map(|observed| wit::State {
            state_id: id,
            partial: "{}".into(),
            completed: observed,
        }))
    }

    fn identify(&self, _: wit::WriterInfo) {}
    fn writers(&self, _: Vec<String>) -> Result<Vec<(String, wit::WriterInfo)>, wit::Error> {
        Ok(Vec::new())
    }
    fn set(&self, _: wit::State) -> Result<(), wit::Error> {
        Ok(())
    }
    fn update(&self, _: wit::State) -> Result<(), wit::Error> {
        Ok(())
    }
    fn delete(&self, _: String) -> Result<(), wit::Error> {
        Ok(())
    }
    fn clear(&self, _: String) -> Result<(), wit::Error> {
        Ok(())
    }
    fn state_ids(&self, _: Option<String>) -> Result<Vec<String>, wit::Error> {
        Ok(Vec::new())
    }
    fn get_all(&self, _: Option<String>) -> Result<Vec<wit::State>, wit::Error> {
        Ok(Vec::new())
    }
    fn set_all(&self, _: Vec<wit::State>) -> Result<u64, wit::Error> {
        Ok(0)
    }
    fn clear_all(&self) -> Result<u64, wit::Error> {
        Ok(0)
    }
    fn acquire_lock(&self, _: String) -> Result<api::Lock, wit::Error> {
        Ok(api::Lock::new(EvilLock))
    }
    fn set_locked(&self, _: wit::State, _: api::LockBorrow<'_>) -> Result<(), wit::Error> {
        Ok(())
    }
    fn delete_locked(&self, _: api::LockBorrow<'_>) -> Result<(), wit::Error> {
        Ok(())
    }
    fn lock_info(&self, _: String) -> Result<Option<wit::LockInfo>, wit::Error> {
        Ok(None)
    }
    fn history(&self, _: String, _: u32) -> Result<Vec<wit::HistoryEntry>, wit::Error> {
        Ok(Vec::new())
    }
    fn get_at(&self, _: String, _: wit::Point) -> Result<wit::HistoryEntry, wit::Error> {
        Err(wit::Error::InvalidInput(String::new()))
    }
    fn restore_locked(
        &self,
        _: wit::Point,
        _: api::LockBorrow<'_>,
    ) -> Result<wit::Restored, wit::Error> {
        Err(wit::Error::InvalidInput(String::new()))
    }
    fn clear_streams_locked(
        &self,
        _: Vec<String>,
        _: api::LockBorrow<'_>,
    ) -> Result<wit::State, wit::Error> {
        Err(wit::Error::InvalidInput(String::new()))
    }
    fn hold_run(&self, _: String, _: bool) -> Result<(), wit::Error> {
        Ok(())
    }
    fn force_unlock(&self, _: String) -> Result<bool, wit::Error> {
        Ok(false)
    }
    fn migrate(&self) -> Result<(), wit::Error> {
        Ok(())
    }
    fn schema(&self) -> Result<Vec<String>, wit::Error> {
        Ok(Vec::new())
    }
    fn diagnose(&self) -> wit::Diagnosis {
        wit::Diagnosis {
            checks: Vec::new(),
            unreleased: Vec::new(),
        }
    }
    fn idle(&self) -> Result<Option<u64>, wit::Error> {
        Ok(None)
    }
    fn close(&self) -> Result<(), wit::Error> {
        Ok(())
    }
}

impl GuestLock for EvilLock {
    fn state_id(&self) -> String {
        String::new()
    }
    fn token(&self) -> u64 {
        0
    }
    fn info(&self) -> wit::LockInfo {
        wit::LockInfo {
            state_id: String::new(),
            owner: String::new(),
            token: 0,
            acquired_at_ms: 0,
            expires_at_ms: 0,
        }
    }
    fn renew(&self) -> Result<(), wit::Error> {
        Ok(())
    }
    fn release(&self) -> Result<(), wit::Error> {
        Ok(())
    }
}

export!(Evil);
