use super::staggered::arranged_pipelines;
use super::two_zones::{caps_of, fits, pair_shares};
use super::zone_pipelines::fill;
use super::*;
use crate::cost::builtin::builtin;
use crate::cost::objective::Objective;

/// Parcae's V100s: 15.5 GiB usable.
const V100_MB: f64 = 15.5 * 1024.0;

fn gpt() -> ModelSpec {
    builtin("gpt-1.5b").unwrap().0
}

fn zone(name: &str, device: DeviceCosts) -> FleetPool {
    FleetPool {
        pool: name.parse().unwrap(),
        device,
    }
}

/// Zone `a` of V100s, zone `b` of a kind `speed` times as fast with 24 GiB.
fn two_kinds(speed: f64) -> Fleet {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let fast = v100.derived("fast", speed, 24.0 * 1024.0);
    Fleet::new(
        spec,
        vec![zone("a", v100), zone("b", fast)],
        Links::default(),
    )
    .unwrap()
}

/// The zones of `counts[z]` nodes of each zone `z`, joined one from each zone in turn.
fn alternating(counts: &[u32]) -> Vec<u8> {
    let mut left = counts.to_vec();
    let mut joined = Vec::new();
    while left.iter().any(|&n| n > 0) {
        for (z, n) in left.iter_mut().enumerate() {
            if *n > 0 {
                *n -= 1;
                joined.push(z as u8);
            }
        }
    }
    joined
}

fn sizes(bounds: &[usize]) -> Vec<usize> {
    bounds.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn uneven_stages_on_unequal_devices_beat_the_worst_devices_split() {
    let mut fleet = two_kinds(2.0);
    let c = ParallelConfig::new(2, 8);
    let aware = fleet.plans(&[8, 8]);
    let blind = fleet.blind_plans(&alternating(&[8, 8]));
    let (a, b) = (&aware.placements[&c], &blind.placements[&c]);
    let a_zones = a.slot_zones();
    // Two pipelines of four V100 stages and four fast ones: the fast stages hold more layers.
    let held = sizes(&a.bounds);
    let on = |kind: usize| -> usize {
        (0..8)
            .filter(|&s| a_zones[0][s] == kind)
            .map(|s| held[s])
            .sum()
    };
    assert!(on(1) > on(0), "fast {} layers, v100 {}", on(1), on(0));
    assert!(
        a.samples_per_sec >= 1.15 * b.samples_per_sec,
        "aware {} blind {}",
        a.samples_per_sec,
        b.samples_per_sec
    );
    // Every stage's replicas share a zone, so its all-reduce never crosses one.
    for s in 0..8 {
        assert!(a_zones.iter().all(|p| p[s] == a_zones[0][s]), "{a_zones:?}");
    }
    assert!(a.egress_usd_per_sample < b.egress_usd_per_sample);
}

#[test]
fn with_one_kind_pipelines_stay_in_the_fewest_zones_and_pay_no_egress() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let zones = vec![zone("a", v100.clone()), zone("b", v100)];
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let c = ParallelConfig::new(2, 8);
    let aware = fleet.plans(&[16, 10]);
    let placed = &aware.placements[&c];
    assert!(
        placed.slot_zones().iter().flatten().all(|&z| z == 0),
        "{:?}",
        placed.pipelines
    );
    assert_eq!(placed.egress_usd_per_sample, 0.0);
    let blind = fleet.blind_plans(&alternating(&[16, 10]));
    let spread = &blind.placements[&c];
    assert!(spread.egress_usd_per_sample > 0.0);
    assert!(spread.samples_per_sec < placed.samples_per_sec);
    // Nodes that joined zone by zone: the blind planner's first 16 are all in zone a, as a
    // zone-ignorant system's first 16 ranks would be.
    let mut by_zone = vec![0; 16];
    by_zone.extend([1; 10]);
    let in_order = &fleet.blind_plans(&by_zone).placements[&c];
    assert!(in_order.slot_zones().iter().flatten().all(|&z| z == 0));
    assert_eq!(in_order.egress_usd_per_sample, 0.0);
    assert!(in_order.samples_per_sec > spread.samples_per_sec);
    // A zone index past the fleet's lays nothing out.
    assert!(fleet.blind_plans(&[0, 2, 1]).placements.is_empty());
    // A fleet of one zone plans as the one-zone table does.
    let table = fleet.uniform_table(&fleet.pools()[0].device.clone(), 16);
    let alone = fleet.plans(&[16, 0]);
    assert_eq!(alone.table.samples_per_sec(c), table.samples_per_sec(c));
    assert!(table.samples_per_sec(c) > 0.0);
}

#[test]
fn the_blind_planner_believes_the_slowest_layers_and_the_least_memory() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let big_slow = v100.derived("big-slow", 0.5, 80.0 * 1024.0);
    let zones = vec![zone("a", v100.clone()), zone("b", big_slow.clone())];
    let fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let worst = fleet.worst();
    assert_eq!(worst.memory_mb, V100_MB);
    assert_eq!(worst.layers[3].forward_ms, big_slow.layers[3].forward_ms);
    assert!(worst.layers[3].forward_ms > v100.layers[3].forward_ms);
}

#[test]
fn a_fleet_of_no_zone_or_too_many_or_a_name_twice_is_refused() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let fleet = |zones| Fleet::new(gpt(), zones, Links::default()).err();
    assert_eq!(fleet(vec![]), Some(FleetError::Pools(0)));
    let many: Vec<FleetPool> = (0..=MAX_POOLS)
        .map(|i| zone(&format!("z{i}"), v100.clone()))
        .collect();
    assert_eq!(fleet(many), Some(FleetError::Pools(MAX_POOLS + 1)));
    assert_eq!(
        fleet(vec![zone("a", v100.clone()), zone("a", v100.clone())]),
        Some(FleetError::Duplicate("a".parse().unwrap()))
    );
    let mut short = v100.clone();
    short.layers.pop();
    assert_eq!(
        fleet(vec![zone("a", short)]),
        Some(FleetError::Layers(
            "a".parse().unwrap(),
            spec.layers.len() - 1,
            spec.layers.len()
        ))
    );
}

/// A job whose steps stay inside a zone (DiLoCo) is laid out in zone pipelines only, its
/// rings priced on the zones' own links: never slower than the same pipelines' rings across.
#[test]
fn steps_inside_zones_lay_every_pipeline_inside_one() {
    let mut across = two_kinds(1.0);
    let mut inside = two_kinds(1.0).with_steps_in_zone(true);
    assert!(inside.steps_in_zone() && !across.steps_in_zone());
    let (a, i) = (across.plans(&[8, 8]), inside.plans(&[8, 8]));
    assert!(!i.placements.is_empty());
    for (c, placed) in &i.placements {
        for pipelines in &placed.pipelines {
            assert!(
                pipelines.pools.iter().all(|&z| z == pipelines.pools[0]),
                "{c:?}: {:?}",
                pipelines.pools
            );
        }
        if let Some(theirs) = a.placements.get(c) {
            let crosses = theirs
                .pipelines
                .iter()
                .any(|p| p.pools.iter().any(|&z| z != p.pools[0]));
            if !crosses {
                assert!(
                    placed.samples_per_sec >= theirs.samples_per_sec * (1.0 - 1e-9),
                    "{c:?}"
                );
            }
        }
    }
}

#[test]
fn stages_are_split_over_zones_within_their_counts() {
    // Each share's stages in the first zones (the rest of the array is zero).
    let pair_splits = |p: usize, counts: &[u32], d: u32| -> Vec<Vec<usize>> {
        let caps = caps_of(counts, d);
        pair_shares(p, counts.len())
            .filter(|k| fits(k, &caps))
            .map(|k| {
                assert!(k[counts.len()..].iter().all(|&s| s == 0), "{k:?}");
                k[..counts.len()].to_vec()
            })
            .collect()
    };
    assert_eq!(pair_splits(3, &[4, 6], 2), vec![vec![1, 2], vec![2, 1]]);
    assert_eq!(
        pair_splits(2, &[1, 1, 1], 1),
        vec![vec![1, 1, 0], vec![1, 0, 1], vec![0, 1, 1]]
    );
    assert!(pair_splits(4, &[1, 1], 1).is_empty());
    assert_eq!(fill(&[16, 9], &[1, 0], 3, 8), Some(vec![2, 1]));
    assert_eq!(fill(&[16, 9], &[0, 1], 4, 8), None);
}

#[test]
fn a_dollar_table_weighs_each_rate_by_its_egress_against_the_bill() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let fast = v100.derived("fast", 1.5, 24.0 * 1024.0);
    let zones = vec![zone("a", v100), zone("b", fast)];
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let plans = fleet.plans(&[8, 8]);
    // 16 nodes at $1 an hour each.
    let (counts, usd) = ([8, 8], [1.0, 1.0]);
    let bill = 16.0 / 3600.0;
    let table = Objective::SamplesPerDollar {
        usd_per_node_hour: usd.to_vec(),
    }
    .table(&plans, &counts);
    let (mut crossing, mut alone) = (0, 0);
    for (config, placed) in &plans.placements {
        let (r, e) = (placed.samples_per_sec, placed.egress_usd_per_sample);
        let weighed = table.samples_per_sec(*config);
        // Samples per dollar r / (C_used + e r), times the bill C of every pool held: a pool
        // the placement leaves idle is released.
        let pools = placed.nodes_per_zone(2).iter().filter(|&&n| n > 0).count();
        let used = bill * pools as f64 / 2.0;
        assert!(
            (weighed - r * bill / (used + e * r)).abs() < 1e-9 * r,
            "{config:?}"
        );
        if e > 0.0 {
            crossing += 1;
        }
        if pools == 1 {
            alone += 1;
            assert!(weighed > r, "{config:?}: half the bill");
        } else if e > 0.0 {
            assert!(weighed < r, "{config:?}");
        } else {
            assert_eq!(weighed, r, "{config:?}");
        }
    }
    assert!(
        crossing > 0 && alone > 0,
        "{crossing} cross zones, {alone} use one"
    );
    // For samples, or with no bill, no weighing.
    assert_eq!(Objective::Samples.table(&plans, &counts), plans.table);
    let free = Objective::SamplesPerDollar {
        usd_per_node_hour: vec![0.0; 2],
    };
    assert_eq!(*free.table(&plans, &counts), *plans.table);
}

#[test]
fn staggered_pipelines_count_what_each_zone_holds() {
    // 14 + 10 nodes, 3 x 8 as 5 + 3: two pipelines of 5 + 3 and one of 4 + 4 use 14 and 10.
    assert_eq!(arranged_pipelines(14, 10, 5, 3, 3), Some(2));
    // As 4 + 4 the second zone would need 12 (or 15 of the first with 5 + 3 everywhere).
    assert_eq!(arranged_pipelines(14, 10, 4, 4, 3), None);
    // Equal pipelines fit already: nothing to stagger.
    assert_eq!(arranged_pipelines(15, 9, 5, 3, 3), None);
    // One stage in the first zone has none to give up; one pipeline has no other to differ from.
    assert_eq!(arranged_pipelines(14, 10, 1, 7, 3), None);
    assert_eq!(arranged_pipelines(4, 4, 5, 3, 1), None);
    // Too few nodes for any count.
    assert_eq!(arranged_pipelines(12, 10, 5, 3, 3), None);
}

#[test]
fn staggered_pipelines_hold_a_composition_that_equal_pipelines_do_not() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let zones = vec![zone("a", v100.clone()), zone("b", v100.clone())];
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let c = ParallelConfig::new(3, 8);
    let counts = [14, 10];
    let aware = fleet.plans(&counts);
    let blind = fleet.blind_plans(&alternating(&counts));
    let placed = &aware.placements[&c];
    // Two orders of zones that differ only at one stage.
    let mut orders = placed.slot_zones();
    orders.sort();
    orders.dedup();
    assert_eq!(orders.len(), 2, "{:?}", placed.pipelines);
    let differ: Vec<usize> = (0..8).filter(|&s| orders[0][s] != orders[1][s]).collect();
    assert_eq!(differ.len(), 1, "{orders:?}");
    // Each zone's nodes hold the stages placed in it.
    for (z, &n) in counts.iter().enumerate() {
        let used = placed.nodes_per_zone(counts.len())[z];
        assert!(used <= n, "zone {z}: {used} of {n}");
    }
    // Faster than the zone-blind layout of the same nodes, no faster than one zone of them,
    // and only the junction stage's ring crosses zones where the blind layout's every ring may.
    let alone = fleet.uniform_table(&v100, 24).samples_per_sec(c);
    let spread = &blind.placements[&c];
    assert!(
        placed.samples_per_sec > spread.samples_per_sec && placed.samples_per_sec <= alone,
        "staggered {} blind {} one zone {alone}",
        placed.samples_per_sec,
        spread.samples_per_sec
    );
    assert!(placed.egress_usd_per_sample < spread.egress_usd_per_sample);
}

#[test]
fn zone_pipelines_of_a_faster_kind_take_more_of_the_batch() {
    let mut fleet = two_kinds(2.0);
    let aware = fleet.plans(&[16, 16]);
    // Two pipelines of 16 stages, one in each zone: the twice-as-fast zone's runs about twice
    // the micro-batches, and the batch is still 128 samples.
    let placed = &aware.placements[&ParallelConfig::new(2, 16)];
    let homes: Vec<usize> = placed.slot_zones().iter().map(|z| z[0]).collect();
    assert_eq!(homes, vec![1, 0]);
    let micro = placed.micro_batches.clone().expect("uneven shares");
    assert_eq!(micro, vec![86, 42]);
    assert_eq!(micro.iter().sum::<u32>() * gpt().micro_batch, 128);
    assert_eq!(super::shares::batch_shares(&micro, 128), vec![86, 42]);
}

#[test]
fn planned_for_samples_per_dollar_a_plan_may_leave_a_dear_pool_idle() {
    // Zone `b` is 1.5x as fast at ten times the price: per dollar its work costs 6.7x `a`'s.
    let mut fleet = two_kinds(1.5);
    let counts = [16, 16];
    let usd = [0.3, 3.0];
    let objective = Objective::SamplesPerDollar {
        usd_per_node_hour: usd.to_vec(),
    };
    let for_samples = fleet.plans(&counts);
    let fastest = for_samples.table.best(32);
    assert!(for_samples.placements[&fastest].nodes_per_zone(2)[1] > 0);
    fleet.set_prices(objective.prices());
    let for_dollars = fleet.plans(&counts);
    let table = objective.table(&for_dollars, &counts);
    let chosen = table.best(32);
    let placed = &for_dollars.placements[&chosen];
    assert_eq!(placed.nodes_per_zone(2)[1], 0, "{chosen:?}: {placed:?}");
    // Samples per dollar while `a` alone is held, against the fastest plan holding both.
    let per_dollar = |placed: &Placement, held_usd_per_hour: f64| {
        placed.samples_per_sec
            / (held_usd_per_hour / 3600.0 + placed.egress_usd_per_sample * placed.samples_per_sec)
    };
    let alone = per_dollar(placed, 16.0 * usd[0]);
    let both = per_dollar(
        &for_samples.placements[&fastest],
        16.0 * usd[0] + 16.0 * usd[1],
    );
    assert!(alone > 2.0 * both, "alone {alone} both {both}");
    // Every placement of the priced plans is at least as good per dollar as the one the
    // samples plans laid for the same configuration.
    for (config, placed) in &for_dollars.placements {
        let was = for_samples.placements[config].per_dollar_rate(&counts, &usd);
        assert!(
            placed.per_dollar_rate(&counts, &usd) >= was - 1e-9,
            "{config:?}"
        );
    }
    // Back to samples: the first plans again.
    fleet.set_prices(None);
    assert_eq!(*fleet.plans(&counts), *for_samples);
}

#[test]
fn where_links_cost_nothing_packed_pipelines_leave_no_node_idle() {
    // Four zones of V100s joined by links as good as one zone's: pipelines of 8 inside a zone
    // hold 32 of 40 nodes; packed over the zones, 5 x 8 holds them all, and the zone-aware
    // planner is never behind the zone-blind one.
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let mut links = Links::default();
    links.across = links.within;
    let zones = ["a", "b", "c", "d"].map(|n| zone(n, v100.clone())).to_vec();
    let mut fleet = Fleet::new(spec, zones, links).unwrap();
    let counts = [13, 11, 9, 7];
    let aware = fleet.plans(&counts);
    let blind = fleet.blind_plans(&alternating(&counts));
    let c = ParallelConfig::new(5, 8);
    let packed = &aware.placements[&c];
    assert_eq!(packed.nodes_per_zone(4), vec![13, 11, 9, 7]);
    assert!(packed.samples_per_sec >= blind.placements[&c].samples_per_sec);
    assert_never_behind(&aware, &blind);
}

#[test]
fn eight_pools_are_planned_and_never_behind_zone_blind() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let fast = v100.derived("fast", 1.5, 24.0 * 1024.0);
    let zones: Vec<FleetPool> = (0..MAX_POOLS)
        .map(|i| {
            let device = if i % 2 == 0 {
                v100.clone()
            } else {
                fast.clone()
            };
            zone(&format!("us-east-1{}", (b'a' + i as u8) as char), device)
        })
        .collect();
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let counts = [9, 8, 7, 6, 5, 4, 3, 2];
    let aware = fleet.plans(&counts);
    let blind = fleet.blind_plans(&alternating(&counts));
    assert!(!aware.placements.is_empty());
    assert_never_behind(&aware, &blind);
    // Eight small zones hold no pipeline of the model's depths inside one: the best is packed
    // over the zones, as fast as zone-blind's layout (priced alike) and crossing fewer zones.
    let c = ParallelConfig::new(4, 11);
    let (a, b) = (&aware.placements[&c], &blind.placements[&c]);
    assert_eq!(a.samples_per_sec, b.samples_per_sec);
    assert!(
        a.egress_usd_per_sample < 0.75 * b.egress_usd_per_sample,
        "{} vs {}",
        a.egress_usd_per_sample,
        b.egress_usd_per_sample
    );
}

/// Every configuration of `blind` is laid out by `aware` at least as fast.
fn assert_never_behind(aware: &Plans, blind: &Plans) {
    for (config, b) in &blind.placements {
        let a = aware
            .placements
            .get(config)
            .map_or(0.0, |p| p.samples_per_sec);
        assert!(
            a >= b.samples_per_sec * (1.0 - 1e-9),
            "{config:?}: {a} < {}",
            b.samples_per_sec
        );
    }
}

#[test]
fn plans_laid_out_in_shards_are_one_threads_plans() {
    let spec = gpt();
    let v100 = DeviceCosts::profiled(&spec, "v100", V100_MB);
    let kinds = [(1.0, 16.0), (1.5, 24.0), (0.75, 16.0), (2.0, 40.0)];
    let pools = kinds
        .iter()
        .enumerate()
        .map(|(z, &(speed, gib))| zone(&format!("z{z}"), v100.derived("k", speed, gib * 1024.0)))
        .collect();
    let one = Fleet::new(spec, pools, Links::default()).unwrap();
    let mut serial = one.clone();
    let mut sharded = one.clone();
    sharded.shards = (0..3).filter_map(|k| one.shard(k, 3)).collect();
    assert_eq!(sharded.shards.len(), 3);
    let usd = [0.9, 1.2, 0.7, 3.0];
    for prices in [None, Some(&usd[..])] {
        serial.set_prices(prices);
        sharded.set_prices(prices);
        if prices.is_some() {
            sharded.shards = (0..2).filter_map(|k| sharded.shard(k, 2)).collect();
        }
        for counts in [
            [16, 16, 16, 16],
            [17, 16, 16, 16],
            [15, 16, 16, 16],
            [3, 40, 0, 9],
        ] {
            let total = counts.iter().sum();
            let alone = serial.plans_of(total, |f, d, p| f.zone_aware(&counts, d, p));
            let dealt = sharded.plans(&counts);
            assert!(!alone.placements.is_empty());
            assert_eq!(*dealt, *alone, "{counts:?} priced {}", prices.is_some());
        }
    }
}
