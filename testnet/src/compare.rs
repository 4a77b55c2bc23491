//! `parcae-testnet compare`: the same trace and seed replayed with each of `--strategies`
//! (by default `liveput`, then `reactive`: restart on every change, Parcae's
//! throughput-optimised baseline, which has no notice handler, so its nodes are killed at
//! their deadlines unannounced), every run's report beside the simulator's account of the
//! same strategy on the same trace and cost model (see [`crate::predicted`]), and the
//! measured and simulated ratio of liveput's committed samples over reactive's. With
//! `--repeat N` every strategy runs N times, round by round with node seeds `--seed`,
//! `--seed + 1`, ..., and each figure is reported as its mean and range ([`crate::repeats`]).

use anyhow::Result;
use serde::Serialize;

use crate::cluster::NoticeMode;
use crate::node_args::{NodeArgs, OutputArgs, REACTIVE, STRATEGIES};
use crate::predicted;
use crate::prices::PriceArgs;
use crate::repeats::{self, Repeats, Round, ratio_of};
use crate::report::{self, RunReport};
use crate::run::{self, SessionSpec};
use crate::trace_plan::{Planned, TraceArgs};
use parcae_testnet::interrupt::Interrupt;

/// Options of `compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    trace: TraceArgs,
    /// Strategies to run, in this order, each on the same trace and seed.
    #[arg(long, value_delimiter = ',', default_value = "liveput,reactive", value_parser = STRATEGIES)]
    strategies: Vec<String>,
    /// Runs of each strategy, round by round, the node seed one higher each round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    repeat: u32,
    /// Zones, `NAME=TRACE[@SPEED],...` in place of --trace, as `run --zones` takes them: every
    /// strategy replays the same zones (with --emulate, held to the fleet simulator).
    #[arg(long, value_delimiter = ',')]
    zones: Vec<String>,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    prices: PriceArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// The JSON `--json` writes.
#[derive(Debug, Serialize)]
pub struct CompareReport {
    /// One run per strategy, in the order of `--strategies`, round after round.
    pub runs: Vec<RunReport>,
    /// Committed samples of liveput over reactive (null unless both ran and reactive
    /// committed some); the mean over the rounds.
    pub ratio: Option<f64>,
    /// The simulator's ratio for the same trace and cost model (null without both); the mean
    /// over the rounds.
    pub simulated_ratio: Option<f64>,
    /// Each figure over the rounds (one round without `--repeat`).
    pub repeats: Repeats,
}

/// `parcae-testnet compare`.
pub fn run(mut args: Args, interrupt: &Interrupt) -> Result<()> {
    args.node.spot_prices = args.prices.price_spot.clone();
    args.node.validate()?;
    args.prices.prices()?;
    let (planned, _) = run::replay_of(&args.zones, &args.trace, &args.node)?;
    let mut strategies: Vec<&str> = Vec::new();
    for s in &args.strategies {
        if !strategies.contains(&s.as_str()) {
            strategies.push(s);
        }
    }
    let mut rounds = Vec::new();
    let mut outcomes = Vec::new();
    for k in 0..u64::from(args.repeat) {
        let node = NodeArgs {
            seed: args.node.seed.wrapping_add(k),
            ..args.node.clone()
        };
        let round = one_round(&args, &node, &planned, &strategies, interrupt)?;
        let refs: Vec<&run::Outcome> = round.iter().collect();
        run::finish(&refs, &args.output, &planned.source)?;
        print_ratio(&node, &round);
        rounds.push(Round {
            seed: node.seed,
            runs: round.iter().map(|o| o.report.clone()).collect(),
        });
        outcomes.extend(round);
    }
    let repeats = repeats::summarize(&rounds);
    if args.repeat > 1 {
        repeats::print(&repeats);
    }
    if let Some(path) = &args.output.json {
        let doc = CompareReport {
            runs: outcomes.iter().map(|o| o.report.clone()).collect(),
            ratio: repeats.ratio.map(|s| s.mean),
            simulated_ratio: repeats.simulated_ratio.map(|s| s.mean),
            repeats,
        };
        report::write_json(path, &doc)?;
    }
    let refs: Vec<&run::Outcome> = outcomes.iter().collect();
    run::check(&refs, &args.output)
}

/// Every strategy once with `node`'s seed, each beside the simulator's account of it. With
/// several rounds a run is labelled with its seed (its directory and its plot).
fn one_round(
    args: &Args,
    node: &NodeArgs,
    planned: &Planned,
    strategies: &[&str],
    interrupt: &Interrupt,
) -> Result<Vec<run::Outcome>> {
    let mut outcomes = Vec::with_capacity(strategies.len());
    let nodes_max = run::nodes_max_of(&args.zones, &args.trace);
    // What every strategy replays; each session gets a fresh copy to play out.
    let (_, replayed) = run::replay_of(&args.zones, &args.trace, node)?;
    for &strategy in strategies {
        let (_, mut scenario) = run::replay_of(&args.zones, &args.trace, node)?;
        // The baseline has no notice handler: a preemption is a kill at the deadline.
        let notice = if strategy == REACTIVE {
            NoticeMode::None
        } else {
            node.notice
        };
        let label = if args.repeat > 1 {
            format!("{strategy}-seed{}", node.seed)
        } else {
            strategy.to_string()
        };
        let spec = SessionSpec {
            strategy,
            label,
            trace: planned.source.clone(),
            intervals: planned.counts.len() as u64,
            nodes_max,
        };
        let with_notice = NodeArgs {
            notice,
            ..node.clone()
        };
        outcomes.push(run::session(&with_notice, spec, &mut scenario, interrupt)?);
    }
    run::hold_to_simulator(
        &mut outcomes,
        node,
        planned,
        nodes_max,
        args.prices.prices()?,
        &replayed,
    );
    Ok(outcomes)
}

/// Prints one round's measured and simulated ratio (and on CPUs, what bounds the simulation).
fn print_ratio(node: &NodeArgs, round: &[run::Outcome]) {
    let runs: Vec<RunReport> = round.iter().map(|o| o.report.clone()).collect();
    let ratio = ratio_of(&runs, |r| Some(r.samples as f64));
    let simulated_ratio = ratio_of(&runs, |r| r.simulated_samples);
    if node.emulate.is_none() && simulated_ratio.is_some() {
        let observed: Vec<&crate::engine::Observed> = round.iter().map(|o| &o.observed).collect();
        if let Some(note) = predicted::restart_floor_note(&observed) {
            println!("{note}");
        }
    }
    let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    println!(
        "liveput / reactive samples (seed {}): measured {}, simulated ({}) {}",
        node.seed,
        show(ratio),
        predicted::LIVEPUT,
        show(simulated_ratio)
    );
}
