//! The node's default strategy never loses to the baselines: on every trace shape (the four
//! bands, the multi-day zone families, Parcae's p3 trace and its one-hour windows), for every
//! profiled model at H = 8 and H = 12, it trains at least as much as `reactive` and at least
//! 0.995 of the better of `reactive` and Parcae's `liveput-predict`; the oracle with the same
//! terminal value trains at least as much as `reactive`.
//!
//! The multi-day families run here for three days each (five seeds); the two-week runs of
//! every family are in `docs/strategies.md`
//! (`cargo run --release -p parcae-strategies --example who_wins`).

mod common;

use std::sync::Arc;

use parcae_strategies::cost::CostModel;
use parcae_strategies::sim::{self, NODE_DEFAULT, SimSetup};
use parcae_strategies::trace::{self, Band, Family, Trace};

const MODELS: [&str; 5] = ["gpt-1.5b", "gpt-6.7b", "bert", "resnet152", "vgg19"];
const SEEDS: u64 = 5;

/// Samples of `name` on `trace[range]`.
fn samples(
    model: &Arc<CostModel>,
    trace: &Trace,
    range: std::ops::Range<usize>,
    h: usize,
    name: &str,
) -> f64 {
    let setup = SimSetup {
        model: model.clone(),
        lookahead: h,
        seed: 1,
        unannounced_kills: None,
    };
    let bounds = sim::job_bounds(model, trace.max_nodes());
    let strategy = sim::strategy_by_name(name, bounds, 1).unwrap();
    sim::simulate(&setup, trace, range, strategy).samples
}

/// Asserts the bars on `trace[range]` for every model and both look-aheads.
fn holds(trace: &Trace, range: std::ops::Range<usize>, what: &str) {
    for model in MODELS {
        let m = Arc::new(CostModel::builtin(model).unwrap());
        for h in [8, 12] {
            let run = |name| samples(&m, trace, range.clone(), h, name);
            let reactive = run("reactive");
            let predict = run("liveput-predict");
            let ours = run(NODE_DEFAULT);
            let oracle = run("liveput-zone-truth");
            let bar = reactive.max(predict);
            assert!(
                ours >= reactive && ours >= 0.995 * bar,
                "{what} {model} H={h}: {NODE_DEFAULT} {ours:.0}, reactive {reactive:.0}, liveput-predict {predict:.0}"
            );
            assert!(
                oracle >= reactive,
                "{what} {model} H={h}: liveput-zone-truth {oracle:.0} < reactive {reactive:.0}"
            );
        }
    }
}

fn family(family: Family) {
    for seed in 0..SEEDS {
        let name = format!("synthetic:{family}:{seed}:days=3");
        let t = trace::load(&name, 60).unwrap();
        holds(&t, 0..t.len(), &name);
    }
}

#[test]
fn quiet_zones() {
    family(Family::Quiet);
}

#[test]
fn zones_with_outages() {
    family(Family::Outage);
}

#[test]
fn diurnal_zones() {
    family(Family::Diurnal);
}

#[test]
fn shifting_zones() {
    family(Family::Shifting);
}

#[test]
fn the_one_hour_bands() {
    for band in Band::ALL {
        for seed in 0..SEEDS {
            let name = format!("synthetic:{band}:{seed}");
            let t = trace::load(&name, 60).unwrap();
            holds(&t, 0..t.len(), &name);
        }
    }
}

#[test]
fn parcaes_trace_and_its_windows() {
    let Some(t) = common::p3() else { return };
    holds(&t, 0..t.len(), "p3");
    for (name, a, b) in [
        ("hh", 5.5, 6.5),
        ("hl", 1.5, 2.5),
        ("lh", 8.0, 9.0),
        ("ll", 10.0, 11.0),
    ] {
        holds(&t, t.window(a, b).unwrap(), &format!("p3 {name}"));
    }
}

#[test]
fn on_parcaes_trace_the_default_beats_parcae_and_nears_the_oracle() {
    let Some(t) = common::p3() else { return };
    let m = Arc::new(CostModel::builtin("gpt-1.5b").unwrap());
    let run = |name| samples(&m, &t, 0..t.len(), 12, name);
    let ours = run(NODE_DEFAULT);
    let predict = run("liveput-predict");
    let truth = run("liveput-truth");
    assert!(
        ours >= 1.08 * predict,
        "{ours:.0} vs liveput-predict {predict:.0}"
    );
    assert!(
        ours >= 0.95 * truth,
        "{ours:.0} vs liveput-truth {truth:.0}"
    );
}
