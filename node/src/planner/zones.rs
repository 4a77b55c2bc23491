//! Plans over zones (issue 37): when the workers run in two zones or more (each member's
//! `caps.zone`), what a configuration trains depends on how many nodes each zone holds and on
//! each zone's device, and a plan must say which zone each slot runs in. `cost::fleet` lays
//! every `(D, P)` over the zones (pipelines inside a zone, or pipelines over two zones with each
//! stage's replicas in one, stages split unevenly over unequal devices); the strategy chooses on
//! that composition's table, and the plan takes the placement's stage bounds and puts every
//! slot on a node of its zone.
//!
//! The fleet's unit is a pool: one zone's nodes of one instance type (`ZONE/TYPE`, `caps.zone`
//! and `caps.instance_type`; the zone alone for a member that did not say its type). Unlike
//! types in one zone are unlike devices, with their own availability and price, joined by the
//! zone's own free link. A cluster in one pool, or one with a member whose zone is unknown, is
//! planned as before: as one cluster of alike nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parcae_api::{FleetView, LinkView, PoolAdviceView, PoolView};
use parcae_consensus::{ControlState, NodeId};
use parcae_pool::Pool;
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::advice::advise;
use parcae_strategies::cost::fleet::{Fleet, FleetPool, MAX_POOLS, Plans};
use parcae_strategies::cost::links::{Link, Links, pool_price};
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::objective::{self, ObjectiveKind};
use parcae_strategies::cost::region::regions_apart;
use parcae_strategies::cost::spec::LayerCost;
use parcae_strategies::cost::throughput::ThroughputTable;
use parcae_strategies::cost::transfer::TransferModel;

use super::costs::{JobShape, reported_layers};

/// The workers as a fleet of zones at this moment.
pub struct Zoned {
    /// The zone (an index into the fleet's zones) of each worker, in the workers' order.
    pub node_zones: Vec<usize>,
    /// Every configuration's placement on the zones' counts.
    pub plans: Arc<Plans>,
    /// The measured cost model with this composition's table, weighed for the objective (each
    /// rate by its egress, for samples per dollar): what the strategy chooses on.
    pub cost: Arc<CostModel>,
    /// The zones and links as priced, for `/status`.
    pub view: FleetView,
}

impl Zoned {
    /// The workers `config` would run in each zone (`None` when the fleet cannot lay it out).
    pub fn nodes_per_zone(&self, config: parcae_strategies::ParallelConfig) -> Option<Vec<u32>> {
        let placement = self.plans.placements.get(&config)?;
        Some(placement.nodes_per_zone(self.view.pools.len()))
    }

    /// The view with each pool's advice under `config`, the plan in force (every pool idle
    /// where the fleet cannot lay it out, or nothing runs).
    pub fn advised(self, config: parcae_strategies::ParallelConfig) -> FleetView {
        let held: Vec<u32> = self.view.pools.iter().map(|p| p.nodes).collect();
        let used = self
            .nodes_per_zone(config)
            .unwrap_or_else(|| vec![0; held.len()]);
        let advice = advise(&held, &used)
            .into_iter()
            .zip(self.view.pools.iter().zip(used))
            .map(|(a, (pool, used))| PoolAdviceView {
                pool: pool.pool.clone(),
                nodes_now: pool.nodes,
                nodes_used: used,
                action: a.action.as_str().to_owned(),
                reason: a.reason,
            })
            .collect();
        FleetView {
            advice,
            ..self.view
        }
    }
}

/// The fleet of the zones seen last: kept while its zones, their devices' costs and the links
/// stay the same, so each composition's tables are laid out once. Links the configuration sets
/// by zone pair price those pairs over what the nodes measured.
#[derive(Default)]
pub struct FleetCache {
    fleet: Option<Fleet>,
    objective: ObjectiveKind,
    zone_prices: BTreeMap<String, f64>,
    /// Device hours per wall-clock hour: an emulated device's time scale, else 1.
    time_scale: f64,
    /// What the plans of the zones seen last are after.
    planned_for: Option<objective::Objective>,
    /// The links the configuration sets by zone pair (`[planner] links`).
    set_links: Links,
    /// Every ring across zones flat (`[planner] all_reduce_by_zone = false`); by zone where
    /// no slower otherwise.
    flat_rings: bool,
}

impl FleetCache {
    /// A cache whose plans are after `objective`, zones priced at `zone_prices` (USD per
    /// node-hour by zone name), on devices that run `time_scale` device hours per wall-clock
    /// hour (an emulated one's time scale; 1 on a real one).
    pub fn new(
        objective: ObjectiveKind,
        zone_prices: BTreeMap<String, f64>,
        time_scale: f64,
    ) -> Self {
        Self {
            fleet: None,
            objective,
            zone_prices,
            time_scale,
            planned_for: None,
            set_links: Links::default(),
            flat_rings: false,
        }
    }

    /// The cache whose plans keep every ring across zones flat where `by_zone` is false.
    pub fn with_all_reduce_by_zone(self, by_zone: bool) -> Self {
        Self {
            flat_rings: !by_zone,
            ..self
        }
    }

    /// The cache with the links `set` sets by zone pair over what the nodes measured.
    pub fn with_links(self, set: Links) -> Self {
        Self {
            set_links: set,
            ..self
        }
    }

    /// What each configuration trains with `counts[z]` nodes in zone `z` of the zones seen
    /// last, weighed as their plans are (`None` before any fleet): a look-ahead over zones
    /// values each step at the composition forecast for it.
    pub fn table(&mut self, counts: &[u32]) -> Option<Arc<ThroughputTable>> {
        let objective = self.planned_for.as_ref()?;
        let fleet = self.fleet.as_mut()?;
        Some(objective.table(&fleet.plans(counts), counts))
    }

    /// What the plans over `pools` are after: samples per dollar where asked and every pool
    /// has a price (its own, `ZONE/TYPE`, or its zone's); else samples.
    fn objective(&self, pools: &[Pool]) -> objective::Objective {
        // A node-hour is priced in the device's time: an emulated cluster at time scale k
        // lives k of them per wall-clock hour, while its rates and egress per second are wall
        // clock ones, so the bill per wall second is k times the price's.
        let scale = if self.time_scale.is_finite() && self.time_scale > 0.0 {
            self.time_scale
        } else {
            1.0
        };
        let prices: Option<Vec<f64>> = pools
            .iter()
            .map(|n| {
                pool_price(n, |name| self.zone_prices.get(name).copied()).map(|usd| usd * scale)
            })
            .collect();
        match (self.objective, prices) {
            (ObjectiveKind::SamplesPerDollar, Some(usd_per_node_hour)) => {
                objective::Objective::SamplesPerDollar { usd_per_node_hour }
            }
            _ => objective::Objective::Samples,
        }
    }

    /// The zone-aware view of `workers` under the measured `cost`, or `None` when they are in
    /// one pool, in more than [`MAX_POOLS`], or when any of them has not said its zone.
    pub fn zoned(
        &mut self,
        state: &ControlState,
        workers: &[NodeId],
        shape: &JobShape,
        cost: &CostModel,
    ) -> Option<Zoned> {
        let pools: Vec<Option<Pool>> = workers.iter().map(|id| pool_of(state, id)).collect();
        let names: Vec<Pool> = pools
            .iter()
            .cloned()
            .collect::<Option<BTreeSet<_>>>()?
            .into_iter()
            .collect();
        if names.len() < 2 || names.len() > MAX_POOLS {
            return None;
        }
        let reported: Vec<BTreeMap<u32, LayerCost>> = names
            .iter()
            .map(|name| {
                reported_layers(state, shape, &|id| {
                    pool_of(state, id).as_ref() == Some(name)
                })
            })
            .collect();
        let zones: Vec<FleetPool> = names
            .iter()
            .zip(zone_layers(&reported, &cost.spec.layers))
            .map(|(name, layers)| FleetPool {
                pool: name.clone(),
                device: DeviceCosts {
                    name: name.to_string(),
                    layers,
                    memory_mb: pool_memory_mb(state, workers, name, shape),
                },
            })
            .collect();
        let mut links = links(state, &cost.transfer);
        if let Err(e) = links.set_pairs_of(&self.set_links) {
            tracing::warn!("planner.links not applied: {e}");
        }
        let current = self.fleet.as_ref().is_some_and(|f| {
            f.pools() == zones.as_slice()
                && f.spec() == &cost.spec
                && f.links() == &links
                && f.steps_in_zone() == shape.steps_in_zone
        });
        if !current {
            self.fleet = Fleet::new(cost.spec.clone(), zones, links)
                .map(|fleet| {
                    fleet
                        .with_all_reduce_by_zone(!self.flat_rings)
                        .with_steps_in_zone(shape.steps_in_zone)
                })
                .inspect_err(|e| tracing::warn!("planning as one zone: {e}"))
                .ok();
            let shown: Vec<String> = names.iter().map(Pool::to_string).collect();
            if let Some(fleet) = &self.fleet {
                let model_ms: Vec<String> = (0..names.len())
                    .map(|z| format!("{}={:.1}", names[z], fleet.pace(z)))
                    .collect();
                tracing::info!(
                    zones = ?shown,
                    model_ms = ?model_ms,
                    within_gbit = fleet.links().within.gbit_per_s,
                    across_gbit = fleet.links().across.gbit_per_s,
                    "planning over zones"
                );
            }
            if self.objective == ObjectiveKind::SamplesPerDollar
                && self.objective(&names) == objective::Objective::Samples
            {
                tracing::warn!(
                    zones = ?shown,
                    "planning for samples: planner.zone_prices does not price every zone"
                );
            }
        }
        let objective = self.objective(&names);
        self.planned_for = Some(objective.clone());
        let fleet = self.fleet.as_mut()?;
        fleet.set_prices(objective.prices());
        let (node_zones, counts) = counted(&pools, &names);
        let plans = fleet.plans(&counts);
        let view = fleet_view(fleet, &counts);
        let cost = CostModel::new(
            cost.spec.clone(),
            objective.table(&plans, &counts).as_ref().clone(),
            cost.transfer.clone(),
        )
        .with_repartition(cost.repartition);
        Some(Zoned {
            node_zones,
            plans,
            cost: Arc::new(cost),
            view,
        })
    }
}

/// The index in `names` of each worker's pool (`pools`, in the workers' order), and how many
/// workers each of `names` holds.
fn counted(pools: &[Option<Pool>], names: &[Pool]) -> (Vec<usize>, Vec<u32>) {
    let node_zones: Vec<usize> = pools
        .iter()
        .map(|pool| {
            names
                .iter()
                .position(|n| Some(n) == pool.as_ref())
                .unwrap_or(0)
        })
        .collect();
    let counts = (0..names.len())
        .map(|z| node_zones.iter().filter(|&&x| x == z).count() as u32)
        .collect();
    (node_zones, counts)
}

/// The zone member `id` said it is in (`""` when it did not, or is not a member).
pub(crate) fn zone_of<'a>(state: &'a ControlState, id: &NodeId) -> &'a str {
    state
        .members
        .get(id)
        .map_or("", |m| m.peer.caps.zone.as_str())
}

/// Whether zones `a` and `b` were both said and differ (what crosses between them leaves a
/// zone; a member that said no zone crosses nothing).
pub(crate) fn zones_differ(a: &str, b: &str) -> bool {
    !a.is_empty() && !b.is_empty() && a != b
}

/// The pool member `id` is in: its instance type in its zone, or its zone alone where it said
/// no type; `None` when it said no zone (or is not a member).
pub(crate) fn pool_of(state: &ControlState, id: &NodeId) -> Option<Pool> {
    let caps = &state.members.get(id)?.peer.caps;
    // The membership record was checked by the same rule when it was committed.
    Pool::of_node(&caps.zone, &caps.instance_type)
        .ok()
        .flatten()
}

/// The memory `pool`'s devices hold, MiB: the least its `workers` said in their membership
/// records, or `shape`'s (the planner's own device's) where none said.
fn pool_memory_mb(state: &ControlState, workers: &[NodeId], pool: &Pool, shape: &JobShape) -> f64 {
    workers
        .iter()
        .filter(|id| pool_of(state, id).as_ref() == Some(pool))
        .filter_map(|id| state.members.get(id))
        .map(|m| m.peer.caps.memory_mib)
        .filter(|&mib| mib > 0)
        .min()
        .map_or(shape.memory_mb, |mib| mib as f64)
}

/// `fleet` with `counts` workers per zone, as `/status` shows it.
fn fleet_view(fleet: &Fleet, counts: &[u32]) -> FleetView {
    let link = |l: &Link| LinkView {
        gbit_per_s: l.gbit_per_s,
        latency_ms: l.latency_ms,
        usd_per_gb: l.usd_per_gb,
    };
    FleetView {
        pools: fleet
            .pools()
            .iter()
            .zip(counts)
            .enumerate()
            .map(|(z, (zone, nodes))| PoolView {
                pool: zone.pool.to_string(),
                nodes: *nodes,
                model_ms: fleet.pace(z),
            })
            .collect(),
        within: link(&fleet.links().within),
        across: link(&fleet.links().across),
        across_regions: link(&fleet.links().across_regions),
        advice: Vec::new(),
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
    median(
        layers
            .values()
            .filter(|l| l.params > 0.0)
            .map(|l| (l.forward_ms + l.backward_ms) / l.params)
            .filter(|p| p.is_finite() && *p > 0.0)
            .collect(),
    )
}

/// The links the plans are priced on, from the rates the nodes measured from their sources
/// (`CostReport::bandwidth`): within a zone, the median of the rates between two nodes of one
/// zone (free); across, the median of the rates between zones of one region, and between
/// regions that of the rates between zones of two (each at the cloud's default price). A kind
/// of link nobody measured yet takes, within a zone, the cost model's rate (`transfer`: every
/// measured rate, else the assumed one) and, across zones or regions, the within rate slowed
/// by the ratio of the cloud's defaults ([`Links::default`]). Never the default's absolute rate: an
/// emulated cluster measures its rates at its time scale, and a fixed rate beside them made
/// every crossing look that many times dearer (the emulated hour at time scale 6 ran two
/// pipelines in one zone while the other stood idle).
fn links(state: &ControlState, transfer: &TransferModel) -> Links {
    let cloud = Links::default();
    let mut links = cloud.clone();
    let (mut within, mut across, mut apart) = (Vec::new(), Vec::new(), Vec::new());
    for (node, report) in &state.costs {
        for (source, rate) in &report.bandwidth {
            if !(rate.is_finite() && *rate > 0.0) {
                continue;
            }
            let (a, b) = (zone_of(state, node), zone_of(state, source));
            if a == b {
                within.push(*rate);
            } else if regions_apart(a, b) {
                apart.push(*rate);
            } else {
                across.push(*rate);
            }
        }
    }
    let gbit = |bytes_per_sec: f64| bytes_per_sec * 8.0 / 1e9;
    let (latency_ms, assumed) = match *transfer {
        TransferModel::Linear {
            latency_ms,
            bytes_per_sec,
        } => (latency_ms, gbit(bytes_per_sec)),
        TransferModel::Profiled10Gbps => (cloud.within.latency_ms, cloud.within.gbit_per_s),
    };
    links.within = Link {
        gbit_per_s: median(within).map_or(assumed, gbit),
        latency_ms,
        usd_per_gb: 0.0,
    };
    // Across zones and across regions: as measured, else the within rate slowed as the cloud's
    // defaults are.
    let slowed = |measured: Vec<f64>, default: &Link| {
        median(measured).map_or(
            links.within.gbit_per_s * default.gbit_per_s / cloud.within.gbit_per_s,
            gbit,
        )
    };
    links.across.gbit_per_s = slowed(across, &cloud.across);
    links.across_regions.gbit_per_s = slowed(apart, &cloud.across_regions);
    links.across.latency_ms = cloud.across.latency_ms.max(latency_ms);
    links.across_regions.latency_ms = cloud.across_regions.latency_ms.max(latency_ms);
    links
}

/// The median of `v`, `None` when it is empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests;
