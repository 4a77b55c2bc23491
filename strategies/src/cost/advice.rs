//! What to do with each pool a plan is laid over: release one the plan leaves idle (its nodes
//! are billed for nothing), grow one whose every node the plan uses (more would train more),
//! keep one with nodes standing by for preemptions. A pure rule on the counts, for `/status`
//! and the simulator's report.

use serde::{Deserialize, Serialize};

/// What to do with a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Give its nodes back: the plan uses none of them.
    Release,
    /// Ask for more nodes: the plan uses every one it has.
    Grow,
    /// Keep it as it is: the plan uses some of its nodes and the rest stand by.
    Keep,
}

impl Action {
    /// Its name in reports: `release`, `grow` or `keep`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Grow => "grow",
            Self::Keep => "keep",
        }
    }
}

/// The advice for one pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// What to do.
    pub action: Action,
    /// Why, in words.
    pub reason: String,
}

/// The advice for each pool that holds `held[z]` nodes of which the plan uses `used[z]`.
pub fn advise(held: &[u32], used: &[u32]) -> Vec<Advice> {
    held.iter()
        .zip(used.iter().chain(std::iter::repeat(&0)))
        .map(|(&held, &used)| {
            let (action, reason) = match (held, used) {
                (0, _) => (Action::Keep, "it holds no node".to_owned()),
                (_, 0) => (
                    Action::Release,
                    format!("the plan leaves its {held} nodes idle, billed for nothing"),
                ),
                (h, u) if u >= h => (
                    Action::Grow,
                    format!("the plan uses all {h} of its nodes: more would train more"),
                ),
                (h, u) => (
                    Action::Keep,
                    format!("the plan uses {u} of its {h} nodes; the rest stand by"),
                ),
            };
            Advice { action, reason }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_pool_is_released_a_full_one_grown_and_one_with_spares_kept() {
        let advice = advise(&[8, 16, 12, 0], &[0, 16, 10, 0]);
        let actions: Vec<Action> = advice.iter().map(|a| a.action).collect();
        assert_eq!(
            actions,
            [Action::Release, Action::Grow, Action::Keep, Action::Keep]
        );
        assert!(advice[0].reason.contains("8 nodes idle"), "{advice:?}");
        assert!(advice[2].reason.contains("10 of its 12"), "{advice:?}");
        // A plan laid over fewer pools than are held leaves the others idle.
        assert_eq!(advise(&[4, 4], &[4])[1].action, Action::Release);
    }
}
