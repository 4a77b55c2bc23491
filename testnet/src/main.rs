//! `parcae-testnet`: a local multi-process testnet of real `parcae-node` processes that
//! replays preemption traces, and the strategy simulator.
//!
//! Subcommands:
//! * `run`: one trace (`--trace synthetic:BAND[:SEED]|PATH`) replayed on 127.0.0.1 with the
//!   trace's intervals compressed to `--interval-secs`; notices `--grace-secs` ahead (SIGTERM
//!   or a fake AWS metadata server), SIGKILL at the deadline, new processes on arrivals;
//!   progress bar, report table, `--json`, `--out` plots, `--check` as a CI gate;
//! * `compare`: the same trace with `liveput` and `reactive`, their ratio of committed samples
//!   and the simulator's ratio with the cost model measured on the two runs;
//! * `chaos`: SIGKILL without notice every `--kill-every` seconds, replaced by new nodes, a
//!   whole-cluster outage, and nodes frozen with SIGSTOP (`--pause-every`);
//! * `simulate`: every planning strategy on a trace, without processes;
//! * `plot-learning`: the plot of a `parcae-node learn` report.
//!
//! Design: [`cluster`] gives the nodes of a
//! [`parcae_testnet::local_cluster::LocalCluster`] their life in a run (notices, deadlines,
//! crashes against expected exits); every node process is supervised so that it is killed on
//! every exit path (drop, Ctrl-C through [`parcae_testnet::interrupt::Interrupt`], and the
//! kernel's parent-death signal if the testnet itself is killed). A [`engine::Scenario`]
//! ([`replay::Replay`] or [`chaos::Chaos`]) decides when nodes get notices, die or arrive;
//! [`engine::execute`] drives it and [`monitor::Monitor`] polls the nodes' `/status` and
//! `/steps` once per second into the [`ledger`]s from which [`report`] computes the run JSON
//! (lost committed steps, duplicate samples, migrations by kind). Exit codes: 0 success, 2 an
//! error (one message naming the problem), 130 interrupted.

mod chaos;
mod cluster;
mod compare;
mod engine;
mod failover;
mod faults;
mod fidelity;
mod gpus;
mod history;
mod learning;
mod ledger;
mod model_replay;
mod monitor;
mod node_args;
mod node_bin;
mod node_config;
mod outer_rounds;
mod partition;
mod plot;
mod predicted;
mod prices;
mod process;
mod progress;
mod repeats;
mod replay;
mod report;
mod resources;
mod run;
mod run_check;
mod simulate;
mod trace_plan;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use parcae_testnet::error::TestnetError;
use parcae_testnet::interrupt::Interrupt;

/// Parcae-rs testnet and strategy simulator.
#[derive(Parser, Debug)]
#[command(name = "parcae-testnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay a preemption trace on a local cluster of parcae-node processes.
    Run(run::Args),
    /// Replay one trace with liveput and with reactive, and compare with the simulator.
    Compare(compare::Args),
    /// Kill random nodes without notice and replace them; check nothing committed is lost.
    Chaos(chaos::Args),
    /// Replay an availability trace through the planning strategies and compare them.
    Simulate(simulate::Args),
    /// Check the whole committed history of a run directory kept with `--work-dir`.
    Check(history::Args),
    /// Plot the report of `parcae-node learn`: validation loss against samples by mode.
    PlotLearning(learning::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = parcae_testnet::time_factor::read() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Check(args) => history::run(args),
        Command::PlotLearning(args) => learning::run(args),
        Command::Run(args) => with_interrupt(|i| run::run(args, i)),
        Command::Compare(args) => with_interrupt(|i| compare::run(args, i)),
        Command::Chaos(args) => with_interrupt(|i| chaos::run(args, i)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let interrupted = e
                .chain()
                .any(|c| matches!(c.downcast_ref(), Some(TestnetError::Interrupted)));
            ExitCode::from(if interrupted { 130 } else { 2 })
        }
    }
}

/// Runs a subcommand that starts processes with the signal handlers installed.
fn with_interrupt(f: impl FnOnce(&Interrupt) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let interrupt = Interrupt::install()?;
    f(&interrupt)
}
