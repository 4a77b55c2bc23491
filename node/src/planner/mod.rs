//! The `Planner` actor: leader-side planning.
//!
//! Every planning interval it proposes `AvailabilityTick` (the predictor's history), and it
//! proposes `Reconfigure` when
//! * there is no plan yet, or the plan names a node that is leaving or lost (a notice or a
//!   loss: re-plan at once, so a leaving node is drained before its deadline), or
//! * at an interval boundary the strategy picks another `(D, P)`: `liveput` runs the
//!   simulator's node default (`sim::NODE_DEFAULT`, `liveput-zone` in `docs/strategies.md`):
//!   Parcae's look-ahead optimizer with the cost model the nodes measured ([`model`]), on the
//!   zone model's forecast (persistence plus its time-of-day drift, known notices folded in),
//!   its look-ahead valued past the horizon by the zone's expected stay; `reactive` takes the
//!   throughput-optimal configuration for the nodes present.
//!
//! Slots go to nodes by `strategies::assign` (maximum overlap with the layers each node holds,
//! so survivors keep their stage when they can). All inputs come from the replicated state, so
//! a new leader continues where the old one stopped.

pub mod model;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parcae_consensus::state::{MemberStatus, Plan, StageSlot};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_strategies::ParallelConfig;
use parcae_strategies::assign::{Holding, assign};
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::spec::partition;
use parcae_strategies::liveput::{LiveputOptimizer, PlanState, Terminal};
use parcae_strategies::predict::{ForecastInput, NoticeAhead, NoticeAware, Predictor, ZoneModel};
use parcae_strategies::trace::Interval;

use crate::config::{NodeConfig, PlanStrategy};
use crate::raft::{GetPlanningInput, PlanningInput, ProposeCommand, Raft};
use crate::status::{EstimateView, Estimates, Status};
use model::JobShape;

/// The actor.
pub struct Planner {
    raft: Addr<Raft>,
    status: Addr<Status>,
    interval: Duration,
    strategy: PlanStrategy,
    lookahead: usize,
    pin: Option<ParallelConfig>,
    shape: JobShape,
    last_tick: Option<Instant>,
    optimizer: Option<(usize, LiveputOptimizer)>,
    zone: NoticeAware<ZoneModel>,
}

impl Planner {
    /// A planner proposing through `raft`, showing estimates on `status`.
    pub fn new(raft: Addr<Raft>, status: Addr<Status>, config: &NodeConfig) -> Self {
        let shape = JobShape {
            global_batch: config.train.global_batch,
            micro_batch: config.train.micro_batch,
            max_nodes: 64,
            restart_ms: 2000.0,
        };
        let interval = Duration::from_secs_f64(config.planner.interval_secs);
        Self {
            raft,
            status,
            interval,
            strategy: config.planner.strategy,
            pin: config.planner.pin.map(|[d, p]| ParallelConfig::new(d, p)),
            lookahead: usize::from(config.planner.lookahead),
            shape,
            last_tick: None,
            optimizer: None,
            zone: NoticeAware::new(ZoneModel::new(interval.as_secs_f64())),
        }
    }

    fn round(&mut self, input: PlanningInput) -> Vec<Command> {
        let mut out = Vec::new();
        let tick = self.last_tick.is_none_or(|t| t.elapsed() >= self.interval);
        if tick {
            self.last_tick = Some(Instant::now());
            out.push(availability_tick(&input));
        }
        if let Some(plan) = self.next_plan(&input.state, tick) {
            out.push(Command::Reconfigure { plan });
        }
        out
    }

    fn next_plan(&mut self, state: &ControlState, interval_boundary: bool) -> Option<Plan> {
        if state.pending_plan.is_some() {
            return None;
        }
        let workers = workers(state);
        let n = workers.len() as u32;
        let current = state.plan.as_ref();
        // The reactive baseline does not act on notices: a leaving node works until it is gone,
        // and only then is the plan broken.
        let reactive = self.strategy == PlanStrategy::Reactive && self.pin.is_none();
        let gone = |id: &NodeId| match state.members.get(id).map(|m| m.status) {
            Some(MemberStatus::Leaving { .. }) => !reactive,
            Some(s) => !s.is_healthy(),
            None => true,
        };
        let broken = current.is_some_and(|p| p.assignment.keys().any(gone));
        if current.is_some() && !broken && !interval_boundary {
            return None;
        }
        let cost = Arc::new(model::measured(state, self.shape)?);
        self.status.do_send(Estimates(estimates(&cost, n)));
        let now = current.map_or(ParallelConfig::IDLE, |p| {
            ParallelConfig::new(p.data_parallel, p.pipeline_stages)
        });
        let target = match (self.pin, self.strategy) {
            (Some(pin), _) if pin.nodes() <= n => pin,
            (Some(_), _) if current.is_none() => return None,
            (_, PlanStrategy::Reactive) => {
                let leaving = state
                    .members
                    .values()
                    .filter(|m| matches!(m.status, MemberStatus::Leaving { .. }))
                    .count() as u32;
                if !broken && current.is_some() && cost.best(n + leaving) == now {
                    return None;
                }
                cost.best(n)
            }
            (_, PlanStrategy::Liveput) => {
                let (future, terminal) = self.forecast(state, n);
                let layers = cost.spec.layers.len();
                let optimizer = match &mut self.optimizer {
                    Some((l, o)) if *l == layers => o,
                    slot => {
                        let o = LiveputOptimizer::new(cost.clone(), self.interval.as_secs_f64(), 1);
                        &mut slot.insert((layers, o)).1
                    }
                };
                let decision = optimizer.decide_with_terminal(
                    PlanState {
                        nodes: n,
                        config: now,
                        leftover_ms: 0.0,
                    },
                    &future,
                    terminal,
                );
                // The optimizer plans for the upcoming interval's count; never ask for more
                // nodes than are here now.
                if decision.config.nodes() <= n {
                    decision.config
                } else {
                    cost.best(n)
                }
            }
        };
        if target.nodes() == 0 || (target == now && !broken) {
            return None;
        }
        let plan = build_plan(state, current, &workers, target, &cost)?;
        tracing::info!(
            epoch = plan.epoch,
            d = target.d,
            p = target.p,
            at_step = plan.at_step,
            nodes = n,
            "proposing a new plan"
        );
        Some(plan)
    }

    /// The next `lookahead` intervals from the zone model of the recorded availability, the
    /// nodes that announced they leave folded in, and the zone's terminal value as the
    /// forecast ends.
    fn forecast(&mut self, state: &ControlState, n: u32) -> (Vec<Interval>, Terminal) {
        let mut history: Vec<Interval> = Vec::with_capacity(state.availability.len());
        let mut prev: Option<u32> = None;
        for s in &state.availability {
            let p = prev.unwrap_or(s.count);
            history.push(Interval {
                nodes: s.count,
                added: s.count.saturating_sub(p),
                removed: p.saturating_sub(s.count),
            });
            prev = Some(s.count);
        }
        let leaving = state
            .members
            .values()
            .filter(|m| matches!(m.status, MemberStatus::Leaving { .. }))
            .count() as u32;
        let notices = [NoticeAhead {
            offset: 0,
            nodes: leaving,
        }];
        let future = self.zone.forecast(&ForecastInput {
            history: &history,
            known_next: Some(n),
            notices: if leaving > 0 { &notices } else { &[] },
            horizon: self.lookahead,
        });
        let end = future.last().map_or(n, |s| s.nodes);
        let terminal = self.zone.inner().terminal(
            history.len() + future.len(),
            end,
            self.interval.as_secs_f64() * 1000.0,
        );
        (future, terminal)
    }
}

/// Members that can take a slot: healthy, with a data plane, most stable first.
fn workers(state: &ControlState) -> Vec<(NodeId, u64)> {
    let mut w: Vec<(NodeId, u64)> = state
        .members
        .iter()
        .filter(|(_, m)| m.status.is_healthy() && m.peer.data_addr.is_some())
        .map(|(id, m)| (*id, m.join_seq))
        .collect();
    w.sort_by_key(|(_, seq)| *seq);
    w
}

fn estimates(cost: &CostModel, n: u32) -> Vec<EstimateView> {
    let mut v: Vec<EstimateView> = cost
        .candidates()
        .iter()
        .filter(|c| c.nodes() <= n.max(1))
        .map(|c| EstimateView {
            config: [c.d, c.p],
            samples_per_sec: cost.samples_per_sec(*c),
        })
        .collect();
    v.sort_by(|a, b| b.samples_per_sec.total_cmp(&a.samples_per_sec));
    v.truncate(8);
    v
}

/// The plan running `target` from the next step, slots matched to what nodes hold.
fn build_plan(
    state: &ControlState,
    current: Option<&Plan>,
    workers: &[(NodeId, u64)],
    target: ParallelConfig,
    cost: &CostModel,
) -> Option<Plan> {
    let layers = cost.spec.layers.len();
    let bounds = partition(layers, target.p as usize);
    let holdings: Vec<Holding<NodeId>> = workers
        .iter()
        .map(|(id, _)| {
            let slot = current.and_then(|p| p.assignment.get(id).map(|s| (p, *s)));
            match slot.and_then(|(p, s)| Some((s, p.stage_layers(s.stage)?))) {
                Some((s, r)) => Holding {
                    node: *id,
                    slot: Some(parcae_strategies::assign::Slot {
                        pipeline: s.pipeline,
                        stage: s.stage,
                    }),
                    layers: r.start as usize..r.end as usize,
                },
                None => Holding {
                    node: *id,
                    slot: None,
                    layers: 0..0,
                },
            }
        })
        .collect();
    let layer_bytes: Vec<f64> = cost
        .spec
        .layers
        .iter()
        .map(|l| cost.spec.state_bytes(l.params))
        .collect();
    let a = match assign(&holdings, target, &bounds, &layer_bytes) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("no assignment for {target}: {e}");
            return None;
        }
    };
    let latest = state
        .pending_plan
        .as_ref()
        .or(state.plan.as_ref())
        .map_or(0, |p| p.epoch);
    Some(Plan {
        epoch: latest + 1,
        data_parallel: target.d,
        pipeline_stages: target.p,
        partition: bounds.iter().map(|b| *b as u32).collect(),
        assignment: a
            .slots
            .into_iter()
            .map(|(id, s)| {
                (
                    id,
                    StageSlot {
                        pipeline: s.pipeline,
                        stage: s.stage,
                    },
                )
            })
            .collect(),
        at_step: state.progress.next_step(),
    })
}

/// The availability command for the next interval.
pub fn availability_tick(input: &PlanningInput) -> Command {
    Command::AvailabilityTick {
        interval: input.last_interval.map_or(0, |i| i + 1),
        count: input.healthy_members,
    }
}

impl Actor for Planner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let check = self.interval.min(Duration::from_secs(1));
        ctx.run_interval(check, |act, ctx| {
            let raft = act.raft.clone();
            ctx.spawn(
                async move { raft.send(GetPlanningInput).await.ok().flatten() }
                    .into_actor(act)
                    .map(|input, act, _| {
                        let Some(input) = input else { return };
                        for command in act.round(input) {
                            let kind = command.kind();
                            act.raft.do_send(ProposeCommand(command));
                            tracing::debug!(kind, "planner proposed");
                        }
                    }),
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_interval_continues_the_replicated_sequence() {
        let mut input = PlanningInput {
            last_interval: None,
            healthy_members: 4,
            state: ControlState::default(),
        };
        assert_eq!(
            availability_tick(&input),
            Command::AvailabilityTick {
                interval: 0,
                count: 4
            }
        );
        input.last_interval = Some(41);
        assert_eq!(
            availability_tick(&input),
            Command::AvailabilityTick {
                interval: 42,
                count: 4
            }
        );
    }
}
