//! One job over two zones (issue 37): Parcae's p3 trace as one zone and a synthetic family as
//! the other, planned zone-aware (`liveput-zone` laid out by `cost::fleet`), zone-blind,
//! reactively and on the best zone alone.

mod common;

use parcae_strategies::cost::analytic::Hardware;
use parcae_strategies::cost::builtin::builtin;
use parcae_strategies::cost::fleet::{Fleet, FleetPool};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::sim::fleet::{
    FLEET_STRATEGIES, FleetRun, Layout, Objective, compositions, nodes_used, simulate_fleet,
};
use parcae_strategies::trace::{self, Trace};

/// The four strategies on `p3` (V100s) beside `other` (a device `speed` times as fast, with
/// `memory_gib`), over the whole p3 trace.
fn fleet_runs(p3: &Trace, other: &str, speed: f64, memory_gib: f64) -> Vec<FleetRun> {
    fleet_runs_for(p3, other, speed, memory_gib, &Objective::Samples)
}

/// [`fleet_runs`] planned for `objective`.
fn fleet_runs_for(
    p3: &Trace,
    other: &str,
    speed: f64,
    memory_gib: f64,
    objective: &Objective,
) -> Vec<FleetRun> {
    let spec = builtin("gpt-1.5b").unwrap().0;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    let device = v100.derived("other", speed, memory_gib * 1024.0);
    let zones = vec![
        FleetPool {
            pool: "p3".parse().unwrap(),
            device: v100,
        },
        FleetPool {
            pool: "b".parse().unwrap(),
            device,
        },
    ];
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let b = trace::load(other, 60).unwrap();
    simulate_fleet(
        &mut fleet,
        &[p3.clone(), b],
        0..p3.len(),
        12,
        1,
        objective,
        None,
    )
    .unwrap()
}

fn samples(runs: &[FleetRun], name: &str) -> f64 {
    runs.iter()
        .find(|r| r.run.name == name)
        .unwrap()
        .run
        .samples
}

#[test]
fn the_zone_aware_planner_beats_the_best_zone_and_the_zone_blind_one() {
    let Some(p3) = common::p3() else { return };
    for family in ["quiet:1", "diurnal:2", "shifting:3"] {
        let other = format!("synthetic:{family}");
        // A second kind 1.5x as fast with 24 GiB, and the same V100s in the second zone.
        for (speed, memory, over_blind) in [(1.5, 24.0, 1.25), (1.0, 15.5, 1.05)] {
            let runs = fleet_runs(&p3, &other, speed, memory);
            let names: Vec<&str> = runs.iter().map(|r| r.run.name.as_str()).collect();
            assert_eq!(names, FLEET_STRATEGIES);
            let ours = samples(&runs, "liveput-zone");
            let single = samples(&runs, "single-zone-best");
            let blind = samples(&runs, "zone-blind");
            let reactive = samples(&runs, "reactive");
            let case = format!("{other} at {speed}x");
            assert!(ours >= 1.25 * single, "{case}: {ours} vs single {single}");
            assert!(
                ours >= over_blind * blind,
                "{case}: {ours} vs blind {blind}"
            );
            assert!(ours > reactive, "{case}: {ours} vs reactive {reactive}");
            // The blind planner's rings cross zones; ours keep each stage's ring in one.
            let egress = |name: &str| runs.iter().find(|r| r.run.name == name).unwrap().egress_usd;
            assert!(
                egress("zone-blind") > 2.0 * egress("liveput-zone"),
                "{case}"
            );
            assert_eq!(egress("single-zone-best"), 0.0);
        }
    }
}

/// Samples per dollar of `name`'s run: its zones' node-hours at `prices`, and its egress.
fn per_dollar(runs: &[FleetRun], name: &str, prices: &[f64]) -> (f64, f64) {
    let run = runs.iter().find(|r| r.run.name == name).unwrap();
    let nodes: f64 = run.node_hours.iter().zip(prices).map(|(h, p)| h * p).sum();
    (run.run.samples / (nodes + run.egress_usd), run.egress_usd)
}

#[test]
fn planning_for_samples_per_dollar_buys_more_of_them_and_less_egress() {
    let Some(p3) = common::p3() else { return };
    let prices = [0.918, 1.2];
    let dollars = Objective::SamplesPerDollar {
        usd_per_node_hour: prices.to_vec(),
    };
    for (other, speed, memory) in [
        ("synthetic:diurnal:2", 1.0, 15.5),
        ("synthetic:quiet:1", 1.5, 24.0),
    ] {
        let for_samples = fleet_runs(&p3, other, speed, memory);
        let for_dollars = fleet_runs_for(&p3, other, speed, memory, &dollars);
        let (most, paid) = per_dollar(&for_samples, "liveput-zone", &prices);
        let (cheapest, saved) = per_dollar(&for_dollars, "liveput-zone", &prices);
        let case = format!("{other} at {speed}x");
        assert!(
            cheapest >= 1.03 * most,
            "{case}: {cheapest} vs {most} samples per $"
        );
        assert!(saved < 0.5 * paid, "{case}: egress ${saved} vs ${paid}");
        // As many as the pool that buys the most alone (measured 0.999x and 1.000x: the plan
        // keeps to that pool and releases the other).
        let (alone, _) = per_dollar(&for_dollars, "single-zone-best", &prices);
        assert!(
            cheapest >= 0.99 * alone,
            "{case}: {cheapest} vs {alone} alone"
        );
        // The objective trades samples for dollars; it is not a free lunch.
        assert!(
            samples(&for_dollars, "liveput-zone") < samples(&for_samples, "liveput-zone"),
            "{case}"
        );
        // The zone-blind planner sees no egress to save: its run is the same either way.
        assert_eq!(
            samples(&for_dollars, "zone-blind"),
            samples(&for_samples, "zone-blind")
        );
    }
}

#[test]
fn a_dollar_objective_without_every_price_is_refused() {
    let spec = builtin("gpt-1.5b").unwrap().0;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    let zones = ["a", "b"]
        .map(|name| FleetPool {
            pool: name.parse().unwrap(),
            device: v100.clone(),
        })
        .to_vec();
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let t = trace::load("synthetic:quiet:1:nodes=8:days=1", 60).unwrap();
    for prices in [vec![1.0], vec![1.0, f64::NAN], vec![1.0, -1.0]] {
        let objective = Objective::SamplesPerDollar {
            usd_per_node_hour: prices.clone(),
        };
        let err = simulate_fleet(
            &mut fleet,
            &[t.clone(), t.clone()],
            0..10,
            4,
            1,
            &objective,
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("price for each of the 2 zones"),
            "{prices:?}: {err}"
        );
    }
}

#[test]
fn zones_pool_into_one_cluster_interval_by_interval() {
    let a = trace::load("synthetic:quiet:1:nodes=8:days=1", 60).unwrap();
    let b = trace::load("synthetic:diurnal:2:nodes=12:days=2", 60).unwrap();
    let comps = compositions(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(comps.counts.len(), a.len().min(b.len()));
    for (i, (iv, counts)) in comps.pooled.intervals.iter().zip(&comps.counts).enumerate() {
        assert_eq!(counts, &vec![a.intervals[i].nodes, b.intervals[i].nodes]);
        assert_eq!(iv.nodes, a.intervals[i].nodes + b.intervals[i].nodes);
        assert_eq!(iv.added, a.intervals[i].added + b.intervals[i].added);
        assert_eq!(iv.removed, a.intervals[i].removed + b.intervals[i].removed);
    }
    let other = trace::load("synthetic:quiet:1:nodes=8:days=1", 30).unwrap();
    assert!(compositions(&[a, other]).is_err());
}

#[test]
fn the_nodes_used_per_zone_are_the_placements_and_within_each_zone() {
    let spec = builtin("gpt-1.5b").unwrap().0;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    let fast = v100.derived("fast", 1.5, 24.0 * 1024.0);
    let zones = vec![
        FleetPool {
            pool: "a".parse().unwrap(),
            device: v100,
        },
        FleetPool {
            pool: "b".parse().unwrap(),
            device: fast,
        },
    ];
    let mut fleet = Fleet::new(spec, zones, Links::default()).unwrap();
    let a = trace::load("synthetic:diurnal:1:nodes=16:days=1", 60).unwrap();
    let b = trace::load("synthetic:shifting:2:nodes=12:days=1", 60).unwrap();
    let traces = [a, b];
    let range = 60..300;
    let runs = simulate_fleet(
        &mut fleet,
        &traces,
        range.clone(),
        12,
        1,
        &Objective::Samples,
        None,
    )
    .unwrap();
    let counts = compositions(&traces).unwrap().counts;
    let ours = &runs[0].run;
    let used = nodes_used(&mut fleet, Layout::ZoneAware, &counts, ours, range.start);
    assert_eq!(used.len(), range.len());
    let mut both = 0;
    for (k, (used, config)) in used.iter().zip(&ours.configs).enumerate() {
        let have = &counts[range.start + k];
        assert!(
            used.iter().zip(have).all(|(u, h)| u <= h),
            "{k}: {used:?} of {have:?}"
        );
        let placed = fleet.plans(have);
        let expected = if placed.placements.contains_key(config) {
            config.nodes()
        } else {
            0
        };
        assert_eq!(used.iter().sum::<u32>(), expected, "{k}: {config:?}");
        both += u32::from(used.iter().all(|&u| u > 0));
    }
    // A faster zone beside a slower one: some intervals train on both.
    assert!(both > 0);
}

#[test]
fn planned_for_samples_per_dollar_a_dear_pool_is_left_idle_and_the_cheap_one_alone_is_matched() {
    // A cheap, churning pool of V100s ($0.55) beside a stable, dear one 1.5x as fast ($1.20):
    // per dollar of work the cheap pool is 1.45x the dear one, and a ring across them pays
    // egress every step. Two days of both synthetic traces.
    let spec = builtin("gpt-1.5b").unwrap().0;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    let zones = vec![
        FleetPool {
            pool: "cheap".parse().unwrap(),
            device: v100.clone(),
        },
        FleetPool {
            pool: "stable".parse().unwrap(),
            device: v100.derived("stable", 1.5, 24.0 * 1024.0),
        },
    ];
    let traces = [
        trace::load("synthetic:shifting:1:nodes=32", 60).unwrap(),
        trace::load("synthetic:quiet:1", 60).unwrap(),
    ];
    let prices = [0.55, 1.2];
    let run = |objective: &Objective| {
        let mut fleet = Fleet::new(spec.clone(), zones.clone(), Links::default()).unwrap();
        simulate_fleet(&mut fleet, &traces, 0..48 * 60, 12, 1, objective, None).unwrap()
    };
    let for_samples = run(&Objective::Samples);
    let for_dollars = run(&Objective::SamplesPerDollar {
        usd_per_node_hour: prices.to_vec(),
    });
    let (ours, _) = per_dollar(&for_dollars, "liveput-zone", &prices);
    let (alone, _) = per_dollar(&for_dollars, "single-zone-best", &prices);
    let (for_samples_ours, _) = per_dollar(&for_samples, "liveput-zone", &prices);
    let (blind, _) = per_dollar(&for_dollars, "zone-blind", &prices);
    // Measured 4,148 against the cheap pool's 4,145 samples per $ (1,585 planned for samples,
    // 355 zone-blind).
    assert!(
        ours >= 0.99 * alone,
        "{ours} vs the best pool alone {alone}"
    );
    assert!(
        ours >= 2.0 * for_samples_ours,
        "{ours} vs {for_samples_ours}"
    );
    assert!(ours >= 1.1 * blind, "{ours} vs zone-blind {blind}");
    // The dear pool is released nearly all the time: billed a twentieth of what it offered.
    let theirs = for_dollars
        .iter()
        .find(|r| r.run.name == "liveput-zone")
        .unwrap();
    assert!(
        theirs.node_hours[1] < 0.05 * theirs.held_node_hours[1],
        "{:?} of {:?}",
        theirs.node_hours,
        theirs.held_node_hours
    );
    let single = for_dollars
        .iter()
        .find(|r| r.run.name == "single-zone-best")
        .unwrap();
    assert_eq!(single.zone.as_deref(), Some("cheap"));
}
