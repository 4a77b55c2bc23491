//! `parcae-testnet chaos`: unannounced failures. Every `--kill-every` seconds a seeded random
//! node other than the founder is SIGKILLed without notice and a new node is started in its
//! place; with `--outage-at`, every node is SIGKILLed at once and, `--outage-secs` later, as
//! many new nodes on fresh data directories found a new cluster that resumes from the job's
//! store (a directory of the run). The report is the same as `run`'s, so
//! `lost_committed_steps`, `rolled_back_steps` and `duplicate_samples` show whether training
//! survived without losing or repeating work, and its `outage` whether it resumed.

use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use crate::engine::{Ctx, Scenario};
use crate::report::{self, OutageReport};
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
    /// Seconds after the start at which every node is SIGKILLed at once.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    outage_at: Option<u64>,
    /// Seconds the cluster stays down before new nodes start.
    #[arg(long, default_value_t = 20, requires = "outage_at", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    outage_secs: u64,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// A whole-cluster outage: from `at` for `secs` seconds no node runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outage {
    /// Seconds after the start.
    pub at: f64,
    /// Seconds without nodes.
    pub secs: f64,
}

/// What the outage cut off: the last step committed before it, in which history.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CutOff {
    last_step: Option<u64>,
    history: u64,
}

/// Kill-and-replace on a fixed period, and at most one whole-cluster outage.
pub struct Chaos {
    nodes: u32,
    duration: f64,
    kill_every: f64,
    interval_secs: f64,
    next_kill: f64,
    rng: ChaCha8Rng,
    outage: Option<Outage>,
    /// Set when the outage began; the restart is due once this is set and the outage ended.
    cut_off: Option<CutOff>,
    restarted: bool,
}

impl Chaos {
    /// `nodes` kept alive for `duration` s, one killed every `kill_every` s, and the outage.
    pub fn new(
        nodes: u32,
        duration: f64,
        kill_every: f64,
        interval_secs: f64,
        seed: u64,
        outage: Option<Outage>,
    ) -> Self {
        Self {
            nodes,
            duration,
            kill_every,
            interval_secs,
            next_kill: kill_every,
            rng: ChaCha8Rng::seed_from_u64(seed),
            outage,
            cut_off: None,
            restarted: false,
        }
    }

    fn in_outage(&self, t: f64) -> bool {
        self.outage.is_some_and(|o| o.at <= t && t < o.at + o.secs)
    }

    /// When the outage's next edge is due: its start, then the new nodes' start.
    fn next_outage_edge(&self) -> Option<f64> {
        let o = self.outage?;
        match (self.cut_off, self.restarted) {
            (None, _) => Some(o.at),
            (Some(_), false) => Some(o.at + o.secs),
            (Some(_), true) => None,
        }
    }

    /// The outage's part of the report, once it happened.
    pub fn outage_report(&self, final_seq: &[parcae_api::StepRecord]) -> Option<OutageReport> {
        let c = self.cut_off?;
        Some(OutageReport::of(c.last_step, c.history, final_seq))
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
        [Some(self.next_kill), self.next_outage_edge()]
            .into_iter()
            .flatten()
            .filter(|t| *t < self.duration)
            .min_by(f64::total_cmp)
    }

    fn act(&mut self, ctx: &mut Ctx<'_>) -> Result<(), TestnetError> {
        let t = ctx.now();
        if self.next_outage_edge().is_some_and(|edge| edge <= t) {
            if self.cut_off.is_none() {
                for victim in ctx.cluster.running() {
                    ctx.kill(victim);
                }
                self.cut_off = Some(CutOff {
                    last_step: ctx.monitor.steps.last_step(),
                    history: ctx.monitor.steps.latest_history().unwrap_or(0),
                });
            } else {
                self.restarted = true;
                ctx.start_nodes(self.nodes as usize)?;
            }
            return Ok(());
        }
        self.next_kill += self.kill_every;
        if self.in_outage(t) {
            return Ok(());
        }
        let candidates: Vec<usize> = ctx.cluster.up().into_iter().filter(|&i| i != 0).collect();
        if let Some(&victim) = candidates.choose(&mut self.rng) {
            ctx.kill(victim);
        }
        let missing = (self.nodes as usize).saturating_sub(ctx.cluster.up().len());
        ctx.start_nodes(missing)?;
        Ok(())
    }

    fn target(&self, t: f64) -> u32 {
        if self.in_outage(t) { 0 } else { self.nodes }
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
    let outage = args.outage_at.map(|at| Outage {
        at: at as f64,
        secs: args.outage_secs as f64,
    });
    if let Some(o) = outage
        && o.at + o.secs >= args.duration as f64
    {
        bail!(
            "the outage (--outage-at {} --outage-secs {}) must end before --duration {}",
            o.at,
            o.secs,
            args.duration
        );
    }
    let mut scenario = Chaos::new(
        args.nodes,
        args.duration as f64,
        args.kill_every as f64,
        interval,
        args.node.seed,
        outage,
    );
    let name = match outage {
        Some(o) => format!(
            "chaos:kill-every={}s:outage={}s+{}s",
            args.kill_every, o.at, o.secs
        ),
        None => format!("chaos:kill-every={}s", args.kill_every),
    };
    let spec = SessionSpec {
        strategy: &args.strategy,
        label: args.strategy.clone(),
        trace: name.clone(),
        intervals: scenario.interval_at(f64::INFINITY).1,
        nodes_max: args.nodes,
    };
    let mut outcome = run::session(&args.node, spec, &mut scenario, interrupt)?;
    outcome.report.outage = scenario.outage_report(&outcome.observed.final_seq);
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
        let mut c = Chaos::new(6, 60.0, 20.0, 10.0, 1, None);
        assert_eq!(c.initial_nodes(), 6);
        assert_eq!(c.next_action(), Some(20.0));
        c.next_kill += c.kill_every;
        assert_eq!(c.next_action(), Some(40.0));
        c.next_kill += c.kill_every;
        assert_eq!(c.next_action(), None, "no kill at the very end");
        assert_eq!(c.interval_at(35.0), (3, 6));
        assert_eq!(c.target(1.0), 6);
    }

    #[test]
    fn an_outage_stops_every_node_then_starts_new_ones() {
        let outage = Outage {
            at: 30.0,
            secs: 15.0,
        };
        let mut c = Chaos::new(4, 90.0, 20.0, 10.0, 1, Some(outage));
        assert_eq!(c.next_action(), Some(20.0), "the first kill");
        c.next_kill += c.kill_every;
        assert_eq!(
            c.next_action(),
            Some(30.0),
            "the outage before the kill at 40"
        );
        c.cut_off = Some(CutOff {
            last_step: Some(12),
            history: 0,
        });
        assert_eq!(c.next_action(), Some(40.0));
        assert!(c.in_outage(40.0) && c.in_outage(44.9) && !c.in_outage(45.0));
        assert_eq!(c.target(35.0), 0);
        assert_eq!(c.next_outage_edge(), Some(45.0), "the restart");
        c.restarted = true;
        assert_eq!(c.next_outage_edge(), None);
        let rec = |step, history| parcae_api::StepRecord {
            step,
            history,
            samples: 8,
            sample_start: step * 8,
            ..parcae_api::StepRecord::default()
        };
        let seq: Vec<_> = (0..=9)
            .map(|s| rec(s, 0))
            .chain((10..15).map(|s| rec(s, 1)))
            .collect();
        assert_eq!(
            c.outage_report(&seq),
            Some(OutageReport {
                last_step_before: Some(12),
                resumed_from_step: Some(9),
                steps_after: 5
            })
        );
        let fresh: Vec<_> = (0..3).map(|s| rec(s, 0)).collect();
        assert_eq!(
            c.outage_report(&fresh).and_then(|o| o.resumed_from_step),
            None,
            "a new cluster that started over did not resume"
        );
    }
}
