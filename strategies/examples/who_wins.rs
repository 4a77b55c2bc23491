//! Who wins, everywhere: the node's default strategy against `reactive` and Parcae's
//! `liveput-predict` on every trace family (the four one-hour bands, the two-week zones, Parcae's
//! p3 trace and its one-hour windows), for every profiled model at H = 8 and H = 12, with the
//! oracle of the same objective beside it. Prints a line per run and a summary per family;
//! `docs/strategies.md` quotes the summary.
//!
//!     cargo run --release -p parcae-strategies --example who_wins [FILTER] [SEEDS]
//!
//! FILTER keeps the traces whose name contains it (default: all); SEEDS is the number of seeds
//! per synthetic family (default 5). Parcae's trace is read from `../shared` when it is there.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use parcae_strategies::cost::CostModel;
use parcae_strategies::sim::{self, NODE_DEFAULT, SimSetup};
use parcae_strategies::trace::{self, Band, Family, Trace};

const MODELS: [&str; 5] = ["gpt-1.5b", "gpt-6.7b", "bert", "resnet152", "vgg19"];
const RUNS: [&str; 5] = [
    "reactive",
    "liveput-predict",
    NODE_DEFAULT,
    "liveput-zone-truth",
    "liveput-truth",
];
const P3: &str = "../shared/traces/parcae/liveput/traces/p3trace.csv";

/// A trace to run: family name for the summary, trace name, the trace and its window.
struct Case {
    family: String,
    name: String,
    trace: Trace,
    range: Range<usize>,
}

/// Worst and mean ratios of one family.
#[derive(Default)]
struct Summary {
    runs: usize,
    min_x_reactive: Option<f64>,
    min_x_best: Option<f64>,
    min_oracle_x_reactive: Option<f64>,
    sum_x_best: f64,
}

fn min(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.min(b)))
}

fn cases(seeds: u64) -> Vec<Case> {
    let mut out = Vec::new();
    let mut synthetic = |family: String, seed: u64| {
        let name = format!("synthetic:{family}:{seed}");
        let trace = trace::load(&name, 60).expect("synthetic traces generate");
        let range = 0..trace.len();
        out.push(Case {
            family,
            name,
            trace,
            range,
        });
    };
    for family in Family::ALL {
        (0..seeds).for_each(|seed| synthetic(family.to_string(), seed));
    }
    for band in Band::ALL {
        (0..seeds).for_each(|seed| synthetic(band.to_string(), seed));
    }
    match trace::load(P3, 60) {
        Ok(p3) => {
            for (name, a, b) in [
                ("p3", 0.0, p3.hours()),
                ("p3-hh", 5.5, 6.5),
                ("p3-hl", 1.5, 2.5),
                ("p3-lh", 8.0, 9.0),
                ("p3-ll", 10.0, 11.0),
            ] {
                out.push(Case {
                    family: name.to_string(),
                    name: name.to_string(),
                    range: p3.window(a, b).expect("the windows are inside the trace"),
                    trace: p3.clone(),
                });
            }
        }
        Err(e) => eprintln!("skipping Parcae's trace: {e}"),
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.first().cloned().unwrap_or_default();
    let seeds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let mut summaries: BTreeMap<String, Summary> = BTreeMap::new();
    for case in cases(seeds)
        .into_iter()
        .filter(|c| c.name.contains(&filter))
    {
        for model in MODELS {
            let m = Arc::new(CostModel::builtin(model).expect("built-in model"));
            let bounds = sim::job_bounds(&m, case.trace.max_nodes());
            for h in [8, 12] {
                let setup = SimSetup {
                    model: m.clone(),
                    lookahead: h,
                    seed: 1,
                    unannounced_kills: None,
                };
                let samples: Vec<f64> = std::thread::scope(|scope| {
                    let handles: Vec<_> = RUNS
                        .iter()
                        .map(|name| {
                            let (setup, case) = (&setup, &case);
                            scope.spawn(move || {
                                let s = sim::strategy_by_name(name, bounds, 1).expect("known");
                                sim::simulate(setup, &case.trace, case.range.clone(), s).samples
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a run"))
                        .collect()
                });
                let [reactive, predict, ours, oracle, truth] = samples[..] else {
                    unreachable!("one result per run")
                };
                let x_reactive = ours / reactive;
                let x_best = ours / reactive.max(predict);
                let oracle_x_reactive = oracle / reactive;
                let flag = if x_reactive < 1.0 || x_best < 0.995 || oracle_x_reactive < 1.0 {
                    "  <-- short"
                } else {
                    ""
                };
                println!(
                    "{:<22} {model:<9} H={h:<2} x reactive: predict {:.4} {NODE_DEFAULT} {x_reactive:.4} zone-truth {oracle_x_reactive:.4} truth {:.4}; {NODE_DEFAULT} x max(reactive, predict) {x_best:.4}{flag}",
                    case.name,
                    predict / reactive,
                    truth / reactive,
                );
                let s = summaries.entry(case.family.clone()).or_default();
                s.runs += 1;
                s.min_x_reactive = min(s.min_x_reactive, x_reactive);
                s.min_x_best = min(s.min_x_best, x_best);
                s.min_oracle_x_reactive = min(s.min_oracle_x_reactive, oracle_x_reactive);
                s.sum_x_best += x_best;
            }
        }
    }
    println!();
    println!(
        "| trace family | runs | {NODE_DEFAULT} / reactive (min) | {NODE_DEFAULT} / max(reactive, predict) (min) | (mean) | zone-truth / reactive (min) |"
    );
    println!("|---|---|---|---|---|---|");
    let show = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
    for (family, s) in &summaries {
        println!(
            "| {family} | {} | {} | {} | {:.4} | {} |",
            s.runs,
            show(s.min_x_reactive),
            show(s.min_x_best),
            s.sum_x_best / s.runs.max(1) as f64,
            show(s.min_oracle_x_reactive),
        );
    }
}
