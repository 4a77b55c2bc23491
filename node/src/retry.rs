//! When to try again something that can fail or get lost on the way (a dial, a `Join`, a step
//! report): exponential backoff with jitter from `backon`, reset once it worked. Jitter keeps a
//! cluster that lost its leader, or a whole rack of restarted nodes, from retrying in lockstep.
//!
//! Callers poll: an actor's interval or a loop asks [`Retry::due`] and reports
//! [`Retry::attempted`]; nothing here sleeps.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A retry schedule: the first attempt is due at once, each later one after a delay that
/// doubles from `min` up to `max`, plus a random jitter of up to the delay itself.
#[derive(Debug)]
pub struct Retry {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
    next: Option<Instant>,
}

impl Retry {
    /// A schedule whose delays grow from `min` to `max` (before jitter).
    pub fn new(min: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max,
            next: None,
        }
    }

    /// Whether an attempt may be made at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|t| now >= t)
    }

    /// An attempt was made at `now`: the next one waits for the next delay.
    pub fn attempted(&mut self, now: Instant) {
        let delay = self.delays.next().unwrap_or(self.max);
        self.next = Some(now + delay);
    }

    /// It worked, or the situation changed: the next attempt is due at once and delays start
    /// again from the minimum.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_with_jitter_and_reset() {
        let (min, max) = (Duration::from_millis(100), Duration::from_millis(400));
        let mut r = Retry::new(min, max);
        let t0 = Instant::now();
        assert!(r.due(t0), "the first attempt is due at once");
        let mut at = t0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            r.attempted(at);
            let next = r.next.unwrap();
            waits.push(next - at);
            assert!(!r.due(next - Duration::from_millis(1)));
            assert!(r.due(next));
            at = next;
        }
        // Delay k is base_k plus a jitter in [0, base_k): base 100, 200, 400, 400, ...
        for (w, base) in waits.iter().zip([100u64, 200, 400, 400, 400, 400]) {
            let base = Duration::from_millis(base);
            assert!(*w >= base && *w < 2 * base, "{w:?} outside [{base:?}, 2x)");
        }
        r.reset();
        assert!(r.due(at));
        r.attempted(at);
        assert!(
            r.next.unwrap() - at < 2 * min,
            "delays start again from the minimum"
        );
    }
}
