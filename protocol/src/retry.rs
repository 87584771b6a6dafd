//! When to try a failed request again, and when to give up: exponential back-off with jitter,
//! bounded in time (the retry budget), optionally in count, and by the lease of a lock the call
//! holds. Plain arithmetic on the host's clock; the guest's session does the waiting.

/// The longest pause between two tries: a server back from a restart is noticed within it.
pub const MAX_PAUSE_MS: u64 = 2_000;

/// The retry policy of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The first pause; it doubles with each try, up to [`MAX_PAUSE_MS`].
    pub first_pause_ms: u64,
    /// How long after the first try a retry may still start.
    pub budget_ms: u64,
    /// At most this many retries, if set.
    pub max_retries: Option<u32>,
}

/// What to do after the `retry`-th failure (1 for the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Wait this long, then try again.
    After(u64),
    /// Stop; the reason, for the error.
    GiveUp(String),
}

impl Policy {
    /// The decision after failure number `failures` of a call that started at `started_ms`, at
    /// `now_ms`. `lease_end_ms`: a lock the call writes under, whose lease a retry must not
    /// outlast. `random` draws the jitter.
    pub fn next(
        &self,
        failures: u32,
        started_ms: u64,
        now_ms: u64,
        lease_end_ms: Option<u64>,
        random: u128,
    ) -> Next {
        let tried = now_ms.saturating_sub(started_ms);
        let over = |why: String| {
            let times = if failures == 1 {
                "once".to_string()
            } else {
                format!("{failures} times")
            };
            Next::GiveUp(format!("tried {times} over {} s; {why}", seconds(tried)))
        };
        if let Some(max) = self.max_retries
            && failures > max
        {
            return over(format!("the setting retries allows {max} retries"));
        }
        let pause = self.pause(failures, random);
        let resume = now_ms.saturating_add(pause);
        if resume > started_ms.saturating_add(self.budget_ms) {
            return over(format!(
                "the retry budget is {} s (setting retry_budget_seconds)",
                seconds(self.budget_ms)
            ));
        }
        if lease_end_ms.is_some_and(|end| resume > end) {
            return over("the lock's lease would end before the next try".into());
        }
        Next::After(pause)
    }

    /// The pause after failure number `failures`: half the back-off, plus a random part up to
    /// the other half, so that clients failed by the same restart do not come back in step.
    pub fn pause(&self, failures: u32, random: u128) -> u64 {
        let doublings = failures.saturating_sub(1).min(16);
        let base = self
            .first_pause_ms
            .saturating_mul(1 << doublings)
            .min(MAX_PAUSE_MS);
        let half = base / 2;
        half + (random % (u128::from(base - half) + 1)) as u64
    }
}

/// Milliseconds as seconds with at most one decimal ("9.6", "3"), without float formatting
/// (which would add some 20 KB to the component).
fn seconds(ms: u64) -> String {
    let tenths = (ms + 50) / 100;
    match tenths % 10 {
        0 => format!("{}", tenths / 10),
        t => format!("{}.{t}", tenths / 10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        first_pause_ms: 200,
        budget_ms: 60_000,
        max_retries: None,
    };

    fn splitmix(state: &mut u64) -> u128 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = *state;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        u128::from(x ^ (x >> 31))
    }

    /// Simulates a server that refuses until `back_at_ms`: whether the call gets through, and
    /// how many tries it made.
    fn ride(policy: &Policy, back_at_ms: u64, lease_end_ms: Option<u64>, seed: u64) -> (bool, u32) {
        let mut random = seed;
        let (mut now, mut failures) = (0u64, 0u32);
        loop {
            if now >= back_at_ms {
                return (true, failures + 1);
            }
            failures += 1;
            now += 5; // a refused connection takes a few ms
            match policy.next(failures, 0, now, lease_end_ms, splitmix(&mut random)) {
                Next::After(pause) => now += pause,
                Next::GiveUp(_) => return (false, failures),
            }
        }
    }

    #[test]
    fn the_default_rides_through_thirty_seconds_and_more() {
        for seed in 0..200 {
            for back_at in [500, 2_000, 10_000, 30_000, 55_000] {
                assert!(
                    ride(&POLICY, back_at, None, seed).0,
                    "{back_at} ms, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn a_restart_is_noticed_within_the_longest_pause() {
        // After a few failures every pause is at most MAX_PAUSE_MS: a server back at 10 s is
        // reached by 12 s at the latest.
        for seed in 0..200 {
            let mut random = seed;
            let mut now = 0;
            for failures in 1.. {
                if now >= 10_000 {
                    assert!(now <= 10_000 + MAX_PAUSE_MS + 5, "{now}");
                    break;
                }
                now += 5;
                match POLICY.next(failures, 0, now, None, splitmix(&mut random)) {
                    Next::After(pause) => now += pause,
                    Next::GiveUp(why) => panic!("{why}"),
                }
            }
        }
    }

    #[test]
    fn pauses_double_with_jitter_up_to_the_maximum() {
        for failures in 1..20 {
            let base = (200u64 << (failures - 1).min(16)).min(MAX_PAUSE_MS);
            let lowest = POLICY.pause(failures, 0);
            let highest = POLICY.pause(failures, u128::from(base - base / 2));
            assert_eq!(lowest, base / 2, "failure {failures}");
            assert_eq!(highest, base, "failure {failures}");
            for r in 0..50u128 {
                let p = POLICY.pause(failures, r * 7_919);
                assert!((lowest..=highest).contains(&p));
            }
        }
    }

    #[test]
    fn past_the_budget_it_gives_up_naming_the_budget() {
        let policy = Policy {
            budget_ms: 2_000,
            ..POLICY
        };
        for seed in 0..100 {
            let (through, tries) = ride(&policy, 60_000, None, seed);
            assert!(!through);
            assert!(tries >= 4, "{tries}");
        }
        match policy.next(5, 0, 1_990, None, 0) {
            Next::GiveUp(why) => {
                assert!(why.contains("tried 5 times over 2 s"), "{why}");
                assert!(why.contains("retry_budget_seconds"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_try_starts_after_the_lease_would_end() {
        let mut random = 7;
        let mut now = 0;
        for failures in 1.. {
            now += 5;
            match POLICY.next(failures, 0, now, Some(3_000), splitmix(&mut random)) {
                Next::After(pause) => {
                    now += pause;
                    assert!(now <= 3_000, "a try at {now} ms, the lease ends at 3000");
                }
                Next::GiveUp(why) => {
                    assert!(why.contains("lease"), "{why}");
                    break;
                }
            }
        }
    }

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(3_000), "3");
        assert_eq!(seconds(9_640), "9.6");
        assert_eq!(seconds(60_000), "60");
        assert_eq!(seconds(1_990), "2");
        assert_eq!(seconds(50), "0.1");
    }

    #[test]
    fn a_count_limit_still_applies() {
        let policy = Policy {
            max_retries: Some(2),
            ..POLICY
        };
        assert!(matches!(policy.next(2, 0, 10, None, 0), Next::After(_)));
        match policy.next(3, 0, 10, None, 0) {
            Next::GiveUp(why) => assert!(why.contains("retries allows 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        let none = Policy {
            max_retries: Some(0),
            ..POLICY
        };
        match none.next(1, 0, 10, None, 0) {
            Next::GiveUp(why) => assert!(why.starts_with("tried once"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
