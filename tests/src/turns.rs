//! Two sides timed call by call, taking turns (the A/B benchmarks): the order flips every pair,
//! so that neither side always runs on a warmer server, and each pair gives a ratio.

use std::time::Instant;

/// One operation's pairs, as they are timed.
#[derive(Default)]
pub struct Turns {
    first: Vec<f64>,
    second: Vec<f64>,
    ratios: Vec<f64>,
}

/// An operation's medians: each side's time, and the ratio of paired calls (first over second).
pub struct Paired {
    pub first_ms: f64,
    pub second_ms: f64,
    pub ratio: f64,
}

impl Turns {
    /// Which side goes first in pair `pair`: `[true, false]` is the first side, then the second.
    pub fn order(pair: usize) -> [bool; 2] {
        let even = pair.is_multiple_of(2);
        [even, !even]
    }

    /// Times one call of a side (`first`: the first side's).
    pub async fn time<F: Future<Output = ()>>(&mut self, first: bool, call: F) {
        let started = Instant::now();
        call.await;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        if first {
            self.first.push(elapsed);
        } else {
            self.second.push(elapsed);
        }
        if self.first.len() == self.second.len()
            && let (Some(a), Some(b)) = (self.first.last(), self.second.last())
        {
            self.ratios.push(a / b);
        }
    }

    pub fn medians(self) -> Paired {
        Paired {
            first_ms: median(self.first),
            second_ms: median(self.second),
            ratio: median(self.ratios),
        }
    }
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
