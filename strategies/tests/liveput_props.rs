//! Properties of the liveput optimizer and the simulator on random inputs.

use std::sync::Arc;
use std::sync::OnceLock;

use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::migration::{MigrationCosts, MigrationEvent};
use parcae_strategies::cost::spec::RestartKind;
use parcae_strategies::liveput::{LiveputOptimizer, PlanState};
use parcae_strategies::sim::{self, STRATEGIES, SimSetup};
use parcae_strategies::trace::{self, Interval, intervals_from_counts};
use proptest::prelude::*;

fn model() -> Arc<CostModel> {
    static M: OnceLock<Arc<CostModel>> = OnceLock::new();
    M.get_or_init(|| Arc::new(CostModel::builtin("gpt-1.5b").unwrap()))
        .clone()
}

/// A consistent forecast from `start` following signed changes.
fn forecast(start: u32, changes: &[i8]) -> Vec<Interval> {
    let mut nodes = start;
    let counts = changes.iter().map(|&c| {
        nodes = (i64::from(nodes) + i64::from(c)).clamp(0, 40) as u32;
        nodes
    });
    intervals_from_counts(start, counts)
}

/// Samples of keeping `config` through the whole forecast, with the optimizer's accounting;
/// `None` when it stops fitting.
fn stay_put(
    costs: &mut MigrationCosts,
    now: PlanState,
    future: &[Interval],
    interval_ms: f64,
) -> Option<f64> {
    let m = costs.model().clone();
    let c = now.config;
    let (mut nodes, mut leftover, mut samples) = (now.nodes, now.leftover_ms, 0.0);
    for step in future {
        if c.nodes() > step.nodes {
            return None;
        }
        let ev = MigrationEvent {
            nodes,
            from: c,
            added: step.added,
            removed: step.removed,
        };
        let expected = costs.expected(ev, c);
        let cost = if leftover <= 0.0 {
            expected
        } else if expected > 0.0 {
            expected + m.spec.restart.restart_ms(c, RestartKind::Remove)
        } else {
            leftover
        };
        let slack = interval_ms - cost;
        if slack >= 0.0 {
            samples += m.samples_per_sec(c) * slack / 1000.0;
            leftover = 0.0;
        } else {
            leftover = -slack;
        }
        nodes = step.nodes;
    }
    Some(samples)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn decisions_fit_and_never_lose_to_staying_put(
        start in 6u32..=32,
        pick in 0usize..47,
        changes in proptest::collection::vec(-4i8..=4, 1..=12),
    ) {
        let m = model();
        let fitting: Vec<ParallelConfig> = m.candidates().iter().copied().filter(|c| c.nodes() <= start).collect();
        prop_assume!(!fitting.is_empty());
        let config = fitting[pick % fitting.len()];
        let now = PlanState { nodes: start, config, leftover_ms: 0.0 };
        let future = forecast(start, &changes);
        let mut opt = LiveputOptimizer::new(m.clone(), 60.0, 3);
        let d = opt.decide(now, &future);
        prop_assert!(d.config.nodes() <= future[0].nodes, "{} on {} nodes", d.config, future[0].nodes);
        if let Some(stay) = stay_put(opt.costs(), now, &future, 60_000.0) {
            prop_assert!(d.expected_samples + 1e-6 >= stay, "{} < stay {}", d.expected_samples, stay);
        }
    }

    #[test]
    fn simulating_random_synthetic_traces_never_panics(
        band in prop::sample::select(vec!["hh", "hl", "lh", "ll"]),
        seed in 0u64..1000,
        lookahead in 1usize..=12,
    ) {
        let t = trace::load(&format!("synthetic:{band}:{seed}"), 60).unwrap();
        let m = model();
        let bounds = sim::job_bounds(&m, t.max_nodes());
        let setup = SimSetup {
            model: m.clone(),
            lookahead,
            seed,
            unannounced_kills: None,
        };
        let mut ideal = f64::INFINITY;
        for name in STRATEGIES {
            let r = sim::simulate(&setup, &t, 0..t.len(), sim::strategy_by_name(name, bounds, seed).unwrap());
            prop_assert_eq!(r.configs.len(), t.len());
            for (c, iv) in r.configs.iter().zip(&t.intervals) {
                prop_assert!(c.nodes() <= iv.nodes, "{} on {}", c, iv.nodes);
            }
            if name == "ideal" {
                ideal = r.samples;
            }
            prop_assert!(r.samples <= ideal + 1e-6, "{name} {} beats ideal {ideal}", r.samples);
        }
    }
}
