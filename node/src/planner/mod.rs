//! The `Planner` actor: leader-side planning.
//!
//! Every planning interval it proposes `AvailabilityTick` (the predictors' history), and it
//! proposes `Reconfigure` when there is no plan yet, when the plan names a node that is leaving
//! or lost (re-planned at once, so a leaving node is drained before its deadline), or when at
//! an interval boundary the strategy picks another `(D, P)`; one decision an interval, which a
//! departure brings forward ([`settle::tick_decides`]). The actor only moves data: when
//! it may plan is [`settle`]'s and [`clock`]'s, what it plans is [`decide`]'s, a pure function
//! of the replicated state and the costs measured in it ([`costs`]) through the configured
//! [`strategy`], which owns its caches; the plan itself is [`build`]'s. All inputs come from
//! the replicated state, so a new leader continues where the old one stopped.

pub mod bench;
pub mod build;
pub mod clock;
pub mod costs;
pub mod decide;
pub mod forecast;
pub mod settle;
pub mod strategy;
pub mod zones;

use std::time::{Duration, Instant};

use actix::prelude::*;
use parcae_consensus::{Command, NodeId};
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::links::Links;

use crate::config::{NodeConfig, PlanStrategy};
use crate::control::ControlHandle;
use crate::status::{Estimates, Status};
use build::{availability_tick, next_interval, workers};
use clock::IntervalClock;
use costs::{JobShape, MeasuredCache};
use decide::decide;
use settle::{
    DecidedEarly, Proposed, Since, departing_from_plan, departures_settle_until,
    first_plan_settles_until, plan_on_its_way, tick_decides,
};
use strategy::Strategy;
use strategy::liveput::Liveput;
use strategy::pinned::Pinned;
use strategy::predict::LiveputPredict;
use strategy::reactive::Reactive;
use zones::FleetCache;

/// The strategy `config` names, with its caches empty.
pub fn strategy_for(config: &NodeConfig) -> Box<dyn Strategy> {
    let p = &config.planner;
    let (lookahead, interval_secs) = (usize::from(p.lookahead), p.interval_secs);
    let chosen: Box<dyn Strategy> = match p.strategy {
        PlanStrategy::Liveput => Box::new(Liveput::new(lookahead, interval_secs)),
        PlanStrategy::LiveputPredict => Box::new(LiveputPredict::new(
            config.train.seed,
            p.max_nodes,
            lookahead,
            interval_secs,
        )),
        PlanStrategy::Reactive => Box::new(Reactive::default()),
    };
    match p.pin {
        Some([d, p]) => Box::new(Pinned::new(ParallelConfig::new(d, p), chosen)),
        None => chosen,
    }
}

/// The actor.
pub struct Planner {
    control: ControlHandle,
    status: Addr<Status>,
    interval: Duration,
    shape: JobShape,
    strategy: Box<dyn Strategy>,
    costs: MeasuredCache,
    fleets: FleetCache,
    clock: IntervalClock,
    next_tick: Option<SpawnHandle>,
    proposed: Option<Proposed>,
    workers_seen: Since<Vec<NodeId>>,
    /// The plan's departing members as last seen, and since when.
    departing_seen: Since<Vec<NodeId>>,
    /// The last plan made between two ticks.
    decided_early: Option<DecidedEarly>,
}

impl Planner {
    /// A planner proposing through `control`, showing estimates on `status`.
    pub fn new(control: ControlHandle, status: Addr<Status>, config: &NodeConfig) -> Self {
        Self {
            control,
            status,
            interval: Duration::from_secs_f64(config.planner.interval_secs),
            shape: JobShape::of(config),
            strategy: strategy_for(config),
            costs: MeasuredCache::default(),
            fleets: FleetCache::new(
                config.planner.objective,
                config.planner.zone_prices.clone(),
                config.device.emulated_time_scale(),
            )
            .with_links(config.planner.set_links().unwrap_or_else(|e| {
                tracing::error!("planning on measured and default links: {e}");
                Links::default()
            }))
            .with_all_reduce_by_zone(config.planner.all_reduce_by_zone),
            clock: IntervalClock::default(),
            next_tick: None,
            proposed: None,
            workers_seen: Since::default(),
            departing_seen: Since::default(),
            decided_early: None,
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
        let workers_now = workers(&state);
        let workers_since = self.workers_seen.observe(workers_now.clone(), now);
        let departing = departing_from_plan(&state, self.strategy.acts_on_notices());
        let departing_since = self.departing_seen.observe(departing.clone(), now);
        // While a new cluster settles, neither its availability nor a plan is recorded: both
        // would describe a cluster that is still arriving.
        let settling = first_plan_settles_until(&state, workers_since, now);
        let batching = departures_settle_until(&departing, departing_since, now);
        let tick = settling.is_none() && now >= self.clock.ends(now, self.interval);
        let mut out = Vec::new();
        if tick {
            self.clock.begin(next_interval(&state), now);
            out.push(availability_tick(&state));
        }
        self.arm_timer(ctx, now, settling.into_iter().chain(batching).min());
        if settling.is_none() && batching.is_none() && !plan_on_its_way(&state, self.proposed, now)
        {
            let boundary =
                tick && tick_decides(self.decided_early.as_ref(), recorded, &workers_now);
            let decision = decide(
                &state,
                self.strategy.as_mut(),
                &self.shape,
                &mut self.costs,
                &mut self.fleets,
                boundary,
                crate::clock::unix_ms(std::time::SystemTime::now()),
            );
            if let Some(estimates) = decision.estimates {
                self.status.do_send(Estimates(estimates, decision.fleet));
            }
            if let Some(plan) = decision.plan {
                self.proposed = Some(Proposed {
                    epoch: plan.epoch,
                    at_step: plan.at_step,
                    at: now,
                });
                if !tick {
                    self.decided_early = Some(DecidedEarly {
                        recorded,
                        workers: workers_now,
                    });
                }
                out.push(Command::Reconfigure { plan });
            }
        }
        for command in out {
            self.propose(ctx, command);
        }
    }

    /// Proposes `command` through raft without waiting for it.
    fn propose(&self, ctx: &mut Context<Self>, command: Command) {
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
