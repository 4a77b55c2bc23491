//! The sections of the node's configuration besides `[train]` and `[device]`: raft timing,
//! planning, notices and network bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::objective::ObjectiveKind;
use serde::Deserialize;

use super::error::ConfigError;

use crate::net::swarm::NetLimits;

/// Raft timing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Milliseconds per raft tick.
    pub tick_ms: u64,
    /// Election timeout in ticks (randomised by raft between this and twice this).
    pub election_ticks: usize,
    /// Leader heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// Milliseconds a member may stay unreachable before the leader proposes `Lost`.
    pub lost_timeout_ms: u64,
    /// Applied log entries between two snapshots of the control state (the log before a
    /// snapshot is compacted; a member that fell further behind is sent the snapshot).
    pub snapshot_interval: u64,
}

/// Leader-side planning.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    /// Seconds between availability ticks (one planning interval).
    pub interval_secs: f64,
    /// How configurations are chosen: `liveput` (Parcae's look-ahead optimizer on the measured
    /// cost model, moving state peer to peer), `liveput-predict` (the same optimizer on
    /// Parcae's published ARIMA predictor) or `reactive` (the throughput-optimal
    /// configuration for the nodes present, restarting from checkpoints on every change, like
    /// Parcae's throughput-optimised baseline).
    pub strategy: PlanStrategy,
    /// Planning intervals the liveput optimizer looks ahead.
    pub lookahead: u16,
    /// The cluster size the job asked for (Parcae's 32): the most nodes planned for, and the
    /// upper bound of `liveput-predict`'s forecasts.
    pub max_nodes: u32,
    /// A fixed `[D, P]` (experiments, reproducible runs): used whenever enough nodes are
    /// present; the first plan waits for them.
    pub pin: Option<[u32; 2]>,
    /// A profile of the model on the cluster's card (`parcae-node profile`): layers are priced
    /// from it instead of the nodes' own two-run measurements, so the first plan needs no
    /// report and uses warmed-up medians.
    pub profile: Option<PathBuf>,
    /// What plans over zones are after: `samples` (the most) or `samples-per-dollar` (the
    /// most per dollar of the nodes held, at `zone_prices`, and of the egress between zones).
    pub objective: ObjectiveKind,
    /// Spot price of a node-hour, USD, by zone or by pool (`ZONE/TYPE`, one instance type in a
    /// zone; a pool without an entry of its own takes its zone's). `samples-per-dollar` plans
    /// over pools whose every one has a price; others are planned for samples.
    pub zone_prices: BTreeMap<String, f64>,
    /// Links set by zone pair, `ZONE/ZONE=GBIT,MS,USD_PER_GB` (as `parcae-testnet simulate
    /// --link`; the same zone twice sets that zone's own link): what the plans are priced on
    /// for those pairs, over what the nodes measured and the cloud's defaults.
    pub links: Vec<String>,
    /// Whether a stage's replicas spread over zones may all-reduce by zone (a ring in each
    /// zone, shards across; chosen where no slower than one ring); `false` keeps one flat ring
    /// over them, as a planner blind to zones runs it.
    pub all_reduce_by_zone: bool,
}

/// Most zones `planner.zone_prices` names.
pub const MAX_ZONE_PRICES: usize = 64;

impl PlannerConfig {
    /// The links `links` sets, each entry checked (its zones, figures and the number of pairs).
    pub fn set_links(&self) -> Result<Links, ConfigError> {
        let mut links = Links::default();
        for (i, text) in self.links.iter().enumerate() {
            links
                .set(text)
                .map_err(|e| ConfigError::Invalid(format!("planner.links[{i}]: {e}")))?;
        }
        Ok(links)
    }

    /// Refuses prices that are not finite and non-negative, too many of them, or a
    /// samples-per-dollar objective with none.
    pub fn validate_pricing(&self) -> Result<(), ConfigError> {
        if self.zone_prices.len() > MAX_ZONE_PRICES {
            return Err(ConfigError::Invalid(format!(
                "planner.zone_prices: {} zones, at most {MAX_ZONE_PRICES}",
                self.zone_prices.len()
            )));
        }
        if let Some((zone, usd)) = self
            .zone_prices
            .iter()
            .find(|(_, usd)| !(usd.is_finite() && **usd >= 0.0))
        {
            return Err(ConfigError::Invalid(format!(
                "planner.zone_prices.{zone:?}: {usd} is not a price (USD per node-hour, >= 0)"
            )));
        }
        if self.objective == ObjectiveKind::SamplesPerDollar && self.zone_prices.is_empty() {
            return Err(ConfigError::Invalid(
                "planner.objective = \"samples-per-dollar\" needs planner.zone_prices".into(),
            ));
        }
        Ok(())
    }
}

/// See [`PlannerConfig::strategy`].
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PlanStrategy {
    /// Look-ahead liveput optimization with live migration, on the zone model's forecast
    /// with the notices the cluster holds (the simulator's `liveput-zone`).
    Liveput,
    /// Parcae as published: the look-ahead optimizer on its ARIMA predictor of the recorded
    /// availability, nothing valued past the horizon (the simulator's `liveput-predict`).
    LiveputPredict,
    /// Throughput-optimal configuration, restart on every change.
    Reactive,
}

/// Where preemption notices come from besides SIGTERM and SIGINT (which always count).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeProvider {
    /// Probe the AWS, GCE and Azure metadata services at start and poll the one that answers.
    #[default]
    Auto,
    /// AWS IMDSv2 spot instance-action.
    Aws,
    /// GCE `instance/preempted`.
    Gce,
    /// Azure Scheduled Events.
    Azure,
    /// Signals only.
    None,
}

/// Cloud metadata polling: which provider, and where each one's metadata service is (the
/// well-known addresses unless set; tests point them at local fakes).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct NoticeConfig {
    /// Which provider to poll (`auto`: the one that answers at start).
    pub provider: NoticeProvider,
    /// Milliseconds between metadata polls.
    pub poll_interval_ms: Option<u64>,
    /// AWS IMDS base URL (default `http://169.254.169.254`).
    pub aws_base_url: Option<String>,
    /// GCE metadata base URL (default `http://metadata.google.internal`).
    pub gce_base_url: Option<String>,
    /// Azure IMDS base URL (default `http://169.254.169.254`).
    pub azure_base_url: Option<String>,
}

/// Network bounds (see [`NetLimits`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Largest control frame in bytes.
    pub max_control_frame: u32,
    /// Most established connections.
    pub max_connections: u32,
    /// Milliseconds allowed for a connection handshake.
    pub handshake_timeout_ms: u64,
    /// Milliseconds allowed to open a control stream to a peer, or to write the frames waiting
    /// for it; past this they are dropped and the peer reported unreachable to raft.
    pub request_timeout_ms: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            lost_timeout_ms: 3000,
            snapshot_interval: 1024,
        }
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            interval_secs: 60.0,
            strategy: PlanStrategy::Liveput,
            lookahead: 8,
            max_nodes: 64,
            pin: None,
            profile: None,
            objective: ObjectiveKind::Samples,
            all_reduce_by_zone: true,
            zone_prices: BTreeMap::new(),
            links: Vec::new(),
        }
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        let d = NetLimits::default();
        Self {
            max_control_frame: d.max_control_frame,
            max_connections: d.max_connections,
            handshake_timeout_ms: d.handshake_timeout.as_millis() as u64,
            request_timeout_ms: d.request_timeout.as_millis() as u64,
        }
    }
}
