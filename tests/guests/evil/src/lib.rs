//! A hostile guest. It implements the `clickhouse-state-backend` world, and `get(id)` does what
//! `id` names instead of reading a state:
//!
//! - `loop`: spin forever;
//! - `alloc`: allocate without bound;
//! - `panic`: panic with a message;
//! - `env`: read the environment, arguments and files (`/etc/passwd`, `/proc/self/environ`);
//! - `http <url>`: send a GET to any URL;
//! - `smuggle`: try to set headers that would change where or how a request goes.
//!
//! What it observed comes back as the `completed` part of the returned state (a JSON object).

#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({
    path: "../../../wit",
    world: "clickhouse-state-backend",
    generate_all,
});

use exports::meltano::state_backend::backend::{self as api, Guest, GuestLock, GuestStore};
use meltano::state_backend::types as wit;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

struct Evil;

impl Guest for Evil {
    type Store = EvilStore;
    type Lock = EvilLock;
}

struct EvilStore;
struct EvilLock;

fn observed(id: &str, json: String) -> Result<Option<wit::State>, wit::Error> {
    Ok(Some(wit::State {
        state_id: id.to_string(),
        partial: "{}".into(),
        completed: json,
    }))
}

fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn http_get(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some((_, rest)) => (Scheme::Http, rest),
        None => (Scheme::Http, url),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(&Method::Get);
    let _ = request.set_scheme(Some(&scheme));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(path));
    let Ok(body) = request.body() else {
        return "no body".into();
    };
    let future = match outgoing_handler::handle(request, None) {
        Ok(f) => f,
        Err(e) => return format!("refused: {e:?}"),
    };
    let _ = OutgoingBody::finish(body, None);
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => format!("answered: HTTP {}", response.status()),
        Some(Ok(Err(e))) => format!("refused: {e:?}"),
        other => format!("no answer: {:?}", other.is_some()),
    }
}

impl GuestStore for EvilStore {
    fn open(_uri: String, _settings: Vec<(String, String)>) -> Result<api::Store, wit::Error> {
        Ok(api::Store::new(EvilStore))
    }

    fn get(&self, id: String) -> Result<Option<wit::State>, wit::Error> {
        match id.as_str() {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("the evil guest panicked on purpose (state {id})"),
            "env" => {
                // Files are out of reach by construction: the host does not link wasi:filesystem,
                // and a component that imports it does not load (tests/tests/evil.rs).
                let vars = std::env::vars().count();
                let args = std::env::args().count();
                observed(&id, format!("{{\"vars\":{vars},\"args\":{args}}}"))
            }
            "smuggle" => {
                let fields = Fields::new();
                let mut refused = Vec::new();
                let mut accepted = Vec::new();
                for name in [
                    "host",
                    "connection",
                    "transfer-encoding",
                    "te",
                    "upgrade",
                    "keep-alive",
                    "proxy-authorization",
                    "x-forwarded-for",
                    "forwarded",
                    "content-length",
                    "x-harmless",
                ] {
                    match fields.append(name, b"evil") {
                        Ok(()) => accepted.push(quote(name)),
                        Err(_) => refused.push(quote(name)),
                    }
                }
                observed(
                    &id,
                    format!(
                        "{{\"refused\":[{}],\"accepted\":[{}]}}",
                        refused.join(","),
                        accepted.join(",")
                    ),
                )
            }
            other => match other.strip_prefix("http ") {
                Some(url) => observed(&id, format!("{{\"result\":{}}}", quote(&http_get(url)))),
                None => Ok(None),
            },
        }
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
    fn force_unlock(&self, _: String) -> Result<bool, wit::Error> {
        Ok(false)
    }
    fn migrate(&self) -> Result<(), wit::Error> {
        Ok(())
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
