//! Plans over zones (issue 37): when the workers run in two zones or more (each member's
//! `caps.zone`), what a configuration trains depends on how many nodes each zone holds and on
//! each zone's device, and a plan must say which zone each slot runs in. `cost::fleet` lays
//! every `(D, P)` over the zones (pipelines inside a zone, or pipelines over two zones with each
//! stage's replicas in one, stages split unevenly over unequal devices); the strategy chooses on
//! that composition's table, and the plan takes the placement's stage bounds and puts every
//! slot on a node of its zone.
//!
//! A cluster in one zone, or one with a member whose zone is unknown, is planned as before: as
//! one cluster of alike nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parcae_consensus::{ControlState, NodeId};
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::fleet::{Fleet, Layout, MAX_ZONES, Plans, Zone};
use parcae_strategies::cost::links::{Link, Links};
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::spec::LayerCost;
use parcae_strategies::cost::transfer::TransferModel;

use super::costs::{JobShape, reported_layers};

/// The workers as a fleet of zones at this moment.
pub struct Zoned {
    /// The zone (an index into the fleet's zones) of each worker, in the workers' order.
    pub node_zones: Vec<usize>,
    /// Every configuration's placement on the zones' counts.
    pub plans: Arc<Plans>,
    /// The measured cost model with this composition's table: what the strategy chooses on.
    pub cost: Arc<CostModel>,
}

/// The fleet of the zones seen last: kept while its zones, their devices' costs and the links
/// stay the same, so each composition's tables are laid out once.
#[derive(Default)]
pub struct FleetCache {
    fleet: Option<Fleet>,
}

impl FleetCache {
    /// The zone-aware view of `workers` under the measured `cost`, or `None` when they are in
    /// one zone, in more than [`MAX_ZONES`], or when any of them has not said its zone.
    pub fn zoned(
        &mut self,
        state: &ControlState,
        workers: &[NodeId],
        shape: &JobShape,
        cost: &CostModel,
    ) -> Option<Zoned> {
        let zone_of = |id: &NodeId| {
            state
                .members
                .get(id)
                .map_or("", |m| m.peer.caps.zone.as_str())
        };
        let names: Vec<&str> = workers
            .iter()
            .map(zone_of)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if names.len() < 2 || names.len() > MAX_ZONES || names.contains(&"") {
            return None;
        }
        let reported: Vec<BTreeMap<u32, LayerCost>> = names
            .iter()
            .map(|name| reported_layers(state, shape, &|id| zone_of(id) == *name))
            .collect();
        let zones: Vec<Zone> = names
            .iter()
            .zip(zone_layers(&reported, &cost.spec.layers))
            .map(|(name, layers)| Zone {
                name: (*name).into(),
                device: DeviceCosts {
                    name: (*name).into(),
                    layers,
                    memory_mb: shape.memory_mb,
                },
            })
            .collect();
        let links = links(&cost.transfer);
        let current = self.fleet.as_ref().is_some_and(|f| {
            f.zones() == zones.as_slice() && f.spec() == &cost.spec && f.links() == &links
        });
        if !current {
            tracing::info!(zones = ?names, "planning over zones");
            self.fleet = Fleet::new(cost.spec.clone(), zones, links)
                .inspect_err(|e| tracing::warn!("planning as one zone: {e}"))
                .ok();
        }
        let fleet = self.fleet.as_mut()?;
        let node_zones: Vec<usize> = workers
            .iter()
            .map(|id| names.iter().position(|n| *n == zone_of(id)).unwrap_or(0))
            .collect();
        let counts: Vec<u32> = (0..names.len())
            .map(|z| node_zones.iter().filter(|&&x| x == z).count() as u32)
            .collect();
        let plans = fleet.plans(Layout::ZoneAware, &counts);
        let cost = CostModel::new(
            cost.spec.clone(),
            plans.table.as_ref().clone(),
            cost.transfer.clone(),
        )
        .with_repartition(cost.repartition);
        Some(Zoned {
            node_zones,
            plans,
            cost: Arc::new(cost),
        })
    }
}

/// Each zone's layers from what its own nodes reported (`reported[z]`, by layer). A node
/// reports only the layers it runs, so a zone whose nodes hold some stages has not timed the
/// others: those are what the zones that run them reported, scaled by how much slower this
/// zone's device is than theirs (the ratio of the zones' median time per parameter over the
/// layers each timed; a model's blocks are alike, so this is their speed ratio). A layer no
/// zone reported, or a zone that reported nothing, takes the pooled medians (`pooled`).
fn zone_layers(reported: &[BTreeMap<u32, LayerCost>], pooled: &[LayerCost]) -> Vec<Vec<LayerCost>> {
    let pace: Vec<Option<f64>> = reported.iter().map(ms_per_param).collect();
    (0..reported.len())
        .map(|z| {
            (0..pooled.len())
                .map(|i| {
                    let layer = i as u32;
                    if let Some(own) = reported[z].get(&layer) {
                        return *own;
                    }
                    let timed_by =
                        (0..reported.len()).find(|&w| w != z && reported[w].contains_key(&layer));
                    match (timed_by, pace[z]) {
                        (Some(w), Some(mine)) => {
                            let theirs = reported[w][&layer];
                            let slower = pace[w].map_or(1.0, |p| mine / p);
                            LayerCost {
                                forward_ms: theirs.forward_ms * slower,
                                backward_ms: theirs.backward_ms * slower,
                                optimizer_ms: theirs.optimizer_ms * slower,
                                ..theirs
                            }
                        }
                        _ => pooled[i],
                    }
                })
                .collect()
        })
        .collect()
}

/// The median forward plus backward time per parameter of the layers in `layers` that have
/// parameters, or `None` without any.
fn ms_per_param(layers: &BTreeMap<u32, LayerCost>) -> Option<f64> {
    let mut paces: Vec<f64> = layers
        .values()
        .filter(|l| l.params > 0.0)
        .map(|l| (l.forward_ms + l.backward_ms) / l.params)
        .filter(|p| p.is_finite() && *p > 0.0)
        .collect();
    paces.sort_by(f64::total_cmp);
    paces.get(paces.len() / 2).copied()
}

/// The links the plans are priced on: within a zone the rate the nodes measured, free; between
/// zones the cloud default ([`Links::default`]), never faster than within one.
fn links(transfer: &TransferModel) -> Links {
    let mut links = Links::default();
    if let TransferModel::Linear {
        latency_ms,
        bytes_per_sec,
    } = *transfer
    {
        links.within = Link {
            gbit_per_s: bytes_per_sec * 8.0 / 1e9,
            latency_ms,
            usd_per_gb: 0.0,
        };
        links.across.gbit_per_s = links.across.gbit_per_s.min(links.within.gbit_per_s);
        links.across.latency_ms = links.across.latency_ms.max(latency_ms);
    }
    links
}

#[cfg(test)]
mod tests;
