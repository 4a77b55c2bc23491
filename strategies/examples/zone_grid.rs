//! The zone grid of `docs/strategies.md`: Parcae's p3 trace as zone `p3` (V100s, $0.918 a
//! node-hour) beside a synthetic zone `b` of every family and seeds 1-3, with V100s ($0.918) or
//! a kind 1.5x as fast with 24 GiB ($1.20), gpt-1.5b, H = 12, seed 1: the mixed planner's
//! samples against each other strategy's, and its samples per dollar against the zone-blind
//! planner's, planning for samples and planning for samples per dollar (then also against the
//! pool that buys the most per dollar alone). The last row puts the
//! 1.5x kind in the p3 trace's own zone, as a second pool (instance type) of it: the two pools
//! share the zone's free link.
//!
//!     cargo run --release -p parcae-strategies --example zone_grid [P3TRACE] [--flat-rings]
//!
//! `P3TRACE` defaults to `../shared/traces/parcae/liveput/traces/p3trace.csv`. With
//! `--flat-rings` every ring across zones is one flat ring, as before the all-reduce by zone.

use parcae_strategies::cost::analytic::Hardware;
use parcae_strategies::cost::builtin::builtin;
use parcae_strategies::cost::fleet::{Fleet, FleetPool};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::sim::fleet::{FleetRun, Objective, simulate_fleet};
use parcae_strategies::trace;

const FAMILIES: [&str; 4] = ["quiet", "outage", "diurnal", "shifting"];
const P3_USD: f64 = 0.918;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flat_rings = args.iter().any(|a| a == "--flat-rings");
    let path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "../shared/traces/parcae/liveput/traces/p3trace.csv".into());
    let p3 = trace::load(&path, 60).expect("the p3 trace");
    let spec = builtin("gpt-1.5b").expect("gpt-1.5b").0;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    println!(
        "b's device    family:seed   ours/single ours/blind ours/reactive  $ours/$blind  ($-planned)  $ours/$single ($-planned)"
    );
    for (kind, names, speed, memory_gib, usd) in [
        ("V100s", ["p3", "b"], 1.0, 15.5, P3_USD),
        ("1.5x", ["p3", "b"], 1.5, 24.0, 1.2),
        (
            "1.5x pool",
            ["a/p3.2xlarge", "a/g5.2xlarge"],
            1.5,
            24.0,
            1.2,
        ),
    ] {
        let mut range: [Vec<f64>; 6] = Default::default();
        for family in FAMILIES {
            for seed in 1..=3 {
                let other = format!("synthetic:{family}:{seed}");
                let b = trace::load(&other, 60).expect("a synthetic zone");
                let device = v100.derived("b", speed, memory_gib * 1024.0);
                let zones = vec![
                    FleetPool {
                        pool: names[0].parse().expect("a pool's name"),
                        device: v100.clone(),
                    },
                    FleetPool {
                        pool: names[1].parse().expect("a pool's name"),
                        device,
                    },
                ];
                let traces = [p3.clone(), b];
                let run = |objective: &Objective| -> Vec<FleetRun> {
                    let mut fleet = Fleet::new(spec.clone(), zones.clone(), Links::default())
                        .expect("a fleet")
                        .with_all_reduce_by_zone(!flat_rings);
                    simulate_fleet(&mut fleet, &traces, 0..p3.len(), 12, 1, objective, None)
                        .expect("a fleet run")
                };
                let samples = run(&Objective::Samples);
                let prices = vec![P3_USD, usd];
                let dollars = run(&Objective::SamplesPerDollar {
                    usd_per_node_hour: prices.clone(),
                });
                let of = |runs: &[FleetRun], name: &str| {
                    runs.iter()
                        .find(|r| r.run.name == name)
                        .expect("every strategy")
                        .clone()
                };
                let ours = of(&samples, "liveput-zone").run.samples;
                let ratios = [
                    ours / of(&samples, "single-zone-best").run.samples,
                    ours / of(&samples, "zone-blind").run.samples,
                    ours / of(&samples, "reactive").run.samples,
                    per_dollar(&of(&samples, "liveput-zone"), &prices)
                        / per_dollar(&of(&samples, "zone-blind"), &prices),
                    per_dollar(&of(&dollars, "liveput-zone"), &prices)
                        / per_dollar(&of(&dollars, "zone-blind"), &prices),
                    per_dollar(&of(&dollars, "liveput-zone"), &prices)
                        / per_dollar(&of(&dollars, "single-zone-best"), &prices),
                ];
                println!(
                    "{kind:<13} {family}:{seed:<10} {:>11.3} {:>10.3} {:>13.3} {:>13.2} {:>12.2} {:>25.3}",
                    ratios[0], ratios[1], ratios[2], ratios[3], ratios[4], ratios[5]
                );
                for (r, v) in range.iter_mut().zip(ratios) {
                    r.push(v);
                }
            }
        }
        let span = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{lo:.3}-{hi:.3}")
        };
        println!(
            "{kind}: ours/single {}, ours/blind {}, ours/reactive {}, $ {} ($-planned {}, against the best pool alone {})",
            span(&range[0]),
            span(&range[1]),
            span(&range[2]),
            span(&range[3]),
            span(&range[4]),
            span(&range[5])
        );
    }
}

/// Samples per dollar of `run` at `prices`.
fn per_dollar(run: &FleetRun, prices: &[f64]) -> f64 {
    run.run.samples / run.cost_usd(prices)
}
