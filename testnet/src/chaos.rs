//! `parcae-testnet chaos`: unannounced failures. Every `--kill-every` seconds a seeded random
//! node other than the founder is SIGKILLed without notice and a new node is started in its
//! place; with `--outage-at`, every node is SIGKILLed at once and, `--outage-secs` later, as
//! many new nodes on fresh data directories found a new cluster that resumes from the job's
//! store (a directory of the run); with `--pause-every`, a node (the leader the first time) is
//! frozen with SIGSTOP for `--pause-secs` and woken with SIGCONT, as a VM stalled by its host
//! that wakes up believing it still holds its stage; with `--partition-every` (and `--netns`),
//! the network splits for `--partition-secs` ([`crate::partition`]), and what the minority
//! applied meanwhile must be in the final history as it was; with `--disk-full-every`, the
//! checkpoint disk of a node that writes checkpoints fills up for `--disk-full-secs`; with
//! `--clock-skew`, every third node runs with its wall clock off ([`ClockSkew`]); with
//! `--slow-link-every` (and `--netns`), a node's link is slowed for `--slow-link-secs`. The
//! report is the same as `run`'s, so `lost_committed_steps`, `rolled_back_steps` and
//! `duplicate_samples` show whether training survived without losing or repeating work, its
//! `outage` whether it resumed, and its `faults` list what was done to which node and when.

use anyhow::Result;
use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use crate::engine::{Ctx, Scenario, ZoneStart};
use crate::faults::{self, Fault, FaultKind};
use crate::partition::{self, Split};
use crate::report::{self, OutageReport};
use crate::run::{self, SessionSpec};
pub use args::Args;
use parcae_api::StepRecord;
use parcae_testnet::clock_skew::ClockSkew;
use parcae_testnet::error::TestnetError;
use parcae_testnet::interrupt::Interrupt;
use schedule::{Schedule, trace_name};

/// Size of each node's checkpoint disk with `--disk-full-every`: room for a few checkpoints of
/// the models the testnet trains, and little memory for the tmpfs when filled.
const CHECKPOINT_DISK_MIB: u64 = 256;

/// Seconds a full disk waits for a node that writes checkpoints to answer.
const FILL_RETRY_SECS: f64 = 1.0;

/// Mixed into the run's seed for the slow links' random stream.
const SLOW_LINK_STREAM: u64 = 0x5107_11AC;

/// What the outage cut off: the last step committed before it, in which history.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CutOff {
    last_step: Option<u64>,
    history: u64,
}

/// The split in force, until when, and its entry in the fault list.
#[derive(Debug, Clone, PartialEq)]
struct ActiveSplit {
    split: Split,
    until: f64,
    fault: usize,
}

/// The node frozen (or whose disk is full) now, until when, and its entry in the fault list.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    node: usize,
    until: f64,
    fault: usize,
}

/// Kill-and-replace on a fixed period, pauses, splits and full disks each on its own, and at
/// most one whole-cluster outage.
pub struct Chaos {
    schedule: Schedule,
    /// The zones the nodes are spread over (none: no zone).
    zones: Vec<String>,
    next_kill: f64,
    next_pause: f64,
    rng: ChaCha8Rng,
    /// Set when the outage began; the restart is due once this is set and the outage ended.
    cut_off: Option<CutOff>,
    restarted: bool,
    frozen: Option<Held>,
    leader_paused: bool,
    next_split: f64,
    splits: u32,
    split: Option<ActiveSplit>,
    /// What the minority nodes had applied when each split healed.
    minority_seen: Vec<StepRecord>,
    next_fill: f64,
    filled: Option<Held>,
    next_slow: f64,
    slowed: Option<Held>,
    /// The slow links' own random stream: adding them to a run leaves the other faults'
    /// choices as they were.
    slow_rng: ChaCha8Rng,
    /// Failed checkpoint writes the nodes whose disk was full reported when it was emptied.
    write_failures: u64,
    faults: Vec<Fault>,
    /// Nodes started so far (`node<k>` for `k` below it).
    started: usize,
}

/// The node to freeze: the leader while it was never frozen (`leader` is then `Some`) and is
/// up, otherwise a random node that is up.
fn pause_victim(leader: Option<usize>, up: &[usize], rng: &mut ChaCha8Rng) -> Option<usize> {
    leader
        .filter(|l| up.contains(l))
        .or_else(|| up.choose(rng).copied())
}

impl Chaos {
    /// The run `schedule` describes, its random choices drawn from `seed`.
    pub fn new(schedule: Schedule, seed: u64) -> Self {
        Self {
            schedule,
            zones: Vec::new(),
            next_kill: schedule.kill_every,
            next_pause: schedule.pauses.map_or(f64::INFINITY, |p| p.every),
            rng: ChaCha8Rng::seed_from_u64(seed),
            cut_off: None,
            restarted: false,
            frozen: None,
            leader_paused: false,
            next_split: schedule.partitions.map_or(f64::INFINITY, |p| p.every),
            splits: 0,
            split: None,
            minority_seen: Vec::new(),
            next_fill: schedule.disks_full.map_or(f64::INFINITY, |p| p.every),
            filled: None,
            next_slow: schedule.slow_links.map_or(f64::INFINITY, |p| p.every),
            slowed: None,
            slow_rng: ChaCha8Rng::seed_from_u64(seed ^ SLOW_LINK_STREAM),
            write_failures: 0,
            faults: Vec::new(),
            started: schedule.nodes as usize,
        }
    }

    /// The same chaos, its nodes spread over `zones`.
    pub fn in_zones(self, zones: Vec<String>) -> Self {
        Self { zones, ..self }
    }

    /// Starts `count` nodes: without zones anywhere, else each in the zone with the fewest
    /// nodes up (the first of them on a tie).
    fn start(&self, ctx: &mut Ctx<'_>, count: usize) -> Result<(), TestnetError> {
        if self.zones.is_empty() {
            return ctx.start_nodes(count, None);
        }
        let mut up: Vec<usize> = (0..self.zones.len())
            .map(|z| ctx.cluster.up_in(z).len())
            .collect();
        for _ in 0..count {
            let z = (0..up.len()).min_by_key(|&z| (up[z], z)).unwrap_or(0);
            ctx.start_nodes(1, Some(z))?;
            up[z] += 1;
        }
        Ok(())
    }

    fn in_outage(&self, t: f64) -> bool {
        self.schedule
            .outage
            .is_some_and(|o| o.at <= t && t < o.at + o.secs)
    }

    /// When the outage's next edge is due: its start, then the new nodes' start.
    fn next_outage_edge(&self) -> Option<f64> {
        let o = self.schedule.outage?;
        match (self.cut_off, self.restarted) {
            (None, _) => Some(o.at),
            (Some(_), false) => Some(o.at + o.secs),
            (Some(_), true) => None,
        }
    }

    /// When the pauses' next edge is due: the frozen node's wake-up, or the next pause.
    fn next_pause_edge(&self) -> Option<f64> {
        match self.frozen {
            Some(f) => Some(f.until),
            None => self.schedule.pauses.map(|_| self.next_pause),
        }
    }

    /// When the splits' next edge is due: the heal, or the next split.
    fn next_split_edge(&self) -> Option<f64> {
        match &self.split {
            Some(s) => Some(s.until),
            None => self.schedule.partitions.map(|_| self.next_split),
        }
    }

    /// When the full disks' next edge is due: the ballast's removal, or the next fill.
    fn next_fill_edge(&self) -> Option<f64> {
        match self.filled {
            Some(h) => Some(h.until),
            None => self.schedule.disks_full.map(|_| self.next_fill),
        }
    }

    /// When the slow links' next edge is due: the link's recovery, or the next slow link.
    fn next_slow_edge(&self) -> Option<f64> {
        match self.slowed {
            Some(h) => Some(h.until),
            None => self.schedule.slow_links.map(|_| self.next_slow),
        }
    }

    /// The outage's part of the report, once it happened.
    pub fn outage_report(&self, final_seq: &[StepRecord]) -> Option<OutageReport> {
        let c = self.cut_off?;
        Some(OutageReport::of(c.last_step, c.history, final_seq))
    }

    /// Every fault injected, in order, then one entry per node started with a skewed clock
    /// (for its whole life; the times are the run's).
    pub fn faults(&self) -> Vec<Fault> {
        let skewed = self
            .clock_skew()
            .into_iter()
            .flat_map(|skew| (0..self.started).filter_map(move |k| Some((k, skew.of_node(k)?))));
        let skews = skewed.map(|(k, ms)| Fault {
            kind: FaultKind::ClockSkew,
            start_secs: 0.0,
            end_secs: self.schedule.duration,
            nodes: vec![format!("node{k}")],
            skew_secs: Some(ms / 1000),
            link_kbit: None,
        });
        self.faults.iter().cloned().chain(skews).collect()
    }

    fn record(&mut self, kind: FaultKind, start_secs: f64, end_secs: f64, nodes: Vec<String>) {
        self.faults.push(Fault {
            kind,
            start_secs,
            end_secs,
            nodes,
            skew_secs: None,
            link_kbit: None,
        });
    }

    /// Records `kind` on node `victim` from `t` for `secs` s; what ending it needs.
    fn hold(&mut self, ctx: &Ctx<'_>, kind: FaultKind, victim: usize, t: f64, secs: f64) -> Held {
        self.record(kind, t, t + secs, vec![name_of(ctx, victim)]);
        Held {
            node: victim,
            until: t + secs,
            fault: self.faults.len() - 1,
        }
    }

    /// The outage's start (every node killed) or its end (as many new nodes started).
    fn outage_edge(&mut self, ctx: &mut Ctx<'_>, t: f64) -> Result<(), TestnetError> {
        if self.cut_off.is_none() {
            let victims = ctx.cluster.running();
            let names = victims.iter().map(|&i| name_of(ctx, i)).collect();
            for victim in victims {
                ctx.kill(victim);
            }
            self.cut_off = Some(CutOff {
                last_step: ctx.monitor.steps.last_step(),
                history: ctx.monitor.steps.latest_history().unwrap_or(0),
            });
            let planned_end = self.schedule.outage.map_or(t, |o| o.at + o.secs);
            self.record(FaultKind::Outage, t, planned_end, names);
        } else {
            self.restarted = true;
            if let Some(f) = self
                .faults
                .iter_mut()
                .rfind(|f| f.kind == FaultKind::Outage)
            {
                f.end_secs = t;
            }
            self.start(ctx, self.schedule.nodes as usize)?;
            self.started += self.schedule.nodes as usize;
        }
        Ok(())
    }

    /// Wakes the frozen node, or freezes the next one.
    fn pause_edge(&mut self, ctx: &mut Ctx<'_>, t: f64) {
        if let Some(f) = self.frozen.take() {
            ctx.resume(f.node);
            self.faults[f.fault].end_secs = t;
            return;
        }
        let schedule = self.schedule;
        let Some(secs) = schedule.turn(schedule.pauses, &mut self.next_pause, t) else {
            return;
        };
        let leader = if self.leader_paused {
            None
        } else {
            ctx.cluster.leader().map(|(i, _)| i)
        };
        let Some(victim) = pause_victim(leader, &ctx.cluster.up(), &mut self.rng) else {
            return;
        };
        self.leader_paused |= leader == Some(victim);
        ctx.pause(victim);
        self.frozen = Some(self.hold(ctx, FaultKind::Pause, victim, t, secs));
    }
}

impl Chaos {
    /// Heals the split in force, or makes the next one.
    fn split_edge(&mut self, ctx: &mut Ctx<'_>, t: f64) -> Result<(), TestnetError> {
        if let Some(active) = self.split.take() {
            // What the minority applied while cut off, read before it hears the others again.
            for &i in &active.split.minority {
                if let Ok(records) = ctx.cluster.client().steps(ctx.cluster.node(i).status_addr) {
                    self.minority_seen.extend(records);
                }
            }
            for &(a, b) in &active.split.cuts {
                ctx.cluster.set_link(a, b, false)?;
            }
            self.faults[active.fault].end_secs = t;
            return Ok(());
        }
        let schedule = self.schedule;
        let Some(secs) = schedule.turn(schedule.partitions, &mut self.next_split, t) else {
            return Ok(());
        };
        let Some(split) = partition::plan(self.splits, &ctx.cluster.running(), &mut self.rng)
        else {
            return Ok(());
        };
        self.splits += 1;
        for &(a, b) in &split.cuts {
            ctx.cluster.set_link(a, b, true)?;
        }
        let mut cut_off: Vec<usize> = split.cuts.iter().map(|&(a, _)| a).collect();
        cut_off.sort_unstable();
        cut_off.dedup();
        let names = cut_off.iter().map(|&i| name_of(ctx, i)).collect();
        self.record(FaultKind::Partition, t, t + secs, names);
        self.split = Some(ActiveSplit {
            split,
            until: t + secs,
            fault: self.faults.len() - 1,
        });
        Ok(())
    }

    /// Empties the full disk (reading how many checkpoint writes its node saw fail), or fills
    /// the next node's.
    fn fill_edge(&mut self, ctx: &mut Ctx<'_>, t: f64) -> Result<(), TestnetError> {
        if let Some(h) = self.filled.take() {
            let addr = ctx.cluster.node(h.node).status_addr;
            if let Ok(text) = ctx.cluster.client().metrics(addr) {
                self.write_failures += counter(&text, "parcae_checkpoint_write_failures_total");
            }
            ctx.cluster.free_disk(h.node);
            self.faults[h.fault].end_secs = t;
            return Ok(());
        }
        let schedule = self.schedule;
        // Pipeline 0 writes every stage's checkpoints: one of its nodes. While none answers (its
        // one node frozen by a pause, a cluster between plans), the fill waits a second at a
        // time, as long as it still fits the run, rather than fill a disk nobody writes to.
        let up = ctx.cluster.up();
        let writers: Vec<usize> = up
            .iter()
            .copied()
            .filter(|&i| {
                let slot = ctx.cluster.status(i).and_then(|s| s.training?.slot);
                slot.is_some_and(|[pipeline, _]| pipeline == 0)
            })
            .collect();
        if let Some(fill) = schedule.disks_full
            && writers.is_empty()
            && schedule.fits(t + FILL_RETRY_SECS, fill.secs)
        {
            self.next_fill = t + FILL_RETRY_SECS;
            return Ok(());
        }
        let Some(secs) = schedule.turn(schedule.disks_full, &mut self.next_fill, t) else {
            return Ok(());
        };
        let pool = if writers.is_empty() { &up } else { &writers };
        let Some(&victim) = pool.choose(&mut self.rng) else {
            return Ok(());
        };
        ctx.cluster.fill_disk(victim)?;
        self.filled = Some(self.hold(ctx, FaultKind::DiskFull, victim, t, secs));
        Ok(())
    }

    /// Restores the slow link, or slows a random node's.
    fn slow_edge(&mut self, ctx: &mut Ctx<'_>, t: f64) -> Result<(), TestnetError> {
        if let Some(h) = self.slowed.take() {
            ctx.cluster.set_slow_link(h.node, None)?;
            self.faults[h.fault].end_secs = t;
            return Ok(());
        }
        let schedule = self.schedule;
        let Some(secs) = schedule.turn(schedule.slow_links, &mut self.next_slow, t) else {
            return Ok(());
        };
        let Some(&victim) = ctx.cluster.up().choose(&mut self.slow_rng) else {
            return Ok(());
        };
        let rate = schedule.slow_link_kbit;
        ctx.cluster.set_slow_link(victim, Some(rate))?;
        let held = self.hold(ctx, FaultKind::Link, victim, t, secs);
        self.faults[held.fault].link_kbit = Some(rate);
        self.slowed = Some(held);
        Ok(())
    }

    /// Checkpoint writes that failed on the nodes whose disk was full (`None` without full
    /// disks; a node counts what it saw until its disk was emptied).
    pub fn checkpoint_write_failures(&self) -> Option<u64> {
        self.schedule.disks_full.map(|_| self.write_failures)
    }

    /// What the minority sides applied while cut off, for the history check (`None` without
    /// splits).
    pub fn minority_seen(&self) -> Option<Vec<StepRecord>> {
        self.schedule.partitions.map(|_| self.minority_seen.clone())
    }
}

/// The value of counter `name` in OpenMetrics `text` (0 when absent).
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn name_of(ctx: &Ctx<'_>, i: usize) -> String {
    ctx.cluster.node(i).name.clone()
}

impl Scenario for Chaos {
    fn initial_nodes(&self) -> usize {
        self.schedule.nodes as usize
    }

    fn duration_secs(&self) -> f64 {
        self.schedule.duration
    }

    fn next_action(&self) -> Option<f64> {
        [
            Some(self.next_kill),
            self.next_outage_edge(),
            self.next_pause_edge(),
            self.next_split_edge(),
            self.next_fill_edge(),
            self.next_slow_edge(),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t < self.schedule.duration)
        .min_by(f64::total_cmp)
    }

    fn act(&mut self, ctx: &mut Ctx<'_>) -> Result<(), TestnetError> {
        let t = ctx.now();
        if self.next_outage_edge().is_some_and(|edge| edge <= t) {
            return self.outage_edge(ctx, t);
        }
        if self.next_pause_edge().is_some_and(|edge| edge <= t) {
            self.pause_edge(ctx, t);
            return Ok(());
        }
        if self.next_split_edge().is_some_and(|edge| edge <= t) {
            return self.split_edge(ctx, t);
        }
        if self.next_fill_edge().is_some_and(|edge| edge <= t) {
            return self.fill_edge(ctx, t);
        }
        if self.next_slow_edge().is_some_and(|edge| edge <= t) {
            return self.slow_edge(ctx, t);
        }
        self.next_kill += self.schedule.kill_every;
        if self.in_outage(t) {
            return Ok(());
        }
        let candidates: Vec<usize> = ctx.cluster.up().into_iter().filter(|&i| i != 0).collect();
        if let Some(&victim) = candidates.choose(&mut self.rng) {
            let names = vec![name_of(ctx, victim)];
            ctx.kill(victim);
            self.record(FaultKind::Kill, t, t, names);
        }
        // A frozen node is still running: it is not replaced.
        let missing = (self.schedule.nodes as usize).saturating_sub(ctx.cluster.running().len());
        self.start(ctx, missing)?;
        self.started += missing;
        Ok(())
    }

    fn target(&self, t: f64) -> u32 {
        if self.in_outage(t) {
            0
        } else {
            self.schedule.nodes
        }
    }

    fn interval_at(&self, t: f64) -> (u64, u64) {
        let len = (self.schedule.duration / self.schedule.interval_secs).ceil() as u64;
        (((t / self.schedule.interval_secs) as u64).min(len), len)
    }

    fn checkpoint_disk_mib(&self) -> Option<u64> {
        self.schedule.disks_full.map(|_| CHECKPOINT_DISK_MIB)
    }

    fn keeps_every_checkpoint(&self) -> bool {
        true
    }

    fn clock_skew(&self) -> Option<ClockSkew> {
        self.schedule.clock_skew.map(|secs| ClockSkew { secs })
    }

    fn zones(&self) -> Vec<ZoneStart> {
        let (n, z) = (self.schedule.nodes as usize, self.zones.len());
        self.zones
            .iter()
            .enumerate()
            .map(|(k, name)| ZoneStart {
                name: name.clone(),
                speed: 1.0,
                initial: n / z + usize::from(k < n % z),
            })
            .collect()
    }
}

/// `parcae-testnet chaos`.
pub fn run(args: Args, interrupt: &Interrupt) -> Result<()> {
    args.node.validate()?;
    let schedule = schedule::of(&args)?;
    check_zones(&args.zones, args.nodes)?;
    let mut scenario = Chaos::new(schedule, args.node.seed).in_zones(args.zones.clone());
    let name = trace_name(&schedule);
    let spec = SessionSpec {
        strategy: &args.strategy,
        label: args.strategy.clone(),
        trace: name.clone(),
        intervals: scenario.interval_at(f64::INFINITY).1,
        nodes_max: args.nodes,
    };
    let mut outcome = run::session(&args.node, spec, &mut scenario, interrupt)?;
    outcome.report.outage = scenario.outage_report(&outcome.observed.final_seq);
    outcome.report.faults = scenario.faults();
    run::verify_history(&mut outcome, scenario.minority_seen(), &args.node)?;
    outcome.report.checkpoint_write_failures = scenario.checkpoint_write_failures();
    println!("{}", faults::summary(&outcome.report.faults));
    run::finish(&[&outcome], &args.output, &name)?;
    if let Some(path) = &args.output.json {
        report::write_json(path, &outcome.report)?;
    }
    run::check(&[&outcome], &args.output)
}

/// Refuses zones a node cannot be placed in, named twice, or more than the nodes.
fn check_zones(zones: &[String], nodes: u32) -> Result<()> {
    for (k, name) in zones.iter().enumerate() {
        name.parse::<parcae_pool::Pool>()
            .map_err(|e| anyhow::anyhow!("--zones {name}: {e}"))?;
        anyhow::ensure!(!zones[..k].contains(name), "--zones names {name} twice");
    }
    anyhow::ensure!(
        zones.len() <= nodes as usize,
        "--zones: {} zones for {nodes} nodes",
        zones.len()
    );
    Ok(())
}

mod args;
mod schedule;
#[cfg(test)]
mod tests;
