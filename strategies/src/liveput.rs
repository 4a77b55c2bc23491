//! The liveput optimizer (spec 4.2): a dynamic program over the next `H` intervals that picks
//! the configuration maximising the expected number of samples trained, migration costs
//! included, and keeps only its first step (receding horizon).

use std::sync::Arc;

use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::migration::{MigrationCosts, MigrationEvent};
use crate::cost::spec::RestartKind;
use crate::trace::Interval;

/// Where the job stands at an interval boundary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanState {
    /// Nodes alive before the next interval's event.
    pub nodes: u32,
    /// Configuration running now.
    pub config: ParallelConfig,
    /// Migration work still unfinished, ms (0 when none is running).
    pub leftover_ms: f64,
}

/// The optimizer's choice for the next interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Configuration to run in the next interval.
    pub config: ParallelConfig,
    /// Whether the migration into it is expected to outlast the interval.
    pub migrating: bool,
    /// Expected samples over the whole look-ahead.
    pub expected_samples: f64,
}

/// One state of the dynamic program.
#[derive(Clone, Copy, Debug)]
struct Node {
    config: ParallelConfig,
    migrating: bool,
    samples: f64,
    leftover_ms: f64,
    parent: usize,
}

impl Node {
    /// Whether `self` beats `other` as the value of the same state.
    fn beats(&self, other: &Node, parent_p: u32, other_parent_p: u32) -> bool {
        if self.migrating {
            self.samples > other.samples
                || (self.samples == other.samples && self.leftover_ms < other.leftover_ms)
        } else {
            self.samples > other.samples
                || (self.samples == other.samples && parent_p < other_parent_p)
        }
    }
}

/// The look-ahead optimizer with its memoised migration costs.
pub struct LiveputOptimizer {
    costs: MigrationCosts,
    interval_ms: f64,
}

impl LiveputOptimizer {
    /// An optimizer for `model` with intervals of `interval_secs`; `seed` drives the sampling
    /// of preemption scenarios.
    pub fn new(model: Arc<CostModel>, interval_secs: f64, seed: u64) -> Self {
        Self {
            costs: MigrationCosts::new(model, seed),
            interval_ms: interval_secs * 1000.0,
        }
    }

    /// The memoised migration costs (shared with the simulator's accounting).
    pub fn costs(&mut self) -> &mut MigrationCosts {
        &mut self.costs
    }

    /// Best configuration for the next interval given the forecast `future` (next interval
    /// first). An empty forecast keeps the current configuration.
    pub fn decide(&mut self, now: PlanState, future: &[Interval]) -> Decision {
        let model = self.costs.model().clone();
        let cands = model.candidates();
        let considered = considered(cands, now, future);
        let throughput: Vec<f64> = cands.iter().map(|&c| model.samples_per_sec(c)).collect();
        let idle_slot = cands.len();
        // Two table slots per candidate (settled, still migrating), then two for idle.
        let mut stages: Vec<Vec<Node>> = Vec::with_capacity(future.len() + 1);
        stages.push(vec![Node {
            config: now.config,
            migrating: now.leftover_ms > 0.0,
            samples: 0.0,
            leftover_ms: now.leftover_ms,
            parent: usize::MAX,
        }]);
        let mut nodes = now.nodes;
        for step in future {
            let (added, removed) = event_between(nodes, *step);
            let after = step.nodes;
            let prev = stages.last().map(Vec::as_slice).unwrap_or(&[]);
            let mut table: Vec<Option<Node>> = vec![None; (idle_slot + 1) * 2];
            let fitting: Vec<usize> = considered
                .iter()
                .copied()
                .filter(|&i| cands[i].nodes() <= after)
                .collect();
            let mut expected = vec![0.0; fitting.len()];
            for (pi, pred) in prev.iter().enumerate() {
                let ev = MigrationEvent {
                    nodes,
                    from: pred.config,
                    added,
                    removed,
                };
                let all = self.costs.expected_for(ev, &fitting);
                for (e, &i) in expected.iter_mut().zip(&fitting) {
                    *e = all[i];
                }
                for (&ti, &expected_ms) in fitting.iter().zip(&expected) {
                    let to = cands[ti];
                    let cost = self.step_cost(pred, expected_ms, to);
                    self.relax(&mut table, ti * 2, pred, pi, prev, to, cost, throughput[ti]);
                }
                if fitting.is_empty() {
                    let idle = ParallelConfig::IDLE;
                    let cost = if pred.migrating {
                        pred.leftover_ms
                    } else {
                        0.0
                    };
                    self.relax(&mut table, idle_slot * 2, pred, pi, prev, idle, cost, 0.0);
                }
            }
            stages.push(table.into_iter().flatten().collect());
            nodes = after;
        }
        let last = stages.last().map(Vec::as_slice).unwrap_or(&[]);
        let Some(mut at) = best_index(last) else {
            return Decision {
                config: now.config,
                migrating: now.leftover_ms > 0.0,
                expected_samples: 0.0,
            };
        };
        let expected_samples = last[at].samples;
        let mut depth = stages.len() - 1;
        while depth > 1 {
            at = stages[depth][at].parent;
            depth -= 1;
        }
        let first = stages[depth][at];
        Decision {
            config: first.config,
            migrating: first.migrating && depth > 0,
            expected_samples,
        }
    }

    /// Migration cost charged in an interval for moving from `pred` to `to` (spec 4.2): a new
    /// migration during an unfinished one pays an extra restart; staying burns the remainder.
    fn step_cost(&self, pred: &Node, expected_ms: f64, to: ParallelConfig) -> f64 {
        if !pred.migrating {
            expected_ms
        } else if expected_ms > 0.0 {
            expected_ms
                + self
                    .costs
                    .model()
                    .spec
                    .restart
                    .restart_ms(to, RestartKind::Remove)
        } else {
            pred.leftover_ms
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn relax(
        &self,
        table: &mut [Option<Node>],
        settled_slot: usize,
        pred: &Node,
        pred_index: usize,
        prev: &[Node],
        to: ParallelConfig,
        cost_ms: f64,
        samples_per_sec: f64,
    ) {
        let slack_ms = self.interval_ms - cost_ms;
        let cand = if slack_ms >= 0.0 {
            Node {
                config: to,
                migrating: false,
                samples: pred.samples + samples_per_sec * slack_ms / 1000.0,
                leftover_ms: 0.0,
                parent: pred_index,
            }
        } else {
            Node {
                config: to,
                migrating: true,
                samples: pred.samples,
                leftover_ms: -slack_ms,
                parent: pred_index,
            }
        };
        let slot = settled_slot + usize::from(cand.migrating);
        match &table[slot] {
            Some(cur) if !cand.beats(cur, pred.config.p, prev[cur.parent].config.p) => {}
            _ => table[slot] = Some(cand),
        }
    }
}

/// Candidate sets up to this size are searched exhaustively, as Parcae does.
const EXHAUSTIVE_CANDIDATES: usize = 256;

/// Indices of the candidates the dynamic program considers. Small sets are searched whole;
/// on large clusters only the configurations that use a node count of the horizon fully are
/// kept (for each depth, the most pipelines that fit one of the forecast counts) plus the
/// current one: a configuration leaving a whole pipeline's worth of nodes idle at every
/// step is rarely better than the next-wider one of the same depth.
fn considered(cands: &[ParallelConfig], now: PlanState, future: &[Interval]) -> Vec<usize> {
    if cands.len() <= EXHAUSTIVE_CANDIDATES {
        return (0..cands.len()).collect();
    }
    let mut counts: Vec<u32> = future.iter().map(|s| s.nodes).collect();
    counts.sort_unstable();
    counts.dedup();
    cands
        .iter()
        .enumerate()
        .filter(|(_, c)| *c == &now.config || counts.iter().any(|&m| c.p > 0 && c.d == m / c.p))
        .map(|(i, _)| i)
        .collect()
}

/// Arrivals and preemptions that lead from `nodes` to `step`: the step's own event when it is
/// consistent, otherwise the net change.
fn event_between(nodes: u32, step: Interval) -> (u32, u32) {
    if (nodes + step.added).checked_sub(step.removed) == Some(step.nodes) {
        (step.added, step.removed)
    } else if step.nodes >= nodes {
        (step.nodes - nodes, 0)
    } else {
        (0, nodes - step.nodes)
    }
}

/// The final state: most samples, then least unfinished migration.
fn best_index(states: &[Node]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, s) in states.iter().enumerate() {
        let better = match best {
            None => true,
            Some(b) => {
                let o = &states[b];
                s.samples > o.samples || (s.samples == o.samples && s.leftover_ms < o.leftover_ms)
            }
        };
        if better {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt() -> LiveputOptimizer {
        LiveputOptimizer::new(Arc::new(CostModel::builtin("gpt-1.5b").unwrap()), 60.0, 1)
    }

    fn steady(n: u32, h: usize) -> Vec<Interval> {
        vec![
            Interval {
                nodes: n,
                added: 0,
                removed: 0
            };
            h
        ]
    }

    #[test]
    fn steady_cluster_starts_on_the_best_config() {
        let mut o = opt();
        let mut future = steady(32, 8);
        future[0].added = 32;
        let d = o.decide(
            PlanState {
                nodes: 0,
                config: ParallelConfig::IDLE,
                leftover_ms: 0.0,
            },
            &future,
        );
        assert_eq!(d.config, ParallelConfig::new(4, 8));
        assert!(!d.migrating);
    }

    #[test]
    fn staying_put_is_free_when_nothing_happens() {
        let mut o = opt();
        let now = PlanState {
            nodes: 26,
            config: ParallelConfig::new(2, 13),
            leftover_ms: 0.0,
        };
        let d = o.decide(now, &steady(26, 4));
        assert_eq!(d.config, ParallelConfig::new(2, 13));
        let t = CostModel::builtin("gpt-1.5b")
            .unwrap()
            .samples_per_sec(d.config);
        assert!((d.expected_samples - 4.0 * 60.0 * t).abs() < 1e-6);
    }

    #[test]
    fn no_feasible_config_idles() {
        let mut o = opt();
        let now = PlanState {
            nodes: 6,
            config: ParallelConfig::new(1, 6),
            leftover_ms: 0.0,
        };
        let mut future = steady(3, 3);
        future[0].removed = 3;
        let d = o.decide(now, &future);
        assert_eq!(d.config, ParallelConfig::IDLE);
    }
}
