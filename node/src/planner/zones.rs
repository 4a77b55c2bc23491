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

use std::collections::BTreeSet;
use std::sync::Arc;

use parcae_consensus::{ControlState, NodeId};
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::fleet::{Fleet, Layout, MAX_ZONES, Plans, Zone};
use parcae_strategies::cost::links::{Link, Links};
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::transfer::TransferModel;

use super::costs::{JobShape, layer_costs_of};

/// The workers as a fleet of zones at this moment.
pub struct Zoned {
    /// The zone (an index into the fleet's zones) of each worker, in the workers' order.
    pub node_zones: Vec<usize>,
    /// Every configuration's placement on the zones' counts.
    pub plans: Arc<Plans>,
    /// The measured cost model with this composition's table: what the strategy chooses on.
    pub cost: Arc<CostModel>,
}

/// The fleet of the zones seen last: kept while its zones and their devices' costs stay the
/// same, so each composition's tables are laid out once.
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
        let zones: Vec<Zone> = names
            .iter()
            .map(|name| {
                let layers = layer_costs_of(state, shape, &|id| zone_of(id) == *name)
                    .filter(|l| l.len() == cost.spec.layers.len())
                    .unwrap_or_else(|| cost.spec.layers.clone());
                Zone {
                    name: (*name).into(),
                    device: DeviceCosts {
                        name: (*name).into(),
                        layers,
                        memory_mb: shape.memory_mb,
                    },
                }
            })
            .collect();
        let current = self
            .fleet
            .as_ref()
            .is_some_and(|f| f.zones() == zones.as_slice() && f.spec() == &cost.spec);
        if !current {
            tracing::info!(zones = ?names, "planning over zones");
            self.fleet = Fleet::new(cost.spec.clone(), zones, links(&cost.transfer))
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
