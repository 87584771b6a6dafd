//! `env`: count the environment variables and arguments the host gave it (none, it should be).
//! Files are out of reach by construction: the host does not link wasi:filesystem, and a
//! component that imports it does not load (tests/tests/integration/evil.rs).

pub fn run(_: &str) -> String {
    let vars = std::env::vars().count();
    let args = std::env::args().count();
    format!("{{\"vars\":{vars},\"args\":{args}}}")
}
