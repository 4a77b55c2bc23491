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
//!   its look-ahead valued past the horizon by the zone's expected stay; `liveput-predict` is
//!   Parcae as published (the simulator's `liveput-predict`): the same optimizer on Parcae's
//!   ARIMA predictor of the recorded availability, nothing valued past the horizon, its choice
//!   shrunk to the nodes present as Parcae does; `reactive` takes the throughput-optimal
//!   configuration for the nodes present.
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
use parcae_strategies::predict::{
    ForecastInput, NoticeAware, Predictor, RulePredictor, SeriesModel, ZoneModel, observed,
};
use parcae_strategies::sim::job_bounds;
use parcae_strategies::trace::Interval;

use crate::config::{NodeConfig, PlanStrategy};
use crate::control::ControlHandle;
use crate::status::{EstimateView, Estimates, Status};
use model::JobShape;

/// How long a proposed plan counts as on its way: after that (a dropped proposal, a change of
/// leader) the planner may propose again.
const PLAN_IN_FLIGHT: Duration = Duration::from_secs(2);

/// The last plan this planner proposed.
#[derive(Debug, Clone, Copy)]
struct Proposed {
    epoch: u64,
    at_step: u64,
    at: Instant,
}

/// Whether the last proposed plan may still apply: its epoch is not reached yet, no step has
/// committed past its effective step (which would reject it), and it is younger than
/// [`PLAN_IN_FLIGHT`]. Planning again meanwhile would only put a duplicate in the log.
fn plan_on_its_way(state: &ControlState, proposed: Option<Proposed>, now: Instant) -> bool {
    let latest = state
        .pending_plan
        .as_ref()
        .or(state.plan.as_ref())
        .map_or(0, |p| p.epoch);
    proposed.is_some_and(|p| {
        p.epoch > latest
            && state.progress.next_step() <= p.at_step
            && now.saturating_duration_since(p.at) < PLAN_IN_FLIGHT
    })
}

/// How long the set of workers must stay the same before the first plan: the nodes of a
/// cluster started together join over seconds (32 nodes started within 0.7 s on two busy
/// cores joined with gaps of more than a second, and a 1 s settle planned for 3 of them), and
/// planning at each arrival would restart training as many times.
const FIRST_PLAN_SETTLE: Duration = Duration::from_secs(3);

/// Until when the first plan waits: [`FIRST_PLAN_SETTLE`] after the set of workers last
/// changed (`workers_since`), if there is no plan yet; `None` when planning may go ahead.
fn first_plan_settles_until(
    state: &ControlState,
    workers_since: Instant,
    now: Instant,
) -> Option<Instant> {
    let settled = workers_since + FIRST_PLAN_SETTLE;
    (state.plan.is_none() && state.pending_plan.is_none() && now < settled).then_some(settled)
}

/// How long a plan broken by departures waits for more of them: the preemptions of one
/// interval boundary reach the leader over a second or so, one `Notice` at a time (the 32-node
/// hh replay re-planned at every arriving notice, gossip and a commit apart; a notice comes 30 s,
/// on AWS 120 s, before its deadline), and members killed together are marked lost a liveness
/// check or two apart (the reactive hh replay: three killed at once, marked 0.1 s apart, cost
/// two restarts). Planning at each would reconfigure as many times.
const DEPARTURE_SETTLE: Duration = Duration::from_millis(500);

/// The members of the plan in force that are gone (lost, or no longer members) or, when
/// `notices` (the strategy acts on them), announced they leave: in id order.
fn departing_from_plan(state: &ControlState, notices: bool) -> Vec<NodeId> {
    state.plan.as_ref().map_or_else(Vec::new, |plan| {
        plan.assignment
            .keys()
            .filter(|id| {
                state.members.get(id).is_none_or(|m| match m.status {
                    MemberStatus::Lost => true,
                    MemberStatus::Leaving { .. } => notices,
                    _ => false,
                })
            })
            .copied()
            .collect()
    })
}

/// Until when a plan that departures broke waits for more of them: [`DEPARTURE_SETTLE`] after
/// the set of its departing members (`departing`) last changed (`since`); `None` when planning
/// may go ahead.
fn departures_settle_until(departing: &[NodeId], since: Instant, now: Instant) -> Option<Instant> {
    let settled = since + DEPARTURE_SETTLE;
    (!departing.is_empty() && now < settled).then_some(settled)
}

/// When the current availability interval began, as this node saw it: the leader when it
/// proposes a tick, a follower when it applies one. A new leader goes on at the old one's
/// phase; one that started a new interval at once recorded its first seconds as a whole
/// interval and planned at a boundary that was none (the 64-node run's new leader re-planned
/// seven times in 100 s).
#[derive(Debug, Default)]
struct IntervalClock {
    /// The last interval known to have begun.
    interval: Option<u64>,
    began: Option<Instant>,
}

impl IntervalClock {
    /// Notes the last interval the replicated state records: a later one than known began now.
    fn observe(&mut self, recorded: Option<u64>, now: Instant) {
        if recorded > self.interval {
            self.interval = recorded;
            self.began = Some(now);
        }
    }

    /// Notes that this node (the leader) begins `interval` now.
    fn begin(&mut self, interval: u64, now: Instant) {
        self.interval = Some(interval);
        self.began = Some(now);
    }

    /// When the current interval ends: now if none is known to have begun.
    fn ends(&self, now: Instant, length: Duration) -> Instant {
        self.began.map_or(now, |t| t + length)
    }
}

/// The actor.
pub struct Planner {
    control: ControlHandle,
    status: Addr<Status>,
    interval: Duration,
    strategy: PlanStrategy,
    lookahead: usize,
    pin: Option<ParallelConfig>,
    shape: JobShape,
    clock: IntervalClock,
    next_tick: Option<SpawnHandle>,
    proposed: Option<Proposed>,
    workers_seen: Option<(Vec<NodeId>, Instant)>,
    /// The plan's departing members as last seen, and since when.
    departing_seen: Option<(Vec<NodeId>, Instant)>,
    optimizer: Option<LiveputOptimizer>,
    zone: NoticeAware<ZoneModel>,
    /// Parcae's predictor for `liveput-predict`, made with the first cost model (its bounds
    /// are the smallest feasible configuration and the job's cluster size).
    arima: Option<RulePredictor>,
    seed: u64,
}

impl Planner {
    /// A planner proposing through `control`, showing estimates on `status`.
    pub fn new(control: ControlHandle, status: Addr<Status>, config: &NodeConfig) -> Self {
        let device = config.device.emulation().ok().flatten();
        let shape = JobShape {
            global_batch: config.train.global_batch,
            micro_batch: config.train.micro_batch,
            max_nodes: config.planner.max_nodes,
            restart_ms: 2000.0,
            memory_mb: device
                .as_ref()
                .map_or(model::CPU_MEMORY_MB, |d| d.memory_mb()),
            min_depth: device.as_ref().map_or(1, |d| d.min_depth()),
        };
        let interval = Duration::from_secs_f64(config.planner.interval_secs);
        Self {
            control,
            status,
            interval,
            strategy: config.planner.strategy,
            pin: config.planner.pin.map(|[d, p]| ParallelConfig::new(d, p)),
            lookahead: usize::from(config.planner.lookahead),
            shape,
            clock: IntervalClock::default(),
            next_tick: None,
            proposed: None,
            workers_seen: None,
            departing_seen: None,
            optimizer: None,
            zone: NoticeAware::new(ZoneModel::new(interval.as_secs_f64())),
            arima: None,
            seed: config.train.seed,
        }
    }

    /// One planning round on the leader: the availability tick when an interval is over, and
    /// a new plan when one is needed and none is on its way.
    fn round(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let recorded = self
            .control
            .state()
            .borrow()
            .availability
            .back()
            .map(|s| s.interval);
        self.clock.observe(recorded, now);
        if !*self.control.leading().borrow() {
            return;
        }
        let state = self.control.state().borrow().clone();
        let workers_now: Vec<NodeId> = workers(&state).into_iter().map(|(id, _)| id).collect();
        if self
            .workers_seen
            .as_ref()
            .is_none_or(|(w, _)| *w != workers_now)
        {
            self.workers_seen = Some((workers_now, now));
        }
        let since = self.workers_seen.as_ref().map_or(now, |(_, t)| *t);
        let departing_now = departing_from_plan(&state, self.acts_on_notices());
        if self
            .departing_seen
            .as_ref()
            .is_none_or(|(d, _)| *d != departing_now)
        {
            self.departing_seen = Some((departing_now, now));
        }
        // While a new cluster settles, neither its availability nor a plan is recorded: both
        // would describe a cluster that is still arriving.
        let settling = first_plan_settles_until(&state, since, now);
        let batching = self
            .departing_seen
            .as_ref()
            .and_then(|(departing, since)| departures_settle_until(departing, *since, now));
        let tick = settling.is_none() && now >= self.clock.ends(now, self.interval);
        let mut out = Vec::new();
        if tick {
            self.clock.begin(next_interval(&state), now);
            out.push(availability_tick(&state));
        }
        self.arm_timer(ctx, now, settling.into_iter().chain(batching).min());
        if settling.is_none()
            && batching.is_none()
            && !plan_on_its_way(&state, self.proposed, now)
            && let Some(plan) = self.next_plan(&state, tick)
        {
            self.proposed = Some(Proposed {
                epoch: plan.epoch,
                at_step: plan.at_step,
                at: now,
            });
            out.push(Command::Reconfigure { plan });
        }
        for command in out {
            let control = self.control.clone();
            let kind = command.kind();
            ctx.spawn(
                async move {
                    match control.propose(command).await {
                        Ok(_) => tracing::debug!(kind, "planner proposed"),
                        Err(e) => tracing::debug!(kind, "planner's proposal went nowhere: {e}"),
                    }
                }
                .into_actor(self),
            );
        }
    }

    /// Whether this planner re-plans when a member of the plan announces it leaves: the
    /// reactive baseline does not (a leaving node works until it is gone), a pinned plan does.
    fn acts_on_notices(&self) -> bool {
        self.strategy != PlanStrategy::Reactive || self.pin.is_some()
    }

    /// Runs a round when the current interval ends, or the workers or the notices settled
    /// (`settling`), whichever comes first, whatever else happens before.
    fn arm_timer(&mut self, ctx: &mut Context<Self>, now: Instant, settling: Option<Instant>) {
        if let Some(h) = self.next_tick.take() {
            ctx.cancel_future(h);
        }
        let interval_due = self.clock.ends(now, self.interval);
        let due = settling
            .map_or(interval_due, |s| s.min(interval_due))
            .saturating_duration_since(now);
        self.next_tick = Some(ctx.run_later(due, |act, ctx| {
            act.next_tick = None;
            act.round(ctx);
        }));
    }

    fn next_plan(&mut self, state: &ControlState, interval_boundary: bool) -> Option<Plan> {
        if state.pending_plan.is_some() {
            return None;
        }
        let workers = workers(state);
        let n = workers.len() as u32;
        let current = state.plan.as_ref();
        let broken = !departing_from_plan(state, self.acts_on_notices()).is_empty();
        if current.is_some() && !broken && !interval_boundary {
            return None;
        }
        let cost = Arc::new(model::measured(
            state,
            self.shape.for_job(state.job.as_ref()),
        )?);
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
            (_, strategy) => {
                let (before, future, terminal) = match strategy {
                    PlanStrategy::LiveputPredict => {
                        let seed = self.seed;
                        let bounds = job_bounds(&cost, self.shape.max_nodes);
                        let arima = self.arima.get_or_insert_with(|| {
                            RulePredictor::new(SeriesModel::Arima, bounds, seed)
                        });
                        (
                            n,
                            parcae_forecast(arima, state, n, self.lookahead),
                            Terminal::default(),
                        )
                    }
                    _ => zone_forecast(
                        &mut self.zone,
                        state,
                        n,
                        self.lookahead,
                        self.interval.as_secs_f64(),
                    ),
                };
                let optimizer =
                    optimizer_for(&mut self.optimizer, &cost, self.interval.as_secs_f64());
                let decision = optimizer.decide_with_terminal(
                    PlanState {
                        nodes: before,
                        config: now,
                        leftover_ms: 0.0,
                    },
                    &future,
                    terminal,
                );
                // Parcae's predictor may forecast more nodes than are here now; never ask for
                // them: D shrinks first (spec 1.4), as in the simulator.
                decision.config.clamp_to(n)
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
}

/// The look-ahead optimizer for the cost model measured now: the one kept while the model is
/// the same (its memoised migration costs stay valid), a new one as soon as the nodes measured
/// anything new. The decision is then a function of the replicated state alone, so a new
/// leader decides as the old one would have; an optimizer kept from the first plan priced
/// every later move at the costs measured before any reconfiguration (the 2 s default restart).
fn optimizer_for<'a>(
    kept: &'a mut Option<LiveputOptimizer>,
    cost: &Arc<CostModel>,
    interval_secs: f64,
) -> &'a mut LiveputOptimizer {
    let current = kept
        .as_mut()
        .is_some_and(|o| o.costs().model().as_ref() == cost.as_ref());
    if !current {
        *kept = None;
    }
    kept.get_or_insert_with(|| LiveputOptimizer::new(cost.clone(), interval_secs, 1))
}

/// The count before the upcoming event, and the next `lookahead` intervals as the
/// simulator's `liveput-zone` sees them at an interval's start: the upcoming interval
/// observed (the `n` workers present, the members leaving or lost as its removals) and the
/// zone model's forecast of the recorded availability after it; with the zone's terminal
/// value as the forecast ends. Observing the first step, not forecasting it, makes the
/// choice at a notice the one the next boundary makes when nothing else happened: a
/// forecast first step of more nodes than are here sent the planner to the throughput-
/// optimal configuration at a notice and the optimizer's own at the next boundary (six of
/// the 23 re-plans of the 32-node hh replay were such a pair).
fn zone_forecast(
    zone: &mut NoticeAware<ZoneModel>,
    state: &ControlState,
    n: u32,
    lookahead: usize,
    interval_secs: f64,
) -> (u32, Vec<Interval>, Terminal) {
    let history = availability_history(state);
    let first = first_recorded(state);
    let departing = departing(state);
    let event = Interval {
        nodes: n,
        added: 0,
        removed: departing,
    };
    let future = observed(zone, &history, first, event, lookahead);
    let end = future.last().map_or(n, |s| s.nodes);
    let terminal = zone.inner().terminal(
        first + history.len() + future.len(),
        end,
        interval_secs * 1000.0,
    );
    (n + departing, future, terminal)
}

/// Members that announced they leave or were found lost: gone from the workers, not yet from
/// the membership.
fn departing(state: &ControlState) -> u32 {
    state
        .members
        .values()
        .filter(|m| matches!(m.status, MemberStatus::Leaving { .. } | MemberStatus::Lost))
        .count() as u32
}

/// Parcae's forecast of the next `horizon` intervals from the recorded availability alone:
/// the count of the upcoming interval is told only before any was recorded (the job's
/// initial allocation), and notices are not folded in (the simulator's `liveput-predict`).
fn parcae_forecast(
    predictor: &mut impl Predictor,
    state: &ControlState,
    n: u32,
    horizon: usize,
) -> Vec<Interval> {
    let history = availability_history(state);
    predictor.forecast(&ForecastInput {
        history: &history,
        first: first_recorded(state),
        known_next: history.is_empty().then_some(n),
        notices: &[],
        horizon,
    })
}

/// The recorded availability as intervals (each one's arrivals and departures against the
/// previous count).
fn availability_history(state: &ControlState) -> Vec<Interval> {
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
    history
}

/// The number of the oldest availability interval the replicated state still records (it
/// keeps the latest `limits::MAX_AVAILABILITY`; the leader numbers them one by one from 0).
fn first_recorded(state: &ControlState) -> usize {
    state
        .availability
        .front()
        .map_or(0, |s| s.interval as usize)
}

/// Members that can take a slot: healthy, with a data plane, training the cluster's job, most
/// stable first.
fn workers(state: &ControlState) -> Vec<(NodeId, u64)> {
    let mut w: Vec<(NodeId, u64)> = state
        .members
        .iter()
        .filter(|(_, m)| {
            m.status.is_healthy() && m.peer.data_addr.is_some() && state.trains_the_job(&m.peer)
        })
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

/// The number of the next availability interval.
fn next_interval(state: &ControlState) -> u64 {
    state.availability.back().map_or(0, |s| s.interval + 1)
}

/// The availability command for the next interval: the count of healthy members, continuing
/// the replicated sequence (so a new leader goes on where the old one stopped).
pub fn availability_tick(state: &ControlState) -> Command {
    Command::AvailabilityTick {
        interval: next_interval(state),
        count: state
            .members
            .values()
            .filter(|m| m.status.is_healthy())
            .count() as u32,
    }
}

impl Actor for Planner {
    type Context = Context<Self>;

    /// Plans whenever the applied state or the leadership changes, and at every interval
    /// boundary (a timer `Planner::round` re-arms).
    fn started(&mut self, ctx: &mut Context<Self>) {
        let changes = (self.control.state(), self.control.leading());
        ctx.add_stream(futures::stream::unfold(
            changes,
            |(mut state, mut leading)| async move {
                tokio::select! {
                    changed = state.changed() => changed.ok()?,
                    changed = leading.changed() => changed.ok()?,
                }
                Some(((), (state, leading)))
            },
        ));
    }
}

impl StreamHandler<()> for Planner {
    fn handle(&mut self, _: (), ctx: &mut Context<Self>) {
        self.round(ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::state::PeerInfo;

    #[test]
    fn only_members_that_train_the_cluster_s_job_are_workers() {
        use parcae_consensus::state::Job;
        let job = |seed: &str| Job {
            settings: [("seed".to_string(), seed.to_string())].into(),
        };
        let mut state = ControlState::default();
        for (n, seed) in [(1u8, Some("3")), (2, Some("4")), (3, None)] {
            let peer = PeerInfo {
                peer_id: vec![n],
                data_addr: Some(format!("127.0.0.1:700{n}")),
                job: seed.map(|s| job(s).digest()),
                ..PeerInfo::default()
            };
            let node = NodeId::from_peer_bytes(&[n]);
            state.apply(&Command::Join { node, peer }).unwrap();
        }
        assert!(workers(&state).is_empty(), "no job defined yet");
        state.apply(&Command::DefineJob { job: job("3") }).unwrap();
        let ids: Vec<NodeId> = workers(&state).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, vec![NodeId::from_peer_bytes(&[1])]);
    }

    #[test]
    fn next_interval_continues_the_replicated_sequence() {
        let mut state = ControlState::default();
        for n in 1..=4u8 {
            let join = Command::Join {
                node: NodeId::from_peer_bytes(&[n]),
                peer: PeerInfo {
                    peer_id: vec![n],
                    ..PeerInfo::default()
                },
            };
            state.apply(&join).unwrap();
        }
        let first = availability_tick(&state);
        assert_eq!(
            first,
            Command::AvailabilityTick {
                interval: 0,
                count: 4
            }
        );
        state.apply(&first).unwrap();
        state
            .members
            .get_mut(&NodeId::from_peer_bytes(&[2]))
            .unwrap()
            .status = MemberStatus::Lost;
        assert_eq!(
            availability_tick(&state),
            Command::AvailabilityTick {
                interval: 1,
                count: 3
            }
        );
    }

    #[test]
    fn the_forecast_counts_intervals_past_the_record_s_bound() {
        use parcae_consensus::state::limits::MAX_AVAILABILITY;
        let mut state = ControlState::default();
        assert_eq!(first_recorded(&state), 0);
        let mut zone = NoticeAware::new(ZoneModel::new(60.0));
        let total = MAX_AVAILABILITY + 100;
        for interval in 0..total as u64 {
            let count = 8 + u32::from(interval >= 3000 && interval % 2 == 1);
            state
                .apply(&Command::AvailabilityTick { interval, count })
                .unwrap();
            if interval % 1000 == 0 {
                zone_forecast(&mut zone, &state, count, 4, 60.0);
            }
        }
        assert_eq!(first_recorded(&state), 100);
        let stay = |zone: &mut NoticeAware<ZoneModel>, state: &ControlState| {
            zone_forecast(zone, state, 9, 4, 60.0).2.stay_ms
        };
        let kept = stay(&mut zone, &state);
        let new_leader = stay(&mut NoticeAware::new(ZoneModel::new(60.0)), &state);
        // A new leader learns from the record alone, the old one also from what it dropped.
        assert!(
            (kept - new_leader).abs() <= 0.05 * kept,
            "a new leader values about as the old one: {kept} vs {new_leader}"
        );
        for interval in total as u64..total as u64 + 30 {
            state
                .apply(&Command::AvailabilityTick { interval, count: 9 })
                .unwrap();
        }
        assert!(
            stay(&mut zone, &state) > kept,
            "the calm intervals after the record was full were consumed"
        );
    }

    #[test]
    fn parcae_forecasts_from_the_recorded_availability_alone() {
        let bounds = parcae_strategies::predict::Bounds {
            min_nodes: 2,
            max_nodes: 32,
        };
        let mut arima = RulePredictor::new(SeriesModel::Arima, bounds, 7);
        let mut state = ControlState::default();
        // Before any interval was recorded, the nodes present are the job's allocation.
        let first = parcae_forecast(&mut arima, &state, 12, 4);
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].nodes, 12);
        for (interval, count) in [(0, 20), (1, 18), (2, 16), (3, 14)] {
            state
                .apply(&Command::AvailabilityTick { interval, count })
                .unwrap();
        }
        assert_eq!(
            availability_history(&state)
                .iter()
                .map(|i| (i.nodes, i.added, i.removed))
                .collect::<Vec<_>>(),
            vec![(20, 0, 0), (18, 0, 2), (16, 0, 2), (14, 0, 2)]
        );
        // Afterwards the present count is not told (30 here): the forecast continues the
        // recorded series from its last count, within the job's bounds.
        let later = parcae_forecast(&mut arima, &state, 30, 4);
        assert_eq!(later.len(), 4);
        assert!(
            later.iter().all(|i| (2..=32).contains(&i.nodes)),
            "{later:?}"
        );
        assert!(later[0].nodes <= 16, "{later:?}");
    }

    #[test]
    fn the_first_plan_waits_for_the_workers_to_settle() {
        let state = ControlState::default();
        let t0 = Instant::now();
        assert_eq!(
            first_plan_settles_until(&state, t0, t0),
            Some(t0 + FIRST_PLAN_SETTLE)
        );
        assert_eq!(
            first_plan_settles_until(&state, t0, t0 + FIRST_PLAN_SETTLE),
            None
        );
        let mut planned = state.clone();
        planned.plan = Some(Plan {
            epoch: 1,
            data_parallel: 1,
            pipeline_stages: 1,
            partition: vec![0, 1],
            assignment: Default::default(),
            at_step: 0,
        });
        assert_eq!(
            first_plan_settles_until(&planned, t0, t0),
            None,
            "a broken plan is replaced at once"
        );
    }

    #[test]
    fn a_plan_broken_by_departures_waits_for_the_other_departures_of_the_boundary() {
        let mut state = ControlState::default();
        let ids: Vec<NodeId> = (1..=3u8)
            .map(|n| {
                let id = NodeId::from_peer_bytes(&[n]);
                state
                    .apply(&Command::Join {
                        node: id,
                        peer: PeerInfo {
                            peer_id: vec![n],
                            ..PeerInfo::default()
                        },
                    })
                    .unwrap();
                id
            })
            .collect();
        state.plan = Some(Plan {
            epoch: 1,
            data_parallel: 3,
            pipeline_stages: 1,
            partition: vec![0, 1],
            assignment: ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let slot = StageSlot {
                        pipeline: i as u32,
                        stage: 0,
                    };
                    (*id, slot)
                })
                .collect(),
            at_step: 0,
        });
        let t0 = Instant::now();
        let settle = |notices: bool, since: Instant, now: Instant, state: &ControlState| {
            departures_settle_until(&departing_from_plan(state, notices), since, now)
        };
        assert_eq!(settle(true, t0, t0, &state), None, "nobody departs");
        for id in &ids[..2] {
            state
                .apply(&Command::Notice {
                    node: *id,
                    deadline_ms: 10_000,
                })
                .unwrap();
        }
        let mut noticed = ids[..2].to_vec();
        noticed.sort();
        assert_eq!(departing_from_plan(&state, true), noticed);
        assert_eq!(settle(true, t0, t0, &state), Some(t0 + DEPARTURE_SETTLE));
        assert_eq!(settle(true, t0, t0 + DEPARTURE_SETTLE, &state), None);
        assert!(
            departing_from_plan(&state, false).is_empty(),
            "notices do not count for a strategy that ignores them"
        );
        let mut lost = state.clone();
        lost.apply(&Command::Lost { node: ids[2] }).unwrap();
        assert_eq!(
            departing_from_plan(&lost, false),
            vec![ids[2]],
            "a member gone without notice counts for every strategy"
        );
        assert_eq!(
            settle(false, t0, t0, &lost),
            Some(t0 + DEPARTURE_SETTLE),
            "losses marked one liveness check apart make one plan"
        );
        state.apply(&Command::Leave { node: ids[0] }).unwrap();
        assert_eq!(
            departing_from_plan(&state, true),
            noticed,
            "a member that left is still gone from the plan"
        );
    }

    #[test]
    fn the_choice_at_a_notice_is_the_one_made_after_the_leave() {
        let cost = Arc::new(CostModel::builtin("gpt-1.5b").unwrap());
        let interval_secs = 60.0;
        let mut zone = NoticeAware::new(ZoneModel::new(interval_secs));
        let mut optimizer = LiveputOptimizer::new(cost.clone(), interval_secs, 1);
        let mut state = ControlState::default();
        let ids: Vec<NodeId> = (1..=32u8)
            .map(|n| {
                let id = NodeId::from_peer_bytes(&[n]);
                let peer = PeerInfo {
                    peer_id: vec![n],
                    ..PeerInfo::default()
                };
                state.apply(&Command::Join { node: id, peer }).unwrap();
                id
            })
            .collect();
        // A cluster that grew by a node an interval: the zone expects more to come.
        for (interval, count) in (24..=32).enumerate() {
            let tick = Command::AvailabilityTick {
                interval: interval as u64,
                count,
            };
            state.apply(&tick).unwrap();
        }
        let mut decide = |state: &ControlState, n: u32, now: ParallelConfig| {
            let (before, future, terminal) = zone_forecast(&mut zone, state, n, 8, interval_secs);
            assert_eq!(
                future[0].nodes, n,
                "the upcoming interval is observed: {future:?}"
            );
            assert_eq!(before, future[0].nodes + future[0].removed);
            let state = PlanState {
                nodes: before,
                config: now,
                leftover_ms: 0.0,
            };
            let decision = optimizer.decide_with_terminal(state, &future, terminal);
            decision.config.clamp_to(n)
        };
        let running = ParallelConfig::new(4, 8);
        for id in &ids[..3] {
            state
                .apply(&Command::Notice {
                    node: *id,
                    deadline_ms: 10_000,
                })
                .unwrap();
        }
        let at_notice = decide(&state, 29, running);
        assert!(at_notice.nodes() <= 29, "{at_notice:?}");
        for id in &ids[..3] {
            state.apply(&Command::Leave { node: *id }).unwrap();
        }
        assert_eq!(decide(&state, 29, at_notice), at_notice, "no move back");
    }

    #[test]
    fn a_new_leader_keeps_the_old_leader_s_interval_phase() {
        let length = Duration::from_secs(20);
        let t0 = Instant::now();
        let mut clock = IntervalClock::default();
        assert_eq!(
            clock.ends(t0, length),
            t0,
            "nothing recorded: an interval is due"
        );
        clock.observe(None, t0);
        assert_eq!(clock.ends(t0, length), t0);
        // As a follower: interval 7 applied at t0, nothing new after it.
        clock.observe(Some(7), t0);
        let t1 = t0 + Duration::from_secs(3);
        clock.observe(Some(7), t1);
        assert_eq!(
            clock.ends(t1, length),
            t0 + length,
            "the old leader's phase"
        );
        // As the leader: it begins interval 8 and later applies its own tick.
        let t2 = t0 + length;
        clock.begin(8, t2);
        clock.observe(Some(8), t2 + Duration::from_millis(40));
        assert_eq!(
            clock.ends(t2, length),
            t2 + length,
            "no drift by commit latency"
        );
        clock.observe(Some(7), t2 + length);
        assert_eq!(
            clock.ends(t2, length),
            t2 + length,
            "an older record changes nothing"
        );
    }

    #[test]
    fn the_optimizer_prices_moves_at_the_costs_measured_last() {
        let priced = |ms: f64| {
            let mut cost = CostModel::builtin("gpt-1.5b").unwrap();
            cost.spec.restart = parcae_strategies::cost::spec::RestartCost::Fixed { ms };
            Arc::new(cost)
        };
        let (cheap, dear) = (priced(1_000.0), priced(3_600_000.0));
        // Sixteen nodes run, thirty-two are here and stay: a move pays off unless it costs
        // more than the look-ahead.
        let now = PlanState {
            nodes: 32,
            config: ParallelConfig::new(2, 8),
            leftover_ms: 0.0,
        };
        let future = vec![
            Interval {
                nodes: 32,
                added: 0,
                removed: 0,
            };
            8
        ];
        let fresh = |cost: &Arc<CostModel>| {
            LiveputOptimizer::new(cost.clone(), 60.0, 1)
                .decide(now, &future)
                .config
        };
        assert_ne!(fresh(&cheap), fresh(&dear), "the price decides");
        let mut kept = None;
        let first = optimizer_for(&mut kept, &cheap, 60.0).decide(now, &future);
        assert_eq!(first.config, fresh(&cheap));
        let later = optimizer_for(&mut kept, &dear, 60.0).decide(now, &future);
        assert_eq!(later.config, fresh(&dear), "the costs measured since");
        let again = optimizer_for(&mut kept, &dear, 60.0).decide(now, &future);
        assert_eq!(again.config, later.config);
    }

    #[test]
    fn a_proposed_plan_is_on_its_way_until_applied_overtaken_or_old() {
        let state = ControlState::default();
        let t0 = Instant::now();
        let proposed = Some(Proposed {
            epoch: 1,
            at_step: 0,
            at: t0,
        });
        assert!(plan_on_its_way(&state, proposed, t0));
        assert!(!plan_on_its_way(&state, None, t0));
        assert!(
            !plan_on_its_way(&state, proposed, t0 + PLAN_IN_FLIGHT),
            "given up on"
        );
        let stale = Some(Proposed {
            epoch: 1,
            at_step: 0,
            at: t0,
        });
        let mut stepped = state.clone();
        stepped.progress.last_committed_step = Some(0);
        assert!(
            !plan_on_its_way(&stepped, stale, t0),
            "a step committed past its effective step: it will be rejected"
        );
    }
}
