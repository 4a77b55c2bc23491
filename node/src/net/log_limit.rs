//! At most one log line per source per interval: an outsider that connects thousands of times
//! must not fill the disk, and an operator must still see that it happens.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Sources remembered at most; when full, the ones not logged within the interval are
/// forgotten, and if none is, every source is (the next line of each is logged again).
const MAX_SOURCES: usize = 4096;

/// When each source was last logged, and how many lines were held back since.
#[derive(Debug)]
pub struct LogLimit<K> {
    every: Duration,
    last: HashMap<K, (Instant, u64)>,
}

impl<K: Eq + Hash + Clone> LogLimit<K> {
    /// One line per source per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: HashMap::new(),
        }
    }

    /// Whether a line about `source` may be logged at `now`; if so, how many were held back
    /// since the last one.
    pub fn allow(&mut self, source: &K, now: Instant) -> Option<u64> {
        if let Some((at, held)) = self.last.get_mut(source) {
            if now.saturating_duration_since(*at) < self.every {
                *held += 1;
                return None;
            }
            let suppressed = *held;
            *at = now;
            *held = 0;
            return Some(suppressed);
        }
        if self.last.len() >= MAX_SOURCES {
            let every = self.every;
            self.last
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < every);
            if self.last.len() >= MAX_SOURCES {
                self.last.clear();
            }
        }
        self.last.insert(source.clone(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_source_per_interval_with_the_count_held_back() {
        let mut limit = LogLimit::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(limit.allow(&"a", t0), Some(0));
        for s in 1..100 {
            assert_eq!(limit.allow(&"a", t0 + Duration::from_millis(s)), None);
        }
        assert_eq!(limit.allow(&"b", t0), Some(0), "another source");
        assert_eq!(limit.allow(&"a", t0 + Duration::from_secs(60)), Some(99));
        assert_eq!(limit.allow(&"a", t0 + Duration::from_secs(61)), None);
    }

    #[test]
    fn memory_is_bounded() {
        let mut limit = LogLimit::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..(3 * MAX_SOURCES) {
            assert!(limit.allow(&i, t0).is_some());
        }
        assert!(limit.last.len() <= MAX_SOURCES);
    }
}
