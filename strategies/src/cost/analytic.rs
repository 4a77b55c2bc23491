//! Throughput of `(D, P)` computed from per-layer costs (spec 2.3-2.4): a 1F1B event
//! simulation of one pipeline, the data-parallel all-reduce and the optimizer step, and a
//! memory feasibility check. This is how a model the nodes measured themselves is planned
//! without an offline profiling campaign.

use super::links::GRADIENT_BYTES_PER_PARAM;
use super::spec::{Family, LayerCost, ModelSpec};
use super::throughput::ThroughputTable;
use super::transfer::TransferModel;
use crate::config::ParallelConfig;

const MIB: f64 = 1024.0 * 1024.0;

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

/// Sums of the layer costs of one stage, on the device it runs on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StageCost {
    pub(crate) forward_ms: f64,
    pub(crate) backward_ms: f64,
    pub(crate) optimizer_ms: f64,
    pub(crate) params: f64,
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

fn micro_batches(spec: &ModelSpec, d: u32) -> u32 {
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
/// or `None` when its weights, optimizer state and recomputed activations do not fit; a stage
/// that cannot keep the activations of its micro-batches in flight (1F1B: `p - s`) recomputes
/// them, a second forward inside its backward.
pub(crate) fn stage_cost(
    spec: &ModelSpec,
    layers: &[LayerCost],
    memory_mb: f64,
    s: usize,
    p: usize,
) -> Option<StageCost> {
    let boundary_mb = spec.boundary_bytes / MIB;
    let mut c = StageCost::default();
    let mut acts = 0.0;
    for l in layers {
        c.forward_ms += l.forward_ms;
        c.backward_ms += l.backward_ms;
        c.optimizer_ms += l.optimizer_ms;
        c.params += l.params;
        acts += l.activation_mb;
    }
    let states_mb = c.params * 4.0 / MIB * f64::from(spec.optimizer_states + 1);
    let peak_block = layers.iter().map(|l| l.activation_mb).fold(0.0, f64::max);
    let recompute_mb = match spec.family {
        Family::Transformer => (1..=layers.len())
            .map(|chunk| {
                chunk as f64 * peak_block + (layers.len().div_ceil(chunk)) as f64 * boundary_mb
            })
            .fold(f64::INFINITY, f64::min),
        Family::Cnn => acts,
    };
    if states_mb + recompute_mb > memory_mb {
        return None;
    }
    let in_flight = (p - s) as f64;
    if in_flight * acts > memory_mb {
        c.backward_ms += c.forward_ms;
    }
    Some(c)
}

/// Samples per second of `d` pipelines over `stages`.
pub(crate) fn samples_per_sec(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    stages: &[StageCost],
    d: u32,
) -> f64 {
    let ms = iteration_ms(spec, hw, transfer, stages, d);
    let samples = f64::from(spec.micro_batch * d * micro_batches(spec, d));
    samples / (ms / 1000.0)
}

/// One training iteration of `d` pipelines over `stages`, ms.
fn iteration_ms(
    spec: &ModelSpec,
    hw: Hardware,
    transfer: &TransferModel,
    stages: &[StageCost],
    d: u32,
) -> f64 {
    let m = micro_batches(spec, d) as usize;
    let comm = if stages.len() > 1 {
        transfer.cost_ms(spec.boundary_bytes)
    } else {
        0.0
    };
    let ends = one_f_one_b(stages, m, comm);
    ends.iter()
        .zip(stages)
        .enumerate()
        .map(|(s, (end, c))| {
            let group = if s == 0 && spec.family == Family::Transformer && stages.len() > 1 {
                2 * d
            } else {
                d
            };
            end + allreduce_ms(c.params * GRADIENT_BYTES_PER_PARAM, group, hw) + c.optimizer_ms
        })
        .fold(0.0, f64::max)
}

/// Ring all-reduce of `bytes` over `width` replicas, ms.
fn allreduce_ms(bytes: f64, width: u32, hw: Hardware) -> f64 {
    if width <= 1 {
        return 0.0;
    }
    let w = f64::from(width);
    bytes / MIB / hw.allreduce_mb_per_ms * 2.0 * (w - 1.0) / w
}

/// Per-stage finish time of a 1F1B schedule of `m` micro-batches; `comm` is the transfer time
/// of one boundary activation or gradient between neighbouring stages.
fn one_f_one_b(stages: &[StageCost], m: usize, comm: f64) -> Vec<f64> {
    let p = stages.len();
    // Each stage runs a fixed order: warm-up forwards, then alternating backward/forward.
    let orders: Vec<Vec<(bool, usize)>> = (0..p)
        .map(|s| {
            let warm = (p - s).min(m);
            let mut order: Vec<(bool, usize)> = (0..warm).map(|i| (true, i)).collect();
            let (mut f, mut b) = (warm, 0);
            while b < m {
                order.push((false, b));
                b += 1;
                if f < m {
                    order.push((true, f));
                    f += 1;
                }
            }
            order
        })
        .collect();
    let mut fwd_end = vec![vec![f64::NAN; m]; p];
    let mut bwd_end = vec![vec![f64::NAN; m]; p];
    let mut free = vec![0.0f64; p];
    let mut next = vec![0usize; p];
    let mut remaining: usize = orders.iter().map(Vec::len).sum();
    while remaining > 0 {
        let mut progressed = false;
        for s in 0..p {
            while let Some(&(is_fwd, i)) = orders[s].get(next[s]) {
                let ready = if is_fwd {
                    if s == 0 {
                        Some(0.0)
                    } else {
                        ready_after(fwd_end[s - 1][i], comm)
                    }
                } else if s + 1 == p {
                    ready_after(fwd_end[s][i], 0.0)
                } else {
                    ready_after(bwd_end[s + 1][i], comm)
                };
                let Some(ready) = ready else { break };
                let start = free[s].max(ready);
                let c = &stages[s];
                let end = start + if is_fwd { c.forward_ms } else { c.backward_ms };
                if is_fwd {
                    fwd_end[s][i] = end;
                } else {
                    bwd_end[s][i] = end;
                }
                free[s] = end;
                next[s] += 1;
                remaining -= 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    free
}

fn ready_after(end: f64, comm: f64) -> Option<f64> {
    (!end.is_nan()).then_some(end + comm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::builtin::builtin;

    #[test]
    fn one_stage_is_sum_of_micro_batches() {
        let st = [StageCost {
            forward_ms: 1.0,
            backward_ms: 2.0,
            ..Default::default()
        }];
        assert_eq!(one_f_one_b(&st, 4, 0.0), vec![12.0]);
    }

    #[test]
    fn pipeline_bubble_matches_closed_form() {
        let st = vec![
            StageCost {
                forward_ms: 1.0,
                backward_ms: 2.0,
                ..Default::default()
            };
            4
        ];
        let ends = one_f_one_b(&st, 8, 0.0);
        // (m + p - 1) * (f + b) for uniform stages without communication.
        assert!((ends[0] - 11.0 * 3.0).abs() < 1e-9, "{ends:?}");
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
