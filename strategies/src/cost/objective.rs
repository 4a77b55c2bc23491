//! What a zone-aware planner plans for, the user's choice: the most samples, or the most
//! samples per dollar of the nodes held and of the egress between zones.

use std::sync::Arc;

use super::fleet::Plans;
use super::throughput::ThroughputTable;

impl Plans {
    /// The table of a planner that wants the most samples per dollar, where the fleet's nodes
    /// cost `held_usd_per_sec` (billed held, used or not) and each placement pays its egress:
    /// every rate `r` becomes `r C / (C + e r)`, its samples per dollar at that bill `C` scaled
    /// back to samples per second (so a placement that crosses no zone keeps its rate, and the
    /// planner's migration and look-ahead arithmetic stays in samples). Without a bill the
    /// table is unchanged.
    pub fn per_dollar(&self, held_usd_per_sec: f64) -> ThroughputTable {
        if !(held_usd_per_sec.is_finite() && held_usd_per_sec > 0.0) {
            return (*self.table).clone();
        }
        let c = held_usd_per_sec;
        ThroughputTable::from_rows(self.placements.iter().map(|(config, placed)| {
            let r = placed.samples_per_sec;
            (*config, r / (1.0 + placed.egress_usd_per_sample * r / c))
        }))
    }
}

/// What a zone-aware planner plans for: the user's choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Objective {
    /// The most samples.
    #[default]
    Samples,
    /// The most samples per dollar, the nodes of zone `z` billed at `usd_per_node_hour[z]`
    /// and egress at the links' prices ([`Plans::per_dollar`]).
    SamplesPerDollar {
        /// Spot price of a node-hour in each zone, in the fleet's zone order.
        usd_per_node_hour: Vec<f64>,
    },
}

impl Objective {
    /// The table a zone-aware planner plans by on `plans`, with `counts[z]` nodes held in
    /// zone `z`.
    pub fn table(&self, plans: &Plans, counts: &[u32]) -> Arc<ThroughputTable> {
        match self {
            Self::Samples => plans.table.clone(),
            Self::SamplesPerDollar { usd_per_node_hour } => {
                let per_hour: f64 = counts
                    .iter()
                    .zip(usd_per_node_hour)
                    .map(|(&n, usd)| f64::from(n) * usd)
                    .sum();
                Arc::new(plans.per_dollar(per_hour / 3600.0))
            }
        }
    }
}
