//! Pipelines over unequal devices: stages whose layer counts differ, so that a faster device,
//! or one with more memory, holds more of the model.
//!
//! A pipeline runs at the pace of its slowest stage. Parcae, Bamboo and Oobleck split the
//! layers evenly because their nodes are alike; on a fleet of mixed instance types an even
//! split leaves every faster device waiting on the slowest one. [`balanced_bounds`] splits the
//! layers of one pipeline, whose stage `s` runs on `devices[s]`, so that the slowest stage's
//! forward and backward of one micro-batch is as short as it can be, each stage within its
//! device's memory (weights, gradients, optimizer moments and the activations 1F1B keeps in
//! flight, as [`super::analytic`] prices them); [`samples_per_sec`] prices `d` such pipelines
//! with the same 1F1B simulation and all-reduce as the even split's table.

use super::analytic::{self, Hardware, StageCost, stage_cost};
use super::spec::{LayerCost, ModelSpec};
use super::split::{Splits, StageDevice, join};
use super::transfer::TransferModel;

/// One device kind as the cost model sees it: the job's layers timed on it, and its memory.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCosts {
    /// Name in reports (an instance type, a card).
    pub name: String,
    /// The job's layers as this device runs them, in the spec's order.
    pub layers: Vec<LayerCost>,
    /// Usable accelerator memory, MiB.
    pub memory_mb: f64,
}

impl DeviceCosts {
    /// The device the spec's layers were timed on, with `memory_mb` of memory.
    pub fn profiled(spec: &ModelSpec, name: &str, memory_mb: f64) -> Self {
        Self {
            name: name.into(),
            layers: spec.layers.clone(),
            memory_mb,
        }
    }

    /// A device derived from this one: every layer's forward, backward and optimizer step
    /// `speed` times as fast, with `memory_mb` of memory (a card known only by its datasheet,
    /// until `parcae-node profile` measures it).
    pub fn derived(&self, name: &str, speed: f64, memory_mb: f64) -> Self {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerCost {
                forward_ms: l.forward_ms / speed,
                backward_ms: l.backward_ms / speed,
                optimizer_ms: l.optimizer_ms / speed,
                ..*l
            })
            .collect();
        Self {
            name: name.into(),
            layers,
            memory_mb,
        }
    }
}

/// Sums of stage `s` of the pipeline over `devices` holding layers `from..to`, timed on its
/// device, or `None` when they do not fit its memory.
fn stage_on(
    spec: &ModelSpec,
    devices: &[&DeviceCosts],
    s: usize,
    from: usize,
    to: usize,
) -> Option<StageCost> {
    let device = devices[s];
    stage_cost(
        spec,
        device.layers.get(from..to)?,
        device.memory_mb,
        s,
        devices.len(),
    )
}

/// Stage bounds `[0, b1, ..., L]` of one pipeline whose stage `s` runs on `devices[s]`: each
/// stage holds at least one layer and fits its device, and the slowest stage's forward plus
/// backward of one micro-batch is the least any such split gives (`Splits::search`). `None`
/// when no split fits, or with more stages than layers.
pub fn balanced_bounds(spec: &ModelSpec, devices: &[&DeviceCosts]) -> Option<Vec<usize>> {
    let (layers, p) = (spec.layers.len(), devices.len());
    if p == 0 || p > layers || devices.iter().any(|d| d.layers.len() != layers) {
        return None;
    }
    let splits = Splits::search(
        spec,
        p,
        false,
        |s| layers - (p - s),
        |s| StageDevice {
            layers: &devices[s].layers,
            memory_mb: devices[s].memory_mb,
            in_flight: p - s,
        },
    );
    splits
        .pace(p, layers)
        .is_finite()
        .then(|| splits.bounds(p, layers))
}

/// The split search of `device` as the first block of a `p`-stage pipeline: its leading
/// stages, for every count of them up to `p - 1` (for [`join`]).
pub(crate) fn heads(spec: &ModelSpec, device: &DeviceCosts, p: usize) -> Splits {
    let layers = spec.layers.len();
    Splits::search(
        spec,
        p.saturating_sub(1),
        false,
        |s| layers.saturating_sub(p - s),
        |s| StageDevice {
            layers: &device.layers,
            memory_mb: device.memory_mb,
            in_flight: p - s,
        },
    )
}

/// The split search of `device` as the last block of any pipeline: up to `stages` trailing
/// stages (for [`join`]).
pub(crate) fn tails(spec: &ModelSpec, device: &DeviceCosts, stages: usize) -> Splits {
    let layers = spec.layers.len();
    Splits::search(
        spec,
        stages,
        true,
        |_| layers.saturating_sub(1),
        |s| StageDevice {
            layers: &device.layers,
            memory_mb: device.memory_mb,
            in_flight: s + 1,
        },
    )
}

/// One kind's part in a pipeline over two kinds: its searches as the first block ([`heads`] of
/// the pipeline's depth) and as the last ([`tails`]), and how many stages it runs.
pub(crate) struct Part<'s> {
    /// The kind as the first block.
    pub heads: &'s Splits,
    /// The kind as the last block.
    pub tails: &'s Splits,
    /// Its stages in the pipeline.
    pub stages: usize,
}

/// The better of the two block orders of a pipeline over kinds `a` and `b` (`a` first on a
/// tie): whether `a` goes first, and the stage bounds. The order matters through memory alone:
/// the stages before others keep more micro-batches' activations in flight, and the first and
/// last hold the embedding and the head. `None` when neither order fits.
pub(crate) fn arrange_two(a: Part<'_>, b: Part<'_>) -> Option<(bool, Vec<usize>)> {
    let a_first = join(a.heads, a.stages, b.tails, b.stages);
    let b_first = join(b.heads, b.stages, a.tails, a.stages);
    match (a_first, b_first) {
        (Some((x, _)), Some((y, bounds))) if y < x => Some((false, bounds)),
        (Some((_, bounds)), _) => Some((true, bounds)),
        (None, other) => other.map(|(_, bounds)| (false, bounds)),
    }
}

/// The stage order and bounds of one pipeline of `a.1` stages on `a.0` and `b.1` on `b.0`, in
/// the better block order (`arrange_two`), each kind at least one stage; `None` when neither
/// order fits. What [`arrange`] finds for two kinds, with two split searches per kind instead
/// of one per order.
pub fn arrange_pair<'a>(
    spec: &ModelSpec,
    a: (&'a DeviceCosts, usize),
    b: (&'a DeviceCosts, usize),
) -> Option<(Vec<&'a DeviceCosts>, Vec<usize>)> {
    let p = a.1 + b.1;
    let searches =
        [a, b].map(|(device, stages)| (heads(spec, device, p), tails(spec, device, stages)));
    let part = |i: usize, stages: usize| Part {
        heads: &searches[i].0,
        tails: &searches[i].1,
        stages,
    };
    let (a_first, bounds) = arrange_two(part(0, a.1), part(1, b.1))?;
    let (first, second) = if a_first { (a, b) } else { (b, a) };
    let devices = std::iter::repeat_n(first.0, first.1)
        .chain(std::iter::repeat_n(second.0, second.1))
        .collect();
    Some((devices, bounds))
}

/// Most device kinds one pipeline is arranged over: their orders are tried one by one.
pub const MAX_KINDS: usize = 6;

/// The stage order and bounds of one pipeline over `kinds` (each a device kind and how many of
/// the pipeline's stages run on it): the kinds in contiguous blocks, in the order whose
/// [`balanced_bounds`] leave the slowest stage fastest (the first such order on a tie). The
/// order matters through memory alone: the stages before others keep more micro-batches'
/// activations in flight, and the first and last hold the embedding and the head. `None` with
/// no stages, more than [`MAX_KINDS`] kinds, or no order that fits.
pub fn arrange<'a>(
    spec: &ModelSpec,
    kinds: &[(&'a DeviceCosts, usize)],
) -> Option<(Vec<&'a DeviceCosts>, Vec<usize>)> {
    if kinds.len() > MAX_KINDS {
        return None;
    }
    let mut order: Vec<usize> = (0..kinds.len()).collect();
    let mut best: Option<(f64, Vec<&DeviceCosts>, Vec<usize>)> = None;
    loop {
        let devices: Vec<&DeviceCosts> = order
            .iter()
            .flat_map(|&k| std::iter::repeat_n(kinds[k].0, kinds[k].1))
            .collect();
        if let Some(bounds) = balanced_bounds(spec, &devices) {
            let pace = slowest_pace(spec, &devices, &bounds);
            if best.as_ref().is_none_or(|(b, _, _)| pace < *b) {
                best = Some((pace, devices, bounds));
            }
        }
        if !next_permutation(&mut order) {
            break;
        }
    }
    best.map(|(_, devices, bounds)| (devices, bounds))
}

/// The slowest stage's pace under `bounds` (each stage known to fit).
fn slowest_pace(spec: &ModelSpec, devices: &[&DeviceCosts], bounds: &[usize]) -> f64 {
    bounds
        .windows(2)
        .enumerate()
        .filter_map(|(s, w)| stage_on(spec, devices, s, w[0], w[1]))
        .map(|c| c.pace_ms())
        .fold(0.0, f64::max)
}

/// Steps `order` to the next permutation in lexicographic order; false after the last.
fn next_permutation(order: &mut [usize]) -> bool {
    let Some(i) = order.windows(2).rposition(|w| w[0] < w[1]) else {
        return false;
    };
    let j = order.iter().rposition(|&x| x > order[i]).unwrap_or(i);
    order.swap(i, j);
    order[i + 1..].reverse();
    true
}

/// The stage sums of one pipeline with stage `s` on `devices[s]` holding the layers between
/// `bounds[s]` and `bounds[s + 1]`; `None` when a stage does not fit its device or the bounds do
/// not split the model into `devices.len()` stages.
pub(crate) fn stages_of(
    spec: &ModelSpec,
    devices: &[&DeviceCosts],
    bounds: &[usize],
) -> Option<Vec<StageCost>> {
    let splits = bounds.len() == devices.len() + 1
        && bounds.first() == Some(&0)
        && bounds.last() == Some(&spec.layers.len())
        && bounds.windows(2).all(|w| w[0] < w[1]);
    if !splits {
        return None;
    }
    bounds
        .windows(2)
        .enumerate()
        .map(|(s, w)| stage_on(spec, devices, s, w[0], w[1]))
        .collect()
}

/// Samples per second of `d` pipelines, each with stage `s` on `devices[s]` holding the layers
/// between `bounds[s]` and `bounds[s + 1]`, over links of `allreduce_mb_per_ms` (the
/// all-reduce) and `transfer` (activations between stages); `None` when a stage does not fit
/// its device or the bounds do not split the model into `devices.len()` stages.
pub fn samples_per_sec(
    spec: &ModelSpec,
    devices: &[&DeviceCosts],
    bounds: &[usize],
    d: u32,
    allreduce_mb_per_ms: f64,
    transfer: &TransferModel,
) -> Option<f64> {
    if d == 0 {
        return None;
    }
    let stages = stages_of(spec, devices, bounds)?;
    Some(analytic::samples_per_sec(
        spec,
        link(allreduce_mb_per_ms),
        transfer,
        &stages,
        d,
    ))
}

/// [`samples_per_sec`] of `d` pipelines over `stages` ([`stages_of`]) whose 1F1B schedule
/// ends at `ends` ([`analytic::schedule_ends`]), all-reducing at `allreduce_mb_per_ms`.
pub(crate) fn rate_after(
    spec: &ModelSpec,
    stages: &[StageCost],
    ends: &[f64],
    d: u32,
    allreduce_mb_per_ms: f64,
) -> f64 {
    analytic::samples_per_sec_after(spec, link(allreduce_mb_per_ms), stages, ends, d)
}

/// One iteration of `d` pipelines over `stages` whose 1F1B schedule ends at `ends`,
/// all-reducing at `allreduce_mb_per_ms`, ms.
pub(crate) fn iteration_after(
    spec: &ModelSpec,
    stages: &[StageCost],
    ends: &[f64],
    d: u32,
    allreduce_mb_per_ms: f64,
) -> f64 {
    analytic::iteration_after_rings(spec, link(0.0), stages, ends, d, |_| allreduce_mb_per_ms)
}

/// Samples per second of `d` pipelines of which each runs one of `pipelines` (its stages and
/// the ends of their 1F1B schedule), stage `s` of every one all-reducing at
/// `ring_mb_per_ms(s)`: the step waits for the slowest.
pub(crate) fn rate_after_rings(
    spec: &ModelSpec,
    pipelines: &[(&[StageCost], &[f64])],
    d: u32,
    ring_mb_per_ms: impl Fn(usize) -> f64 + Copy,
) -> f64 {
    let iteration = pipelines
        .iter()
        .map(|(stages, ends)| {
            analytic::iteration_after_rings(spec, link(0.0), stages, ends, d, ring_mb_per_ms)
        })
        .fold(0.0, f64::max);
    analytic::rate_of(spec, d, iteration)
}

/// At least [`samples_per_sec`] of `d` pipelines over `stages` ([`stages_of`]), without
/// simulating their schedule.
pub(crate) fn samples_per_sec_bound(
    spec: &ModelSpec,
    stages: &[StageCost],
    d: u32,
    allreduce_mb_per_ms: f64,
    transfer: &TransferModel,
) -> f64 {
    analytic::samples_per_sec_bound(spec, link(allreduce_mb_per_ms), transfer, stages, d)
}

/// A link of `allreduce_mb_per_ms` with no memory limit: each stage's fit was checked on its
/// own device.
fn link(allreduce_mb_per_ms: f64) -> Hardware {
    Hardware {
        memory_mb: f64::INFINITY,
        allreduce_mb_per_ms,
    }
}

#[cfg(test)]
mod tests;
