use parcae_consensus::Command;
use parcae_strategies::cost::spec::LayerCost;

use super::*;
use crate::planner::bench::{Member, member_id};
use crate::planner::build::workers;
use crate::planner::costs::{CPU_MEMORY_MB, MeasuredCache};
use crate::planner::decide::decide;
use crate::planner::strategy::reactive::Reactive;

const LAYERS: u32 = 8;

fn shape() -> JobShape {
    JobShape {
        global_batch: 16,
        micro_batch: 2,
        max_nodes: 16,
        restart_ms: 2000.0,
        memory_mb: CPU_MEMORY_MB,
        min_depth: 1,
        profile: None,
        steps_in_zone: false,
    }
}

/// A cluster training one job whose members are in `zones` (one entry per member, `ZONE` or
/// `ZONE/TYPE`), each reporting every layer at its pool's speed: zone or type `fast` twice as
/// fast as the others.
fn cluster(zones: &[&str]) -> ControlState {
    let members: Vec<Member> = zones
        .iter()
        .map(|name| {
            // "" for a member that names no zone.
            let pool: Option<Pool> = (!name.is_empty()).then(|| name.parse().unwrap());
            let zone = pool.as_ref().map_or("", Pool::zone);
            let kind = pool
                .as_ref()
                .and_then(Pool::instance_type)
                .unwrap_or_default();
            Member {
                zone: zone.into(),
                instance_type: kind.into(),
                speed: if zone == "fast" || kind == "fast" {
                    2.0
                } else {
                    1.0
                },
            }
        })
        .collect();
    crate::planner::bench::cluster(&members, LAYERS, 0).unwrap()
}

/// The id of the `n`th member of [`cluster`] (from 1).
fn id(n: u8) -> NodeId {
    member_id(u32::from(n))
}

fn zoned(state: &ControlState, fleets: &mut FleetCache) -> Option<Zoned> {
    let cost = MeasuredCache::default().get(state, &shape()).unwrap();
    fleets.zoned(state, &workers(state), &shape(), &cost)
}

#[test]
fn each_zone_is_priced_at_what_its_own_nodes_measured() {
    let state = cluster(&[
        "fast", "fast", "fast", "fast", "slow", "slow", "slow", "slow",
    ]);
    let mut fleets = FleetCache::default();
    let z = zoned(&state, &mut fleets).expect("two named zones");
    assert_eq!(z.node_zones, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let fleet = fleets.fleet.as_ref().unwrap();
    let (fast, slow) = (&fleet.pools()[0], &fleet.pools()[1]);
    assert_eq!(
        (fast.pool.to_string(), slow.pool.to_string()),
        ("fast".to_string(), "slow".to_string())
    );
    assert_eq!(fast.device.layers[3].forward_ms, 5.0);
    assert_eq!(slow.device.layers[3].forward_ms, 10.0);
    // The strategy chooses on the zones' table: a pipeline over both zones, split unevenly,
    // beats one of the slow zone's.
    let c = parcae_strategies::ParallelConfig::new(2, 4);
    let placed = &z.plans.placements[&c];
    let slot_zones = placed.slot_zones();
    assert_eq!(z.cost.samples_per_sec(c), placed.samples_per_sec);
    let held: Vec<usize> = placed.bounds.windows(2).map(|w| w[1] - w[0]).collect();
    let on = |zone: usize| -> usize {
        (0..4)
            .filter(|&s| slot_zones[0][s] == zone)
            .map(|s| held[s])
            .sum()
    };
    assert!(on(0) > on(1), "fast {} slow {}: {placed:?}", on(0), on(1));
}

#[test]
fn each_pool_is_planned_at_the_least_memory_its_members_said() {
    let mut state = cluster(&["a/fast", "a/fast", "b/slow", "b/slow", "c/slow", "c/slow"]);
    let said = [16_384, 0, 24_576, 20_480, 0, 0];
    for (n, mib) in (1u8..).zip(said) {
        let member = state.members.get_mut(&id(n)).unwrap();
        member.peer.caps.memory_mib = mib;
    }
    let mut fleets = FleetCache::default();
    zoned(&state, &mut fleets).expect("three named pools");
    let memory: Vec<f64> = fleets
        .fleet
        .as_ref()
        .unwrap()
        .pools()
        .iter()
        .map(|z| z.device.memory_mb)
        .collect();
    // a: the one that said; b: the lesser of two; c: nobody said, the planner's own.
    assert_eq!(memory, vec![16_384.0, 20_480.0, CPU_MEMORY_MB]);
}

#[test]
fn a_zone_prices_the_layers_it_does_not_run_at_its_own_speed() {
    let layer = |ms: f64| LayerCost {
        forward_ms: ms,
        backward_ms: 2.0 * ms,
        optimizer_ms: 0.1 * ms,
        activation_mb: 1.0,
        params: 1000.0,
    };
    // Zone 0 runs the first four layers at 10 ms, zone 1 (twice as fast) the last four.
    let slow: BTreeMap<u32, LayerCost> = (0..4).map(|i| (i, layer(10.0))).collect();
    let fast: BTreeMap<u32, LayerCost> = (4..8).map(|i| (i, layer(5.0))).collect();
    let pooled = vec![layer(7.0); 8];
    let zones = zone_layers(&[slow, fast, BTreeMap::new()], &pooled);
    for i in 0..8 {
        assert!(
            (zones[0][i].forward_ms - 10.0).abs() < 1e-9,
            "slow {i}: {:?}",
            zones[0][i]
        );
        assert!(
            (zones[1][i].forward_ms - 5.0).abs() < 1e-9,
            "fast {i}: {:?}",
            zones[1][i]
        );
        assert!((zones[1][i].backward_ms - 10.0).abs() < 1e-9);
        assert_eq!(zones[2][i], pooled[i], "a zone that timed nothing");
    }
}

#[test]
fn the_plan_puts_every_slot_in_its_zone_with_the_placements_bounds() {
    let state = cluster(&[
        "fast", "slow", "fast", "slow", "fast", "slow", "fast", "slow",
    ]);
    let mut fleets = FleetCache::default();
    let decision = reactive_decision(&state, &mut fleets);
    let plan = decision.plan.expect("a first plan");
    let z = zoned(&state, &mut fleets).unwrap();
    let config = parcae_strategies::ParallelConfig::new(plan.data_parallel, plan.pipeline_stages);
    assert_eq!(config, z.cost.best(8), "the zones' best");
    let placed = &z.plans.placements[&config];
    let slot_zones = placed.slot_zones();
    let bounds: Vec<u32> = placed.bounds.iter().map(|b| *b as u32).collect();
    assert_eq!(plan.partition, bounds);
    let ids = workers(&state);
    for (node, slot) in &plan.assignment {
        let n = ids.iter().position(|id| id == node).unwrap();
        assert_eq!(
            z.node_zones[n], slot_zones[slot.pipeline as usize][slot.stage as usize],
            "{slot:?}"
        );
    }
    assert_eq!(plan.assignment.len() as u32, config.nodes());
}

#[test]
fn one_zone_or_an_unnamed_one_is_planned_as_one_cluster() {
    let mut fleets = FleetCache::default();
    assert!(zoned(&cluster(&["a", "a", "a", "a"]), &mut fleets).is_none());
    assert!(zoned(&cluster(&["a", "a", "", "b"]), &mut fleets).is_none());
    let too_many: Vec<String> = (0..=MAX_POOLS).map(|i| format!("z{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert!(zoned(&cluster(&too_many), &mut fleets).is_none());
    let state = cluster(&["a", "a", "a", "a"]);
    let decision = reactive_decision(&state, &mut fleets);
    let plan = decision.plan.unwrap();
    let even =
        parcae_strategies::cost::spec::partition(LAYERS as usize, plan.pipeline_stages as usize);
    let even: Vec<u32> = even.iter().map(|b| *b as u32).collect();
    assert_eq!(plan.partition, even);
}

/// `state` with node `from` (1-based, as [`cluster`] numbers them) having measured `rate`
/// bytes/s from each of `sources`.
fn measured_rates(state: &mut ControlState, from: u8, sources: &[u8], rate: f64) {
    let node = id(from);
    let layers: Vec<_> = state.costs[&node].layers.clone().into_iter().collect();
    let report = Command::CostReport {
        node,
        step: 1,
        layers,
        bandwidth: sources.iter().map(|s| (id(*s), rate)).collect(),
        reconfiguration_s: None,
        allreduce_bytes_per_sec: None,
        boundary_link: None,
    };
    state.apply(&report).unwrap();
}

#[test]
fn links_are_priced_at_the_rates_measured_within_and_across_zones() {
    let mut state = cluster(&["a", "a", "b", "b"]);
    let mut fleets = FleetCache::default();
    let gbit = |z: &Zoned| (z.view.within.gbit_per_s, z.view.across.gbit_per_s);
    // Nothing measured: the assumed rate within, the cloud's ratio (5 of 10 Gb/s) across.
    let assumed = crate::planner::costs::DEFAULT_BYTES_PER_SEC * 8.0 / 1e9;
    let z = zoned(&state, &mut fleets).unwrap();
    assert_eq!(gbit(&z), (assumed, assumed / 2.0));
    // Only rates within zones, and fast ones (an emulated cluster measures at its time scale):
    // the crossing keeps the cloud's ratio to them, not the cloud's 5 Gb/s.
    measured_rates(&mut state, 2, &[1], 15e9);
    measured_rates(&mut state, 4, &[3], 15e9);
    let z = zoned(&state, &mut fleets).unwrap();
    assert_eq!(gbit(&z), (120.0, 60.0));
    assert_eq!(z.view.across.usd_per_gb, 0.02);
    assert_eq!(z.view.within.usd_per_gb, 0.0);
    // A rate measured across zones is the crossing's.
    measured_rates(&mut state, 3, &[1, 2], 2.5e9);
    let z = zoned(&state, &mut fleets).unwrap();
    assert_eq!(gbit(&z), (120.0, 20.0));
}

#[test]
fn a_dollar_objective_weighs_what_crosses_zones_where_every_zone_is_priced() {
    let state = cluster(&[
        "fast", "fast", "fast", "fast", "slow", "slow", "slow", "slow",
    ]);
    let prices = |zones: &[(&str, f64)]| -> BTreeMap<String, f64> {
        zones.iter().map(|(z, p)| ((*z).to_string(), *p)).collect()
    };
    let both = prices(&[("fast", 3.0), ("slow", 1.0)]);
    let mut dollars = FleetCache::new(ObjectiveKind::SamplesPerDollar, both.clone(), 1.0);
    let z = zoned(&state, &mut dollars).expect("two named zones");
    let (mut crossing, mut alone) = (0, 0);
    for (config, placed) in &z.plans.placements {
        let chosen_on = z.cost.samples_per_sec(*config);
        let pools = placed.nodes_per_zone(2).iter().filter(|&&n| n > 0).count();
        if pools == 1 {
            // The other pool is released: the same samples for less.
            alone += 1;
            assert!(chosen_on > placed.samples_per_sec, "{config:?}");
        } else if placed.egress_usd_per_sample > 0.0 {
            crossing += 1;
            assert!(chosen_on < placed.samples_per_sec, "{config:?}");
        } else {
            assert_eq!(chosen_on, placed.samples_per_sec, "{config:?}");
        }
    }
    assert!(
        crossing > 0 && alone > 0,
        "{crossing} cross zones, {alone} use one"
    );
    // On a device emulated at time scale 6, a wall-clock second holds the nodes for six of
    // theirs: the bill weighs six times as much against the same egress, as at six times
    // the prices.
    let six = |zones: &[(&'static str, f64)]| -> Vec<(&'static str, f64)> {
        zones.iter().map(|(z, p)| (*z, p * 6.0)).collect()
    };
    let mut scaled = FleetCache::new(ObjectiveKind::SamplesPerDollar, both.clone(), 6.0);
    let mut pricier = FleetCache::new(
        ObjectiveKind::SamplesPerDollar,
        prices(&six(&[("fast", 3.0), ("slow", 1.0)])),
        1.0,
    );
    let (a, b) = (
        zoned(&state, &mut scaled).unwrap(),
        zoned(&state, &mut pricier).unwrap(),
    );
    for config in z.plans.placements.keys() {
        assert_eq!(
            a.cost.samples_per_sec(*config),
            b.cost.samples_per_sec(*config)
        );
        // Equal where nothing crosses (the bill and the pools released scale alike), to the
        // rounding of the two products.
        let (scaled, unscaled) = (
            a.cost.samples_per_sec(*config),
            z.cost.samples_per_sec(*config),
        );
        assert!(
            scaled >= unscaled * (1.0 - 1e-12),
            "{config:?}: {scaled} < {unscaled}"
        );
    }
    // Planning for samples, or with a zone unpriced, the strategy chooses on the plans' rates.
    for mut fleets in [
        FleetCache::new(ObjectiveKind::Samples, both.clone(), 1.0),
        FleetCache::new(
            ObjectiveKind::SamplesPerDollar,
            prices(&[("fast", 3.0)]),
            1.0,
        ),
    ] {
        let z = zoned(&state, &mut fleets).expect("two named zones");
        for (config, placed) in &z.plans.placements {
            assert_eq!(z.cost.samples_per_sec(*config), placed.samples_per_sec);
        }
    }
}

#[test]
fn two_instance_types_in_one_zone_are_two_pools_on_the_zone_s_free_link() {
    let pools = cluster(&[
        "a/fast", "a/fast", "a/fast", "a/fast", "a/slow", "a/slow", "a/slow", "a/slow",
    ]);
    let zones = cluster(&[
        "fast", "fast", "fast", "fast", "slow", "slow", "slow", "slow",
    ]);
    let mut fleets = FleetCache::default();
    let z = zoned(&pools, &mut fleets).expect("two pools");
    let names: Vec<String> = z.view.pools.iter().map(|v| v.pool.clone()).collect();
    assert_eq!(names, ["a/fast", "a/slow"]);
    assert_eq!(z.node_zones, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    // The same devices in two zones pay for every crossing; in one zone nothing crosses.
    let apart = zoned(&zones, &mut FleetCache::default()).unwrap();
    let mut faster = 0;
    for (config, placed) in &z.plans.placements {
        assert_eq!(placed.egress_usd_per_sample, 0.0, "{config:?}");
        let across = apart.plans.placements[config].samples_per_sec;
        assert!(placed.samples_per_sec >= across - 1e-9, "{config:?}");
        faster += usize::from(placed.samples_per_sec > across * 1.001);
    }
    assert!(faster > 0, "some layout gains from the free link");
    // Each pool's availability is recorded under its own name.
    let Command::AvailabilityTick {
        pools: counts,
        count,
        ..
    } = crate::planner::build::availability_tick(&pools)
    else {
        panic!("an availability tick");
    };
    let counted: Vec<(&str, u32)> = counts.iter().map(|p| (p.pool.as_str(), p.nodes)).collect();
    assert_eq!((count, counted), (8, vec![("a/fast", 4), ("a/slow", 4)]));
    // A pool takes its own price, else its zone's.
    let prices: BTreeMap<String, f64> = [("a".to_string(), 1.0), ("a/fast".to_string(), 3.0)]
        .into_iter()
        .collect();
    let priced = FleetCache::new(ObjectiveKind::SamplesPerDollar, prices, 1.0);
    assert_eq!(
        priced.objective(
            &names
                .iter()
                .map(|n| n.parse().unwrap())
                .collect::<Vec<Pool>>()
        ),
        objective::Objective::SamplesPerDollar {
            usd_per_node_hour: vec![3.0, 1.0]
        }
    );
}

#[test]
fn zones_of_two_regions_are_priced_on_the_link_between_regions() {
    let state = cluster(&["us-east-1a", "us-east-1a", "us-west-2a", "us-west-2a"]);
    let mut fleets = FleetCache::default();
    zoned(&state, &mut fleets).expect("two named zones");
    let links = fleets.fleet.as_ref().unwrap().links();
    let cloud = Links::default();
    // Nobody measured a rate between the regions: the within rate slowed as the cloud's are.
    let ratio = cloud.across_regions.gbit_per_s / cloud.within.gbit_per_s;
    assert!((links.across_regions.gbit_per_s - links.within.gbit_per_s * ratio).abs() < 1e-9);
    assert_eq!(
        links.between("us-east-1a", "us-west-2a"),
        links.across_regions
    );
    assert!(links.across_regions.latency_ms >= cloud.across_regions.latency_ms);
}

#[test]
fn a_link_the_configuration_sets_prices_its_pair() {
    let state = cluster(&["us-east-1a", "us-east-1a", "us-west-2a", "us-west-2a"]);
    let mut set = Links::default();
    set.set("us-east-1a/us-west-2a=0.5,45,0.09").unwrap();
    let mut fleets = FleetCache::default().with_links(set);
    zoned(&state, &mut fleets).expect("two named zones");
    let links = fleets.fleet.as_ref().unwrap().links();
    let link = links.between("us-west-2a", "us-east-1a");
    assert_eq!(
        (link.gbit_per_s, link.latency_ms, link.usd_per_gb),
        (0.5, 45.0, 0.09)
    );
}

/// The reactive strategy's first decision on `state` with `fleets`.
fn reactive_decision(
    state: &ControlState,
    fleets: &mut FleetCache,
) -> crate::planner::decide::Decision {
    decide(
        state,
        &mut Reactive::default(),
        &shape(),
        &mut MeasuredCache::default(),
        fleets,
        true,
        0,
    )
}

#[test]
fn planned_for_dollars_a_dear_pool_is_left_idle_and_status_advises_releasing_it() {
    // Four fast nodes at $3 a node-hour beside four slow ones at $1: the slow pool's work costs
    // two thirds of the fast one's, and a ring across the two pays egress.
    let state = cluster(&[
        "fast", "fast", "fast", "fast", "slow", "slow", "slow", "slow",
    ]);
    let prices: BTreeMap<String, f64> = [("fast".to_string(), 3.0), ("slow".to_string(), 1.0)]
        .into_iter()
        .collect();
    let mut fleets = FleetCache::new(ObjectiveKind::SamplesPerDollar, prices, 1.0);
    let decision = reactive_decision(&state, &mut fleets);
    let plan = decision.plan.expect("a plan");
    let fleet = decision.fleet.expect("planned over pools");
    let advice: Vec<(&str, u32, u32, &str)> = fleet
        .advice
        .iter()
        .map(|a| {
            (
                a.pool.as_str(),
                a.nodes_now,
                a.nodes_used,
                a.action.as_str(),
            )
        })
        .collect();
    assert_eq!(plan.data_parallel * plan.pipeline_stages, 4, "{plan:?}");
    assert_eq!(
        advice,
        [("fast", 4, 0, "release"), ("slow", 4, 4, "grow")],
        "{:?}",
        fleet.advice
    );
    // Planning for samples, the advice follows the plan, whichever pools it takes.
    let mut fleets = FleetCache::default();
    let decision = reactive_decision(&state, &mut fleets);
    let plan = decision.plan.expect("a plan");
    let fleet = decision.fleet.expect("planned over pools");
    let used: u32 = fleet.advice.iter().map(|a| a.nodes_used).sum();
    assert_eq!(used, plan.data_parallel * plan.pipeline_stages);
    for a in &fleet.advice {
        let want = match a.nodes_used {
            0 => "release",
            4 => "grow",
            _ => "keep",
        };
        assert_eq!((a.nodes_now, a.action.as_str()), (4, want), "{a:?}");
    }
}
