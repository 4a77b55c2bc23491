//! `compare --repeat N`: the same trace replayed N times per strategy with different node seeds,
//! and each figure of each strategy over those runs as a mean and a range. One run of an
//! emulated cluster on a shared machine is one sample of a noisy instrument; a claim about a
//! strategy (or about the instrument's agreement with the simulator) is made on the spread.

use serde::Serialize;

use crate::node_args::REACTIVE;
use crate::report::RunReport;

/// The proactive strategy the ratio is taken of.
const LIVEPUT: &str = "liveput";

/// `a / b` of two strategies' values, when both ran and `b` is positive.
pub fn ratio_of(runs: &[RunReport], value: impl Fn(&RunReport) -> Option<f64>) -> Option<f64> {
    let of = |name: &str| runs.iter().find(|r| r.strategy == name).and_then(&value);
    let (a, b) = (of(LIVEPUT)?, of(REACTIVE)?);
    (b > 0.0).then(|| a / b)
}

/// The mean and the range of one figure over the repeats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (`None` when there is none).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let values: Vec<f64> = values.into_iter().collect();
        let first = *values.first()?;
        let (min, max) = values
            .iter()
            .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        Some(Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min,
            max,
        })
    }

    /// `mean [min-max]` at `decimals` decimals.
    pub fn show(&self, decimals: usize) -> String {
        format!(
            "{:.d$} [{:.d$}-{:.d$}]",
            self.mean,
            self.min,
            self.max,
            d = decimals
        )
    }
}

/// One round: every strategy once, with one node seed.
#[derive(Debug, Clone)]
pub struct Round {
    /// The node seed of every run of the round (model, data order, preempted nodes, and the
    /// simulator's scenario sampling).
    pub seed: u64,
    /// The round's runs, one per strategy.
    pub runs: Vec<RunReport>,
}

/// One strategy over the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyRepeats {
    /// The strategy.
    pub strategy: String,
    /// Runs of it.
    pub runs: u32,
    /// Committed samples.
    pub samples: Spread,
    /// The simulator's samples for the same seed (null when no run had a simulation).
    pub simulated_samples: Option<Spread>,
    /// Measured over simulated samples, run by run.
    pub vs_simulated: Option<Spread>,
    /// Real work's overrun of the emulated accelerator, as a fraction of its busy time.
    pub overrun_fraction: Option<Spread>,
    /// Seconds spent in reconfigurations.
    pub migration_secs: Spread,
    /// Committed steps lost, over all runs (must be 0).
    pub lost_committed_steps: u64,
    /// Samples trained twice, over all runs (must be 0).
    pub duplicate_samples: u64,
}

/// Every figure of `compare --repeat N`, as the JSON's `"repeats"` writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Repeats {
    /// The node seed of each round.
    pub seeds: Vec<u64>,
    /// Each strategy, in the order of `--strategies`.
    pub strategies: Vec<StrategyRepeats>,
    /// Liveput's committed samples over reactive's, round by round.
    pub ratio: Option<Spread>,
    /// The simulator's ratio, round by round.
    pub simulated_ratio: Option<Spread>,
    /// The measured ratio over the simulated one, round by round (1: the instrument shows the
    /// lead the simulator predicts).
    pub ratio_vs_simulated: Option<Spread>,
}

/// The summary of `rounds`.
pub fn summarize(rounds: &[Round]) -> Repeats {
    let mut names: Vec<&str> = Vec::new();
    for r in rounds.iter().flat_map(|round| &round.runs) {
        if !names.contains(&r.strategy.as_str()) {
            names.push(&r.strategy);
        }
    }
    let strategies = names
        .iter()
        .filter_map(|&name| {
            let runs: Vec<&RunReport> = rounds
                .iter()
                .flat_map(|round| &round.runs)
                .filter(|r| r.strategy == name)
                .collect();
            Some(StrategyRepeats {
                strategy: name.to_string(),
                runs: runs.len() as u32,
                samples: Spread::of(runs.iter().map(|r| r.samples as f64))?,
                simulated_samples: Spread::of(runs.iter().filter_map(|r| r.simulated_samples)),
                vs_simulated: Spread::of(runs.iter().filter_map(|r| r.vs_simulated)),
                overrun_fraction: Spread::of(
                    runs.iter()
                        .filter_map(|r| r.emulated.as_ref().map(|e| e.overrun_fraction)),
                ),
                migration_secs: Spread::of(runs.iter().map(|r| r.migration_secs))?,
                lost_committed_steps: runs.iter().map(|r| r.lost_committed_steps).sum(),
                duplicate_samples: runs.iter().map(|r| r.duplicate_samples).sum(),
            })
        })
        .collect();
    let measured = |r: &RunReport| Some(r.samples as f64);
    let simulated = |r: &RunReport| r.simulated_samples;
    let per_round = |of: &dyn Fn(&[RunReport]) -> Option<f64>| {
        Spread::of(rounds.iter().filter_map(|round| of(&round.runs)))
    };
    Repeats {
        seeds: rounds.iter().map(|r| r.seed).collect(),
        strategies,
        ratio: per_round(&|runs| ratio_of(runs, measured)),
        simulated_ratio: per_round(&|runs| ratio_of(runs, simulated)),
        ratio_vs_simulated: per_round(&|runs| {
            let (a, b) = (ratio_of(runs, measured)?, ratio_of(runs, simulated)?);
            (b > 0.0).then(|| a / b)
        }),
    }
}

/// Prints the summary: a row per figure, a column per strategy, then the ratios.
pub fn print(repeats: &Repeats) {
    let show =
        |s: Option<Spread>, decimals| s.map_or_else(|| "-".to_string(), |s| s.show(decimals));
    let col = |f: &dyn Fn(&StrategyRepeats) -> String| -> Vec<String> {
        repeats.strategies.iter().map(f).collect()
    };
    let rows = [
        ("samples", col(&|s| s.samples.show(0))),
        ("simulated samples", col(&|s| show(s.simulated_samples, 0))),
        ("measured/simulated", col(&|s| show(s.vs_simulated, 3))),
        (
            "emulated overrun %",
            col(&|s| show(s.overrun_fraction.map(|o| scaled(o, 100.0)), 1)),
        ),
        ("migrating (s)", col(&|s| s.migration_secs.show(1))),
        (
            "lost, duplicates",
            col(&|s| format!("{}, {}", s.lost_committed_steps, s.duplicate_samples)),
        ),
    ];
    println!(
        "over {} runs per strategy (node seeds {:?}): mean [min-max]",
        repeats.seeds.len(),
        repeats.seeds
    );
    print!("{:<20}", "strategy");
    for s in &repeats.strategies {
        print!(" {:>30}", s.strategy);
    }
    println!();
    for (name, values) in rows {
        print!("{name:<20}");
        for v in values {
            print!(" {v:>30}");
        }
        println!();
    }
    println!(
        "liveput / reactive samples: measured {}, simulated {}, measured / simulated {}",
        show(repeats.ratio, 3),
        show(repeats.simulated_ratio, 3),
        show(repeats.ratio_vs_simulated, 3)
    );
}

/// `s` with every figure multiplied by `k` (fractions shown as percentages).
fn scaled(s: Spread, k: f64) -> Spread {
    Spread {
        mean: s.mean * k,
        min: s.min * k,
        max: s.max * k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: &str, samples: u64, simulated: Option<f64>) -> RunReport {
        let json = serde_json::json!({
            "strategy": strategy, "trace": "t", "intervals": 1, "nodes_max": 4,
            "committed_steps": 1, "samples": samples, "loss_first": null,
            "loss_last": null, "val_loss_first": null, "val_loss_last": null,
            "migrations": {"intra": 0, "inter": 0, "repartition": 0, "restart": 0},
            "migration_secs": samples as f64 / 100.0, "reconfigurations": [],
            "lost_committed_steps": 0, "duplicate_samples": 1, "wall_secs": 1.0,
            "simulated_samples": simulated,
            "vs_simulated": simulated.map(|s| samples as f64 / s),
            "percent_of_ideal": null
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_ratio_needs_both_strategies_and_reactive_samples() {
        let samples = |r: &RunReport| Some(r.samples as f64);
        let both = [
            run("reactive", 100, None),
            run("liveput-predict", 90, None),
            run("liveput", 130, None),
        ];
        assert_eq!(ratio_of(&both, samples), Some(1.3));
        assert_eq!(ratio_of(&both[..2], samples), None, "no liveput");
        assert_eq!(
            ratio_of(
                &[run("liveput", 5, None), run("reactive", 0, None)],
                samples
            ),
            None
        );
        assert_eq!(ratio_of(&both, |r| r.simulated_samples), None);
    }

    #[test]
    fn a_spread_is_the_mean_and_the_range() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.mean, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of([]), None);
        assert_eq!(s.show(1), "2.0 [1.0-3.0]");
    }

    #[test]
    fn each_strategy_and_the_ratio_are_summarised_over_the_rounds() {
        let rounds = [
            Round {
                seed: 1,
                runs: vec![
                    run("liveput", 120, Some(100.0)),
                    run("reactive", 100, Some(100.0)),
                ],
            },
            Round {
                seed: 2,
                runs: vec![
                    run("liveput", 90, Some(100.0)),
                    run("reactive", 60, Some(80.0)),
                ],
            },
        ];
        let r = summarize(&rounds);
        assert_eq!(r.seeds, vec![1, 2]);
        let names: Vec<&str> = r.strategies.iter().map(|s| s.strategy.as_str()).collect();
        assert_eq!(names, ["liveput", "reactive"]);
        let live = &r.strategies[0];
        assert_eq!(live.runs, 2);
        assert_eq!(live.samples, Spread::of([120.0, 90.0]).unwrap());
        assert_eq!(live.vs_simulated, Spread::of([1.2, 0.9]));
        assert_eq!(live.overrun_fraction, None, "not emulated");
        assert_eq!(live.duplicate_samples, 2, "summed over the runs");
        let reactive = &r.strategies[1];
        assert_eq!(reactive.simulated_samples, Spread::of([100.0, 80.0]));
        assert_eq!(r.ratio, Spread::of([1.2, 1.5]));
        assert_eq!(r.simulated_ratio, Spread::of([1.0, 1.25]));
        assert_eq!(r.ratio_vs_simulated, Spread::of([1.2, 1.2]));
    }

    #[test]
    fn a_round_without_a_simulation_has_no_simulated_ratio() {
        let rounds = [Round {
            seed: 7,
            runs: vec![run("liveput", 50, None), run("reactive", 25, None)],
        }];
        let r = summarize(&rounds);
        assert_eq!(r.ratio, Spread::of([2.0]));
        assert_eq!(r.simulated_ratio, None);
        assert_eq!(r.ratio_vs_simulated, None);
        assert_eq!(r.strategies[0].vs_simulated, None);
    }
}
