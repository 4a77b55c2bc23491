//! Skewed wall clocks for the clock nemesis: which nodes, and by how much.
//!
//! A node reads `PARCAE_CLOCK_SKEW_MS` at start and adds it to every wall-clock reading
//! (`parcae_node::clock`). Every third node from the first is skewed, alternately ahead and
//! behind: the founder, which leads the cluster at first, is always among them, so the leader's
//! clock disagrees with most of its members' as well as a member's with the leader's.

/// The node's test hook (`parcae_node::clock::SKEW_ENV`).
pub const SKEW_ENV: &str = "PARCAE_CLOCK_SKEW_MS";

/// Clocks `secs` off, on every third node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    /// Seconds ahead (or behind) of the host's clock.
    pub secs: u64,
}

impl ClockSkew {
    /// Node `k`'s skew in milliseconds (`None`: its clock is the host's).
    pub fn of_node(&self, k: usize) -> Option<i64> {
        if !k.is_multiple_of(3) {
            return None;
        }
        let ms = i64::try_from(self.secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        Some(if (k / 3).is_multiple_of(2) { ms } else { -ms })
    }

    /// The environment node `k` is started with.
    pub fn env_of(&self, k: usize) -> Option<(&'static str, String)> {
        self.of_node(k).map(|ms| (SKEW_ENV, ms.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_third_node_from_the_founder_is_skewed_alternately_ahead_and_behind() {
        let skew = ClockSkew { secs: 600 };
        let skews: Vec<Option<i64>> = (0..7).map(|k| skew.of_node(k)).collect();
        assert_eq!(
            skews,
            [
                Some(600_000),
                None,
                None,
                Some(-600_000),
                None,
                None,
                Some(600_000)
            ]
        );
        assert_eq!(skew.env_of(3), Some((SKEW_ENV, "-600000".to_string())));
        assert_eq!(skew.env_of(4), None);
    }
}
