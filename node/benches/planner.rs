//! The leader's whole decision (`parcae_node::planner_bench`): cold, as a fresh planner makes it
//! (every pool composition's tables laid out), and memoised, as the next decision on the same
//! cluster is made. Goals (issue 67): 512 nodes in 4 pools <= 100 ms cold, 32 nodes <= 1 ms
//! memoised. `cargo bench -p parcae-node --bench planner`; `parcae-node bench-planner` prints
//! the same as JSON.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use parcae_node::planner_bench::Bench;

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    group.sample_size(10);
    for (nodes, pools) in [(32, 2), (512, 4)] {
        let bench = Bench::new(nodes, pools).expect("a benched cluster");
        group.bench_function(format!("cold/{nodes}x{pools}"), |b| {
            b.iter_batched(
                || bench.fresh(),
                |mut caches| bench.decide(&mut caches),
                BatchSize::PerIteration,
            )
        });
        let mut caches = bench.fresh();
        bench.decide(&mut caches);
        group.bench_function(format!("memoised/{nodes}x{pools}"), |b| {
            b.iter(|| bench.decide(&mut caches))
        });
    }
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
