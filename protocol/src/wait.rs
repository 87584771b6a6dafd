//! How long a waiter sleeps between tries of a lock someone else holds.
//!
//! Every try is a query, and on a busy id the tries of many waiters are most of what the server
//! does: sixteen processes updating one id, each waiting out the others at the plain retry
//! interval, kept the engine so busy that the holder's own queries slowed the whole queue to a
//! third of one process's pace. So the interval adapts to what the waiter sees:
//!
//! - **One grant holds on** (the same generation as at the previous try): the plain retry
//!   interval, so that a waiter notices the release of a long hold, or of a kept lock, within
//!   one interval.
//! - **The lock changed hands** since the previous try, and not to this waiter: others are
//!   winning the hand-offs, so there is a queue. The interval doubles, up to
//!   [`MAX_DOUBLINGS`] times, which thins the tries of a queue of `n` waiters while one of them
//!   still tries soon after each release.
//!
//! Jitter (80–120 %) keeps waiters from trying in lockstep. The caller's deadline caps every
//! pause.
//!
//! Before its first pause for a grant, a waiter appends a `want` row for it (fenced mode,
//! `fenced::want`): a keeper that sees it gives a kept grant back instead of lingering.

/// The interval grows to at most `2^MAX_DOUBLINGS` times the retry interval.
pub const MAX_DOUBLINGS: u32 = 3;

/// One waiter's view of the holders it met, across the tries of one acquire.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Wait {
    /// The grant (fencing token) that held the lock at the previous try.
    last_holder: Option<u64>,
    doublings: u32,
    /// The grant this waiter last said it wants (`fenced::want`).
    wanted: Option<u64>,
}

impl Wait {
    /// Whether to tell grant `holder` that this waiter wants the lock: once per grant.
    pub fn should_want(&mut self, holder: u64) -> bool {
        let first = self.wanted != Some(holder);
        self.wanted = Some(holder);
        first
    }

    /// The pause after a try that found grant `holder` holding the lock: `retry_ms` scaled by
    /// what the waiter has seen, then by `jitter_percent` (80 to 120).
    pub fn pause_ms(&mut self, holder: u64, retry_ms: u64, jitter_percent: u64) -> u64 {
        match self.last_holder {
            Some(last) if last == holder => self.doublings = 0,
            Some(_) => self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS),
            None => {}
        }
        self.last_holder = Some(holder);
        (retry_ms << self.doublings) * jitter_percent / 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_keeps_the_plain_interval() {
        let mut wait = Wait::default();
        for _ in 0..10 {
            assert_eq!(wait.pause_ms(7, 100, 100), 100);
        }
    }

    #[test]
    fn hand_offs_to_others_double_it_up_to_the_cap() {
        let mut wait = Wait::default();
        let pauses: Vec<u64> = (1..=6).map(|g| wait.pause_ms(g, 100, 100)).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 800, 800]);
        // The same holder twice: a long hold, so back to the plain interval.
        assert_eq!(wait.pause_ms(6, 100, 100), 100);
        assert_eq!(wait.pause_ms(7, 100, 100), 200);
    }

    #[test]
    fn a_grant_is_wanted_once() {
        let mut wait = Wait::default();
        assert!(wait.should_want(3));
        assert!(!wait.should_want(3));
        assert!(wait.should_want(4));
    }

    #[test]
    fn jitter_scales_the_pause() {
        let mut wait = Wait::default();
        assert_eq!(wait.pause_ms(1, 100, 80), 80);
        assert_eq!(wait.pause_ms(2, 100, 120), 240);
    }
}
