//! The simulator's account of a testnet run's sessions: the single-cluster simulator on the
//! pooled counts, or for an emulated run over zones the fleet simulator.

use std::sync::Arc;

use parcae_strategies::cost::money::{self, OnDemand, Prices};

use super::{NodeArgs, Outcome};
use crate::engine::Observed;
use crate::fidelity;
use crate::predicted;
use crate::replay::Replay;
use crate::trace_plan::Planned;

/// Gives every session of `replay` the simulator's account of it: an emulated run over zones
/// the fleet simulator's ([`simulate_zoned_session`]); any other run the single-cluster
/// simulator's on the pooled counts ([`simulate_sessions`]: zones of CPU nodes run alike
/// devices and links, one cluster to the simulator).
pub fn hold_to_simulator(
    outcomes: &mut [Outcome],
    node: &NodeArgs,
    planned: &Planned,
    nodes_max: u32,
    prices: Option<Prices>,
    replay: &Replay,
) {
    match &node.emulate {
        Some(profile) if !replay.replayed_zones().is_empty() => {
            for o in outcomes {
                simulate_zoned_session(o, node, profile, replay);
            }
        }
        _ => simulate_sessions(outcomes, node, planned, nodes_max, prices),
    }
}

/// Gives every session replaying `planned` the simulator's account of it
/// ([`crate::predicted`]): its strategy on the same trace, under the emulated profile's cost
/// model (the simulated interval is the emulated one), or on CPUs under the model measured on
/// these sessions together; its share of the simulator's ideal; and with `prices`, its bill in
/// the same world (the replayed machines held for the emulated or real intervals, the on-demand
/// baseline at that model's throughput-optimal configuration). Without a model (a CPU run too
/// short to measure a configuration) there is no simulation and the bill has no saving.
fn simulate_sessions(
    outcomes: &mut [Outcome],
    node: &NodeArgs,
    planned: &Planned,
    nodes_max: u32,
    prices: Option<Prices>,
) {
    let (model, time_scale) = match &node.emulate {
        Some(profile) => (
            predicted::emulated_model(profile, nodes_max),
            node.time_scale,
        ),
        None => {
            let observed: Vec<&Observed> = outcomes.iter().map(|o| &o.observed).collect();
            (predicted::measured_model(&node.model, &observed), 1.0)
        }
    };
    let interval_secs = node.interval_secs as f64 * time_scale;
    let held = money::machine_hours(planned.counts.iter().copied(), interval_secs);
    let on_demand = model.as_ref().map(|m| OnDemand::of(m, nodes_max));
    for o in outcomes.iter_mut() {
        o.report.cost = prices.map(|p| money::bill(held, o.report.samples as f64, p, on_demand));
    }
    let Some(model) = model.map(Arc::new) else {
        return;
    };
    let trace = predicted::replayed_trace(
        &planned.source,
        &planned.counts,
        interval_secs.round().max(1.0) as u64,
    );
    let simulate =
        |strategy: &str| predicted::simulate(&model, &trace, nodes_max, node.seed, strategy);
    let ideal = simulate("ideal").map_or(0.0, |r| r.samples);
    for o in outcomes {
        if let Some(run) = simulate(&o.report.strategy) {
            o.report.compare_with_simulator(run.samples, ideal);
            o.report.fidelity = Some(fidelity::ledger(&fidelity::Inputs {
                timeline: &o.observed.monitor.timeline,
                events: &o.observed.monitor.events,
                reconfigurations: &o.report.reconfigurations,
                simulated: &run,
                model: &model,
                interval_secs: node.interval_secs as f64,
                time_scale,
                samples: o.report.samples,
            }));
            o.simulated = Some(run);
        }
    }
}

/// Gives an emulated run over zones the fleet simulator's account of it
/// ([`predicted::zones`]): its strategy on each zone's replayed counts, each zone's device at
/// its speed, the interval the emulated one.
fn simulate_zoned_session(outcome: &mut Outcome, node: &NodeArgs, profile: &str, replay: &Replay) {
    let interval_secs = node.interval_secs as f64 * node.time_scale;
    let zones = replay.replayed_zones();
    let strategy = outcome.report.strategy.clone();
    if let Some(run) =
        predicted::zones::simulate(profile, &zones, interval_secs, node.seed, &strategy)
    {
        outcome.report.compare_with_simulator(run.samples, 0.0);
        outcome.simulated = Some(run);
    }
}
