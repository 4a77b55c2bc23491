//! `parcae-testnet compare`: the same trace and seed replayed with `liveput` and then with
//! `reactive` (restart on every change, Parcae's throughput-optimised baseline, which has no
//! notice handler: its nodes are killed at their deadlines unannounced), both reports,
//! the measured ratio of committed samples, and the simulator's ratio for the same trace with
//! the cost model measured on these two runs (see [`crate::predicted`]).

use anyhow::Result;
use serde::Serialize;

use crate::cluster::NoticeMode;
use crate::predicted;
use crate::replay::Replay;
use crate::report::{self, RunReport};
use crate::run::{self, NodeArgs, OutputArgs, REACTIVE, STRATEGIES, SessionSpec, TraceArgs};
use parcae_testnet::interrupt::Interrupt;

/// Options of `compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// The JSON `--json` writes.
#[derive(Debug, Serialize)]
pub struct CompareReport {
    /// The liveput run, then the reactive run.
    pub runs: Vec<RunReport>,
    /// Committed samples of liveput over reactive (null when reactive committed none).
    pub ratio: Option<f64>,
    /// The simulator's ratio for the same trace (null without a measured configuration).
    pub simulated_ratio: Option<f64>,
}

/// `parcae-testnet compare`.
pub fn run(args: Args, interrupt: &Interrupt) -> Result<()> {
    args.node.validate()?;
    let planned = run::plan_trace(&args.trace)?;
    let mut outcomes = Vec::with_capacity(STRATEGIES.len());
    // Proactive first, then the reactive baseline.
    for strategy in STRATEGIES {
        let mut scenario = Replay::new(
            planned.counts.clone(),
            args.node.interval_secs as f64,
            args.node.grace_secs,
            args.node.seed,
        );
        // The baseline has no notice handler: a preemption is a kill at the deadline.
        let notice = if strategy == REACTIVE {
            NoticeMode::None
        } else {
            args.node.notice
        };
        let node = NodeArgs {
            notice,
            ..args.node.clone()
        };
        let spec = SessionSpec {
            strategy,
            trace: planned.source.clone(),
            intervals: planned.counts.len() as u64,
            nodes_max: args.trace.nodes_max,
        };
        outcomes.push(run::session(&node, spec, &mut scenario, interrupt)?);
    }
    let refs: Vec<&run::Outcome> = outcomes.iter().collect();
    run::finish(&refs, &args.output, &planned.source)?;
    let (live, reactive) = (&outcomes[0].report, &outcomes[1].report);
    let ratio = (reactive.samples > 0).then(|| live.samples as f64 / reactive.samples as f64);
    let observed: Vec<&crate::engine::Observed> = outcomes.iter().map(|o| &o.observed).collect();
    let simulated_ratio = predicted::measured_model(&args.node.model, &observed).and_then(|m| {
        let trace =
            predicted::replayed_trace(&planned.source, &planned.counts, args.node.interval_secs);
        predicted::simulated_ratio(m, &trace, args.trace.nodes_max, args.node.seed)
    });
    if simulated_ratio.is_some()
        && let Some(note) = predicted::restart_floor_note(&observed)
    {
        println!("{note}");
    }
    let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    println!(
        "liveput / reactive samples: measured {}, simulated ({}) {}",
        show(ratio),
        predicted::LIVEPUT,
        show(simulated_ratio)
    );
    if let Some(path) = &args.output.json {
        let doc = CompareReport {
            runs: outcomes.iter().map(|o| o.report.clone()).collect(),
            ratio,
            simulated_ratio,
        };
        report::write_json(path, &doc)?;
    }
    run::check(&refs, &args.output)
}
