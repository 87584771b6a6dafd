//! `http <url>`: send a GET to any URL, for the egress policy to refuse.

use super::quote;
use crate::wasi::http::outgoing_handler;
use crate::wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

pub fn run(url: &str) -> String {
    format!("{{\"result\":{}}}", quote(&get(url)))
}

fn get(url: &str) -> String {
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
