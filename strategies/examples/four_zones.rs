//! The four-zone case of `docs/strategies.md`: Parcae's p3 trace as zone `p3` (V100s) beside
//! a quiet zone `b` of 16 nodes 1.5x as fast with 24 GiB, a diurnal zone `c` of 32 nodes at
//! 0.8x and an outage zone `d` of 24 V100s, the synthetic zones of seeds 1-3, gpt-1.5b,
//! H = 12, seed 1: the mixed planner's samples against each other strategy's.
//!
//!     cargo run --release -p parcae-strategies --example four_zones [P3TRACE] [--flat-rings]
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
    let memory = Hardware::default().memory_mb;
    let v100 = DeviceCosts::profiled(&spec, "v100", memory);
    println!("seed  ours/single ours/blind ours/reactive");
    for seed in 1..=3 {
        let zones = [
            ("p3", v100.clone()),
            ("b", v100.derived("b", 1.5, 24.0 * 1024.0)),
            ("c", v100.derived("c", 0.8, memory)),
            ("d", v100.clone()),
        ]
        .map(|(name, device)| FleetPool {
            pool: name.parse().expect("a pool's name"),
            device,
        });
        let mut traces = vec![p3.clone()];
        for other in [
            format!("synthetic:quiet:{seed}"),
            format!("synthetic:diurnal:{seed}:nodes=32"),
            format!("synthetic:outage:{seed}:nodes=24"),
        ] {
            traces.push(trace::load(&other, 60).expect("a synthetic zone"));
        }
        let mut fleet = Fleet::new(spec.clone(), zones.to_vec(), Links::default())
            .expect("a fleet")
            .with_all_reduce_by_zone(!flat_rings);
        let runs = simulate_fleet(
            &mut fleet,
            &traces,
            0..p3.len(),
            12,
            1,
            &Objective::Samples,
            None,
        )
        .expect("a fleet run");
        let of = |name: &str| -> &FleetRun {
            runs.iter()
                .find(|r| r.run.name == name)
                .expect("every strategy")
        };
        let ours = of("liveput-zone").run.samples;
        println!(
            "{seed:<5} {:>11.3} {:>10.3} {:>13.3}",
            ours / of("single-zone-best").run.samples,
            ours / of("zone-blind").run.samples,
            ours / of("reactive").run.samples,
        );
    }
}
