//! The phase of the availability intervals as this node saw them begin.

use std::time::{Duration, Instant};

/// When the current availability interval began, as this node saw it: the leader when it
/// proposes a tick, a follower when it applies one. A new leader goes on at the old one's
/// phase; one that started a new interval at once recorded its first seconds as a whole
/// interval and planned at a boundary that was none (the 64-node run's new leader re-planned
/// seven times in 100 s).
#[derive(Debug, Default)]
pub struct IntervalClock {
    /// The last interval known to have begun.
    interval: Option<u64>,
    began: Option<Instant>,
}

impl IntervalClock {
    /// Notes the last interval the replicated state records: a later one than known began now.
    pub fn observe(&mut self, recorded: Option<u64>, now: Instant) {
        if recorded > self.interval {
            self.interval = recorded;
            self.began = Some(now);
        }
    }

    /// Notes that this node (the leader) begins `interval` now.
    pub fn begin(&mut self, interval: u64, now: Instant) {
        self.interval = Some(interval);
        self.began = Some(now);
    }

    /// When the current interval ends: now if none is known to have begun.
    pub fn ends(&self, now: Instant, length: Duration) -> Instant {
        self.began.map_or(now, |t| t + length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_leader_keeps_the_old_leader_s_interval_phase() {
        let length = Duration::from_secs(20);
        let t0 = Instant::now();
        let mut clock = IntervalClock::default();
        assert_eq!(
            clock.ends(t0, length),
            t0,
            "nothing recorded: an interval is due"
        );
        clock.observe(None, t0);
        assert_eq!(clock.ends(t0, length), t0);
        // As a follower: interval 7 applied at t0, nothing new after it.
        clock.observe(Some(7), t0);
        let t1 = t0 + Duration::from_secs(3);
        clock.observe(Some(7), t1);
        assert_eq!(
            clock.ends(t1, length),
            t0 + length,
            "the old leader's phase"
        );
        // As the leader: it begins interval 8 and later applies its own tick.
        let t2 = t0 + length;
        clock.begin(8, t2);
        clock.observe(Some(8), t2 + Duration::from_millis(40));
        assert_eq!(
            clock.ends(t2, length),
            t2 + length,
            "no drift by commit latency"
        );
        clock.observe(Some(7), t2 + length);
        assert_eq!(
            clock.ends(t2, length),
            t2 + length,
            "an older record changes nothing"
        );
    }
}
