//! What the cost models need to know about a training job: its layers, batch and the
//! constants of its restarts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Profiled or measured cost of one layer (an entry of the model's layer list).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerCost {
    /// Forward time of one micro-batch, ms.
    pub forward_ms: f64,
    /// Backward time of one micro-batch, ms.
    pub backward_ms: f64,
    /// Optimizer step time, ms.
    pub optimizer_ms: f64,
    /// Activation memory of one micro-batch, MiB.
    pub activation_mb: f64,
    /// Number of parameters.
    pub params: f64,
}

/// Architecture family, which decides recomputation memory and tied-embedding traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    /// Embedding, blocks, head (GPT, BERT): activations recomputed per block.
    Transformer,
    /// Convolutional networks: no stage-boundary activations to recompute.
    Cnn,
}

/// Rebuilding the communication groups after a change (spec 3.2, `G`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GroupCost {
    /// One cost per group, `d + p + 1 + d*p` groups (GPT models).
    PerGroup {
        /// Per group when new nodes join (rendezvous), ms.
        add_ms: f64,
        /// Per group otherwise, ms.
        other_ms: f64,
    },
    /// One cost per node of the grid (VGG).
    PerNode {
        /// Per node when new nodes join, ms.
        add_ms: f64,
        /// Per node otherwise, ms.
        other_ms: f64,
    },
    /// A step function of the data-parallel width (BERT, ResNet).
    ByWidth,
}

/// Re-instantiating a stage module for depth `p` (spec 3.2, `B`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BuildCost {
    /// `base + per_block * ceil(blocks / p)`.
    PerBlock {
        /// Fixed part, ms.
        base_ms: f64,
        /// Per transformer block held by the stage, ms.
        per_block_ms: f64,
        /// Transformer blocks of the model.
        blocks: u32,
    },
    /// Profiled per depth; depths missing from the table cost the nearest profiled one.
    Table(BTreeMap<u32, f64>),
}

/// How a restart is priced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RestartCost {
    /// Built from rendezvous, group rebuild, process start and model build (spec 3.2).
    Profiled {
        /// Process start, ms.
        proc_ms: f64,
        /// Rendezvous with new nodes, ms.
        rendezvous_ms: f64,
        /// Extra start-up work when nodes join (data loading), ms.
        add_extra_ms: f64,
        /// Communication-group rebuild.
        groups: GroupCost,
        /// Stage module build.
        build: BuildCost,
    },
    /// Every restart costs the same (Parcae's `--restart-cost` sweeps).
    Fixed {
        /// The cost, ms.
        ms: f64,
    },
}

/// Whether a restart brings in nodes that were not running the old configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestartKind {
    /// New or spare nodes join: a full rendezvous.
    Add,
    /// Only survivors of the old configuration take part.
    Remove,
}

/// Everything the cost models know about a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Model name as used on the command line.
    pub name: String,
    /// Architecture family.
    pub family: Family,
    /// Layer list: for transformers embedding, blocks, head.
    pub layers: Vec<LayerCost>,
    /// Optimizer state tensors per parameter (Adam: 2).
    pub optimizer_states: u32,
    /// Global batch size, samples.
    pub global_batch: u32,
    /// Micro-batch size, samples.
    pub micro_batch: u32,
    /// Stage-boundary activation of one micro-batch, bytes (0 for CNNs).
    pub boundary_bytes: f64,
    /// Pipeline depths the job allows (memory and implementation constraints).
    pub depths: Vec<u32>,
    /// Smallest data-parallel degree the job allows.
    pub min_d: u32,
    /// Restart pricing.
    pub restart: RestartCost,
}

impl ModelSpec {
    /// Whether `(d, p)` is allowed by the job's constraints.
    pub fn admits(&self, d: u32, p: u32) -> bool {
        d >= self.min_d.max(1) && self.depths.contains(&p)
    }

    /// Stage boundaries `[0, b1, ..., L]` for `p` stages, by layer count (spec 2.2): the first
    /// stage takes one extra entry, and the remainder goes to the stages before the last; with as
    /// many stages as layers or more, one layer each.
    pub fn partition(&self, p: u32) -> Vec<usize> {
        partition(self.layers.len(), p as usize)
    }

    /// Bytes of model state (weights plus optimizer moments, f32) of `params` parameters.
    pub fn state_bytes(&self, params: f64) -> f64 {
        params * f64::from(1 + self.optimizer_states) * 4.0
    }
}

/// Partition of `layers` entries into `p` contiguous stages (spec 2.2).
pub fn partition(layers: usize, p: usize) -> Vec<usize> {
    if p == 0 || layers == 0 {
        return vec![0, layers];
    }
    if p >= layers {
        return (0..=layers).collect();
    }
    let base = (layers - 1) / p;
    let mut sizes = vec![base; p];
    sizes[0] += 1;
    for i in 0..(layers - 1) % p {
        let idx = p - 2 - i;
        sizes[idx] += 1;
    }
    let mut bounds = Vec::with_capacity(p + 1);
    bounds.push(0);
    for s in sizes {
        bounds.push(bounds.last().copied().unwrap_or(0) + s);
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_matches_spec_examples() {
        assert_eq!(partition(50, 8), vec![0, 7, 13, 19, 25, 31, 37, 44, 50]);
        assert_eq!(
            partition(50, 13),
            vec![0, 4, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 50]
        );
        assert_eq!(partition(50, 1), vec![0, 50]);
        assert_eq!(partition(3, 5), vec![0, 1, 2, 3]);
    }
}
