//! The leader's decision, a function of the replicated state and the costs measured in it:
//! whether the plan must change and, if so, the plan that runs the strategy's choice.

use std::cell::RefCell;

use parcae_consensus::ControlState;
use parcae_consensus::state::Plan;
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;

use super::build::{build_plan, effective_step, workers};
use super::costs::{JobShape, MeasuredCache};
use super::forecast::ZonesAt;
use super::settle::departing_from_plan;
use super::strategy::{Situation, Strategy};
use super::zones::{FleetCache, Zoned};
use crate::status::{EstimateView, FleetView};

/// What a planning round decided.
#[derive(Debug, Default)]
pub struct Decision {
    /// The throughput of the best configurations for the workers present, when the costs
    /// were looked at (for `/status`).
    pub estimates: Option<Vec<EstimateView>>,
    /// The zones planned over, when the workers are in several (for `/status`).
    pub fleet: Option<FleetView>,
    /// The plan to propose, if the plan must change.
    pub plan: Option<Plan>,
}

/// Decides at an interval boundary (`interval_boundary`) or on a change of the state: no new
/// plan while one is pending (unless it waits for a step in flight that a node gone from the
/// plan in force will never let commit), none while the plan in force is whole between
/// boundaries, none before some node measured every layer; otherwise the plan that runs
/// `strategy`'s choice, unless that is what runs already and nothing is broken, from the step
/// after the one in flight when the plan in force can finish it by `now_unix_ms`
/// ([`effective_step`], with two of its steps to spare before a deadline). Workers in two
/// zones or more are planned over their zones (`fleets`, [`super::zones`]); the cost model is
/// built again only when the measured costs changed (`costs`).
pub fn decide(
    state: &ControlState,
    strategy: &mut dyn Strategy,
    shape: &JobShape,
    costs: &mut MeasuredCache,
    fleets: &mut FleetCache,
    interval_boundary: bool,
    now_unix_ms: u64,
) -> Decision {
    if let Some(pending) = &state.pending_plan {
        let waits_in_vain = pending.at_step > state.progress.next_step()
            && !departing_from_plan(state, false).is_empty();
        if !waits_in_vain {
            return Decision::default();
        }
    }
    let workers = workers(state);
    let n = workers.len() as u32;
    let current = state.plan.as_ref();
    let broken = !departing_from_plan(state, strategy.acts_on_notices()).is_empty();
    if current.is_some() && !broken && !interval_boundary {
        return Decision::default();
    }
    let shape = shape.for_job(state.job.as_ref());
    let Some(cost) = costs.get(state, &shape) else {
        return Decision::default();
    };
    let zoned = fleets.zoned(state, &workers, &shape, &cost);
    let cost = zoned.as_ref().map_or(cost, |z| z.cost.clone());
    let running = current.map_or(ParallelConfig::IDLE, |p| {
        ParallelConfig::new(p.data_parallel, p.pipeline_stages)
    });
    let fleets = RefCell::new(fleets);
    let table_of = |counts: &[u32]| fleets.borrow_mut().table(counts);
    let situation = Situation {
        state,
        cost: &cost,
        workers: n,
        running,
        planned: current.is_some(),
        broken,
        zones: zoned.as_ref().map(|z| ZonesAt {
            names: z.view.pools.iter().map(|v| v.pool.as_str()).collect(),
            workers: z.view.pools.iter().map(|v| v.nodes).collect(),
            table_of: &table_of,
        }),
    };
    let choice = strategy.choose(&situation);
    if interval_boundary && current.is_none() {
        warn_if_nothing_fits(n, choice, shape.steps_in_zone);
    }
    let plan = choice
        .filter(|target| {
            let restart = broken || strategy.restarts_in_place();
            target.nodes() > 0 && (*target != running || restart)
        })
        .and_then(|target| {
            let step_ms = 1e3 * f64::from(cost.spec.global_batch) / cost.samples_per_sec(running);
            let margin_ms = if step_ms.is_finite() {
                (2.0 * step_ms) as u64
            } else {
                u64::MAX
            };
            let at_step = effective_step(state, now_unix_ms, margin_ms);
            let plan = build_plan(state, &workers, target, &cost, zoned.as_ref(), at_step)?;
            tracing::info!(
                epoch = plan.epoch,
                d = target.d,
                p = target.p,
                at_step = plan.at_step,
                nodes = n,
                "proposing a new plan"
            );
            Some(plan)
        });
    let in_force = plan.as_ref().map_or(running, |p| {
        ParallelConfig::new(p.data_parallel, p.pipeline_stages)
    });
    Decision {
        estimates: Some(estimates(&cost, n, zoned.as_ref())),
        fleet: zoned.map(|z| z.advised(in_force)),
        plan,
    }
}

/// Says why a cluster of `workers` with no plan yet gets none (the strategy chose no
/// configuration): nothing trains until the workers change, which should not pass in silence.
fn warn_if_nothing_fits(workers: u32, choice: Option<ParallelConfig>, steps_in_zone: bool) {
    if workers == 0 || choice.is_some_and(|c| c.nodes() > 0) {
        return;
    }
    let why = if steps_in_zone {
        "under DiLoCo each pool must hold a whole pipeline of the shallowest depth its \
         device's memory allows"
    } else {
        "no pipeline of a depth the device's memory allows fits them"
    };
    tracing::warn!(workers, why, "no configuration fits the workers");
}

/// The eight fastest configurations for `n` workers, with their nodes per zone over zones.
fn estimates(cost: &CostModel, n: u32, zoned: Option<&Zoned>) -> Vec<EstimateView> {
    let mut v: Vec<EstimateView> = cost
        .candidates()
        .iter()
        .filter(|c| c.nodes() <= n.max(1))
        .map(|c| EstimateView {
            config: [c.d, c.p],
            samples_per_sec: cost.samples_per_sec(*c),
            pools: zoned.and_then(|z| z.nodes_per_zone(*c)).unwrap_or_default(),
        })
        .collect();
    v.sort_by(|a, b| b.samples_per_sec.total_cmp(&a.samples_per_sec));
    v.truncate(8);
    v
}
