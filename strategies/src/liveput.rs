//! The liveput optimizer (spec 4.2): a dynamic program over the next `H` intervals that picks
//! the configuration maximising the expected number of samples trained, migration costs
//! included, and keeps only its first step (receding horizon).

use std::sync::Arc;

use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::migration::{MigrationCosts, MigrationEvent};
use crate::cost::spec::RestartKind;
use crate::cost::throughput::ThroughputTable;
use crate::trace::Interval;

mod horizon;

pub use horizon::{Lookahead, NextChange, Terminal};

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
    /// Whether `self` beats `other` as the value of the same state. Two unfinished migrations
    /// into one configuration are compared by their samples less the samples the remaining
    /// migration work costs at `per_ms` (samples per ms of the configuration): Parcae's
    /// objective passes 0 (more samples first, then less work left), ours the configuration's
    /// throughput, since a migration still running at the horizon delays the terminal value.
    fn beats(&self, other: &Node, parent_p: u32, other_parent_p: u32, per_ms: f64) -> bool {
        if self.migrating {
            let value = |n: &Node| n.samples - per_ms * n.leftover_ms;
            let (mine, theirs) = (value(self), value(other));
            mine > theirs || (mine == theirs && self.leftover_ms < other.leftover_ms)
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
    throughput: Arc<ThroughputTable>,
}

impl LiveputOptimizer {
    /// An optimizer for `model` with intervals of `interval_secs`; `seed` drives the sampling
    /// of preemption scenarios.
    pub fn new(model: Arc<CostModel>, interval_secs: f64, seed: u64) -> Self {
        Self {
            throughput: Arc::new(model.throughput.clone()),
            costs: MigrationCosts::new(model, seed),
            interval_ms: interval_secs * 1000.0,
        }
    }

    /// Values the model's configurations by `table` from now on (the model's own table until
    /// then): on a fleet whose zones change apart, what a configuration trains depends on the
    /// nodes each zone holds, not on their count alone.
    pub fn set_throughput(&mut self, table: Arc<ThroughputTable>) {
        self.throughput = table;
    }

    /// The memoised migration costs (shared with the simulator's accounting).
    pub fn costs(&mut self) -> &mut MigrationCosts {
        &mut self.costs
    }

    /// Best configuration for the next interval given the forecast `future` (next interval
    /// first). An empty forecast keeps the current configuration. This is Parcae's objective:
    /// nothing counts after the horizon.
    pub fn decide(&mut self, now: PlanState, future: &[Interval]) -> Decision {
        self.decide_with_terminal(now, future, Terminal::default())
    }

    /// [`Self::decide`] with a [`Terminal`] value for the configuration the horizon ends in.
    /// Without it a move that pays back only after the horizon is never made, and a planner
    /// keeps a slower configuration for as long as the zone stays quiet.
    /// `Decision::expected_samples` stays the samples within the horizon.
    pub fn decide_with_terminal(
        &mut self,
        now: PlanState,
        future: &[Interval],
        terminal: Terminal,
    ) -> Decision {
        self.decide_with_tables(now, future, terminal, &[])
    }

    /// [`Self::decide_with_terminal`] with what each configuration trains at each step of the
    /// look-ahead: `tables[k]` at `future[k]` (the last for the steps after it; the throughput
    /// set by [`Self::set_throughput`] for all when empty). On a fleet the forecast is of each
    /// zone, and a step that takes nodes from one zone changes what a configuration trains.
    pub fn decide_with_tables(
        &mut self,
        now: PlanState,
        future: &[Interval],
        terminal: Terminal,
        tables: &[Arc<ThroughputTable>],
    ) -> Decision {
        let model = self.costs.model().clone();
        let cands = model.candidates();
        let considered = considered(cands, now, future);
        let rates = |table: &ThroughputTable| -> Vec<f64> {
            cands.iter().map(|&c| table.samples_per_sec(c)).collect()
        };
        let mut throughput = rates(tables.first().unwrap_or(&self.throughput));
        let idle_slot = cands.len();
        let stay_ms = if terminal.stay_ms.is_finite() {
            terminal.stay_ms.max(0.0)
        } else {
            0.0
        };
        // Parcae's objective leaves unfinished work unpriced; with a terminal value it is priced
        // at the throughput it delays.
        let leftover_weight = if stay_ms > 0.0 { 1.0 } else { 0.0 };
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
        for (k, step) in future.iter().enumerate() {
            if k > 0 && k < tables.len() && !Arc::ptr_eq(&tables[k], &tables[k - 1]) {
                throughput = rates(&tables[k]);
            }
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
                self.costs.expected_for(ev, &fitting, &mut expected);
                for (&ti, &expected_ms) in fitting.iter().zip(&expected) {
                    let to = cands[ti];
                    let cost = self.step_cost(pred, expected_ms, to);
                    let relaxed = Relaxed {
                        to,
                        cost_ms: cost,
                        samples_per_sec: throughput[ti],
                        leftover_per_ms: leftover_weight * throughput[ti] / 1000.0,
                    };
                    self.relax(&mut table, ti * 2, pred, pi, prev, relaxed);
                }
                if fitting.is_empty() {
                    let cost = if pred.migrating {
                        pred.leftover_ms
                    } else {
                        0.0
                    };
                    let relaxed = Relaxed {
                        to: ParallelConfig::IDLE,
                        cost_ms: cost,
                        samples_per_sec: 0.0,
                        leftover_per_ms: 0.0,
                    };
                    self.relax(&mut table, idle_slot * 2, pred, pi, prev, relaxed);
                }
            }
            stages.push(table.into_iter().flatten().collect());
            nodes = after;
        }
        let last = stages.last().map(Vec::as_slice).unwrap_or(&[]);
        let end = match tables.get(future.len().min(tables.len()).saturating_sub(1)) {
            Some(table) => table.clone(),
            None => self.throughput.clone(),
        };
        let values = self.final_values(last, nodes, stay_ms, &terminal.next, &end);
        let Some(best) = best_index(last, &values) else {
            return Decision {
                config: now.config,
                migrating: now.leftover_ms > 0.0,
                expected_samples: 0.0,
            };
        };
        let depth = stages.len() - 1;
        let first_step = |mut at: usize| {
            for d in (2..=depth).rev() {
                at = stages[d][at].parent;
            }
            at
        };
        let mut at = best;
        if stay_ms > 0.0 && depth > 0 {
            at = keep_unless_worth_it(&stages[1], last, &values, best, now.config, first_step);
        }
        let expected_samples = last[at].samples;
        let first = stages[depth.min(1)][first_step(at)];
        Decision {
            config: first.config,
            migrating: first.migrating && depth > 0,
            expected_samples,
        }
    }

    /// The value of each final state (on `nodes` nodes, training at `end`'s rates): its
    /// samples, plus with a terminal value the samples of staying for `stay_ms` less the
    /// expected loss of the `next` change.
    /// The loss is priced (migration costs of new events) only for states that can still
    /// matter: in order of their value before the loss, until that falls below the best value
    /// found by more than any move margin; the others are worth `-inf`.
    fn final_values(
        &mut self,
        last: &[Node],
        nodes: u32,
        stay_ms: f64,
        next: &[NextChange],
        end: &Arc<ThroughputTable>,
    ) -> Vec<f64> {
        if stay_ms <= 0.0 {
            return last.iter().map(|n| n.samples).collect();
        }
        let before_loss: Vec<f64> = last
            .iter()
            .map(|n| {
                let running_ms = (stay_ms - n.leftover_ms).max(0.0);
                n.samples + end.samples_per_sec(n.config) * running_ms / 1000.0
            })
            .collect();
        let margin = MOVE_MARGIN * last.iter().map(|n| n.samples).fold(0.0, f64::max);
        let mut order: Vec<usize> = (0..last.len()).collect();
        order.sort_by(|&a, &b| before_loss[b].total_cmp(&before_loss[a]));
        let mut values = vec![f64::NEG_INFINITY; last.len()];
        let mut best = f64::NEG_INFINITY;
        for i in order {
            if before_loss[i] < best - margin {
                break;
            }
            let loss: f64 = next
                .iter()
                .map(|o| o.probability * self.next_change_loss(last[i].config, nodes, o, end))
                .sum();
            values[i] = before_loss[i] - loss;
            best = best.max(values[i]);
        }
        values
    }

    /// Samples that the `next` change costs `config`, running on `nodes` nodes, against
    /// the throughput-optimal configuration for the count it brings: the cheaper of migrating
    /// there (at its throughput, in expectation over which nodes a preemption hits) and
    /// running on in `config` as far as it still fits, short of the optimum's throughput until
    /// the change after. Rates are the change's own table, else `end`'s.
    fn next_change_loss(
        &mut self,
        config: ParallelConfig,
        nodes: u32,
        next: &NextChange,
        end: &Arc<ThroughputTable>,
    ) -> f64 {
        let model = self.costs.model().clone();
        let table = next.table.as_ref().unwrap_or(end).clone();
        let best = table.best(next.nodes);
        if best.is_idle() {
            return 0.0;
        }
        let event = MigrationEvent {
            nodes,
            from: config,
            added: next.nodes.saturating_sub(nodes),
            removed: nodes.saturating_sub(next.nodes),
        };
        let best_rate = table.samples_per_sec(best);
        let migrate = self.costs.expected(event, best) * best_rate / 1000.0;
        let kept = config.clamp_to(next.nodes);
        let keep = if kept.is_idle() || !model.candidates().contains(&kept) {
            f64::INFINITY
        } else {
            let shortfall = (best_rate - table.samples_per_sec(kept)).max(0.0);
            let switch_ms = self.costs.expected(event, kept);
            shortfall * next.stay_ms / 1000.0 + switch_ms * table.samples_per_sec(kept) / 1000.0
        };
        migrate.min(keep)
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

    fn relax(
        &self,
        table: &mut [Option<Node>],
        settled_slot: usize,
        pred: &Node,
        pred_index: usize,
        prev: &[Node],
        step: Relaxed,
    ) {
        let Relaxed {
            to,
            cost_ms,
            samples_per_sec,
            leftover_per_ms,
        } = step;
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
            Some(cur)
                if !cand.beats(
                    cur,
                    pred.config.p,
                    prev[cur.parent].config.p,
                    leftover_per_ms,
                ) => {}
            _ => table[slot] = Some(cand),
        }
    }
}

/// One transition of the dynamic program: into `to` at a migration cost of `cost_ms`.
#[derive(Clone, Copy, Debug)]
struct Relaxed {
    to: ParallelConfig,
    cost_ms: f64,
    samples_per_sec: f64,
    /// What a ms of unfinished migration is worth in samples (see [`Node::beats`]).
    leftover_per_ms: f64,
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

/// A move ours makes only when it is expected to gain at least this share of the samples of
/// the look-ahead: a migration that the forecast and the zone model value within that margin
/// of staying is a coin toss on their errors, and every one costs real work.
pub const MOVE_MARGIN: f64 = 0.01;

/// The final state to follow: `best`, unless its first step leaves `current` (settled and
/// feasible in the first interval) while the best path that stays there first is worth within
/// [`MOVE_MARGIN`] of it; then that path. `first_step` maps a final state to its state in
/// `first` (the states after the first interval).
fn keep_unless_worth_it(
    first: &[Node],
    last: &[Node],
    values: &[f64],
    best: usize,
    current: ParallelConfig,
    first_step: impl Fn(usize) -> usize,
) -> usize {
    let stays = |i: usize| {
        let f = &first[first_step(i)];
        f.config == current && !f.migrating
    };
    if current.is_idle() || stays(best) {
        return best;
    }
    let kept = (0..last.len())
        .filter(|&i| stays(i))
        .max_by(|&a, &b| values[a].total_cmp(&values[b]));
    match kept {
        Some(k) if values[best] - values[k] < MOVE_MARGIN * last[best].samples => k,
        _ => best,
    }
}

/// The final state: highest value (aligned with `states`), then least unfinished migration.
fn best_index(states: &[Node], values: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, (s, &value)) in states.iter().zip(values).enumerate() {
        let better = match best {
            None => true,
            Some(b) => {
                value > values[b] || (value == values[b] && s.leftover_ms < states[b].leftover_ms)
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

    #[test]
    fn each_step_is_valued_by_its_own_table() {
        // On 32 nodes 4 x 8 trains the most now; if from the second interval on it is
        // forecast to train a tenth of that (its nodes' zone is slowed), the look-ahead
        // starts on another configuration, and without the step tables on 4 x 8.
        let model = CostModel::builtin("gpt-1.5b").unwrap();
        let wide = ParallelConfig::new(4, 8);
        let now_table = Arc::new(model.throughput.clone());
        let later = Arc::new(ThroughputTable::from_rows(model.throughput.configs().map(
            |(c, r)| {
                let r = if c == wide { r / 10.0 } else { r };
                (c, r)
            },
        )));
        let mut future = steady(32, 8);
        future[0].added = 32;
        let start = PlanState {
            nodes: 0,
            config: ParallelConfig::IDLE,
            leftover_ms: 0.0,
        };
        let mut tables = vec![later; 8];
        tables[0] = now_table;
        let planned = opt().decide_with_tables(start, &future, Terminal::default(), &tables);
        assert_ne!(planned.config, wide);
        assert!(!planned.config.is_idle());
        let blind = opt().decide_with_tables(start, &future, Terminal::default(), &[]);
        assert_eq!(blind.config, wide);
    }
}
