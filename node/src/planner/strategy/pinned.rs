//! A pinned `[D, P]` (experiments, reproducible runs): run it whenever enough nodes are
//! present; the first plan waits for them, and a cluster that shrank below it is planned by the
//! configured strategy until they are back.

use parcae_strategies::ParallelConfig;

use super::{Situation, Strategy};

/// The pinned configuration and the strategy for fewer nodes.
pub struct Pinned {
    pin: ParallelConfig,
    otherwise: Box<dyn Strategy>,
}

impl Pinned {
    /// Runs `pin`, or what `otherwise` chooses when too few nodes are present.
    pub fn new(pin: ParallelConfig, otherwise: Box<dyn Strategy>) -> Self {
        Self { pin, otherwise }
    }
}

impl Strategy for Pinned {
    fn acts_on_notices(&self) -> bool {
        true
    }

    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig> {
        if self.pin.nodes() <= at.workers {
            return Some(self.pin);
        }
        if !at.planned {
            return None;
        }
        self.otherwise.choose(at)
    }
}
