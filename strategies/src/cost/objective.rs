//! What a zone-aware planner plans for, the user's choice: the most samples, or the most
//! samples per dollar of the pools used and of the egress between zones.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::fleet::Plans;
use super::throughput::ThroughputTable;

/// What to plan for as a user says it, in a node's configuration (`[planner] objective`) or on
/// a command line (`--objective`): [`Objective`] is the same choice with the pools' prices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum ObjectiveKind {
    /// The most samples.
    #[default]
    Samples,
    /// The most samples per dollar.
    SamplesPerDollar,
}

impl ObjectiveKind {
    /// Its name in configuration files, flags and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Samples => "samples",
            Self::SamplesPerDollar => "samples-per-dollar",
        }
    }
}

/// What a zone-aware planner plans for: the user's choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Objective {
    /// The most samples.
    #[default]
    Samples,
    /// The most samples per dollar, the nodes of pool `z` billed at `usd_per_node_hour[z]`
    /// while a plan uses the pool (a pool it leaves idle is released), and egress at the
    /// links' prices ([`super::fleet::Placement::per_dollar_rate`]).
    SamplesPerDollar {
        /// Spot price of a node-hour in each pool, in the fleet's order.
        usd_per_node_hour: Vec<f64>,
    },
}

impl Objective {
    /// Which choice it is.
    pub fn kind(&self) -> ObjectiveKind {
        match self {
            Self::Samples => ObjectiveKind::Samples,
            Self::SamplesPerDollar { .. } => ObjectiveKind::SamplesPerDollar,
        }
    }

    /// The pools' prices a fleet lays its plans out by (`None`: for samples).
    pub fn prices(&self) -> Option<&[f64]> {
        match self {
            Self::Samples => None,
            Self::SamplesPerDollar { usd_per_node_hour } => Some(usd_per_node_hour),
        }
    }

    /// The table a zone-aware planner plans by on `plans`, with `counts[z]` nodes held in
    /// pool `z`.
    pub fn table(&self, plans: &Plans, counts: &[u32]) -> Arc<ThroughputTable> {
        match self.prices() {
            None => plans.table.clone(),
            Some(usd) => {
                Arc::new(ThroughputTable::from_rows(plans.placements.iter().map(
                    |(config, placed)| (*config, placed.per_dollar_rate(counts, usd)),
                )))
            }
        }
    }
}
