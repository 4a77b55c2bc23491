//! The planner's cost model (the costs of the strategies' choices), built from what the nodes measured (`CostReport`s in the
//! replicated state) instead of an offline profiling campaign: per-layer forward, backward and
//! optimizer times (median over reporting nodes), parameter counts and activation sizes feed
//! `strategies::cost::analytic`, which simulates 1F1B, the all-reduce and the optimizer step
//! for every `(D, P)`. The price of a reconfiguration is learned the same way: the median of
//! what the nodes' latest priced reconfigurations took beyond moving state (links, groups,
//! building the stage, waiting for the slowest peer) is the model's restart cost, so the
//! look-ahead weighs a change of configuration at what changes cost on this cluster.
//!
//! With `[planner] profile`, the layers are the profile's (`parcae-node profile` on the card the
//! cluster runs on), scaled to the job's micro-batch, and the device's memory is the profile's:
//! the planner plans before any node reported, and from medians of warmed-up runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use parcae_consensus::state::LinkTime;
use parcae_consensus::{ControlState, NodeId};
use parcae_strategies::cost::analytic::{Hardware, MIB, throughput_table};
use parcae_strategies::cost::profile::DeviceProfile;
use parcae_strategies::cost::spec::{Family, LayerCost, ModelSpec, RestartCost};
use parcae_strategies::cost::transfer::TransferModel;
use parcae_strategies::cost::{CostModel, RepartitionRule};

use crate::job::JobSpec;

/// Data-plane rate assumed until nodes report measured ones (the 10 Gb/s of Parcae's cluster;
/// the encrypted data plane measured 1.3-1.5 GB/s on loopback).
pub const DEFAULT_BYTES_PER_SEC: f64 = 1.25e9;

/// Latency of a link assumed until nodes report the time of a boundary activation's crossing
/// (`CostReport::boundary_link`), ms.
pub const DEFAULT_LATENCY_MS: f64 = 1.0;

/// Memory planned for on CPU hosts, MiB.
pub const CPU_MEMORY_MB: f64 = 64.0 * 1024.0;

/// What the job looks like beyond its layers, and where its layers' costs come from.
#[derive(Debug, Clone)]
pub struct JobShape {
    /// Samples per step.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Most nodes planned for.
    pub max_nodes: u32,
    /// Cost of a restart, ms (process restart, state reload), until nodes measured their
    /// reconfigurations (`CostReport::reconfiguration_s`).
    pub restart_ms: f64,
    /// Usable memory of a node's device, MiB: which depths fit.
    pub memory_mb: f64,
    /// The shallowest pipeline whose stages fit the device (1 on CPUs).
    pub min_depth: u32,
    /// The profile the layers are priced from (`[planner] profile`), instead of the nodes'
    /// reports.
    pub profile: Option<Arc<DeviceProfile>>,
    /// Whether every step's all-reduce stays inside a zone (a DiLoCo job): pipelines are laid
    /// inside zones.
    pub steps_in_zone: bool,
}

impl JobShape {
    /// The shape `config` describes: its batch sizes and cluster size, and the memory and
    /// shallowest pipeline of its device: the profile's (`[planner] profile`), else an emulated
    /// device's, else a CPU's.
    pub fn of(config: &crate::config::NodeConfig) -> JobShape {
        let device = config.device.emulation().ok().flatten();
        let profile = config.planner.profile.as_deref().and_then(|path| {
            DeviceProfile::load(path)
                .inspect_err(|e| tracing::error!("planning from the nodes' reports: {e}"))
                .ok()
        });
        let (memory_mb, min_depth) = match (&profile, &device) {
            (Some(p), _) => (p.memory_mb, p.min_depth().unwrap_or(1)),
            (None, Some(d)) => (d.memory_mb(), d.min_depth()),
            (None, None) => (CPU_MEMORY_MB, 1),
        };
        JobShape {
            global_batch: config.train.global_batch,
            micro_batch: config.train.micro_batch,
            max_nodes: config.planner.max_nodes,
            restart_ms: 2000.0,
            memory_mb,
            min_depth,
            profile: profile.map(Arc::new),
            steps_in_zone: config.train.sync.inner_steps().is_some(),
        }
    }

    /// This shape with the batch sizes of the cluster's job where it names them: the leader
    /// plans the job the cluster trains, not its own file's (a node that adopted the job has
    /// defaults there).
    pub fn for_job(&self, job: Option<&parcae_consensus::state::Job>) -> JobShape {
        let spec = job.and_then(|j| JobSpec::of(j).ok());
        let theirs = |size: fn(&JobSpec) -> u32, own: u32| {
            spec.as_ref().map(size).filter(|v| *v > 0).unwrap_or(own)
        };
        JobShape {
            global_batch: theirs(|s| s.global_batch, self.global_batch),
            micro_batch: theirs(|s| s.micro_batch, self.micro_batch),
            steps_in_zone: spec
                .as_ref()
                .map_or(self.steps_in_zone, |s| s.sync.inner_steps().is_some()),
            ..self.clone()
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    // The upper median, selected without sorting: a leader takes five for every layer of
    // every report at each decision.
    let mid = v.len() / 2;
    if v.is_empty() {
        return 0.0;
    }
    *v.select_nth_unstable_by(mid, f64::total_cmp).1
}

/// The median of `v`, or `otherwise` when it is empty (nothing measured yet).
fn median_or(v: Vec<f64>, otherwise: f64) -> f64 {
    if v.is_empty() { otherwise } else { median(v) }
}

/// Every layer's costs at the job's micro-batch: the profile's, else the medians of what the
/// nodes reported (`None` until some node reported every layer).
fn layer_costs(state: &ControlState, shape: &JobShape) -> Option<Vec<LayerCost>> {
    let per_layer = reported_layers(state, shape, &|_| true);
    let n = per_layer.len();
    if n == 0 || per_layer.keys().copied().ne(0..n as u32) {
        return None;
    }
    Some(per_layer.into_values().collect())
}

/// The costs of the layers the nodes `reported_by` accepts (one zone's) reported, the median
/// of each at the job's micro-batch, by layer; with a profile, every layer's from it.
pub fn reported_layers(
    state: &ControlState,
    shape: &JobShape,
    reported_by: &dyn Fn(&NodeId) -> bool,
) -> BTreeMap<u32, LayerCost> {
    if let Some(p) = &shape.profile {
        let per_sample = f64::from(shape.micro_batch) / f64::from(p.micro_batch.max(1));
        return p
            .layers
            .iter()
            .map(|l| {
                let c = l.cost();
                LayerCost {
                    forward_ms: c.forward_ms * per_sample,
                    backward_ms: c.backward_ms * per_sample,
                    activation_mb: c.activation_mb * per_sample,
                    ..c
                }
            })
            .zip(0..)
            .map(|(c, i)| (i, c))
            .collect();
    }
    let mut per_layer: BTreeMap<u32, Vec<parcae_consensus::state::LayerCost>> = BTreeMap::new();
    for (_, costs) in state.costs.iter().filter(|(id, _)| reported_by(id)) {
        for (layer, c) in &costs.layers {
            per_layer.entry(*layer).or_default().push(*c);
        }
    }
    per_layer
        .into_iter()
        .map(|(layer, cs)| {
            let cost = LayerCost {
                forward_ms: median(cs.iter().map(|c| c.forward_s * 1e3).collect()),
                backward_ms: median(cs.iter().map(|c| c.backward_s * 1e3).collect()),
                optimizer_ms: median(cs.iter().map(|c| c.optimizer_s * 1e3).collect()),
                activation_mb: median(cs.iter().map(|c| c.output_bytes as f64).collect())
                    / (1024.0 * 1024.0),
                params: median(cs.iter().map(|c| c.params as f64).collect()),
            };
            (layer, cost)
        })
        .collect()
}

/// What a cost model is priced from: its throughput table is a function of these alone.
#[derive(Debug, Clone, PartialEq)]
struct Priced {
    spec: ModelSpec,
    hw: Hardware,
    transfer: TransferModel,
    max_nodes: u32,
}

impl Priced {
    fn model(self) -> CostModel {
        let table = throughput_table(&self.spec, self.hw, &self.transfer, self.max_nodes);
        // The nodes hand state off as the handoff rule prices it, not as Parcae's engine does.
        CostModel::new(self.spec, table, self.transfer).with_repartition(RepartitionRule::Handoff)
    }
}

/// The cost model of the costs seen last, kept while what it is priced from stays the same:
/// its throughput table (every configuration of up to the job's nodes through the 1F1B
/// simulation) took 114 ms of each decision at 512 nodes in one pool.
#[derive(Debug, Default)]
pub struct MeasuredCache {
    last: Option<(Priced, Arc<CostModel>)>,
}

impl MeasuredCache {
    /// The cost model of `state`'s measured costs, or `None` until the layers' costs are known
    /// ([`layer_costs`]); the last model again when what it is priced from did not change.
    pub fn get(&mut self, state: &ControlState, shape: &JobShape) -> Option<Arc<CostModel>> {
        let priced = priced(state, shape)?;
        match &self.last {
            Some((seen, model)) if *seen == priced => Some(model.clone()),
            _ => {
                let model = Arc::new(priced.clone().model());
                self.last = Some((priced, model.clone()));
                Some(model)
            }
        }
    }
}

/// What the cost model of `state`'s measured costs is priced from.
fn priced(state: &ControlState, shape: &JobShape) -> Option<Priced> {
    let layers = layer_costs(state, shape)?;
    let n = layers.len();
    // What crosses a stage boundary: the largest output of a layer before the last (the last
    // one's logits stay on its node).
    let boundary_bytes = layers[..n.saturating_sub(1)]
        .iter()
        .map(|l| l.activation_mb * 1024.0 * 1024.0)
        .fold(0.0, f64::max);
    let rate = |r: &f64| r.is_finite() && *r > 0.0;
    let crossings: Vec<LinkTime> = state
        .costs
        .values()
        .filter_map(|c| c.boundary_link)
        .filter(|l| rate(&(l.bytes as f64 / l.secs)))
        .collect();
    // The links' rate as the state fetches found it; until one was timed, the rate of the
    // boundary activations' crossings (a crossing is a transfer over the same link).
    let fetches = state.costs.values().flat_map(|c| c.bandwidth.values());
    let crossed = crossings.iter().map(|l| l.bytes as f64 / l.secs);
    let bytes_per_sec = median_or(
        fetches.copied().filter(rate).collect(),
        median_or(crossed.collect(), DEFAULT_BYTES_PER_SEC),
    );
    // The ring's rate where the nodes know it (an emulated device's is its profile's), else
    // the links' as the state fetches found them.
    let rings = state
        .costs
        .values()
        .filter_map(|c| c.allreduce_bytes_per_sec);
    let ring_bytes_per_sec = median_or(rings.filter(rate).collect(), bytes_per_sec);
    // The links' latency: what a boundary activation's crossing took beyond its bytes at the
    // fetches' rate, where the nodes timed one (an emulated device's is its profiled curve's),
    // so that a crossing is priced at what it takes.
    let latency_ms = median_or(
        crossings
            .iter()
            .map(|l| (l.secs - l.bytes as f64 / bytes_per_sec).max(0.0) * 1e3)
            .collect(),
        DEFAULT_LATENCY_MS,
    );
    let reconfigurations = state.costs.values().filter_map(|c| c.reconfiguration_s);
    let restart_ms = median_or(
        reconfigurations.map(|s| s * 1e3).collect(),
        shape.restart_ms,
    );
    let spec = ModelSpec {
        name: "measured".into(),
        family: Family::Transformer,
        depths: (shape.min_depth.clamp(1, n as u32)..=n as u32).collect(),
        layers,
        optimizer_states: 2,
        global_batch: shape.global_batch,
        micro_batch: shape.micro_batch,
        boundary_bytes,
        min_d: 1,
        restart: RestartCost::Fixed { ms: restart_ms },
    };
    let transfer = TransferModel::Linear {
        latency_ms,
        bytes_per_sec,
    };
    let hw = Hardware {
        memory_mb: shape.memory_mb,
        allreduce_mb_per_ms: ring_bytes_per_sec / MIB / 1000.0,
    };
    Some(Priced {
        spec,
        hw,
        transfer,
        max_nodes: shape.max_nodes.min(shape.global_batch).max(1),
    })
}

#[cfg(test)]
mod tests;
