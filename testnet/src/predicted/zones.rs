//! The simulator's account of an emulated run over zones (`run --emulate --zones`, issue 37):
//! the fleet simulator (`strategies::sim::fleet`) on each zone's replayed counts, with the
//! strategy the nodes ran in its zone-aware form (`liveput-zone` for `liveput`, `reactive`).
//!
//! The simulated fleet is the emulated one: each zone's device is the profile's with its layers
//! divided by the zone's speed and the profile's memory (what `[device] speed` paces), and the
//! links are the cloud's defaults (`Links::default`: 10 Gb/s inside a zone, 5 Gb/s and billed
//! across two), which the emulated nodes pace their activations, gradients, rings and state
//! fetches on (`node::emulate`, `Crossings`). The simulated interval is the emulated one.

use parcae_strategies::cost::fleet::{Fleet, FleetPool};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::profile;
use parcae_strategies::sim::StrategyRun;
use parcae_strategies::sim::fleet::{Objective, simulate_fleet};

use super::{LOOKAHEAD, replayed_trace};

/// One zone of an emulated run: its name, its device's speed and its nodes per interval.
pub struct ReplayedZone<'a> {
    /// The zone's name.
    pub name: &'a str,
    /// Its emulated device's speed against the profiled one.
    pub speed: f64,
    /// Its nodes in every replayed interval.
    pub counts: &'a [u32],
}

/// The fleet simulator's name for a node strategy, `None` for one it has no zone-aware form of.
fn fleet_strategy(node_strategy: &str) -> Option<&'static str> {
    match node_strategy {
        "liveput" => Some("liveput-zone"),
        "reactive" => Some("reactive"),
        _ => None,
    }
}

/// `node_strategy` simulated over `zones` of the emulated `profile`, intervals of
/// `interval_secs` emulated seconds, scenarios seeded with `seed`, the zone-aware strategies
/// planning for `objective` as the nodes did (their rings across zones by zone where
/// `by_zone`); `None` for a profile or a
/// strategy the fleet simulator cannot take, or zones it refuses (the reason is logged).
pub fn simulate(
    profile: &str,
    zones: &[ReplayedZone<'_>],
    interval_secs: f64,
    seed: u64,
    node_strategy: &str,
    (objective, by_zone): (&Objective, bool),
) -> Option<StrategyRun> {
    let name = fleet_strategy(node_strategy)?;
    let emulated = profile::emulated(profile).ok()?;
    let base = DeviceCosts::profiled(&emulated.spec, profile, emulated.hardware.memory_mb);
    let fleet_zones = zones
        .iter()
        .map(|z| {
            Ok(FleetPool {
                pool: z.name.parse()?,
                device: base.derived(&format!("{profile}x{}", z.speed), z.speed, base.memory_mb),
            })
        })
        .collect::<Result<_, parcae_pool::PoolError>>()
        .inspect_err(|e| eprintln!("no simulated account over zones: {e}"))
        .ok()?;
    let mut fleet = Fleet::new(emulated.spec, fleet_zones, Links::default())
        .inspect_err(|e| eprintln!("no simulated account over zones: {e}"))
        .ok()?
        .with_all_reduce_by_zone(by_zone);
    let interval = interval_secs.round().max(1.0) as u64;
    let traces: Vec<_> = zones
        .iter()
        .map(|z| replayed_trace(z.name, z.counts, interval))
        .collect();
    let len = traces.iter().map(|t| t.len()).min().unwrap_or(0);
    let runs = simulate_fleet(
        &mut fleet,
        &traces,
        0..len,
        LOOKAHEAD,
        seed,
        objective,
        None,
    )
    .inspect_err(|e| eprintln!("no simulated account over zones: {e}"))
    .ok()?;
    runs.into_iter()
        .find(|r| r.run.name == name && r.zone.is_none())
        .map(|r| r.run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faster_zone_trains_more_and_the_node_strategies_have_their_fleet_forms() {
        let a = [8u32; 6];
        let b = [8u32; 6];
        let zones = |speed: f64| {
            vec![
                ReplayedZone {
                    name: "a",
                    speed: 1.0,
                    counts: &a,
                },
                ReplayedZone {
                    name: "b",
                    speed,
                    counts: &b,
                },
            ]
        };
        let even = simulate(
            "gpt-1.5b",
            &zones(1.0),
            60.0,
            1,
            "liveput",
            (&Objective::Samples, true),
        )
        .unwrap();
        let faster = simulate(
            "gpt-1.5b",
            &zones(2.0),
            60.0,
            1,
            "liveput",
            (&Objective::Samples, true),
        )
        .unwrap();
        assert_eq!(even.name, "liveput-zone");
        assert!(even.samples > 0.0);
        assert!(
            faster.samples > even.samples * 1.05,
            "{} vs {}",
            faster.samples,
            even.samples
        );
        assert_eq!(
            simulate(
                "gpt-1.5b",
                &zones(1.0),
                60.0,
                1,
                "reactive",
                (&Objective::Samples, true)
            )
            .unwrap()
            .name,
            "reactive"
        );
        assert!(
            simulate(
                "gpt-1.5b",
                &zones(1.0),
                60.0,
                1,
                "liveput-predict",
                (&Objective::Samples, true)
            )
            .is_none()
        );
        assert!(
            simulate(
                "no-such-model",
                &zones(1.0),
                60.0,
                1,
                "liveput",
                (&Objective::Samples, true)
            )
            .is_none()
        );
    }
}
