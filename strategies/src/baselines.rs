//! Parcae's baselines (spec 5): the reactive throughput-optimised system that restarts from a
//! checkpoint on every availability change, and the free-reconfiguration ideal (both run by
//! [`crate::sim`]).

use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::migration::choose;
use crate::cost::spec::{ModelSpec, RestartKind};

/// Saving and loading a checkpoint in the reactive baseline, ms.
pub const CHECKPOINT_MS: f64 = 14_000.0;

/// Cost of the reactive baseline's restart into `to`: the restart itself, the checkpoint
/// round trip when resuming, and every stage's state reloaded one after another.
pub fn restart_ms(model: &CostModel, to: ParallelConfig, kind: RestartKind, resume: bool) -> f64 {
    let reload: f64 = model.stage_transfer_ms(to.p).iter().sum();
    restart_reloading_ms(&model.spec, to, kind, resume, reload)
}

/// [`restart_ms`] when reloading every stage's state one after another takes `reload_ms`: an
/// emulated node charges the reactive baseline this, with the reload timed on its own link.
pub fn restart_reloading_ms(
    spec: &ModelSpec,
    to: ParallelConfig,
    kind: RestartKind,
    resume: bool,
    reload_ms: f64,
) -> f64 {
    spec.restart.restart_ms(to, kind) + if resume { CHECKPOINT_MS } else { 0.0 } + reload_ms
}

/// What kills without notice cost a strategy that does not act on notices (the reactive
/// baseline), beyond its restart. Parcae's simulator charges nothing for them: its reactive
/// baseline restarts at the interval's boundary as if it had been warned. A cluster killed
/// without notice loses the step in flight with a node in use and stalls until its failure
/// detector finds the kill and its planner answers it, and a kill that takes every replica of
/// a stage rolls the job back to its newest checkpoint; a kill of a spare stalls nothing (the
/// configuration trains on until the restart).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnannouncedKills {
    /// From a kill to the plan that answers it, ms: the failure detector's timeout and the
    /// planner's wait for the other kills of the same boundary.
    pub detection_ms: f64,
    /// Steps from one checkpoint to the next: a rollback gives up half of them in expectation.
    pub checkpoint_every: f64,
}

impl UnannouncedKills {
    /// The expected stall, ms, of `removed` nodes killed at random among `before` while
    /// `running` trains with steps of `step_ms`: when a killed node was in use, the detection
    /// and the step in flight (half a step in expectation, a kill falls anywhere in it); when
    /// the kills took every replica of a stage, the steps since the newest checkpoint.
    pub fn expected_ms(
        &self,
        before: u32,
        removed: u32,
        running: ParallelConfig,
        step_ms: f64,
    ) -> f64 {
        let hit = any_in_use(before, running.nodes(), removed);
        let wiped = any_stage_wiped(before, running, removed);
        hit * (self.detection_ms + step_ms / 2.0) + wiped * self.checkpoint_every / 2.0 * step_ms
    }
}

/// The chance that `removed` nodes drawn at random among `before` include every replica of
/// some stage of `running` (inclusion and exclusion over the stages).
fn any_stage_wiped(before: u32, running: ParallelConfig, removed: u32) -> f64 {
    if running.is_idle() || running.nodes() > before {
        return 0.0;
    }
    if removed >= before {
        return 1.0;
    }
    let all = choose(before, removed);
    let (d, p) = (running.d, running.p);
    (1..=p.min(removed / d))
        .map(|k| {
            let sign = if k % 2 == 1 { 1.0 } else { -1.0 };
            sign * choose(p, k) * choose(before - k * d, removed - k * d) / all
        })
        .sum()
}

/// The chance that `removed` nodes drawn at random among `before` include one of `in_use`.
fn any_in_use(before: u32, in_use: u32, removed: u32) -> f64 {
    let spares = before.saturating_sub(in_use);
    if removed == 0 || in_use == 0 {
        return 0.0;
    }
    // The chance that every victim is a spare: drawn one after another without replacement.
    let all_spares: f64 = (0..removed)
        .map(|j| spares.saturating_sub(j) as f64 / before.saturating_sub(j).max(1) as f64)
        .product();
    1.0 - all_spares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_costs_its_detection_and_half_a_step_when_it_hits_a_node_in_use() {
        let kills = UnannouncedKills {
            detection_ms: 2500.0,
            checkpoint_every: 20.0,
        };
        let running = ParallelConfig::new(2, 4);
        // Every node in use: the kill certainly hits one.
        assert_eq!(kills.expected_ms(8, 1, running, 1000.0), 3000.0);
        // One of ten nodes killed, two spares: it hits a node in use with chance 8/10.
        assert!((kills.expected_ms(10, 1, running, 1000.0) - 0.8 * 3000.0).abs() < 1e-9);
        // Two killed, two spares: both spares with chance 2/10 x 1/9, both replicas of one of
        // the four stages with chance 4 / (10 choose 2), rolling back ten steps.
        let p = 1.0 - 2.0 / 10.0 / 9.0;
        let wiped = 4.0 / 45.0;
        let expected = p * 3000.0 + wiped * 10.0 * 1000.0;
        assert!((kills.expected_ms(10, 2, running, 1000.0) - expected).abs() < 1e-9);
        // Nothing killed, or nothing running, costs nothing.
        assert_eq!(kills.expected_ms(10, 0, running, 1000.0), 0.0);
        assert_eq!(kills.expected_ms(10, 3, ParallelConfig::IDLE, 1000.0), 0.0);
    }

    #[test]
    fn a_stage_is_wiped_when_the_kills_take_all_its_replicas() {
        // Without replicas every node in use holds the only copy of its stage.
        let single = ParallelConfig::new(1, 6);
        for removed in 1..4 {
            let hit = any_in_use(8, 6, removed);
            assert!((any_stage_wiped(8, single, removed) - hit).abs() < 1e-12);
        }
        // Two stages of two replicas on four nodes, two killed: one of the 6 pairs of each
        // stage.
        let paired = ParallelConfig::new(2, 2);
        assert!((any_stage_wiped(4, paired, 2) - 2.0 / 6.0).abs() < 1e-12);
        // Four killed: every stage.
        assert!((any_stage_wiped(4, paired, 4) - 1.0).abs() < 1e-12);
        // Fewer kills than replicas wipe nothing.
        assert_eq!(any_stage_wiped(8, ParallelConfig::new(3, 2), 2), 0.0);
        assert_eq!(choose(5, 2), 10.0);
        assert_eq!(choose(2, 5), 0.0);
    }
}
