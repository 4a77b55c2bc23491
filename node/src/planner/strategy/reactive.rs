//! `reactive`: the throughput-optimal configuration for the nodes present, restarting from
//! checkpoints on every change, like Parcae's throughput-optimised baseline. A member that
//! announced it leaves works on until it is gone.

use parcae_strategies::ParallelConfig;

use super::{Situation, Strategy};
use crate::planner::settle::{Departure, departing_members};

/// The strategy (it remembers nothing).
pub struct Reactive;

impl Strategy for Reactive {
    fn acts_on_notices(&self) -> bool {
        false
    }

    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig> {
        // Leaving members still work: the configuration changes once they are gone.
        let leaving = departing_members(at.state, |d| d == Departure::Announced);
        if !at.broken && at.planned && at.cost.best(at.workers + leaving) == at.running {
            return None;
        }
        Some(at.cost.best(at.workers))
    }
}
