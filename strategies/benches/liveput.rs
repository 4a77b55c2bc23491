//! Speed of the liveput decision and of whole-trace simulations.
//!
//! `cargo bench -p parcae-strategies`: goals are one decision for N = 32, H = 12 on the gpt-1.5b
//! table <= 1 ms, N = 512 with the analytic model <= 100 ms, the full p3 simulation of every
//! strategy <= 10 s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::analytic::{Hardware, throughput_table};
use parcae_strategies::cost::transfer::TransferModel;
use parcae_strategies::liveput::{LiveputOptimizer, PlanState};
use parcae_strategies::sim::{self, STRATEGIES, SimSetup};
use parcae_strategies::trace::{self, Interval};

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
    let model = Arc::new(CostModel::builtin("gpt-1.5b").expect("built-in model"));
    let bounds = sim::job_bounds(&model, trace.max_nodes());
    let mut g = c.benchmark_group("simulation");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("full p3 trace, all strategies, gpt-1.5b", |b| {
        b.iter(|| {
            let setup = SimSetup {
                model: model.clone(),
                lookahead: 12,
                seed: 1,
            };
            STRATEGIES
                .iter()
                .map(|name| {
                    let s = sim::strategy_by_name(name, bounds, 1).expect("known strategy");
                    sim::simulate(&setup, &trace, 0..trace.len(), s).samples
                })
                .sum::<f64>()
        })
    });
    g.finish();
}

criterion_group!(benches, decisions, p3_simulation);
criterion_main!(benches);
