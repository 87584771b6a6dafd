//! `smuggle`: try to set headers that would change where or how a request goes.

use super::quote;
use crate::wasi::http::types::Fields;

pub fn run(_: &str) -> String {
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
    format!(
        "{{\"refused\":[{}],\"accepted\":[{}]}}",
        refused.join(","),
        accepted.join(",")
    )
}
