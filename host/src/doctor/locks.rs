//! Stuck locks: grants held by a process of this machine that no longer exists, and grants that
//! lapsed without a release.

use super::check::{Check, Outcome};
use crate::error::LockInfo;

/// Whether the process `pid` of this machine is gone; `None` where this host cannot tell.
pub fn process_gone(pid: u32) -> Option<bool> {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return Some(true);
        };
        // Signal 0 checks that the process exists; EPERM means it exists, as another user's.
        // SAFETY: kill with signal 0 sends nothing.
        let result = unsafe { libc::kill(pid, 0) };
        if result == 0 {
            return Some(false);
        }
        Some(std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        None
    }
}

/// The lock check: a grant still in its lease whose holder is a process of this machine that
/// is gone fails (nobody will release it before its lease ends); grants that lapsed unreleased
/// are listed (they block nothing: the next claim takes the id).
pub fn check(unreleased: &[LockInfo], now_ms: u64) -> Check {
    let this_host = crate::records::this_host();
    let mut stuck = Vec::new();
    let mut lapsed = Vec::new();
    let mut held = 0;
    for info in unreleased {
        let who = info.who.as_deref();
        let process = who
            .map(|w| format!("pid {} on {}", w.pid, w.host))
            .unwrap_or_else(|| format!("owner {}", info.owner));
        if info.expires_at_ms < now_ms {
            lapsed.push(format!("{} ({process})", info.state_id));
            continue;
        }
        held += 1;
        let gone = who
            .filter(|w| w.host == this_host)
            .and_then(|w| process_gone(w.pid))
            .unwrap_or(false);
        if gone {
            stuck.push(format!(
                "{} is held by {process}, which no longer exists, for {} s more",
                info.state_id,
                (info.expires_at_ms - now_ms).div_ceil(1000)
            ));
        }
    }
    let mut detail = format!("{held} held");
    if !lapsed.is_empty() {
        detail.push_str(&format!(
            "; lapsed without a release (harmless: the next claim takes the id): {}",
            lapsed.join(", ")
        ));
    }
    if stuck.is_empty() {
        return Check::new("locks", Outcome::Pass, detail, "");
    }
    Check::new(
        "locks",
        Outcome::Fail,
        format!("stuck: {}; {detail}", stuck.join("; ")),
        "`state-backend force-unlock STATE_ID` frees it now (its holder is gone)",
    )
}
