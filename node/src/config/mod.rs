//! Node configuration: an optional TOML file; every field has a default.
//!
//! The command line names the things that differ per node (data dir, addresses, key); the file
//! holds tuning that is usually shared by a whole cluster. Unknown keys are errors so that a typo
//! does not silently fall back to a default.

mod device;
mod error;
mod placement;
mod sections;
mod train;

pub use device::{DeviceChoice, DeviceConfig, DeviceKind};
pub use error::ConfigError;
pub use placement::PlacementConfig;
pub use sections::{
    NetConfig, NoticeConfig, NoticeProvider, PlanStrategy, PlannerConfig, RaftConfig,
};
pub use train::{JobSource, ModelPreset, TokenDtypeName, TrainConfig};

use parcae_consensus::state::Capabilities;
use parcae_strategies::cost::profile::DeviceProfile;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::net::swarm::NetLimits;

/// Everything tunable about a node.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Seconds a node keeps serving after a SIGTERM/SIGINT notice before it exits.
    pub grace_secs: f64,
    /// Most raft voters; all other members are learners.
    pub max_voters: usize,
    /// Raft timing.
    pub raft: RaftConfig,
    /// Leader-side planning.
    pub planner: PlannerConfig,
    /// Cloud metadata pollers.
    pub notices: NoticeConfig,
    /// Network bounds.
    pub net: NetConfig,
    /// What to train and how.
    pub train: TrainConfig,
    /// What the stage runs on.
    pub device: DeviceConfig,
    /// Where the node runs: its zone and instance type.
    pub placement: PlacementConfig,
    /// The `[train]` keys the file sets: a node that adopts the cluster's job keeps these
    /// (and is refused where they differ from the job) and takes the others from the job.
    #[serde(skip)]
    pub explicit_train: BTreeSet<String>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            grace_secs: 30.0,
            max_voters: 5,
            raft: RaftConfig::default(),
            planner: PlannerConfig::default(),
            notices: NoticeConfig::default(),
            net: NetConfig::default(),
            train: TrainConfig::default(),
            device: DeviceConfig::default(),
            placement: PlacementConfig::default(),
            explicit_train: BTreeSet::new(),
        }
    }
}

impl NodeConfig {
    /// Parses and validates TOML text.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let parse_error = |e| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(e),
        };
        let mut config: NodeConfig = toml::from_str(text).map_err(parse_error)?;
        let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        if let Some(train) = table.get("train").and_then(|t| t.as_table()) {
            config.explicit_train = train.keys().cloned().collect();
        }
        config.validate()?;
        Ok(config)
    }

    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// Checks ranges that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !(self.grace_secs.is_finite() && self.grace_secs >= 0.0) {
            return Err(ConfigError::Invalid("grace_secs must be >= 0".into()));
        }
        if !positive(self.planner.interval_secs) {
            return Err(ConfigError::Invalid(
                "planner.interval_secs must be > 0".into(),
            ));
        }
        if self.max_voters.is_multiple_of(2) {
            return Err(ConfigError::Invalid(
                "max_voters must be odd (an even count adds no fault tolerance)".into(),
            ));
        }
        let r = &self.raft;
        if r.tick_ms == 0 || r.heartbeat_ticks == 0 || r.election_ticks <= r.heartbeat_ticks {
            return Err(ConfigError::Invalid(
                "raft: tick_ms and heartbeat_ticks must be > 0 and election_ticks > heartbeat_ticks"
                    .into(),
            ));
        }
        if !(1..=1_000_000).contains(&r.snapshot_interval) {
            return Err(ConfigError::Invalid(
                "raft.snapshot_interval must be between 1 and 1000000 entries".into(),
            ));
        }
        self.placement.validate()?;
        self.planner.validate_pricing()?;
        self.planner.set_links()?;
        if self.net.max_control_frame < 1024 {
            return Err(ConfigError::Invalid(
                "net.max_control_frame must be >= 1024".into(),
            ));
        }
        let t = &self.train;
        if t.global_batch == 0 || t.micro_batch == 0 || t.micro_batch > t.global_batch {
            return Err(ConfigError::Invalid(
                "train: global_batch and micro_batch must be > 0, micro_batch <= global_batch"
                    .into(),
            ));
        }
        if t.tokens.is_some() && t.data == "synthetic" {
            return Err(ConfigError::Invalid(
                "train.tokens names the width of a token file: set train.data to its path".into(),
            ));
        }
        if let Some(vocab) = t.vocab_size
            && !(2..=u32::MAX as usize).contains(&vocab)
        {
            return Err(ConfigError::Invalid(format!(
                "train.vocab_size {vocab}: must be between 2 and {}",
                u32::MAX
            )));
        }
        if !(0.0..1.0).contains(&t.val_fraction)
            || t.val_fraction > 0.0 && (t.val_every == 0 || t.val_samples == 0)
        {
            return Err(ConfigError::Invalid(format!(
                "train: val_fraction {} must be in [0, 1), and with validation val_every and \
                 val_samples > 0",
                t.val_fraction
            )));
        }
        parcae_model::Gpt::new(self.model())
            .map_err(|e| ConfigError::Invalid(format!("train: the model's sizes: {e}")))?;
        if !(positive(t.peak_lr) && positive(t.peer_timeout_secs)) {
            return Err(ConfigError::Invalid(
                "train.peak_lr and train.peer_timeout_secs must be > 0".into(),
            ));
        }
        check_sync(t)?;
        if let Some([d, p]) = self.planner.pin
            && (d == 0 || p == 0 || d > t.global_batch)
        {
            return Err(ConfigError::Invalid(format!(
                "planner.pin [{d}, {p}] needs D, P > 0 and D <= train.global_batch"
            )));
        }
        if self.planner.lookahead == 0 || self.planner.lookahead > 64 {
            return Err(ConfigError::Invalid(
                "planner.lookahead must be in 1..=64".into(),
            ));
        }
        if self.planner.max_nodes == 0 || self.planner.max_nodes > 1024 {
            return Err(ConfigError::Invalid(
                "planner.max_nodes must be in 1..=1024".into(),
            ));
        }
        if let Some(path) = &self.planner.profile {
            self.check_profile(path)?;
        }
        if self.notices.poll_interval_ms == Some(0) {
            return Err(ConfigError::Invalid(
                "notices.poll_interval_ms must be > 0".into(),
            ));
        }
        self.device.validate()
    }

    /// `[planner] profile` reads as a profile of a model with this node's layer count.
    fn check_profile(&self, path: &Path) -> Result<(), ConfigError> {
        let profile = DeviceProfile::load(path)
            .map_err(|e| ConfigError::Invalid(format!("planner.profile: {e}")))?;
        let layers = self.model().n_blocks + 2;
        if profile.layers.len() != layers {
            return Err(ConfigError::Invalid(format!(
                "planner.profile: {} measured {} ({} layers), and the model trained here has \
                 {layers} layers",
                path.display(),
                profile.model,
                profile.layers.len()
            )));
        }
        Ok(())
    }

    /// The GPT the node trains: the `[train]` preset with the sizes `[train]` sets, a
    /// vocabulary of 256 on byte-level text, and on an emulated device the narrow stand-in of
    /// the emulated model (its layer list, at a small width the `[train]` sizes can change).
    pub fn model(&self) -> parcae_model::GptConfig {
        let t = &self.train;
        let emulation = self.device.emulation().ok().flatten();
        let mut gpt = match &emulation {
            Some(e) => e.stand_in(t.model.gpt()),
            None => t.model.gpt(),
        };
        let overrides = [
            (&mut gpt.vocab_size, t.vocab_size),
            (&mut gpt.d_model, t.d_model),
            (&mut gpt.n_heads, t.n_heads),
            (&mut gpt.n_blocks, t.n_blocks),
            (&mut gpt.d_ff, t.d_ff),
            (&mut gpt.seq_len, t.seq_len),
        ];
        for (field, value) in overrides {
            if let Some(v) = value {
                *field = v;
            }
        }
        if t.data != "synthetic" && t.tokens.is_none() {
            // A text file read byte by byte.
            gpt.vocab_size = 256;
        }
        if let Some(e) = emulation {
            gpt.n_blocks = e.blocks();
        }
        gpt
    }

    /// Time a pipeline neighbour or ring peer may take: `train.peer_timeout_secs`, stretched
    /// by `1 / time_scale` on an emulated device slower than real time, as every emulated wait
    /// is (a faster one keeps it: its waits only shrink). Heartbeats and elections are not
    /// paced, so their timeouts do not change; the lost-member timeout does
    /// ([`NodeConfig::lost_timeout`]).
    pub fn peer_timeout(&self) -> Duration {
        let stretch = (1.0 / self.device.emulated_time_scale()).max(1.0);
        Duration::from_secs_f64(self.train.peer_timeout_secs * stretch)
    }

    /// How long a member may stay unreachable before the leader proposes `Lost`:
    /// `raft.lost_timeout_ms`, divided by the time scale of an emulated device faster than real
    /// time. A preemption without notice is found this long after the kill, and the emulated
    /// cluster must pay it in emulated time as the cluster it emulates would: unscaled, a
    /// 2 s timeout cost a reactive cluster at time scale 5 ten emulated seconds per change,
    /// a handicap its real counterpart does not have. Never below three heartbeats: a member
    /// that missed two is not yet lost.
    pub fn lost_timeout(&self) -> Duration {
        let configured = Duration::from_millis(self.raft.lost_timeout_ms);
        let scale = self.device.emulated_time_scale().max(1.0);
        let heartbeat = Duration::from_millis(self.raft.tick_ms) * self.raft.heartbeat_ticks as u32;
        configured.div_f64(scale).max(heartbeat * 3).min(configured)
    }

    /// Raft's election timeout: `election_ticks` ticks of `tick_ms`.
    pub fn raft_election_timeout(&self) -> Duration {
        Duration::from_millis(self.raft.tick_ms) * self.raft.election_ticks as u32
    }

    /// What this node says of itself in its membership record: zone, instance type, device
    /// and its memory.
    pub fn capabilities(&self) -> Capabilities {
        self.placement.capabilities(&self.device)
    }

    /// The grace period as a duration.
    pub fn grace(&self) -> Duration {
        Duration::from_secs_f64(self.grace_secs)
    }

    /// Network bounds for the swarm.
    pub fn net_limits(&self) -> NetLimits {
        NetLimits {
            max_control_frame: self.net.max_control_frame,
            max_connections: self.net.max_connections,
            handshake_timeout: Duration::from_millis(self.net.handshake_timeout_ms),
            request_timeout: Duration::from_millis(self.net.request_timeout_ms),
            ..NetLimits::default()
        }
    }
}

/// Refuses a sync mode the node does not run, and an outer step no round should take.
fn check_sync(t: &TrainConfig) -> Result<(), ConfigError> {
    if t.sync == parcae_outer::SyncMode::Auto {
        return Err(ConfigError::Invalid(
            "train.sync \"auto\": the node does not choose the mode yet; say \"step\" or \
         \"diloco:H\" (parcae-testnet simulate --sync auto compares them)"
                .into(),
        ));
    }
    t.job_spec()
        .outer
        .check()
        .map_err(|e| ConfigError::Invalid(format!("train.outer_lr/outer_momentum: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests;
