//! The simulator on Parcae's real p3 trace (32 x p3.2xlarge, 11.4 h): it reproduces the
//! independent re-implementation figures of spec 4.5 and the strategy goals.

mod common;

use std::sync::Arc;

use parcae_strategies::cost::{CostModel, RepartitionRule};
use parcae_strategies::predict::Bounds;
use parcae_strategies::sim::{SimSetup, StrategyRun, simulate, strategy_by_name};
use parcae_strategies::trace::Trace;

/// Parcae's bounds for the 32-node p3 runs.
const BOUNDS: Bounds = Bounds {
    min_nodes: 8,
    max_nodes: 32,
};

fn run(
    model: &CostModel,
    trace: &Trace,
    range: std::ops::Range<usize>,
    lookahead: usize,
    name: &str,
) -> StrategyRun {
    let setup = SimSetup {
        model: Arc::new(model.clone()),
        lookahead,
        seed: 1,
        unannounced_kills: None,
    };
    simulate(
        &setup,
        trace,
        range,
        strategy_by_name(name, BOUNDS, 1).unwrap(),
    )
}

#[test]
fn gpt_1_5b_baselines_match_reference() {
    let Some(trace) = common::p3() else { return };
    let m = CostModel::builtin("gpt-1.5b").unwrap();
    let all = 0..trace.len();
    let ideal = run(&m, &trace, all.clone(), 12, "ideal").samples;
    let reactive = run(&m, &trace, all.clone(), 12, "reactive").samples;
    let truth = run(&m, &trace, all.clone(), 12, "liveput-truth").samples;
    eprintln!("ideal {ideal:.0} reactive {reactive:.0} truth {truth:.0}");
    assert!((ideal / 1_506_024.0 - 1.0).abs() < 0.005, "{ideal}");
    assert!((reactive / 1_171_346.0 - 1.0).abs() < 0.03, "{reactive}");
    assert!(truth >= 1_390_000.0, "{truth}");
    // With the artifact's last-stage repartition rule the reference got 1,424,655 (spec 4.5).
    let last = m.clone().with_repartition(RepartitionRule::LastStage);
    let truth_last = run(&last, &trace, all, 12, "liveput-truth").samples;
    assert!(
        (truth_last / 1_424_655.0 - 1.0).abs() < 0.005,
        "{truth_last}"
    );
}

/// Look-ahead of Parcae's own predictor evaluation (`prediction_unit_test`) and README runs;
/// docs/strategies.md also reports H = 12, where ARIMA's far forecast steps are mostly noise.
const PREDICT_LOOKAHEAD: usize = 8;

const MODELS: [&str; 5] = ["gpt-1.5b", "gpt-6.7b", "bert", "resnet152", "vgg19"];

#[test]
fn parcae_prediction_beats_reactive_and_ours_beats_parcae() {
    let Some(trace) = common::p3() else { return };
    let all = 0..trace.len();
    for model in MODELS {
        let m = CostModel::builtin(model).unwrap();
        let reactive = run(&m, &trace, all.clone(), 12, "reactive").samples;
        let predict8 = run(
            &m,
            &trace,
            all.clone(),
            PREDICT_LOOKAHEAD,
            "liveput-predict",
        )
        .samples;
        let predict = run(&m, &trace, all.clone(), 12, "liveput-predict").samples;
        let ours = run(&m, &trace, all.clone(), 12, "liveput-aware").samples;
        eprintln!(
            "{model}: reactive {reactive:.0} predict(H=8) {predict8:.0} predict {predict:.0} ours {ours:.0}"
        );
        assert!(predict8 >= reactive, "{model}: {predict8} < {reactive}");
        assert!(predict >= reactive, "{model}: {predict} < {reactive}");
        assert!(ours >= predict, "{model}: {ours} < {predict}");
        if model == "gpt-1.5b" {
            assert!(predict8 >= 1.10 * reactive, "{predict8} vs {reactive}");
            assert!(ours >= 1.03 * predict, "{ours} vs {predict}");
        }
    }
}

#[test]
fn prediction_holds_up_on_the_one_hour_windows() {
    let Some(trace) = common::p3() else { return };
    for model in MODELS {
        let m = CostModel::builtin(model).unwrap();
        for (name, a, b) in [
            ("hh", 5.5, 6.5),
            ("hl", 1.5, 2.5),
            ("lh", 8.0, 9.0),
            ("ll", 10.0, 11.0),
        ] {
            let w = trace.window(a, b).unwrap();
            let reactive = run(&m, &trace, w.clone(), PREDICT_LOOKAHEAD, "reactive").samples;
            let predict = run(&m, &trace, w.clone(), PREDICT_LOOKAHEAD, "liveput-predict").samples;
            assert!(
                predict >= 0.98 * reactive,
                "{model} {name}: {predict} < 0.98 x {reactive}"
            );
        }
    }
}
