//! Throughput of `(D, P)` computed from per-layer costs (spec 2.3-2.4): a 1F1B event
//! simulation of one pipeline, the data-parallel all-reduce and the optimizer step, and a
//! memory feasibility check. This is how a model the nodes measured themselves is planned
//! without an offline profiling campaign.

use super::links::GRADIENT_BYTES_PER_PARAM;
use super::spec::{Family, LayerCost, ModelSpec};
use super::throughput::ThroughputTable;
use super::transfer::TransferModel;
use crate::config::ParallelConfig;

mod one_f_one_b;
mod stage_cost;
use one_f_one_b::one_f_one_b;
pub(crate) use stage_cost::StageCost;

/// Bytes in a MiB (the profiles give sizes and rates in MiB).
pub const MIB: f64 = 1024.0 * 1024.0;

/// Per-node limits of the cluster the analytic model plans for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hardware {
    /// Usable accelerator memory per node, MiB (Parcae's V100s: 15.5 GiB).
    pub memory_mb: f64,
    /// All-reduce bandwidth, MiB per ms (10 Gb/s ring: 1.25).
    pub allreduce_mb_per_ms: f64,
}

impl Default for Hardware {
    fn default() -> Self {
        Self {
            memory_mb: 15.5 * 1024.0,
            allreduce_mb_per_ms: 1.25,
        }
    }
}

/// Builds the throughput table of every `(d, p)` with `d * p <= max_nodes` that fits in memory.
pub fn throughput_table(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    max_nodes: u32,
) -> ThroughputTable {
    let max_p = spec.layers.len().saturating_sub(1).max(1) as u32;
    let mut rows = Vec::new();
    for p in 1..=max_p.min(max_nodes) {
        let Some(stages) = stage_costs(spec, hw, p) else {
            continue;
        };
        for d in 1..=max_nodes / p {
            if spec.admits(d, p) || spec.depths.is_empty() {
                let rate = samples_per_sec(spec, hw, transfer, &stages, d);
                rows.push((ParallelConfig::new(d, p), rate));
            }
        }
    }
    ThroughputTable::from_rows(rows)
}

/// Micro-batches each of `d` pipelines runs in one iteration.
pub(crate) fn micro_batches(spec: &ModelSpec, d: u32) -> u32 {
    (spec.global_batch / spec.micro_batch.max(1))
        .div_ceil(d)
        .max(1)
}

/// Stage sums for depth `p` (layers split by count), or `None` when a stage does not fit in
/// memory.
fn stage_costs(spec: &ModelSpec, hw: Hardware, p: u32) -> Option<Vec<StageCost>> {
    let p = p as usize;
    spec.partition(p as u32)
        .windows(2)
        .enumerate()
        .map(|(s, w)| stage_cost(spec, &spec.layers[w[0]..w[1]], hw.memory_mb, s, p))
        .collect()
}

/// Sums of stage `s` of `p` holding `layers` (timed on its device) on a device of `memory_mb`,
/// or `None` when they do not fit ([`StageSums::cost`]).
pub(crate) fn stage_cost(
    spec: &ModelSpec,
    layers: &[LayerCost],
    memory_mb: f64,
    s: usize,
    p: usize,
) -> Option<StageCost> {
    let mut sums = StageSums::default();
    for l in layers {
        sums.add(l);
    }
    sums.cost(spec, memory_mb, p - s)
}

/// The running sums of a stage's layers, so that a search over splits grows a stage one layer
/// at a time instead of summing every candidate afresh.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StageSums {
    sums: StageCost,
    acts: f64,
    peak_block: f64,
    layers: usize,
}

impl StageSums {
    /// Takes one more layer into the stage.
    pub(crate) fn add(&mut self, l: &LayerCost) {
        self.sums.forward_ms += l.forward_ms;
        self.sums.backward_ms += l.backward_ms;
        self.sums.optimizer_ms += l.optimizer_ms;
        self.sums.params += l.params;
        self.acts += l.activation_mb;
        self.peak_block = self.peak_block.max(l.activation_mb);
        self.layers += 1;
    }

    /// The stage's costs on a device of `memory_mb`, or `None` when its weights, optimizer
    /// state and recomputed activations do not fit; a stage that cannot keep the activations of
    /// its micro-batches `in_flight` (1F1B: stage `s` of `p` keeps `p - s`) recomputes them, a
    /// second forward inside its backward.
    pub(crate) fn cost(
        &self,
        spec: &ModelSpec,
        memory_mb: f64,
        in_flight: usize,
    ) -> Option<StageCost> {
        let mut c = self.sums;
        let states_mb = c.params * 4.0 / MIB * f64::from(spec.optimizer_states + 1);
        if !self.fits_recomputed(spec, memory_mb - states_mb) {
            return None;
        }
        if in_flight as f64 * self.acts > memory_mb {
            c.backward_ms += c.forward_ms;
        }
        Some(c)
    }

    /// Whether the stage's activations, recomputed in chunks, fit in `free_mb`: a transformer
    /// keeps `chunk` blocks' activations and the boundary of every chunk, at the best chunk
    /// size (a stage of no layers fits nowhere); a CNN keeps them all.
    fn fits_recomputed(&self, spec: &ModelSpec, free_mb: f64) -> bool {
        let Family::Transformer = spec.family else {
            return self.acts <= free_mb;
        };
        let boundary_mb = spec.boundary_bytes / MIB;
        let kept = |chunk: usize| {
            chunk as f64 * self.peak_block + (self.layers.div_ceil(chunk)) as f64 * boundary_mb
        };
        // Every chunk size keeps at least one block and one boundary, and the smallest chunk
        // (a boundary per block, small beside a block) is often the best: the search over
        // every size is needed only between the two (a split search asks this of every stage
        // it weighs).
        if self.layers == 0 || self.peak_block + boundary_mb > free_mb {
            return false;
        }
        if kept(1) <= free_mb {
            return true;
        }
        (1..=self.layers).map(kept).fold(f64::INFINITY, f64::min) <= free_mb
    }
}

/// Samples per second of `d` pipelines over `stages`.
pub(crate) fn samples_per_sec(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    stages: &[StageCost],
    d: u32,
) -> f64 {
    rate_of(spec, d, iteration_ms(spec, hw, transfer, stages, d))
}

/// Samples per second of `d` pipelines whose iteration takes `ms`.
pub(crate) fn rate_of(spec: &ModelSpec, d: u32, ms: f64) -> f64 {
    let samples = f64::from(spec.micro_batch * d * micro_batches(spec, d));
    samples / (ms / 1000.0)
}

/// At least the samples per second of `d` pipelines over `stages` ([`samples_per_sec`]), from
/// a bound on the iteration that needs no schedule: a search over many pipelines simulates
/// only those whose bound beats the best found.
pub(crate) fn samples_per_sec_bound(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    stages: &[StageCost],
    d: u32,
) -> f64 {
    let m = micro_batches(spec, d) as usize;
    let comm = boundary_ms(spec, transfer, stages);
    let p = stages.len();
    let work = StageCost::pace_ms;
    // Stage s works no sooner than micro-batch 0 reaches it, then m forwards and backwards;
    // once it is past its warm-up, every two of its backwards also wait on a forward and a
    // backward of the next stage, with a hop each way (its backward i + 1 follows its forward
    // i - 1 + warm-up, that forward's on the next stage, and the next stage's backward i + 1).
    // After stage s's last backward, the gradient still walks back to stage 0, which ends no
    // sooner.
    let mut behind: f64 =
        stages.iter().map(work).sum::<f64>() + 2.0 * p.saturating_sub(1) as f64 * comm;
    let (mut before_fwd, mut before_bwd) = (0.0, 0.0);
    let mut first = 0.0f64;
    let mut ms = 0.0f64;
    for (s, c) in stages.iter().enumerate() {
        let mut end = before_fwd + m as f64 * work(c);
        let warm = (p - s).min(m);
        if let Some(next) = stages.get(s + 1).filter(|_| m > warm) {
            let steps = (m - warm).div_ceil(2);
            let cycle = work(c) + work(next) + 2.0 * comm;
            let rest = (m - 1 - 2 * steps) as f64 * c.backward_ms;
            end = end.max(before_fwd + behind + steps as f64 * cycle + rest);
        }
        first = first.max(end + before_bwd);
        if s > 0 {
            ms = ms.max(end + finish_ms(spec, hw, stages, s, c, d));
        }
        behind -= work(c) + if s + 1 < p { 2.0 * comm } else { 0.0 };
        before_fwd += c.forward_ms + comm;
        before_bwd += c.backward_ms + comm;
    }
    if let Some(c) = stages.first() {
        ms = ms.max(first + finish_ms(spec, hw, stages, 0, c, d));
    }
    rate_of(spec, d, ms)
}

/// One training iteration of `d` pipelines over `stages`, ms.
fn iteration_ms(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    stages: &[StageCost],
    d: u32,
) -> f64 {
    let ends = schedule_ends(spec, transfer, stages, micro_batches(spec, d));
    iteration_after(spec, hw, stages, &ends, d)
}

/// When each stage ends its part of a 1F1B schedule of `m` micro-batches over `stages`, ms:
/// all an iteration simulates, and the same for every `d` of `m` micro-batches.
pub(crate) fn schedule_ends(
    spec: &ModelSpec,
    transfer: &TransferModel,
    stages: &[StageCost],
    m: u32,
) -> Vec<f64> {
    one_f_one_b(stages, m as usize, boundary_ms(spec, transfer, stages))
}

/// Samples per second of `d` pipelines over `stages` whose schedule ends at `ends`
/// ([`schedule_ends`]): each stage then all-reduces and steps.
pub(crate) fn samples_per_sec_after(
    spec: &ModelSpec,
    hw: Hardware,
    stages: &[StageCost],
    ends: &[f64],
    d: u32,
) -> f64 {
    rate_of(spec, d, iteration_after(spec, hw, stages, ends, d))
}

/// The iteration of `d` pipelines over `stages` whose schedule ends at `ends`, ms.
fn iteration_after(
    spec: &ModelSpec,
    hw: Hardware,
    stages: &[StageCost],
    ends: &[f64],
    d: u32,
) -> f64 {
    iteration_after_rings(spec, hw, stages, ends, d, |_| hw.allreduce_mb_per_ms)
}

/// [`iteration_after`] with stage `s` all-reducing at `ring_mb_per_ms(s)`: stages whose
/// replicas lie in different zones reduce over the slower link between them.
pub(crate) fn iteration_after_rings(
    spec: &ModelSpec,
    hw: Hardware,
    stages: &[StageCost],
    ends: &[f64],
    d: u32,
    ring_mb_per_ms: impl Fn(usize) -> f64,
) -> f64 {
    ends.iter()
        .zip(stages)
        .enumerate()
        .map(|(s, (end, c))| {
            let ring = Hardware {
                allreduce_mb_per_ms: ring_mb_per_ms(s),
                ..hw
            };
            end + finish_ms(spec, ring, stages, s, c, d)
        })
        .fold(0.0, f64::max)
}

/// The transfer of one boundary activation or gradient between neighbouring stages, ms.
fn boundary_ms(spec: &ModelSpec, transfer: &TransferModel, stages: &[StageCost]) -> f64 {
    if stages.len() > 1 {
        transfer.cost_ms(spec.boundary_bytes)
    } else {
        0.0
    }
}

/// What stage `s` does after its last backward: all-reduce its gradients over its replicas
/// ([`stage_allreduce_ms`]), then step.
fn finish_ms(
    spec: &ModelSpec,
    hw: Hardware,
    stages: &[StageCost],
    s: usize,
    c: &StageCost,
    d: u32,
) -> f64 {
    let first_of_several = s == 0 && stages.len() > 1;
    stage_allreduce_ms(spec, c.params, d, first_of_several, hw.allreduce_mb_per_ms) + c.optimizer_ms
}

/// The ring all-reduce of a stage's gradients (`params` parameters) over its `d` replicas at
/// `allreduce_mb_per_ms`, ms: the first stage of a transformer split into several reduces
/// with the last stage's replicas too, a ring of `2 d`, for the tied embedding (spec 2.4). The
/// emulated accelerator paces its ring by this, so that the emulated cluster and the
/// simulator run the same hardware.
pub fn stage_allreduce_ms(
    spec: &ModelSpec,
    params: f64,
    d: u32,
    first_of_several: bool,
    allreduce_mb_per_ms: f64,
) -> f64 {
    let group = if first_of_several && spec.family == Family::Transformer {
        2 * d
    } else {
        d
    };
    allreduce_ms(
        params * GRADIENT_BYTES_PER_PARAM,
        group,
        allreduce_mb_per_ms,
    )
}

/// Ring all-reduce of `bytes` over `width` replicas at `mb_per_ms`, ms.
fn allreduce_ms(bytes: f64, width: u32, mb_per_ms: f64) -> f64 {
    if width <= 1 {
        return 0.0;
    }
    let w = f64::from(width);
    bytes / MIB / mb_per_ms * 2.0 * (w - 1.0) / w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::builtin::builtin;

    #[test]
    fn the_first_stage_of_several_reduces_with_the_last_stage_s_replicas() {
        let (spec, _) = builtin("gpt-1.5b").unwrap();
        let mib = 1e8 * GRADIENT_BYTES_PER_PARAM / MIB;
        let ms = |d, first| stage_allreduce_ms(&spec, 1e8, d, first, 1.25);
        assert!((ms(4, false) - mib / 1.25 * 2.0 * 3.0 / 4.0).abs() < 1e-9);
        assert!((ms(4, true) - mib / 1.25 * 2.0 * 7.0 / 8.0).abs() < 1e-9);
        assert_eq!(ms(1, false), 0.0);
        assert!((ms(1, true) - mib / 1.25).abs() < 1e-9);
    }

    proptest::proptest! {
        /// The bound a search prunes by is never below the simulated schedule's rate, whatever
        /// the stages, their links and the number of pipelines.
        #[test]
        fn the_bound_is_never_below_the_schedule(
            stages in proptest::collection::vec((0.1f64..20.0, 0.1f64..40.0, 0.0f64..5.0, 0.0f64..1e8), 1..12),
            d in 1u32..40,
            latency_ms in 0.0f64..20.0,
        ) {
            let (spec, _) = builtin("gpt-1.5b").unwrap();
            let stages: Vec<StageCost> = stages
                .iter()
                .map(|&(forward_ms, backward_ms, optimizer_ms, params)| StageCost {
                    forward_ms,
                    backward_ms,
                    optimizer_ms,
                    params,
                })
                .collect();
            let transfer = TransferModel::Linear { latency_ms, bytes_per_sec: 1.25e9 };
            let hw = Hardware::default();
            let rate = samples_per_sec(&spec, hw, &transfer, &stages, d);
            let bound = samples_per_sec_bound(&spec, hw, &transfer, &stages, d);
            proptest::prop_assert!(bound >= rate * (1.0 - 1e-12), "{bound} < {rate}");
        }
    }

    #[test]
    fn gpt_small_depths_do_not_fit_and_deep_ones_do() {
        let (spec, _) = builtin("gpt-1.5b").unwrap();
        let t = throughput_table(
            &spec,
            Hardware::default(),
            &TransferModel::Profiled10Gbps,
            32,
        );
        assert_eq!(t.samples_per_sec(ParallelConfig::new(1, 2)), 0.0);
        let deep = t.samples_per_sec(ParallelConfig::new(4, 8));
        assert!(deep > 10.0 && deep < 200.0, "{deep}");
        assert!(t.samples_per_sec(ParallelConfig::new(2, 8)) < deep);
    }
}
