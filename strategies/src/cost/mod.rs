//! Cost models: how fast a configuration trains and what changing configuration costs.
//!
//! * [`throughput`]: samples/s per `(D, P)` from a profile table;
//! * [`analytic`]: the same table computed from per-layer costs (1F1B simulation plus memory
//!   feasibility), so any model the nodes have measured can be planned;
//! * [`mixed`]: pipelines over unequal devices, their layers split unevenly to balance stage
//!   times within each device's memory;
//! * [`fleet`]: one job over several zones of unequal devices, laid out zone-aware or blind;
//! * [`links`]: links between zones (rate, latency, egress price);
//! * [`traffic`]: what a placed plan sends over them, and what that costs;
//! * [`migration`]: intra-stage, inter-stage, repartition and restart costs, in expectation
//!   over which nodes a preemption hits;
//! * [`builtin`]: the paper's five profiled models;
//! * [`profile`]: a model measured on one card by `parcae-node profile`, read from a file;
//! * [`money`]: what a run costs at spot prices and saves against on-demand machines;
//! * [`advice`]: which pools a plan's owner should release or grow.

pub mod advice;
pub mod analytic;
pub mod builtin;
pub mod fleet;
pub mod links;
pub mod migration;
pub mod mixed;
pub mod money;
pub mod objective;
pub mod profile;
pub mod region;
pub mod restart;
pub mod rounds;
pub mod spec;
mod split;
pub mod throughput;
pub mod traffic;
pub mod transfer;

use serde::{Deserialize, Serialize};

use crate::config::ParallelConfig;
use spec::ModelSpec;
use throughput::ThroughputTable;
use transfer::TransferModel;

/// How a repartition is priced: Parcae's formula (spec 3.3: the missing layers of one node a
/// new stage over one link, a broadcast to the replicas and a whole restart), counting the
/// missing layers one of two ways (spec 4.6), or what `parcae-node`'s handoff does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RepartitionRule {
    /// Parcae's formula, summing the parameters every new stage lacks.
    #[default]
    Sum,
    /// Parcae's formula with only the last new stage's missing parameters, as the artifact's
    /// code does.
    LastStage,
    /// `parcae-node`'s handoff: every node of the new configuration fetches what it lacks
    /// from the old configuration's holders at once, its link carrying what it receives and
    /// each holder's what it sends ([`migration`]); the communication groups are rebuilt and
    /// each new stage module built, and nothing restarts or rendezvouses (joiners joined
    /// while the old configuration trained).
    Handoff,
}

/// Throughput and migration costs of one job on one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// The job.
    pub spec: ModelSpec,
    /// Samples/s per configuration.
    pub throughput: ThroughputTable,
    /// Transfer time between nodes.
    pub transfer: TransferModel,
    /// Repartition volume rule.
    pub repartition: RepartitionRule,
    candidates: Vec<ParallelConfig>,
    stage_params: Vec<Vec<f64>>,
    /// Per depth, the time to move each stage's state (the migration costs ask for these for
    /// every scenario of every event).
    stage_transfer_ms: Vec<Vec<f64>>,
    prefix_params: Vec<f64>,
}

impl CostModel {
    /// A cost model; the configurations it plans with are the table's rows the job admits.
    pub fn new(spec: ModelSpec, throughput: ThroughputTable, transfer: TransferModel) -> Self {
        let candidates = throughput
            .configs()
            .map(|(c, _)| c)
            .filter(|c| spec.admits(c.d, c.p))
            .collect();
        let mut prefix_params = vec![0.0];
        for l in &spec.layers {
            prefix_params.push(prefix_params.last().copied().unwrap_or(0.0) + l.params);
        }
        let stage_params: Vec<Vec<f64>> = (0..=spec.layers.len())
            .map(|p| {
                if p == 0 {
                    return Vec::new();
                }
                spec.partition(p as u32)
                    .windows(2)
                    .map(|w| prefix_params[w[1]] - prefix_params[w[0]])
                    .collect()
            })
            .collect();
        let stage_transfer_ms = stage_params
            .iter()
            .map(|stages| {
                stages
                    .iter()
                    .map(|&params| transfer.cost_ms(spec.state_bytes(params)))
                    .collect()
            })
            .collect();
        Self {
            spec,
            throughput,
            transfer,
            repartition: RepartitionRule::default(),
            candidates,
            stage_params,
            stage_transfer_ms,
            prefix_params,
        }
    }

    /// A built-in model with its profiled table on Parcae's 10 Gb/s network.
    pub fn builtin(name: &str) -> Option<Self> {
        let (spec, profile) = builtin::builtin(name)?;
        Some(Self::new(
            spec,
            profile.table,
            TransferModel::Profiled10Gbps,
        ))
    }

    /// The same model with another repartition rule.
    pub fn with_repartition(mut self, rule: RepartitionRule) -> Self {
        self.repartition = rule;
        self
    }

    /// Samples per second of `c`.
    pub fn samples_per_sec(&self, c: ParallelConfig) -> f64 {
        self.throughput.samples_per_sec(c)
    }

    /// Every configuration the planner may choose, in `(d, p)` order.
    pub fn candidates(&self) -> &[ParallelConfig] {
        &self.candidates
    }

    /// The throughput-optimal configuration on `nodes` nodes.
    pub fn best(&self, nodes: u32) -> ParallelConfig {
        self.throughput.best(nodes)
    }

    /// Parameters of each stage of a `p`-stage pipeline (empty for `p = 0`).
    pub fn stage_params(&self, p: u32) -> &[f64] {
        self.stage_params
            .get(p as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Time to move the state of each stage of a `p`-stage pipeline, ms (empty for `p = 0`).
    pub fn stage_transfer_ms(&self, p: u32) -> &[f64] {
        self.stage_transfer_ms
            .get(p as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Parameters of layers `[a, b)`.
    pub fn params_between(&self, a: usize, b: usize) -> f64 {
        if b <= a {
            return 0.0;
        }
        self.prefix_params[b] - self.prefix_params[a]
    }

    /// Time to move the weights and optimizer state of `params` parameters, ms.
    pub fn state_transfer_ms(&self, params: f64) -> f64 {
        self.transfer.cost_ms(self.spec.state_bytes(params))
    }
}
