//! What the leader plans over and estimates, as `/status` shows it: the fleet of zones and
//! pools, the links it prices, its advice per pool, and each configuration's estimate.

use serde::{Deserialize, Serialize};

/// The planner's throughput estimate of a configuration, from the measured cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EstimateView {
    /// `[D, P]`.
    pub config: [u32; 2],
    /// Estimated samples per second.
    pub samples_per_sec: f64,
    /// Over pools: the nodes it would run in each pool, in [`FleetView::pools`]' order (empty
    /// when the workers are planned as one pool).
    #[serde(default)]
    pub pools: Vec<u32>,
}

/// What the leader plans over when its workers are in several pools (issue 37): each pool's
/// nodes and the device speed it measured, and the links the plans are priced on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FleetView {
    /// The pools, by name.
    pub pools: Vec<PoolView>,
    /// A link inside a zone.
    pub within: LinkView,
    /// A link between two zones of one region.
    pub across: LinkView,
    /// A link between zones of two regions.
    pub across_regions: LinkView,
    /// What to do with each pool under the plan in force.
    pub advice: Vec<PoolAdviceView>,
}

/// What to do with one pool under the plan in force.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolAdviceView {
    /// The pool (`ZONE` or `ZONE/TYPE`).
    pub pool: String,
    /// Workers it holds now.
    pub nodes_now: u32,
    /// Of those, the plan's.
    pub nodes_used: u32,
    /// `release`, `grow` or `keep`.
    pub action: String,
    /// Why, in words.
    pub reason: String,
}

/// One pool as the leader prices it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolView {
    /// The pool (`ZONE` or `ZONE/TYPE`: its members' zone, and instance type where the leader
    /// tells types apart).
    pub pool: String,
    /// Workers in it.
    pub nodes: u32,
    /// Forward and backward of every layer on one micro-batch on its device, ms (its own
    /// nodes' reports, or other zones' scaled to its speed): how fast it is.
    pub model_ms: f64,
}

/// A link's price in the plans.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkView {
    /// Bandwidth, Gbit/s.
    pub gbit_per_s: f64,
    /// Latency, ms.
    pub latency_ms: f64,
    /// Egress price, USD per GB.
    pub usd_per_gb: f64,
}
