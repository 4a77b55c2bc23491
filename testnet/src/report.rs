//! The run report: the JSON document of issue 7 (field names are a contract with CI and
//! users), the table printed at the end, and writing both.

use std::path::Path;

use anyhow::{Context, Result};
use curve::val_curve;
use parcae_api::{EmulatedView, StepRecord, ValPoint};
use parcae_outer::Wire;
use parcae_strategies::cost::money::Bill;
use serde::{Deserialize, Serialize};

use crate::engine::Observed;
use crate::failover::LeaderFailover;
use crate::faults::Fault;
use crate::fidelity::Fidelity;
use crate::history::HistoryCheck;
use crate::ledger::{MigrationCounts, Reconfiguration, sample_overlap};
use crate::outer_rounds::OuterRounds;
use crate::resources::ResourceReport;

/// One run, as `--json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Planning strategy of the nodes.
    pub strategy: String,
    /// Trace source (or the chaos schedule).
    pub trace: String,
    /// Planning intervals replayed.
    pub intervals: u64,
    /// Most nodes at once.
    pub nodes_max: u32,
    /// Steps in the final committed sequence.
    pub committed_steps: u64,
    /// Samples of those steps.
    pub samples: u64,
    /// Loss of the first committed step (null without steps).
    pub loss_first: Option<f64>,
    /// Loss of the last committed step (null without steps).
    pub loss_last: Option<f64>,
    /// Loss on the held-out samples at the first step that evaluated them (null without).
    pub val_loss_first: Option<f64>,
    /// Loss on the held-out samples at the last step that evaluated them (null without).
    pub val_loss_last: Option<f64>,
    /// Every validation of the final history against the samples trained before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub val_curve: Vec<ValPoint>,
    /// How the nodes' replicas in different zones agreed (`step`, `diloco:H`).
    #[serde(default = "step_sync")]
    pub sync: String,
    /// The job's seed.
    #[serde(default)]
    pub seed: u64,
    /// DiLoCo's outer learning rate and momentum where the run set them (absent: the
    /// node's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outer: Option<[f32; 2]>,
    /// Under DiLoCo, the form its pseudo-gradients crossed zones in (`f32`, `bf16`, `int8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pseudo_gradient: Option<Wire>,
    /// Reconfigurations by kind.
    pub migrations: MigrationCounts,
    /// Seconds spent in reconfigurations (per epoch the slowest node).
    pub migration_secs: f64,
    /// Every re-plan that moved the running job: when it was seen and how long it took.
    pub reconfigurations: Vec<Reconfiguration>,
    /// Steps seen committed during the run that are missing from or changed in the end
    /// (rolled-back steps apart).
    pub lost_committed_steps: u64,
    /// Committed steps given up by a rollback to a checkpoint (or a resumption after an
    /// outage) and trained again in a later history (0 in reports written before it was).
    #[serde(default)]
    pub rolled_back_steps: u64,
    /// Samples trained by more than one committed step.
    pub duplicate_samples: u64,
    /// Wall-clock seconds of the run: cluster start-up, replay and collection (not a build of
    /// the node binary).
    pub wall_secs: f64,
    /// Bytes the nodes sent in gradient all-reduces (as each node last reported them).
    #[serde(default)]
    pub allreduce_bytes: u64,
    /// Of them, bytes sent to a replica in another zone.
    #[serde(default)]
    pub allreduce_cross_zone_bytes: u64,
    /// Under DiLoCo, the rounds seen closed and whether every group's replicas showed the
    /// same outer weights after each (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outer_rounds: Option<OuterRounds>,
    /// The nodes' emulated accelerator and how far real work overran it (absent on CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulated: Option<EmulatedReport>,
    /// Memory and CPU of the node processes and of the testnet (absent without a poll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceReport>,
    /// The leader SIGKILLed on purpose (`run --kill-leader-at`) and the failover's time
    /// (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_failover: Option<LeaderFailover>,
    /// The whole-cluster outage of `chaos --outage-at` and the resumption after it (absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outage: Option<OutageReport>,
    /// The faults a `chaos` run injected, in order (absent from other runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    /// Steps a node applied while its side of a network split was a minority that the final
    /// history does not hold as they were (`chaos --partition-every`; must be 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minority_commits: Option<u64>,
    /// The check of the whole committed history (`chaos`; absent from other runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_check: Option<HistoryCheck>,
    /// Checkpoint writes the nodes whose disk was full saw fail (`chaos --disk-full-every`):
    /// each was logged and counted, and training went on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_write_failures: Option<u64>,
    /// Samples the simulator trains with the same strategy on the replayed trace and the cost
    /// model the cluster ran under (`crate::predicted`; null without a trace or a cost model).
    pub simulated_samples: Option<f64>,
    /// `samples / simulated_samples`.
    pub vs_simulated: Option<f64>,
    /// Where the samples differ from the simulator's and why (absent without a simulation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<Fidelity>,
    /// `samples` as a percentage of the simulator's ideal on the same trace and model (every
    /// interval at the best configuration for its nodes, reconfigurations free).
    pub percent_of_ideal: Option<f64>,
    /// Machine-hours, cost and the saving against on-demand machines, with `--price-spot` and
    /// `--price-on-demand` (in the emulated world on an emulated run: intervals of
    /// `--interval-secs` x `--time-scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Bill>,
}

impl RunReport {
    /// Adds the simulator's samples for this run and its ideal's.
    pub fn compare_with_simulator(&mut self, simulated: f64, ideal: f64) {
        let measured = self.samples as f64;
        self.simulated_samples = Some(simulated);
        self.vs_simulated = (simulated > 0.0).then(|| measured / simulated);
        self.percent_of_ideal = (ideal > 0.0).then(|| 100.0 * measured / ideal);
    }
}

/// Pacing of the emulated accelerators over every node of a run. Every wait of an emulated
/// run comes from the profile; what real work could not fit in it is this overrun.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmulatedReport {
    /// The profiled model.
    pub profile: String,
    /// Emulated durations were divided by this.
    pub time_scale: f64,
    /// Pieces of work that outlasted their emulated time.
    pub overrun_count: u64,
    /// Their excess over all nodes, seconds.
    pub overrun_secs: f64,
    /// Emulated busy time over all nodes, seconds.
    pub busy_secs: f64,
    /// `overrun_secs / busy_secs`.
    pub overrun_fraction: f64,
}

/// Most overrun a `--check` accepts, as a fraction of the emulated busy time.
pub const MAX_OVERRUN_FRACTION: f64 = 0.05;

impl EmulatedReport {
    /// The sum over the nodes' last views (`None` when no node was emulated).
    pub fn of<'a>(views: impl IntoIterator<Item = &'a EmulatedView>) -> Option<Self> {
        let mut views = views.into_iter().peekable();
        let first = views.peek()?;
        let mut r = Self {
            profile: first.profile.clone(),
            time_scale: first.time_scale,
            overrun_count: 0,
            overrun_secs: 0.0,
            busy_secs: 0.0,
            overrun_fraction: 0.0,
        };
        for v in views {
            r.overrun_count += v.overrun_count;
            r.overrun_secs += v.overrun_secs;
            r.busy_secs += v.busy_secs;
        }
        if r.busy_secs > 0.0 {
            r.overrun_fraction = r.overrun_secs / r.busy_secs;
        }
        Some(r)
    }
}

/// What describes a run besides its observations.
pub struct RunMeta {
    /// Strategy.
    pub strategy: String,
    /// Trace source.
    pub trace: String,
    /// Intervals replayed.
    pub intervals: u64,
    /// Most nodes at once.
    pub nodes_max: u32,
    /// Wall-clock seconds.
    pub wall_secs: f64,
    /// The nodes' sync mode.
    pub sync: String,
    /// The job's seed.
    pub seed: u64,
    /// The outer learning rate and momentum the run set.
    pub outer: Option<[f32; 2]>,
    /// Under DiLoCo, the pseudo-gradients' wire form.
    pub pseudo_gradient: Option<Wire>,
}

fn step_sync() -> String {
    "step".into()
}

/// Every node SIGKILLed at once, and new nodes on fresh data directories started later with
/// the same job store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutageReport {
    /// The last step committed before the outage (null: none).
    pub last_step_before: Option<u64>,
    /// The step of the stored checkpoint the new cluster resumed from (null: it did not
    /// resume; a new history starting from step 0 would show as lost committed steps).
    pub resumed_from_step: Option<u64>,
    /// Steps the new cluster committed.
    pub steps_after: u64,
}

impl OutageReport {
    /// The outage after `last_step_before` in history `history_before`, as the final committed
    /// sequence shows its end: the steps of a later history are the new cluster's.
    pub fn of(
        last_step_before: Option<u64>,
        history_before: u64,
        final_seq: &[StepRecord],
    ) -> Self {
        let after: Vec<&StepRecord> = final_seq
            .iter()
            .filter(|r| r.history > history_before)
            .collect();
        Self {
            last_step_before,
            resumed_from_step: after.first().and_then(|r| r.step.checked_sub(1)),
            steps_after: after.len() as u64,
        }
    }
}

/// What the table shows besides the JSON.
#[derive(Debug, Default)]
pub struct Details {
    /// Samples skipped between committed steps.
    pub gaps: u64,
    /// The first few lost committed steps, described.
    pub lost: Vec<String>,
}

/// Lost steps described in the output (all are counted).
const LOST_SHOWN: usize = 5;

/// Builds the report and its details.
pub fn build(meta: RunMeta, obs: &Observed) -> (RunReport, Details) {
    let seq = &obs.final_seq;
    let (duplicates, gaps) = sample_overlap(seq);
    let lost = obs.monitor.steps.lost(seq);
    let report = RunReport {
        strategy: meta.strategy,
        trace: meta.trace,
        intervals: meta.intervals,
        nodes_max: meta.nodes_max,
        committed_steps: seq.len() as u64,
        samples: seq.iter().map(|r| r.samples).sum(),
        loss_first: seq.first().map(|r| r.loss).filter(|l| l.is_finite()),
        loss_last: seq.last().map(|r| r.loss).filter(|l| l.is_finite()),
        val_loss_first: seq.iter().find_map(|r| r.validation_loss),
        val_loss_last: seq.iter().rev().find_map(|r| r.validation_loss),
        val_curve: val_curve(seq),
        sync: meta.sync,
        seed: meta.seed,
        outer: meta.outer,
        pseudo_gradient: meta.pseudo_gradient,
        migrations: obs.monitor.migrations.counts(),
        migration_secs: obs.monitor.migrations.total_secs(),
        reconfigurations: obs
            .monitor
            .migrations
            .migrations()
            .map(|(&epoch, m)| Reconfiguration {
                epoch,
                kind: m.kind,
                at_step: m.at_step,
                seen_at_secs: m.seen_at,
                secs: m.secs,
            })
            .collect(),
        lost_committed_steps: lost.len() as u64,
        rolled_back_steps: obs.monitor.steps.rolled_back(seq),
        duplicate_samples: duplicates,
        wall_secs: meta.wall_secs,
        allreduce_bytes: obs.monitor.all_reduce_bytes().0,
        allreduce_cross_zone_bytes: obs.monitor.all_reduce_bytes().1,
        outer_rounds: obs.monitor.outer.report(seq),
        emulated: EmulatedReport::of(obs.monitor.emulated.values()),
        resources: obs.monitor.resources.report(),
        leader_failover: obs.monitor.failover.clone(),
        outage: None,
        faults: Vec::new(),
        minority_commits: None,
        history_check: None,
        checkpoint_write_failures: None,
        simulated_samples: None,
        vs_simulated: None,
        fidelity: None,
        percent_of_ideal: None,
        cost: None,
    };
    let details = Details {
        gaps,
        lost: lost
            .iter()
            .take(LOST_SHOWN)
            .map(|l| l.to_string())
            .collect(),
    };
    (report, details)
}

/// Prints runs side by side.
pub fn print_table(runs: &[(&RunReport, u64)]) {
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.4}"));
    let rows: Vec<(&str, Vec<String>)> = vec![
        ("trace", runs.iter().map(|(r, _)| r.trace.clone()).collect()),
        ("intervals", col(runs, |r| r.intervals.to_string())),
        ("nodes max", col(runs, |r| r.nodes_max.to_string())),
        (
            "committed steps",
            col(runs, |r| r.committed_steps.to_string()),
        ),
        ("samples", col(runs, |r| r.samples.to_string())),
        ("loss first", col(runs, |r| opt(r.loss_first))),
        ("loss last", col(runs, |r| opt(r.loss_last))),
        ("val loss first", col(runs, |r| opt(r.val_loss_first))),
        ("val loss last", col(runs, |r| opt(r.val_loss_last))),
        (
            "migrations i/e/r/R",
            col(runs, |r| {
                let m = &r.migrations;
                format!("{}/{}/{}/{}", m.intra, m.inter, m.repartition, m.restart)
            }),
        ),
        (
            "migrating (s)",
            col(runs, |r| format!("{:.2}", r.migration_secs)),
        ),
        (
            "lost committed",
            col(runs, |r| r.lost_committed_steps.to_string()),
        ),
        (
            "rolled back",
            col(runs, |r| r.rolled_back_steps.to_string()),
        ),
        (
            "duplicate samples",
            col(runs, |r| r.duplicate_samples.to_string()),
        ),
        (
            "skipped samples",
            runs.iter().map(|(_, gaps)| gaps.to_string()).collect(),
        ),
        (
            "simulated samples",
            col(runs, |r| {
                r.simulated_samples
                    .map_or("-".into(), |x| format!("{x:.0}"))
            }),
        ),
        ("measured/simulated", col(runs, |r| opt(r.vs_simulated))),
        (
            "% of ideal",
            col(runs, |r| {
                r.percent_of_ideal.map_or("-".into(), |x| format!("{x:.1}"))
            }),
        ),
        ("wall (s)", col(runs, |r| format!("{:.1}", r.wall_secs))),
        (
            "leader failover",
            col(runs, |r| {
                r.leader_failover.as_ref().map_or("-".into(), |f| {
                    f.new_leader_after_secs
                        .map_or("no new leader".into(), |s| format!("{s:.1} s"))
                })
            }),
        ),
        (
            "node RSS peak/mean",
            col(runs, |r| {
                r.resources.as_ref().map_or("-".into(), |x| {
                    format!("{:.0}/{:.0} MiB", x.node_peak_mib, x.node_mean_mib)
                })
            }),
        ),
        (
            "all nodes RSS, CPU",
            col(runs, |r| {
                r.resources.as_ref().map_or("-".into(), |x| {
                    format!(
                        "{:.0} MiB, {:.0} s",
                        x.nodes_peak_total_mib, x.nodes_cpu_secs
                    )
                })
            }),
        ),
        (
            "testnet RSS",
            col(runs, |r| {
                r.resources
                    .as_ref()
                    .map_or("-".into(), |x| format!("{:.0} MiB", x.testnet_peak_mib))
            }),
        ),
        (
            "machine-hours, cost",
            col(runs, |r| {
                r.cost.as_ref().map_or("-".into(), |b| {
                    format!("{:.1} h, {:.2}", b.machine_hours, b.cost)
                })
            }),
        ),
        (
            "per M samples, saving",
            col(runs, |r| {
                r.cost.as_ref().map_or("-".into(), |b| {
                    format!(
                        "{}, {}",
                        b.cost_per_million_samples
                            .map_or("-".into(), |v| format!("{v:.2}")),
                        b.saving_vs_on_demand
                            .map_or("-".into(), |v| format!("{:.1} %", 100.0 * v))
                    )
                })
            }),
        ),
        (
            "emulated overrun",
            col(runs, |r| {
                r.emulated.as_ref().map_or("-".into(), |e| {
                    format!(
                        "{:.1}% ({:.1} s, {} at 1/{})",
                        100.0 * e.overrun_fraction,
                        e.overrun_secs,
                        e.profile,
                        e.time_scale
                    )
                })
            }),
        ),
    ];
    print!("{:<20}", "strategy");
    for (r, _) in runs {
        print!(" {:>24}", r.strategy);
    }
    println!();
    for (name, values) in rows {
        print!("{name:<20}");
        for v in values {
            print!(" {v:>24}");
        }
        println!();
    }
    println!("(migrations: intra/inter/repartition/restart)");
}

/// One sentence on what a run shows: the loss, the reconfigurations and the safety checks.
pub fn summary(r: &RunReport) -> String {
    let loss = match (r.loss_first, r.loss_last) {
        (Some(a), Some(b)) => format!(
            "loss {a:.3} -> {b:.3} over {} committed steps",
            r.committed_steps
        ),
        _ => "no committed step".to_string(),
    };
    let loss = match (r.val_loss_first, r.val_loss_last) {
        (Some(a), Some(b)) => format!("{loss} (validation {a:.3} -> {b:.3})"),
        _ => loss,
    };
    let m = &r.migrations;
    let total = m.intra + m.inter + m.repartition + m.restart;
    let safety = if r.lost_committed_steps == 0 && r.duplicate_samples == 0 {
        "no committed step lost, no sample trained twice".to_string()
    } else {
        format!(
            "{} committed steps LOST, {} samples trained twice",
            r.lost_committed_steps, r.duplicate_samples
        )
    };
    let mut rolled_back = match r.rolled_back_steps {
        0 => String::new(),
        n => format!(" ({n} steps rolled back to a checkpoint and trained again)"),
    };
    if let Some(o) = &r.outage {
        let show = |s: Option<u64>| s.map_or("-".to_string(), |s| s.to_string());
        rolled_back.push_str(&format!(
            "; whole-cluster outage after step {}: resumed from the stored checkpoint of step {}, {} steps after",
            show(o.last_step_before),
            show(o.resumed_from_step),
            o.steps_after
        ));
    }
    format!(
        "{}: {loss}; {total} reconfigurations ({} intra, {} inter, {} repartition, {} restart) \
         taking {:.1} s; {safety}{rolled_back}",
        r.strategy, m.intra, m.inter, m.repartition, m.restart, r.migration_secs
    )
}

fn col(runs: &[(&RunReport, u64)], f: impl Fn(&RunReport) -> String) -> Vec<String> {
    runs.iter().map(|(r, _)| f(r)).collect()
}

/// Writes any serialisable report as pretty JSON.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

mod curve;
#[cfg(test)]
mod tests;
