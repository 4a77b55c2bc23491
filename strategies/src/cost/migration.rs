//! Migration costs (spec 3.3): what moving from one configuration to another costs when an
//! interval's event preempts `removed` of the `nodes` alive, in expectation over which
//! nodes are hit.
//!
//! The cost of one scenario depends only on how many active nodes each old stage lost, so
//! scenarios are kept as per-stage loss vectors ([`scenarios`]). Results are memoised per
//! event.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::spec::RestartKind;
use super::{CostModel, RepartitionRule};
use crate::config::ParallelConfig;

mod handoff;
mod scenarios;

pub(crate) use scenarios::choose;
use scenarios::{Scenario, build_scenarios};

/// What happens at the start of an interval, seen from the running configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigrationEvent {
    /// Nodes alive before the event.
    pub nodes: u32,
    /// Configuration running before the event.
    pub from: ParallelConfig,
    /// Nodes that arrive.
    pub added: u32,
    /// Nodes preempted (any of the `nodes`, spares included).
    pub removed: u32,
}

impl MigrationEvent {
    /// Nodes alive after the event.
    pub fn nodes_after(&self) -> u32 {
        (self.nodes + self.added).saturating_sub(self.removed)
    }
}

/// The kinds of migration Parcae distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigrationKind {
    /// Nothing changes.
    None,
    /// Same depth, every stage keeps enough replicas: pipelines re-formed, nothing moves.
    Intra,
    /// Same depth, some stage lacks replicas: its state is copied from surviving replicas.
    Inter,
    /// New depth: layers move between nodes.
    Repartition,
    /// Restart from a checkpoint (the reactive baseline).
    Restart,
}

/// How the new stages of a repartition would like to be served by the old ones.
struct Ranking {
    /// Per new stage, the old stages ranked by how many of its parameters they lack.
    lists: Vec<Vec<(u32, f64)>>,
    /// Per old stage, how many new stages rank it first.
    demand: Vec<u32>,
    /// The largest of `demand`.
    most_demand: u32,
    /// Missing parameters when every new stage gets its first choice: summed, and the last.
    first_choice: (f64, f64),
}

type Preference = Arc<Ranking>;

/// Memoised expected migration costs for one cost model. The memos are keyed by a few small
/// integers and looked up for every transition of every decision, so they hash with FxHash.
pub struct MigrationCosts {
    model: Arc<CostModel>,
    seed: u64,
    scenarios: FxHashMap<MigrationEvent, Arc<Vec<Scenario>>>,
    per_event: FxHashMap<MigrationEvent, Vec<(usize, f64)>>,
    preference: FxHashMap<(u32, u32), Preference>,
    /// Expected fetch times by event, new depth and (for the handoff, whose fetch depends on
    /// it) new width.
    fetch: FxHashMap<(MigrationEvent, u32, u32), f64>,
}

impl MigrationCosts {
    /// Costs for `model`; sampling is seeded with `seed`.
    pub fn new(model: Arc<CostModel>, seed: u64) -> Self {
        Self {
            model,
            seed,
            scenarios: FxHashMap::default(),
            per_event: FxHashMap::default(),
            preference: FxHashMap::default(),
            fetch: FxHashMap::default(),
        }
    }

    /// The cost model.
    pub fn model(&self) -> &Arc<CostModel> {
        &self.model
    }

    /// Expected costs (ms) of moving after `ev` to the model's candidates at the `wanted`
    /// indices of [`CostModel::candidates`] (ascending; each must fit the nodes left), written
    /// to `out` in the same order. Each event keeps only the costs asked for, sorted by
    /// candidate: on a large cluster a decision asks for a few hundred of thousands of
    /// candidates, for hundreds of events.
    pub fn expected_for(&mut self, ev: MigrationEvent, wanted: &[usize], out: &mut Vec<f64>) {
        let known = self.per_event.get(&ev).map(Vec::as_slice).unwrap_or(&[]);
        let missing = merge_known(known, wanted, out);
        if missing.is_empty() {
            return;
        }
        let model = self.model.clone();
        let computed: Vec<(usize, f64)> = missing
            .into_iter()
            .map(|i| (i, self.expected(ev, model.candidates()[i])))
            .collect();
        let costs = self.per_event.entry(ev).or_default();
        costs.extend(computed);
        costs.sort_unstable_by_key(|&(k, _)| k);
        merge_known(costs, wanted, out);
    }

    /// Expected cost (ms) of moving to `to` after `ev`.
    pub fn expected(&mut self, ev: MigrationEvent, to: ParallelConfig) -> f64 {
        match self.shape(ev, to) {
            Shape::Fixed(_, cost) => cost,
            Shape::SameDepth => {
                let scenarios = self.scenarios(ev);
                scenarios
                    .iter()
                    .map(|s| s.weight * self.same_depth(ev, to, s).1)
                    .sum()
            }
            Shape::Repartition { fixed_ms } => fixed_ms + self.expected_fetch_ms(ev, to),
        }
    }

    /// Expected cost (ms) of moving to `to` after `ev`, with the kind of its most probable
    /// scenario.
    pub fn expected_with_kind(
        &mut self,
        ev: MigrationEvent,
        to: ParallelConfig,
    ) -> (f64, MigrationKind) {
        let cost = self.expected(ev, to);
        let kind = match self.shape(ev, to) {
            Shape::Fixed(kind, _) => kind,
            Shape::Repartition { .. } => MigrationKind::Repartition,
            Shape::SameDepth => {
                let scenarios = self.scenarios(ev);
                let likely = scenarios
                    .iter()
                    .max_by(|a, b| a.weight.total_cmp(&b.weight));
                likely.map_or(MigrationKind::None, |s| self.same_depth(ev, to, s).0)
            }
        };
        (cost, kind)
    }

    fn scenarios(&mut self, ev: MigrationEvent) -> Arc<Vec<Scenario>> {
        let key = MigrationEvent { added: 0, ..ev };
        if let Some(s) = self.scenarios.get(&key) {
            return s.clone();
        }
        let s = Arc::new(build_scenarios(ev.nodes, ev.from, ev.removed, self.seed));
        self.scenarios.insert(key, s.clone());
        s
    }

    /// For each new stage of a `from_p -> to_p` repartition, the old stages ordered by how many
    /// parameters of the new stage they lack (fewest first, then lower index).
    fn preference(&mut self, from_p: u32, to_p: u32) -> Preference {
        if let Some(p) = self.preference.get(&(from_p, to_p)) {
            return p.clone();
        }
        let m = &self.model;
        let old = m.spec.partition(from_p);
        let new = m.spec.partition(to_p);
        let mut lists = Vec::with_capacity(new.len().saturating_sub(1));
        if from_p > 0 && to_p > 0 {
            for w in new.windows(2) {
                let need = m.params_between(w[0], w[1]);
                let mut l: Vec<(u32, f64)> = old
                    .windows(2)
                    .enumerate()
                    .map(|(j, o)| {
                        let overlap = m.params_between(w[0].max(o[0]), w[1].min(o[1]));
                        (j as u32, need - overlap)
                    })
                    .collect();
                l.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                lists.push(l);
            }
        }
        let mut demand = vec![0u32; old.len().saturating_sub(1)];
        let mut first_choice = (0.0, 0.0);
        for (j, miss) in lists.iter().filter_map(|l| l.first()) {
            demand[*j as usize] += 1;
            first_choice = (first_choice.0 + miss, *miss);
        }
        let ranking = Arc::new(Ranking {
            lists,
            most_demand: demand.iter().copied().max().unwrap_or(0),
            demand,
            first_choice,
        });
        self.preference.insert((from_p, to_p), ranking.clone());
        ranking
    }

    /// Which formula of spec 3.3 prices a move, with its scenario-independent part.
    fn shape(&self, ev: MigrationEvent, to: ParallelConfig) -> Shape {
        let m = &self.model;
        let from = ev.from;
        if to.is_idle() || (ev.removed == 0 && to == from) {
            return Shape::Fixed(MigrationKind::None, 0.0);
        }
        let broadcast = if to.d > 1 {
            m.stage_transfer_ms(to.p)
                .iter()
                .copied()
                .fold(0.0, f64::max)
        } else {
            0.0
        };
        if from.is_idle() {
            let start = m.state_transfer_ms(0.0)
                + broadcast
                + m.spec.restart.restart_ms(to, RestartKind::Add);
            return Shape::Fixed(MigrationKind::Repartition, start);
        }
        if to.p == from.p {
            return Shape::SameDepth;
        }
        let restart = &m.spec.restart;
        let kind = restart_kind(ev, to);
        let fixed_ms = match m.repartition {
            RepartitionRule::Handoff => restart.rebuild_ms(to, kind),
            RepartitionRule::Sum | RepartitionRule::LastStage => {
                broadcast + restart.restart_ms(to, kind)
            }
        };
        Shape::Repartition { fixed_ms }
    }

    /// Same-depth move in one scenario: intra-stage when every stage kept `to.d` replicas,
    /// inter-stage otherwise (spec 3.3 case 2), ms.
    fn same_depth(
        &self,
        ev: MigrationEvent,
        to: ParallelConfig,
        scenario: &Scenario,
    ) -> (MigrationKind, f64) {
        let m = &self.model;
        let fewest_survivors = if scenario.lost.is_empty() {
            0
        } else {
            ev.from.d - scenario.most_lost
        };
        if fewest_survivors >= to.d {
            let cost = m.spec.restart.groups_ms(to, RestartKind::Remove) + m.spec.restart.proc_ms();
            return (MigrationKind::Intra, cost);
        }
        let stages = m.stage_transfer_ms(to.p);
        let (mut stage_cost, mut redundant) = (0.0f64, 0.0);
        let survivors = scenario.lost.iter().map(|&k| ev.from.d - k);
        for (s, r) in survivors.enumerate() {
            let need = to.d.saturating_sub(r);
            if need == 0 {
                continue;
            }
            let c = stages
                .get(s)
                .copied()
                .unwrap_or_else(|| m.state_transfer_ms(0.0));
            stage_cost = stage_cost.max(c);
            if need == to.d || (s as u32 + 1 == to.p && need + 1 == to.d) {
                redundant += c;
            }
        }
        let restart = m.spec.restart.restart_ms(to, restart_kind(ev, to));
        (MigrationKind::Inter, stage_cost.max(redundant) + restart)
    }

    /// Expected time to fetch the layers new stages of `to` lack, ms. Parcae's formula moves
    /// the same for every data-parallel degree, so it is memoised per depth; the handoff per
    /// depth and degree.
    fn expected_fetch_ms(&mut self, ev: MigrationEvent, to: ParallelConfig) -> f64 {
        let handoff = self.model.repartition == RepartitionRule::Handoff;
        let key = (
            MigrationEvent { added: 0, ..ev },
            to.p,
            if handoff { to.d } else { 0 },
        );
        if let Some(v) = self.fetch.get(&key) {
            return *v;
        }
        let scenarios = self.scenarios(ev);
        let pref = self.preference(ev.from.p, to.p);
        let m = &self.model;
        let stages = m.stage_params(to.p);
        // Most scenarios miss the same volume (every new stage gets its first choice), so the
        // weights are summed per distinct volume before the transfer curve is read; the
        // handoff's volume is the most any link carries.
        let mut volumes: Vec<(f64, f64)> = Vec::new();
        for s in scenarios.iter() {
            let missing = if handoff {
                let (received, sent) =
                    handoff::moved_params(&pref.lists, stages, &s.lost, ev.from.d, to.d);
                received.max(sent)
            } else {
                repartition_missing(m.repartition, &pref, &s.lost, ev.from.d, stages)
            };
            match volumes.iter_mut().find(|(v, _)| *v == missing) {
                Some((_, w)) => *w += s.weight,
                None => volumes.push((missing, s.weight)),
            }
        }
        let v = volumes
            .iter()
            .map(|&(missing, weight)| weight * m.state_transfer_ms(missing))
            .sum();
        self.fetch.insert(key, v);
        v
    }
}

/// The costs of `known` (sorted by candidate) at the ascending `wanted` candidates, into `out`
/// (`NaN` where unknown), in one merged pass; returns the candidates not known.
fn merge_known(known: &[(usize, f64)], wanted: &[usize], out: &mut Vec<f64>) -> Vec<usize> {
    out.clear();
    let mut missing = Vec::new();
    let mut at = 0;
    for &i in wanted {
        while known.get(at).is_some_and(|&(k, _)| k < i) {
            at += 1;
        }
        match known.get(at) {
            Some(&(k, cost)) if k == i => out.push(cost),
            _ => {
                out.push(f64::NAN);
                missing.push(i);
            }
        }
    }
    missing
}

/// Formula that prices a move (spec 3.3).
enum Shape {
    /// No scenario dependence: nothing to do, or a start from idle.
    Fixed(MigrationKind, f64),
    /// Same depth: intra- or inter-stage depending on the scenario.
    SameDepth,
    /// New depth: scenario-independent broadcast and restart plus the layer fetch.
    Repartition {
        /// Broadcast to replicas plus restart, ms.
        fixed_ms: f64,
    },
}

/// A restart needs new nodes (rendezvous) when the target uses more nodes than the old
/// configuration keeps after the preemptions (spares that were hit count too).
fn restart_kind(ev: MigrationEvent, to: ParallelConfig) -> RestartKind {
    if to.nodes() + ev.removed > ev.from.nodes() {
        RestartKind::Add
    } else {
        RestartKind::Remove
    }
}

/// Parameters the new stages must fetch: each new stage takes the surviving node whose old
/// layers cover it best.
fn repartition_missing(
    rule: RepartitionRule,
    pref: &Ranking,
    lost: &[u32],
    old_d: u32,
    new_stages: &[f64],
) -> f64 {
    let pick = |(sum, last): (f64, f64)| match rule {
        RepartitionRule::Sum | RepartitionRule::Handoff => sum,
        RepartitionRule::LastStage => last,
    };
    // With enough survivors everywhere every new stage gets its first choice (at once when even
    // the stage that lost most keeps what the most wanted stage needs).
    let lost_most = lost.iter().copied().max().unwrap_or(0);
    let plenty = old_d - lost_most >= pref.most_demand
        || pref
            .demand
            .iter()
            .zip(lost)
            .all(|(&want, &k)| old_d - k >= want);
    if plenty && !pref.lists.is_empty() {
        return pick(pref.first_choice);
    }
    let mut left: Vec<u32> = lost.iter().map(|&k| old_d - k).collect();
    let mut sum = 0.0;
    let mut last = 0.0;
    for (s, choices) in pref.lists.iter().enumerate() {
        let miss = choices
            .iter()
            .find(|(j, _)| left[*j as usize] > 0)
            .map(|&(j, miss)| {
                left[j as usize] -= 1;
                miss
            })
            .unwrap_or_else(|| new_stages.get(s).copied().unwrap_or(0.0));
        sum += miss;
        last = miss;
    }
    pick((sum, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> MigrationCosts {
        MigrationCosts::new(Arc::new(CostModel::builtin("gpt-1.5b").unwrap()), 7)
    }

    fn ev(nodes: u32, d: u32, p: u32, added: u32, removed: u32) -> MigrationEvent {
        MigrationEvent {
            nodes,
            from: ParallelConfig::new(d, p),
            added,
            removed,
        }
    }

    #[test]
    fn spec_examples() {
        let mut c = costs();
        let e = ev(32, 4, 8, 0, 1);
        let intra = c.expected(e, ParallelConfig::new(3, 8));
        assert!((intra - 1689.8).abs() < 0.1, "{intra}");
        assert_eq!(
            c.expected(ev(18, 2, 9, 1, 0), ParallelConfig::new(2, 9)),
            0.0
        );
        // The spec's figure uses the artifact's last-stage rule: the new last stage is covered.
        let model = CostModel::builtin("gpt-1.5b")
            .unwrap()
            .with_repartition(RepartitionRule::LastStage);
        let mut last = MigrationCosts::new(Arc::new(model), 7);
        let to_1_18 = last.expected(e, ParallelConfig::new(1, 18));
        assert!((to_1_18 - 3293.0).abs() < 5.0, "{to_1_18}");
        assert!(c.expected(e, ParallelConfig::new(1, 18)) > to_1_18);
    }

    #[test]
    fn weights_sum_to_one_exact_and_sampled() {
        for e in [ev(10, 2, 4, 0, 2), ev(32, 4, 8, 0, 5)] {
            let s = build_scenarios(e.nodes, e.from, e.removed, 1);
            let w: f64 = s.iter().map(|s| s.weight).sum();
            assert!((w - 1.0).abs() < 1e-9, "{e:?}: {w}");
            let mean_lost: f64 = s
                .iter()
                .map(|s| s.weight * s.lost.iter().sum::<u32>() as f64)
                .sum();
            let expect = f64::from(e.removed) * f64::from(e.from.nodes()) / f64::from(e.nodes);
            assert!((mean_lost - expect).abs() < 0.25, "{mean_lost} vs {expect}");
        }
    }

    #[test]
    fn the_handoff_pays_groups_a_build_and_its_busiest_link_below_parcae_s_formula() {
        let model = CostModel::builtin("gpt-1.5b").unwrap();
        let restart = model.spec.restart.clone();
        let mut sum = MigrationCosts::new(Arc::new(model.clone()), 3);
        let handoff = model.with_repartition(RepartitionRule::Handoff);
        let mut ours = MigrationCosts::new(Arc::new(handoff), 3);
        for (e, to) in [
            (ev(32, 4, 8, 0, 1), ParallelConfig::new(2, 13)),
            (ev(26, 2, 13, 0, 1), ParallelConfig::new(4, 6)),
            (ev(24, 4, 6, 0, 0), ParallelConfig::new(3, 8)),
        ] {
            let fixed = restart.rebuild_ms(to, restart_kind(e, to));
            let (handoff, parcae) = (ours.expected(e, to), sum.expected(e, to));
            assert!(
                handoff > fixed && handoff < parcae,
                "{e:?} -> {to}: {handoff} {parcae}"
            );
            // Intra-stage moves are priced alike.
            let intra = ParallelConfig::new(e.from.d - 1, e.from.p);
            assert_eq!(ours.expected(e, intra), sum.expected(e, intra));
        }
        // More pipelines of the new depth: more slots fetch what they lack, and the holders
        // send more.
        let from = ev(24, 4, 6, 0, 0);
        let few = ours.expected(from, ParallelConfig::new(2, 8));
        let many = ours.expected(from, ParallelConfig::new(3, 8));
        assert!(many > few, "{few} {many}");
    }

    #[test]
    fn sum_rule_costs_at_least_last_stage_rule() {
        let model = CostModel::builtin("gpt-1.5b").unwrap();
        let mut sum = MigrationCosts::new(Arc::new(model.clone()), 3);
        let mut last = MigrationCosts::new(
            Arc::new(model.with_repartition(RepartitionRule::LastStage)),
            3,
        );
        let e = ev(27, 2, 13, 0, 1);
        for to in [ParallelConfig::new(2, 12), ParallelConfig::new(1, 24)] {
            assert!(sum.expected(e, to) >= last.expected(e, to));
        }
    }
}
