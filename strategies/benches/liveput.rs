//! Speed of the liveput decision and of whole-trace simulations.
//!
//! `cargo bench -p parcae-strategies`: goals are one decision for N = 32, H = 12 on the gpt-1.5b
//! table <= 1 ms memoised, N = 512 with the analytic model <= 100 ms with cold costs (both with
//! and without the node default's terminal value), the full p3 simulation of every
//! strategy <= 10 s, every strategy on a 16-day zone at 60 s intervals <= 30 s. The fleet's
//! tables (issue 37): compositions of 32 nodes in two zones and of 512 in four, cold and one
//! node changed after them (docs/strategies.md has the figures).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::analytic::{Hardware, throughput_table};
use parcae_strategies::cost::fleet::{Fleet, FleetPool};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::transfer::TransferModel;
use parcae_strategies::liveput::{LiveputOptimizer, NextChange, PlanState, Terminal};
use parcae_strategies::sim::{self, STRATEGIES, SimSetup};
use parcae_strategies::trace::{self, Interval, Trace};

/// A forecast that loses and regains nodes around `n`.
fn forecast(n: u32, h: usize) -> Vec<Interval> {
    let mut out = Vec::with_capacity(h);
    let mut nodes = n;
    for k in 0..h {
        let (added, removed) = match k % 4 {
            1 => (0, (n / 16).max(1)),
            3 => ((n / 32).max(1), 0),
            _ => (0, 0),
        };
        nodes = nodes + added - removed;
        out.push(Interval {
            nodes,
            added,
            removed,
        });
    }
    out
}

fn decisions(c: &mut Criterion) {
    let table = Arc::new(CostModel::builtin("gpt-1.5b").expect("built-in model"));
    let now32 = PlanState {
        nodes: 32,
        config: ParallelConfig::new(4, 8),
        leftover_ms: 0.0,
    };
    let f32 = forecast(32, 12);
    let mut warm = LiveputOptimizer::new(table.clone(), 60.0, 1);
    warm.decide(now32, &f32);
    c.bench_function("decision N=32 H=12 gpt-1.5b table (memoised costs)", |b| {
        b.iter(|| warm.decide(now32, &f32))
    });
    c.bench_function("decision N=32 H=12 gpt-1.5b table (cold costs)", |b| {
        b.iter_batched(
            || LiveputOptimizer::new(table.clone(), 60.0, 1),
            |mut o| o.decide(now32, &f32),
            BatchSize::SmallInput,
        )
    });

    // The node's default: the same decision with the zone model's terminal value.
    let terminal = Terminal {
        stay_ms: 3_600_000.0,
        next: vec![
            NextChange {
                probability: 0.3,
                nodes: 31,
                stay_ms: 600_000.0,
                table: None,
            },
            NextChange {
                probability: 0.7,
                nodes: 29,
                stay_ms: 600_000.0,
                table: None,
            },
        ],
    };
    warm.decide_with_terminal(now32, &f32, terminal.clone());
    c.bench_function(
        "terminal decision N=32 H=12 gpt-1.5b table (memoised costs)",
        |b| b.iter(|| warm.decide_with_terminal(now32, &f32, terminal.clone())),
    );

    let base = CostModel::builtin("gpt-1.5b").expect("built-in model");
    let t512 = throughput_table(
        &base.spec,
        Hardware::default(),
        &TransferModel::Profiled10Gbps,
        512,
    );
    let analytic = Arc::new(CostModel::new(
        base.spec.clone(),
        t512,
        TransferModel::Profiled10Gbps,
    ));
    let start = analytic.best(512);
    let now512 = PlanState {
        nodes: 512,
        config: start,
        leftover_ms: 0.0,
    };
    let f512 = forecast(512, 12);
    let mut warm512 = LiveputOptimizer::new(analytic.clone(), 60.0, 1);
    warm512.decide(now512, &f512);
    let mut g = c.benchmark_group("analytic");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("decision N=512 H=12 analytic (memoised costs)", |b| {
        b.iter(|| warm512.decide(now512, &f512))
    });
    g.bench_function("decision N=512 H=12 analytic (cold costs)", |b| {
        b.iter_batched(
            || LiveputOptimizer::new(analytic.clone(), 60.0, 1),
            |mut o| o.decide(now512, &f512),
            BatchSize::LargeInput,
        )
    });
    let terminal512 = Terminal {
        stay_ms: 3_600_000.0,
        next: vec![
            NextChange {
                probability: 0.5,
                nodes: 520,
                stay_ms: 600_000.0,
                table: None,
            },
            NextChange {
                probability: 0.5,
                nodes: 500,
                stay_ms: 600_000.0,
                table: None,
            },
        ],
    };
    g.bench_function("terminal decision N=512 H=12 analytic (cold costs)", |b| {
        b.iter_batched(
            || LiveputOptimizer::new(analytic.clone(), 60.0, 1),
            |mut o| o.decide_with_terminal(now512, &f512, terminal512.clone()),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn p3_simulation(c: &mut Criterion) {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/traces/parcae/liveput/traces/p3trace.csv"
    ));
    let Some(path) = path.to_str().filter(|_| path.exists()) else {
        eprintln!("skipping the p3 simulation: ../shared is not beside the checkout");
        return;
    };
    let trace = trace::load(path, 60).expect("p3 trace");
    every_strategy(c, "full p3 trace, all strategies, gpt-1.5b", &trace, 30);
}

/// Every strategy on a 16-day multi-day zone at 60 s intervals (23,040 intervals), the goal
/// being <= 30 s.
fn sixteen_days(c: &mut Criterion) {
    let trace = trace::load("synthetic:shifting:0:days=16", 60).expect("synthetic zone");
    every_strategy(
        c,
        "16-day shifting zone, all strategies, gpt-1.5b",
        &trace,
        60,
    );
}

/// Benchmarks simulating every strategy on `trace` with gpt-1.5b at H = 12.
fn every_strategy(c: &mut Criterion, name: &str, trace: &Trace, measurement_secs: u64) {
    let model = Arc::new(CostModel::builtin("gpt-1.5b").expect("built-in model"));
    let bounds = sim::job_bounds(&model, trace.max_nodes());
    let mut g = c.benchmark_group("simulation");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(measurement_secs));
    g.bench_function(name, |b| {
        b.iter(|| {
            let setup = SimSetup {
                model: model.clone(),
                lookahead: 12,
                seed: 1,
                unannounced_kills: None,
            };
            STRATEGIES
                .iter()
                .map(|name| {
                    let s = sim::strategy_by_name(name, bounds, 1).expect("known strategy");
                    sim::simulate(&setup, trace, 0..trace.len(), s).samples
                })
                .sum::<f64>()
        })
    });
    g.finish();
}

/// `zones` zones of gpt-1.5b, zone `i` of a device `1 + i / 2` times the V100's speed.
fn fleet(zones: usize) -> Fleet {
    let spec = CostModel::builtin("gpt-1.5b").expect("built in").spec;
    let v100 = DeviceCosts::profiled(&spec, "v100", Hardware::default().memory_mb);
    let zones = (0..zones)
        .map(|i| FleetPool {
            pool: format!("z{i}").parse().expect("a pool's name"),
            device: v100.derived("d", 1.0 + 0.5 * i as f64, (16 + 8 * i) as f64 * 1024.0),
        })
        .collect();
    Fleet::new(spec, zones, Links::default()).expect("a valid fleet")
}

fn fleet_tables(c: &mut Criterion) {
    let mut g = c.benchmark_group("fleet");
    g.sample_size(10);
    for (zones, n) in [(2, 16), (4, 128)] {
        g.bench_function(format!("cold {zones} x {n} nodes"), |b| {
            b.iter_batched(
                || fleet(zones),
                |mut f| f.plans(&vec![n; zones]),
                BatchSize::PerIteration,
            )
        });
    }
    for (zones, n) in [(2, 16), (4, 128)] {
        let mut f = fleet(zones);
        f.plans(&vec![n; zones]);
        let mut counts = vec![n; zones];
        counts[0] -= 1;
        g.bench_function(format!("one node changed, {zones} x {n} nodes"), |b| {
            b.iter_batched(
                || f.clone(),
                |mut f| f.plans(&counts),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    decisions,
    p3_simulation,
    sixteen_days,
    fleet_tables
);
criterion_main!(benches);
