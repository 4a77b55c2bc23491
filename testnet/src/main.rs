//! `parcae-testnet`: the strategy simulator now, the local multi-process testnet later.

mod plot;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Parcae-rs testnet and strategy simulator.
#[derive(Parser, Debug)]
#[command(name = "parcae-testnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay an availability trace through the planning strategies and compare them.
    Simulate(simulate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
