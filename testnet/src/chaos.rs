//! `parcae-testnet chaos`: unannounced failures. Every `--kill-every` seconds a seeded random
//! node other than the founder is SIGKILLed without notice and a new node is started in its
//! place; the report is the same as `run`'s, so `lost_committed_steps` and
//! `duplicate_samples` show whether training survived without losing or repeating work.

use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use crate::engine::{Ctx, Scenario};
use crate::report;
use crate::run::{self, NodeArgs, OutputArgs, STRATEGIES, SessionSpec};
use parcae_testnet::error::TestnetError;
use parcae_testnet::interrupt::Interrupt;

/// Options of `chaos`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds of chaos.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration: u64,
    /// Seconds between two kills.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    kill_every: u64,
    /// Nodes kept running.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=64))]
    nodes: u32,
    /// Planning strategy of the nodes.
    #[arg(long, default_value = "liveput", value_parser = STRATEGIES)]
    strategy: String,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// Kill-and-replace on a fixed period.
pub struct Chaos {
    nodes: u32,
    duration: f64,
    kill_every: f64,
    interval_secs: f64,
    next_kill: f64,
    rng: ChaCha8Rng,
}

impl Chaos {
    /// `nodes` kept alive for `duration` s, one killed every `kill_every` s.
    pub fn new(nodes: u32, duration: f64, kill_every: f64, interval_secs: f64, seed: u64) -> Self {
        Self {
            nodes,
            duration,
            kill_every,
            interval_secs,
            next_kill: kill_every,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Scenario for Chaos {
    fn initial_nodes(&self) -> usize {
        self.nodes as usize
    }

    fn duration_secs(&self) -> f64 {
        self.duration
    }

    fn next_action(&self) -> Option<f64> {
        (self.next_kill < self.duration).then_some(self.next_kill)
    }

    fn act(&mut self, ctx: &mut Ctx<'_>) -> Result<(), TestnetError> {
        self.next_kill += self.kill_every;
        let candidates: Vec<usize> = ctx.cluster.up().into_iter().filter(|&i| i != 0).collect();
        if let Some(&victim) = candidates.choose(&mut self.rng) {
            ctx.kill(victim);
        }
        let missing = (self.nodes as usize).saturating_sub(ctx.cluster.up().len());
        ctx.cluster.start_nodes(missing)?;
        Ok(())
    }

    fn target(&self, _t: f64) -> u32 {
        self.nodes
    }

    fn interval_at(&self, t: f64) -> (u64, u64) {
        let len = (self.duration / self.interval_secs).ceil() as u64;
        (((t / self.interval_secs) as u64).min(len), len)
    }
}

/// `parcae-testnet chaos`.
pub fn run(args: Args, interrupt: &Interrupt) -> Result<()> {
    args.node.validate()?;
    if args.kill_every >= args.duration {
        bail!(
            "--kill-every {} must be shorter than --duration {}",
            args.kill_every,
            args.duration
        );
    }
    let interval = args.node.interval_secs as f64;
    let mut scenario = Chaos::new(
        args.nodes,
        args.duration as f64,
        args.kill_every as f64,
        interval,
        args.node.seed,
    );
    let name = format!("chaos:kill-every={}s", args.kill_every);
    let spec = SessionSpec {
        strategy: &args.strategy,
        trace: name.clone(),
        intervals: scenario.interval_at(f64::INFINITY).1,
        nodes_max: args.nodes,
    };
    let outcome = run::session(&args.node, spec, &mut scenario, interrupt)?;
    run::finish(&[&outcome], &args.output, &name)?;
    if let Some(path) = &args.output.json {
        report::write_json(path, &outcome.report)?;
    }
    run::check(&[&outcome], &args.output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_on_the_period_until_the_end() {
        let mut c = Chaos::new(6, 60.0, 20.0, 10.0, 1);
        assert_eq!(c.initial_nodes(), 6);
        assert_eq!(c.next_action(), Some(20.0));
        c.next_kill += c.kill_every;
        assert_eq!(c.next_action(), Some(40.0));
        c.next_kill += c.kill_every;
        assert_eq!(c.next_action(), None, "no kill at the very end");
        assert_eq!(c.interval_at(35.0), (3, 6));
        assert_eq!(c.target(1.0), 6);
    }
}
