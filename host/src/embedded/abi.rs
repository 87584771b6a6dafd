//! The C ABI over [`Host`] (described in the module above): every function catches panics, and
//! what it gives out is freed with `sb_free`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use super::{GONE, Host, OpenConfig, failure, logs};

/// Gives `text` out to the caller, who frees it with `sb_free`.
///
/// # Safety
/// `out` and `out_len` are valid for writes.
unsafe fn give(text: String, out: *mut *mut u8, out_len: *mut usize) {
    let bytes = text.into_bytes().into_boxed_slice();
    let len = bytes.len();
    let ptr = Box::into_raw(bytes).cast::<u8>();
    // SAFETY: the caller's promise.
    unsafe {
        *out = ptr;
        *out_len = len;
    }
}

/// # Safety
/// `ptr` is valid for `len` bytes (or `len` is 0).
unsafe fn text_of(ptr: *const u8, len: usize) -> Result<String, String> {
    if len == 0 {
        return Ok(String::new());
    }
    if ptr.is_null() {
        return Err("a null pointer with a length".into());
    }
    // SAFETY: the caller's promise.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8".to_string())
}

/// Starts an instance from the JSON configuration in `config`. Returns the handle, or null
/// when it did not start; either way `out` holds the session's first line.
///
/// # Safety
/// `config` is valid for `len` bytes; `out` and `out_len` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_open(
    config: *const u8,
    len: usize,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> *mut Host {
    let opened = catch_unwind(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { text_of(config, len) }.map_err(|e| format!("configuration: {e}"))?;
        // Where, not serde's message: that can quote a value, and the password is one.
        let config: OpenConfig = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the configuration is not what the host takes (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        Ok::<_, String>(Host::open(config))
    });
    let (host, first) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(message)) => (None, failure(&message)),
        Err(_) => (None, failure("the host panicked while starting")),
    };
    // SAFETY: the caller's promise.
    unsafe { give(first, out, out_len) };
    host.map_or(std::ptr::null_mut(), |host| Box::into_raw(Box::new(host)))
}

/// Sends one request line and waits at most `timeout_ms` for its answer, in `out`. Returns 0,
/// or [`GONE`] or [`HUNG`](super::HUNG) with why in `out`.
///
/// # Safety
/// `host` came from `sb_open` and is not closed; `line` is valid for `len` bytes; `out` and
/// `out_len` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_call(
    host: *const Host,
    line: *const u8,
    len: usize,
    timeout_ms: u64,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> i32 {
    // A panic inside a call is caught where the instance can be given up (`Host::call`).
    let answered = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's promise.
        let host = unsafe { host.as_ref() }.ok_or((GONE, "no host".to_string()))?;
        // SAFETY: the caller's promise.
        let line = unsafe { text_of(line, len) }.map_err(|e| (GONE, format!("request: {e}")))?;
        host.call(line, Duration::from_millis(timeout_ms))
    }));
    let (status, text) = match answered {
        Ok(Ok(answer)) => (0, answer),
        Ok(Err((status, message))) => (status, message),
        Err(_) => (GONE, "the host panicked".to_string()),
    };
    // SAFETY: the caller's promise.
    unsafe { give(text, out, out_len) };
    status
}

/// Sends each line of the host's log to `sink` (null: to stderr), on whichever thread logged
/// it. Set it before the first `sb_open`, and to null before `sink` goes away.
#[unsafe(no_mangle)]
pub extern "C" fn sb_set_log_sink(sink: Option<logs::Sink>) {
    let _ = catch_unwind(|| logs::set_sink(sink));
}

/// Frees what `sb_open` or `sb_call` gave out.
///
/// # Safety
/// `ptr` and `len` are exactly as one of them gave out, and not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_free(ptr: *mut u8, len: usize) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: the caller's promise: a boxed slice of `len` bytes from `give`.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
}

/// Ends the instance: held locks are given back, then it closes, waiting at most `timeout_ms`
/// for that; frees the handle.
///
/// # Safety
/// `host` came from `sb_open` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_close(host: *mut Host, timeout_ms: u64) {
    if host.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let host = unsafe { Box::from_raw(host) };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        host.close(Duration::from_millis(timeout_ms))
    }));
}
