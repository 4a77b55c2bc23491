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

/// The time a stage holds its device for one micro-batch, which paces the whole pipeline.
fn pace_ms(c: &StageCost) -> f64 {
    c.forward_ms + c.backward_ms
}

/// Stage bounds `[0, b1, ..., L]` of one pipeline whose stage `s` runs on `devices[s]`: each
/// stage holds at least one layer and fits its device, and the slowest stage's forward plus
/// backward of one micro-batch is the least any such split gives (a dynamic program over the
/// split points, O(p L^2) stage sums). `None` when no split fits, or with more stages than
/// layers.
pub fn balanced_bounds(spec: &ModelSpec, devices: &[&DeviceCosts]) -> Option<Vec<usize>> {
    let (layers, p) = (spec.layers.len(), devices.len());
    if p == 0 || p > layers || devices.iter().any(|d| d.layers.len() != layers) {
        return None;
    }
    // slowest[s][j]: the least pace of stages 0..s holding layers 0..j; from[s][j]: where
    // stage s - 1 starts in that split.
    let mut slowest = vec![vec![f64::INFINITY; layers + 1]; p + 1];
    let mut from = vec![vec![0usize; layers + 1]; p + 1];
    slowest[0][0] = 0.0;
    for s in 1..=p {
        for j in s..=layers - (p - s) {
            // Stage s - 1 grows as its start `i` moves back, and a larger stage is never
            // faster nor smaller: once it does not fit, or is alone slower than the best split
            // found, no earlier start can do better. Ties go to the earliest start.
            for i in (s - 1..j).rev() {
                let Some(c) = stage_on(spec, devices, s - 1, i, j) else {
                    break;
                };
                let own = pace_ms(&c);
                if own > slowest[s][j] {
                    break;
                }
                let pace = slowest[s - 1][i].max(own);
                if pace <= slowest[s][j] && pace.is_finite() {
                    slowest[s][j] = pace;
                    from[s][j] = i;
                }
            }
        }
    }
    if !slowest[p][layers].is_finite() {
        return None;
    }
    let mut bounds = vec![layers];
    let mut j = layers;
    for s in (1..=p).rev() {
        j = from[s][j];
        bounds.push(j);
    }
    bounds.reverse();
    Some(bounds)
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
        .map(|c| pace_ms(&c))
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
    let splits = bounds.len() == devices.len() + 1
        && bounds.first() == Some(&0)
        && bounds.last() == Some(&spec.layers.len())
        && bounds.windows(2).all(|w| w[0] < w[1]);
    if !splits || d == 0 {
        return None;
    }
    let stages = bounds
        .windows(2)
        .enumerate()
        .map(|(s, w)| stage_on(spec, devices, s, w[0], w[1]))
        .collect::<Option<Vec<_>>>()?;
    let link = Hardware {
        memory_mb: f64::INFINITY,
        allreduce_mb_per_ms,
    };
    Some(analytic::samples_per_sec(spec, link, transfer, &stages, d))
}

#[cfg(test)]
mod tests;
