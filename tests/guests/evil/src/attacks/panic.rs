//! `panic`: panic with a message, which the host must report and survive.

pub fn run(_: &str) -> String {
    panic!("the evil guest panicked on purpose (state panic)")
}
