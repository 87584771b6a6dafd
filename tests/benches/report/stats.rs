//! Latency samples and their quantiles.

use std::time::Instant;

/// Latencies in milliseconds.
#[derive(Default, Clone)]
pub struct Samples {
    ms: Vec<f64>,
}

impl Samples {
    pub fn push(&mut self, ms: f64) {
        self.ms.push(ms);
    }

    /// Times `f` and records it.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.push(started.elapsed().as_secs_f64() * 1000.0);
        out
    }

    /// Forgets the first `n` samples (a warm-up).
    pub fn discard_first(&mut self, n: usize) {
        self.ms.drain(..n.min(self.ms.len()));
    }

    /// The samples, in the order they came.
    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        self.ms.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.ms.len()
    }

    /// The `p` quantile (0 to 1), nearest rank.
    pub fn quantile(&self, p: f64) -> f64 {
        let mut sorted = self.ms.clone();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return f64::NAN;
        }
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[index.min(sorted.len() - 1)]
    }

    pub fn p50(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }
}

impl FromIterator<f64> for Samples {
    fn from_iter<I: IntoIterator<Item = f64>>(ms: I) -> Self {
        Samples {
            ms: ms.into_iter().collect(),
        }
    }
}
