//! Restart cost `R(d, p, kind)` and its parts (spec 3.2).

use super::spec::{BuildCost, GroupCost, RestartCost, RestartKind};
use crate::config::ParallelConfig;

/// Fixed overhead of every communication-group rebuild, ms.
const GROUP_BASE_MS: f64 = 35.0;

impl RestartCost {
    /// Time to restart into `to` (rendezvous if `kind` is `Add`, groups, process, module), ms.
    pub fn restart_ms(&self, to: ParallelConfig, kind: RestartKind) -> f64 {
        match self {
            Self::Fixed { ms } => *ms,
            Self::Profiled {
                proc_ms,
                rendezvous_ms,
                add_extra_ms,
                build,
                ..
            } => {
                let join = match kind {
                    RestartKind::Add => rendezvous_ms + add_extra_ms,
                    RestartKind::Remove => 0.0,
                };
                join + self.groups_ms(to, kind) + proc_ms + build.build_ms(to.p)
            }
        }
    }

    /// Rebuilding communicators only (intra-stage migration), ms.
    pub fn groups_ms(&self, to: ParallelConfig, kind: RestartKind) -> f64 {
        let Self::Profiled { groups, .. } = self else {
            return 0.0;
        };
        let add = kind == RestartKind::Add;
        let (d, p) = (f64::from(to.d), f64::from(to.p));
        GROUP_BASE_MS
            + match groups {
                GroupCost::PerGroup { add_ms, other_ms } => {
                    let n = d + p + 1.0 + d * p;
                    n * if add { add_ms } else { other_ms }
                }
                GroupCost::PerNode { add_ms, other_ms } => {
                    d * p * if add { add_ms } else { other_ms }
                }
                GroupCost::ByWidth => {
                    let base = if to.d >= 12 {
                        2000.0
                    } else if to.d >= 6 {
                        1500.0
                    } else {
                        1000.0
                    };
                    if add { base * 1.5 } else { base }
                }
            }
    }

    /// What a move into `to` that keeps every process rebuilds: the communication groups and
    /// the stage module of a `to.p`-stage pipeline, ms; a fixed restart cost is the whole
    /// price of any move (what the nodes measured beyond their state fetches).
    pub fn rebuild_ms(&self, to: ParallelConfig, kind: RestartKind) -> f64 {
        match self {
            Self::Profiled { build, .. } => self.groups_ms(to, kind) + build.build_ms(to.p),
            Self::Fixed { ms } => *ms,
        }
    }

    /// Process start time, ms (0 for a fixed restart cost).
    pub fn proc_ms(&self) -> f64 {
        match self {
            Self::Profiled { proc_ms, .. } => *proc_ms,
            Self::Fixed { .. } => 0.0,
        }
    }
}

impl BuildCost {
    /// Time to build a stage module of a `p`-stage pipeline, ms.
    pub fn build_ms(&self, p: u32) -> f64 {
        match self {
            Self::PerBlock {
                base_ms,
                per_block_ms,
                blocks,
            } => base_ms + per_block_ms * f64::from(blocks.div_ceil(p.max(1))),
            Self::Table(table) => {
                if let Some(v) = table.get(&p) {
                    return *v;
                }
                let below = table.range(..p).next_back();
                let above = table.range(p..).next();
                match (below, above) {
                    (Some((&b, &vb)), Some((&a, &va))) => {
                        if p - b <= a - p {
                            vb
                        } else {
                            va
                        }
                    }
                    (Some((_, &v)), None) | (None, Some((_, &v))) => v,
                    (None, None) => 0.0,
                }
            }
        }
    }
}
