//! The fidelity ledger of a run (the run JSON's `"fidelity"`): where the samples the cluster
//! trained differ from the simulator's account of the same strategy on the same trace, and why.
//!
//! * Per interval: the configuration the cluster ran (the one it held longest) and the one the
//!   simulator chose, the samples each trained (the leader's sample cursor at the interval's
//!   ends), the seconds the cluster stalled and the seconds the simulator charged, both by
//!   time: a stall that outlasts its interval stalls the next (the simulator's charge runs on
//!   likewise), and stalls that overlap (a plan replaced before the cluster trained in it)
//!   count once.
//! * Per reconfiguration: what caused it (the last scenario action since the previous plan, at
//!   most one interval before it), and
//!   its stall split into the step a kill cut off (the last step committed before the kill to
//!   the kill: the step in flight is lost with the killed node), detection (a kill to the plan
//!   committed; notices and arrivals stall nothing before the plan, the old configuration keeps
//!   training), the nodes' restart (the
//!   plan to ready, as the slowest node measured it) and the refill (ready to the first step of
//!   the new plan committed, less one steady step of it), beside the simulator's charge for
//!   that interval.
//! * The job's start: the replay's start to the first committed step, less one steady step (the
//!   cluster forming and entering its first plan), booked to the first interval, where the
//!   simulator charges the start as a restart.
//! * Per configuration: the steady throughput measured (spans of one plan after its first
//!   committed step) and the cost model's.
//! * The gap, in samples, as a sum of terms: the configuration (the model's rate of the
//!   configuration run against the simulator's choice, over each interval), the stalls (the
//!   measured stall at the configuration's model rate against the simulator's charge at its
//!   own), the throughput (measured steady rate against the model's, over the training time),
//!   the steps a rollback to a checkpoint gave up (trained, counted, then trained again),
//!   the samples of the final sequence outside the intervals (committed after the replay's end,
//!   while the testnet collects), and what is left unexplained (poll resolution, commit granularity, stalls no reconfiguration
//!   accounts for). The terms add up to the gap exactly.
//!
//! Times are the run's wall seconds (the timeline's one-second polls bound their resolution);
//! the simulator's seconds are emulated ones and are divided by the time scale.

use std::collections::BTreeMap;

use parcae_api::MigrationKind;
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;
use parcae_strategies::sim::StrategyRun;
use serde::{Deserialize, Serialize};

use crate::ledger::Reconfiguration;
use crate::monitor::{Event, EventKind, Sample};
use crate::predicted::training_pairs;

/// Everything the ledger is computed from.
pub struct Inputs<'a> {
    /// The leader's once-per-second view.
    pub timeline: &'a [Sample],
    /// The scenario's actions.
    pub events: &'a [Event],
    /// The run's reconfigurations.
    pub reconfigurations: &'a [Reconfiguration],
    /// The simulator's run of the same strategy on the replayed trace.
    pub simulated: &'a StrategyRun,
    /// The cost model the simulator ran under.
    pub model: &'a CostModel,
    /// Wall seconds of one replayed interval.
    pub interval_secs: f64,
    /// Emulated seconds per wall second (1 on CPUs).
    pub time_scale: f64,
    /// Samples of the final committed sequence.
    pub samples: u64,
    /// Committed steps a rollback to a checkpoint gave up.
    pub rolled_back_steps: u64,
}

/// The ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    /// The simulator's seconds are divided by this to be the run's wall seconds.
    pub time_scale: f64,
    /// Every replayed interval.
    pub intervals: Vec<IntervalLedger>,
    /// The job's start: seconds from the replay's start to the first committed step, less one
    /// steady step of its configuration (a stall of the first interval).
    #[serde(default)]
    pub start_secs: f64,
    /// Every reconfiguration of the running job.
    pub reconfigurations: Vec<StallLedger>,
    /// Every configuration the cluster trained in.
    pub throughput: Vec<ConfigThroughput>,
    /// The gap, term by term.
    pub gap: GapLedger,
}

/// One interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntervalLedger {
    /// Its index in the replay.
    pub index: u64,
    /// `[D, P]` the cluster held longest (null: none).
    pub config: Option<[u32; 2]>,
    /// `[D, P]` the simulator chose.
    pub simulated_config: [u32; 2],
    /// Samples the cluster trained in it.
    pub samples: f64,
    /// Samples the simulator trained in it.
    pub simulated_samples: f64,
    /// Seconds the cluster's reconfigurations stalled it.
    pub stalled_secs: f64,
    /// Seconds the simulator charged to migration.
    pub charged_secs: f64,
}

/// One reconfiguration's stall.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallLedger {
    /// The plan's epoch.
    pub epoch: u64,
    /// How the nodes moved.
    pub kind: MigrationKind,
    /// The interval whose charge it is held against (the boundary nearest to its plan; the
    /// intervals' stalled seconds are booked by time).
    pub interval: u64,
    /// The scenario action that caused it (null: the planner moved on its own).
    pub cause: Option<EventKind>,
    /// When that action happened.
    pub cause_at_secs: Option<f64>,
    /// When the leader first showed the plan.
    pub plan_at_secs: f64,
    /// The last step committed before a kill to the kill: the step in flight, lost with the
    /// killed node (0 for other causes).
    #[serde(default)]
    pub cut_off_secs: f64,
    /// A kill to the plan (0 for other causes).
    pub detection_secs: f64,
    /// The plan to every node ready (the slowest node's measure).
    pub restart_secs: f64,
    /// Ready to the first step of the plan committed, less one steady step.
    pub refill_secs: f64,
    /// `cut_off_secs + detection_secs + restart_secs + refill_secs`.
    pub stalled_secs: f64,
    /// The simulator's charge in that interval.
    pub charged_secs: f64,
}

/// One configuration's throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigThroughput {
    /// `[D, P]`.
    pub config: [u32; 2],
    /// Steady seconds measured in it.
    pub secs: f64,
    /// Samples trained in those seconds.
    pub samples: f64,
    /// Measured samples per wall second.
    pub measured_per_sec: f64,
    /// The cost model's samples per wall second.
    pub model_per_sec: f64,
}

/// The gap between the cluster and the simulator, in samples, term by term (the terms add up
/// to `gap`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GapLedger {
    /// Samples of the final sequence.
    pub measured: f64,
    /// Samples the simulator trained.
    pub simulated: f64,
    /// `measured - simulated`.
    pub gap: f64,
    /// The configurations run against the simulator's choices, at the model's rates.
    pub configuration: f64,
    /// The measured stalls against the simulator's charges.
    pub stalls: f64,
    /// The measured steady throughput against the model's.
    pub throughput: f64,
    /// The samples of the committed steps a rollback to a checkpoint gave up: trained and
    /// counted in their intervals, then trained again.
    #[serde(default)]
    pub rolled_back: f64,
    /// The final sequence against the samples counted in the intervals: steps committed after
    /// the replay's end (while the testnet collects the nodes' steps) are in the final sequence
    /// and in no interval.
    pub outside_intervals: f64,
    /// What no term explains.
    pub unexplained: f64,
}

impl GapLedger {
    /// The named terms, largest first by size.
    pub fn terms(&self) -> Vec<(&'static str, f64)> {
        let mut terms = vec![
            ("configuration", self.configuration),
            ("stalls", self.stalls),
            ("throughput", self.throughput),
            ("rolled back", self.rolled_back),
            ("outside the intervals", self.outside_intervals),
            ("unexplained", self.unexplained),
        ];
        terms.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
        terms
    }
}

/// The ledger of one run.
pub fn ledger(inputs: &Inputs<'_>) -> Fidelity {
    let rate = |c: ParallelConfig| inputs.model.samples_per_sec(c) * inputs.time_scale;
    let n = inputs.simulated.configs.len();
    let spans = stall_spans(inputs, n);
    let steady = steady_throughput(inputs.timeline, &spans);
    let batch = samples_per_step(inputs.timeline);
    let step_secs = |c: ParallelConfig| {
        let per_sec = steady.get(&c).map_or_else(|| rate(c), |&(s, t)| s / t);
        if per_sec > 0.0 { batch / per_sec } else { 0.0 }
    };
    let start_secs = start_secs(inputs.timeline, step_secs);
    let charged = |i: usize| {
        inputs
            .simulated
            .charged_secs
            .get(i)
            .map_or(0.0, |s| s / inputs.time_scale)
    };
    let stalls: Vec<StallLedger> = spans
        .iter()
        .map(|s| s.ledger(s.config.map_or(0.0, step_secs), charged(s.interval)))
        .collect();
    let stalled = stalled_spans(start_secs, &spans, &stalls);
    let interval = inputs.interval_secs;
    let mut gap = GapLedger {
        measured: inputs.samples as f64,
        simulated: inputs.simulated.samples,
        gap: inputs.samples as f64 - inputs.simulated.samples,
        configuration: 0.0,
        stalls: 0.0,
        throughput: 0.0,
        rolled_back: -(inputs.rolled_back_steps as f64) * batch,
        outside_intervals: 0.0,
        unexplained: 0.0,
    };
    let mut intervals = Vec::with_capacity(n);
    let mut simulated_before = 0.0;
    for i in 0..n {
        let (start, end) = (i as f64 * interval, (i + 1) as f64 * interval);
        let samples = cursor(inputs.timeline, end) - cursor(inputs.timeline, start);
        let simulated_samples = inputs.simulated.cumulative[i] - simulated_before;
        simulated_before = inputs.simulated.cumulative[i];
        let held = held_longest(inputs.timeline, start, end);
        let chosen = inputs.simulated.configs[i];
        let stalled_secs = within(&stalled, start, end);
        let charged_secs = charged(i);
        let model_rate = held.map_or(0.0, rate);
        let measured_rate = held
            .and_then(|c| steady.get(&c))
            .map_or(model_rate, |&(s, t)| s / t);
        gap.configuration += (model_rate - rate(chosen)) * interval;
        gap.stalls -= model_rate * stalled_secs - rate(chosen) * charged_secs;
        gap.throughput += (measured_rate - model_rate) * (interval - stalled_secs);
        gap.outside_intervals -= samples;
        intervals.push(IntervalLedger {
            index: i as u64,
            config: held.map(|c| [c.d, c.p]),
            simulated_config: [chosen.d, chosen.p],
            samples,
            simulated_samples,
            stalled_secs,
            charged_secs,
        });
    }
    gap.outside_intervals += gap.measured;
    gap.unexplained = gap.gap
        - gap.configuration
        - gap.stalls
        - gap.throughput
        - gap.rolled_back
        - gap.outside_intervals;
    let throughput = steady
        .iter()
        .map(|(&c, &(samples, secs))| ConfigThroughput {
            config: [c.d, c.p],
            secs,
            samples,
            measured_per_sec: samples / secs,
            model_per_sec: rate(c),
        })
        .collect();
    Fidelity {
        time_scale: inputs.time_scale,
        intervals,
        start_secs,
        reconfigurations: stalls,
        throughput,
        gap,
    }
}

/// One reconfiguration on the timeline.
struct StallSpan<'a> {
    reconfiguration: &'a Reconfiguration,
    cause: Option<Event>,
    /// When training stopped: the last step committed before the kill that caused the plan,
    /// else the plan (after a notice or an arrival the old configuration trains until the plan
    /// replaces it).
    stopped: f64,
    plan_at: f64,
    first_step_at: f64,
    /// The configuration of the plan (null: the leader showed none).
    config: Option<ParallelConfig>,
    interval: usize,
}

impl StallSpan<'_> {
    /// When the kill that caused the plan came, else the plan.
    fn killed_at(&self) -> f64 {
        match self.cause {
            Some(Event {
                t,
                kind: EventKind::Kill,
            }) => t,
            _ => self.plan_at,
        }
    }

    /// The ledger of the span, given one steady step of its configuration and the simulator's
    /// charge for its interval.
    fn ledger(&self, step_secs: f64, charged_secs: f64) -> StallLedger {
        let r = self.reconfiguration;
        let cut_off_secs = self.killed_at() - self.stopped;
        let detection_secs = self.plan_at - self.killed_at();
        let refill_secs = (self.first_step_at - self.plan_at - r.secs - step_secs).max(0.0);
        StallLedger {
            epoch: r.epoch,
            kind: r.kind,
            interval: self.interval as u64,
            cause: self.cause.map(|e| e.kind),
            cause_at_secs: self.cause.map(|e| e.t),
            plan_at_secs: self.plan_at,
            cut_off_secs,
            detection_secs,
            restart_secs: r.secs,
            refill_secs,
            stalled_secs: cut_off_secs + detection_secs + r.secs + refill_secs,
            charged_secs,
        }
    }
}

/// Every reconfiguration's place on the timeline: its cause (the last scenario action since
/// the previous plan and within one interval before it: an action further back was answered
/// or outlived, and a plan after it is the planner's own move at a boundary), its plan (the first poll in its epoch), its first committed step, and
/// the interval it is booked to (the boundary nearest its plan: notices come a grace period
/// before a boundary, kills and arrivals at it).
fn stall_spans<'a>(inputs: &Inputs<'a>, intervals: usize) -> Vec<StallSpan<'a>> {
    let end = inputs.timeline.last().map_or(0.0, |s| s.t);
    let mut previous_plan = f64::NEG_INFINITY;
    inputs
        .reconfigurations
        .iter()
        .map(|r| {
            let first_view = inputs.timeline.iter().find(|s| s.epoch >= r.epoch);
            let plan_at = first_view.map_or(r.seen_at_secs - r.secs, |s| s.t);
            let since = previous_plan.max(plan_at - inputs.interval_secs);
            let cause = inputs
                .events
                .iter()
                .rev()
                .find(|e| e.t > since && e.t <= plan_at)
                .copied();
            previous_plan = plan_at;
            let stopped = match cause {
                Some(Event {
                    t,
                    kind: EventKind::Kill,
                }) => last_commit(inputs.timeline, t),
                _ => plan_at,
            };
            let first_step_at = inputs
                .timeline
                .iter()
                .find(|s| s.t >= plan_at && s.epoch >= r.epoch && s.step >= r.at_step)
                .map_or(end, |s| s.t);
            let interval = ((plan_at / inputs.interval_secs).round().max(0.0) as usize)
                .min(intervals.saturating_sub(1));
            StallSpan {
                reconfiguration: r,
                cause,
                stopped,
                plan_at,
                first_step_at,
                config: first_view
                    .and_then(|s| s.config)
                    .map(|(d, p)| ParallelConfig::new(d, p)),
                interval,
            }
        })
        .collect()
}

/// The seconds the cluster stalled, as disjoint spans of the timeline: the job's start and each
/// reconfiguration's (from its kill or its plan, for as long as it stalled), overlapping ones
/// merged. A stall that outlasts its interval stalls the next, as the simulator's charge runs
/// on into the next interval, and a plan that replaces another before the cluster trained in it
/// stalls the cluster once, not once per plan.
fn stalled_spans(
    start_secs: f64,
    spans: &[StallSpan<'_>],
    stalls: &[StallLedger],
) -> Vec<(f64, f64)> {
    let mut all: Vec<(f64, f64)> = std::iter::once((0.0, start_secs))
        .chain(
            spans
                .iter()
                .zip(stalls)
                .map(|(s, l)| (s.stopped, s.stopped + l.stalled_secs)),
        )
        .filter(|(a, b)| b > a)
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(all.len());
    for (a, b) in all {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Seconds of the disjoint `spans` within `[start, end)`.
fn within(spans: &[(f64, f64)], start: f64, end: f64) -> f64 {
    spans
        .iter()
        .map(|&(a, b)| (b.min(end) - a.max(start)).max(0.0))
        .sum()
}

/// Samples and seconds per configuration outside every stall (a kill or a plan to the plan's
/// first committed step) and after the first step of the run.
fn steady_throughput(
    timeline: &[Sample],
    spans: &[StallSpan<'_>],
) -> BTreeMap<ParallelConfig, (f64, f64)> {
    let stalled = |a: f64, b: f64| spans.iter().any(|s| a < s.first_step_at && b > s.stopped);
    let mut acc: BTreeMap<ParallelConfig, (f64, f64)> = BTreeMap::new();
    for (c, a, b) in training_pairs(timeline) {
        if c.d > 0 && a.step > 0 && !stalled(a.t, b.t) {
            let e = acc.entry(c).or_default();
            e.0 += (b.samples - a.samples) as f64;
            e.1 += b.t - a.t;
        }
    }
    acc.retain(|_, (samples, secs)| *secs > 0.0 && *samples > 0.0);
    acc
}

/// Seconds from the replay's start to its first committed step, less one steady step of the
/// configuration that committed it (`step_secs`); 0 without a step.
fn start_secs(timeline: &[Sample], step_secs: impl Fn(ParallelConfig) -> f64) -> f64 {
    let Some(first) = timeline.iter().find(|s| s.samples > 0) else {
        return 0.0;
    };
    let step = first
        .config
        .filter(|&(d, _)| d > 0)
        .map_or(0.0, |(d, p)| step_secs(ParallelConfig::new(d, p)));
    (first.t - step).max(0.0)
}

/// Samples per committed step over the timeline (the global batch; 0 without steps).
fn samples_per_step(timeline: &[Sample]) -> f64 {
    let (samples, steps) = training_pairs(timeline)
        .filter(|(_, a, b)| b.step > a.step)
        .fold((0.0, 0.0), |(s, n), (_, a, b)| {
            (
                s + (b.samples - a.samples) as f64,
                n + (b.step - a.step) as f64,
            )
        });
    if steps > 0.0 { samples / steps } else { 0.0 }
}

/// When the last step committed by `t` was first seen (`t` without one), in the plan of `t`:
/// a kill at `t` cuts off the step in flight, which trained from then on. Polls bound the
/// resolution (the commit came up to one poll before it was seen).
fn last_commit(timeline: &[Sample], t: f64) -> f64 {
    let Some(at) = timeline.iter().take_while(|s| s.t <= t).last() else {
        return t;
    };
    timeline
        .iter()
        .find(|s| s.epoch == at.epoch && s.step == at.step)
        .map_or(t, |s| s.t.min(t))
}

/// The leader's sample cursor at `t` (the last poll at or before it; 0 before the first).
fn cursor(timeline: &[Sample], t: f64) -> f64 {
    timeline
        .iter()
        .take_while(|s| s.t <= t)
        .last()
        .map_or(0.0, |s| s.samples as f64)
}

/// The configuration held longest in `[start, end)` (each poll's holds until the next).
fn held_longest(timeline: &[Sample], start: f64, end: f64) -> Option<ParallelConfig> {
    let mut held: BTreeMap<ParallelConfig, f64> = BTreeMap::new();
    for w in timeline.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let span = b.t.min(end) - a.t.max(start);
        if let Some((d, p)) = a.config
            && span > 0.0
            && d > 0
        {
            *held.entry(ParallelConfig::new(d, p)).or_default() += span;
        }
    }
    held.into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

/// One line on the gap and its largest terms.
pub fn summary(strategy: &str, f: &Fidelity) -> String {
    let terms: Vec<String> = f
        .gap
        .terms()
        .iter()
        .map(|(name, v)| format!("{name} {v:+.0}"))
        .collect();
    // A fold from +0.0: an empty `sum()` of floats is -0.0, which would print as such.
    let sum = |g: fn(&StallLedger) -> f64| f.reconfigurations.iter().map(g).fold(0.0, |a, v| a + v);
    format!(
        "fidelity ({strategy}): measured - simulated = {:+.0} samples = {}; stalls: start {:.1} s, \
         cut off {:.1} s, detection {:.1} s, restart {:.1} s, refill {:.1} s against {:.1} s charged",
        f.gap.gap,
        terms.join(", "),
        f.start_secs,
        sum(|s| s.cut_off_secs),
        sum(|s| s.detection_secs),
        sum(|s| s.restart_secs),
        sum(|s| s.refill_secs),
        f.intervals.iter().map(|i| i.charged_secs).sum::<f64>(),
    )
}

#[cfg(test)]
mod tests;
