//! The data-parallel x pipeline-parallel shape of a training job.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A parallel configuration: `d` pipelines of `p` stages each, one node per stage.
///
/// `(0, 0)` is the idle configuration (nothing runs), used before the first start and when no
/// feasible configuration fits the available nodes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct ParallelConfig {
    /// Data-parallel degree: number of pipelines.
    pub d: u32,
    /// Pipeline depth: number of stages.
    pub p: u32,
}

impl ParallelConfig {
    /// The idle configuration.
    pub const IDLE: ParallelConfig = ParallelConfig { d: 0, p: 0 };

    /// A configuration of `d` pipelines of depth `p`.
    pub const fn new(d: u32, p: u32) -> Self {
        Self { d, p }
    }

    /// Nodes the configuration occupies.
    pub const fn nodes(self) -> u32 {
        self.d * self.p
    }

    /// Whether nothing runs.
    pub const fn is_idle(self) -> bool {
        self.d == 0 || self.p == 0
    }

    /// The configuration actually run when only `nodes` are alive: Parcae shrinks `d` first
    /// and falls back to a single pipeline over every node (spec 1.4).
    pub fn clamp_to(self, nodes: u32) -> Self {
        if self.nodes() <= nodes {
            return self;
        }
        if nodes == 0 {
            return Self::IDLE;
        }
        let d = nodes / self.p;
        if d == 0 {
            Self::new(1, nodes)
        } else {
            Self::new(d, self.p)
        }
    }
}

impl fmt::Display for ParallelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{})", self.d, self.p)
    }
}

impl From<(u32, u32)> for ParallelConfig {
    fn from((d, p): (u32, u32)) -> Self {
        Self::new(d, p)
    }
}
