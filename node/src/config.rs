//! Node configuration: an optional TOML file; every field has a default.
//!
//! The command line names the things that differ per node (data dir, addresses, key); the file
//! holds tuning that is usually shared by a whole cluster. Unknown keys are errors so that a typo
//! does not silently fall back to a default.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::emulate::Emulation;
use crate::net::swarm::NetLimits;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The parse error (with line and column).
        source: Box<toml::de::Error>,
    },
    /// A value is out of its allowed range.
    #[error("config: {0}")]
    Invalid(String),
}

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
    /// The `[train]` keys the file sets: a node that adopts the cluster's job keeps these
    /// (and is refused where they differ from the job) and takes the others from the job.
    #[serde(skip)]
    pub explicit_train: BTreeSet<String>,
}

/// Where a stage's work runs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Burn's CPU backend, at its own speed.
    #[default]
    Cpu,
    /// An emulated GPU ([`crate::emulate`]): the model's layer structure is the profile's, the
    /// work runs on the CPU at a small width and is paced to the profiled GPU's times.
    Emulated,
}

/// The `[device]` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// CPU or an emulated accelerator.
    pub kind: DeviceKind,
    /// The profiled model an emulated accelerator runs (a built-in of `parcae-strategies`).
    pub profile: String,
    /// Emulated durations are divided by this (2: the emulated cluster runs twice as fast).
    pub time_scale: f64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Cpu,
            profile: "gpt-1.5b".into(),
            time_scale: 1.0,
        }
    }
}

impl DeviceConfig {
    /// How much faster than real time the device runs: the time scale of an emulated device
    /// (validated with the rest of the configuration), 1 on a real one.
    pub fn emulated_time_scale(&self) -> f64 {
        match self.kind {
            DeviceKind::Emulated => self.time_scale,
            DeviceKind::Cpu => 1.0,
        }
    }

    /// The emulation this section asks for (`None` on the CPU).
    pub fn emulation(&self) -> Result<Option<Emulation>, ConfigError> {
        match self.kind {
            DeviceKind::Cpu => Ok(None),
            DeviceKind::Emulated => Emulation::new(&self.profile, self.time_scale)
                .map(Some)
                .map_err(|e| ConfigError::Invalid(format!("device: {e}"))),
        }
    }
}

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

/// The built-in GPT presets `parcae-node` trains (`parcae_model::GptConfig`'s).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModelPreset {
    /// 4 pipeline layers, 30,080 parameters: tests and the default testnet.
    Tiny,
    /// 8 pipeline layers, 23.2 M parameters: the benchmark model.
    Small,
    /// GPT-2 124M: Hugging Face GPT-2's structure (14 pipeline layers, untied head).
    #[serde(rename = "gpt2-124m")]
    Gpt2_124m,
    /// GPT-2 medium, 355M (26 pipeline layers).
    #[serde(rename = "gpt2-355m")]
    Gpt2_355m,
    /// GPT-2 large, 774M (38 pipeline layers).
    #[serde(rename = "gpt2-774m")]
    Gpt2_774m,
    /// GPT-2 XL, 1.5B (50 pipeline layers).
    #[serde(rename = "gpt2-1558m")]
    Gpt2_1558m,
}

impl ModelPreset {
    /// The preset's sizes.
    pub fn gpt(self) -> parcae_model::GptConfig {
        use parcae_model::GptConfig;
        match self {
            ModelPreset::Tiny => GptConfig::tiny(),
            ModelPreset::Small => GptConfig::small(),
            ModelPreset::Gpt2_124m => GptConfig::gpt2_124m(),
            ModelPreset::Gpt2_355m => GptConfig::gpt2_355m(),
            ModelPreset::Gpt2_774m => GptConfig::gpt2_774m(),
            ModelPreset::Gpt2_1558m => GptConfig::gpt2_1558m(),
        }
    }
}

/// The width of a token file's ids, as the config names it.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtypeName {
    /// 2-byte ids.
    U16,
    /// 4-byte ids.
    U32,
}

impl From<TokenDtypeName> for parcae_model::TokenDtype {
    fn from(name: TokenDtypeName) -> Self {
        match name {
            TokenDtypeName::U16 => parcae_model::TokenDtype::U16,
            TokenDtypeName::U32 => parcae_model::TokenDtype::U32,
        }
    }
}

/// Where a node's job settings come from.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum JobSource {
    /// This file's `[train]`: a founder defines the cluster's job with it, a joiner whose
    /// job differs is refused.
    #[default]
    Own,
    /// The cluster's job, as its founder's `parcae-node` defined it: the node waits for the
    /// job, then trains it with its own data file (checked against the job's hash) and the
    /// `[train]` keys its file sets (refused where they differ).
    Adopt,
}

/// What the cluster trains. Every node must use the same values: the cluster replicates its
/// founder's as the job, and refuses a joiner whose job differs (or gives it the job, with
/// `job = "adopt"`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Train at all (a node without training only runs the control plane).
    pub enabled: bool,
    /// `own`: the job is this section's; `adopt`: the cluster's ([`JobSource`]).
    pub job: JobSource,
    /// Built-in GPT preset.
    pub model: ModelPreset,
    /// `synthetic` (the seeded built-in task), or a path: a token file when `tokens` names its
    /// width, else a text file read as byte-level tokens.
    pub data: String,
    /// `u16` or `u32`: `data` is a flat file of little-endian token ids (nanoGPT's `.bin`,
    /// or what `parcae-node prepare-data` writes), memory-mapped.
    pub tokens: Option<TokenDtypeName>,
    /// The model's vocabulary instead of the preset's (token ids must stay below it; a token
    /// file of GPT-2 ids needs at least 50,257).
    pub vocab_size: Option<usize>,
    /// Width of the residual stream instead of the preset's (a preset's structure at a
    /// reduced width, for example).
    pub d_model: Option<usize>,
    /// Attention heads instead of the preset's (must divide the width).
    pub n_heads: Option<usize>,
    /// Transformer blocks instead of the preset's.
    pub n_blocks: Option<usize>,
    /// Hidden width of the MLP instead of the preset's.
    pub d_ff: Option<usize>,
    /// Longest sequence instead of the preset's.
    pub seq_len: Option<usize>,
    /// A safetensors file of GPT-2 weights (Hugging Face names, as `parcae-node export`
    /// writes and OpenAI's GPT-2 is published) the model starts from instead of the seeded
    /// initialisation: a fine-tune. Every node needs the same file.
    pub init: Option<String>,
    /// Share of the data's examples (its last ones) held out for the validation loss, never
    /// trained (0: no validation).
    pub val_fraction: f64,
    /// Steps between validation losses (step 0 has one too).
    pub val_every: u64,
    /// Held-out samples each validation loss is the mean over (the same ones every time).
    pub val_samples: u32,
    /// Seed of the weights, the data order and the synthetic task.
    pub seed: u64,
    /// Samples per training step over the whole cluster.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Stop after this many committed steps (0: never).
    pub max_steps: u64,
    /// Every this many steps the first replica of each stage checkpoints (0: never).
    pub checkpoint_every: u64,
    /// The job's durable checkpoint store: a directory, or an `s3://`, `gs://` or `az://` URL
    /// (credentials and endpoint from the environment). Unset: `store/` in the data
    /// directory. A new cluster pointed at the same store resumes the job from it.
    pub checkpoint_store: Option<String>,
    /// Another store of this job (a backup): its newest complete checkpoint is copied into the
    /// job's store at start, for a new cluster, or one whose training stopped for want of a
    /// checkpoint, to resume from (`parcae-node run --restore`).
    pub restore: Option<String>,
    /// Peak learning rate.
    pub peak_lr: f64,
    /// Warmup steps of the learning-rate schedule.
    pub warmup_steps: u64,
    /// Seconds a pipeline neighbour or ring peer may take to answer before the step is
    /// abandoned.
    pub peer_timeout_secs: f64,
    /// Port of the data plane (0: any free port), bound on the libp2p listen IP.
    pub data_port: u16,
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
    /// Milliseconds allowed for one control request.
    pub request_timeout_ms: u64,
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
            explicit_train: BTreeSet::new(),
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            job: JobSource::Own,
            model: ModelPreset::Tiny,
            data: "synthetic".into(),
            tokens: None,
            vocab_size: None,
            d_model: None,
            n_heads: None,
            n_blocks: None,
            d_ff: None,
            seq_len: None,
            init: None,
            val_fraction: 0.0,
            val_every: 10,
            val_samples: 16,
            seed: 1,
            global_batch: 16,
            micro_batch: 2,
            max_steps: 0,
            checkpoint_every: 20,
            checkpoint_store: None,
            restore: None,
            peak_lr: 1e-2,
            warmup_steps: 10,
            peer_timeout_secs: 10.0,
            data_port: 0,
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            lost_timeout_ms: 3000,
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
        if self.notices.poll_interval_ms == Some(0) {
            return Err(ConfigError::Invalid(
                "notices.poll_interval_ms must be > 0".into(),
            ));
        }
        self.device.emulation()?;
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

    /// The validation split `[train]` asks for, if any.
    pub fn validation(&self) -> Option<crate::train::ValidationConfig> {
        let t = &self.train;
        (t.val_fraction > 0.0).then_some(crate::train::ValidationConfig {
            fraction: t.val_fraction,
            every: t.val_every,
            samples: t.val_samples,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = NodeConfig::parse("", "x").unwrap();
        assert_eq!(c, NodeConfig::default());
        assert_eq!(c.grace(), Duration::from_secs(30));
        let c = NodeConfig::parse(
            "grace_secs = 2.5\n[raft]\ntick_ms = 50\n[notices]\naws_base_url = \"http://127.0.0.1:1\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.grace(), Duration::from_millis(2500));
        assert_eq!(c.raft.tick_ms, 50);
        assert_eq!(c.raft.election_ticks, 10);
        assert_eq!(
            c.notices.aws_base_url.as_deref(),
            Some("http://127.0.0.1:1")
        );
    }

    #[test]
    fn rejects_typos_and_bad_ranges() {
        assert!(matches!(
            NodeConfig::parse("grace_sec = 1", "x"),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            NodeConfig::parse("[raft]\nelection_ticks = 1", "x"),
            Err(ConfigError::Invalid(_))
        ));
        assert!(matches!(
            NodeConfig::parse("grace_secs = -1.0", "x"),
            Err(ConfigError::Invalid(_))
        ));
        let e = NodeConfig::parse(
            "[planner]
max_nodes = 0",
            "x",
        )
        .unwrap_err();
        assert!(e.to_string().contains("planner.max_nodes"), "{e}");
        assert!(
            NodeConfig::parse(
                "[planner]
strategy = \"liveput_predict\"",
                "x"
            )
            .is_err()
        );
    }

    #[test]
    fn the_planner_runs_any_of_the_three_strategies() {
        for (name, strategy) in [
            ("liveput", PlanStrategy::Liveput),
            ("liveput-predict", PlanStrategy::LiveputPredict),
            ("reactive", PlanStrategy::Reactive),
        ] {
            let text = format!("[planner]\nstrategy = {name:?}\nmax_nodes = 32\n");
            let c = NodeConfig::parse(&text, "x").unwrap();
            assert_eq!((c.planner.strategy, c.planner.max_nodes), (strategy, 32));
        }
        assert_eq!(NodeConfig::default().planner.max_nodes, 64);
    }

    #[test]
    fn an_emulated_device_trains_the_profile_s_layer_list() {
        let c = NodeConfig::parse(
            "[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = 4.0\n",
            "x",
        )
        .unwrap();
        let e = c.device.emulation().unwrap().expect("emulated");
        assert_eq!(e.time_scale(), 4.0);
        assert_eq!(c.model().n_blocks, 48);
        assert_eq!(c.model().d_model, crate::emulate::STAND_IN.d_model);
        assert_eq!(c.model().kernel, parcae_model::BlockKernel::Fused);
        assert_eq!(
            NodeConfig::default().model().kernel,
            parcae_model::BlockKernel::Composed
        );
        let wider = NodeConfig::parse(
            "[train]\nd_model = 64\n[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\n",
            "x",
        )
        .unwrap();
        assert_eq!((wider.model().d_model, wider.model().n_blocks), (64, 48));
        assert_eq!(
            NodeConfig::default().model(),
            parcae_model::GptConfig::tiny()
        );
        for (bad, named) in [
            ("profile = \"gpt-9b\"", "gpt-9b"),
            ("time_scale = 0.0", "time_scale"),
        ] {
            let text = format!("[device]\nkind = \"emulated\"\n{bad}\n");
            let e = NodeConfig::parse(&text, "x").unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        assert!(NodeConfig::parse("[device]\nkind = \"tpu\"\n", "x").is_err());
        let timeout = |device: &str| {
            let text = format!("[train]\npeer_timeout_secs = 6.0\n[device]\n{device}\n");
            NodeConfig::parse(&text, "x").unwrap().peer_timeout()
        };
        assert_eq!(timeout(""), Duration::from_secs(6));
        assert_eq!(
            timeout("kind = \"emulated\"\ntime_scale = 4.0"),
            Duration::from_secs(6)
        );
        assert_eq!(
            timeout("kind = \"emulated\"\ntime_scale = 0.5"),
            Duration::from_secs(12)
        );
    }

    #[test]
    fn the_lost_member_timeout_runs_on_emulated_time_above_three_heartbeats() {
        let lost = |device: &str| {
            let text = format!(
                "[raft]\ntick_ms = 100\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n[device]\n{device}\n"
            );
            NodeConfig::parse(&text, "x").unwrap().lost_timeout()
        };
        let ms = Duration::from_millis;
        assert_eq!(lost(""), ms(2000));
        assert_eq!(lost("kind = \"emulated\"\ntime_scale = 2.0"), ms(1000));
        // Three heartbeats of 200 ms at the least.
        assert_eq!(lost("kind = \"emulated\"\ntime_scale = 12.0"), ms(600));
        // A slower emulated device does not wait longer: heartbeats are not paced.
        assert_eq!(lost("kind = \"emulated\"\ntime_scale = 0.5"), ms(2000));
    }

    #[test]
    fn the_model_is_one_of_the_presets() {
        let c = NodeConfig::parse(
            "[train]\ndata = \"t.bin\"\ntokens = \"u16\"\nvocab_size = 50257",
            "x",
        )
        .unwrap();
        assert_eq!(c.train.tokens, Some(TokenDtypeName::U16));
        assert_eq!(c.model().vocab_size, 50_257);
        for bad in ["tokens = \"u16\"", "tokens = \"u8\"", "vocab_size = 1"] {
            assert!(
                NodeConfig::parse(&format!("[train]\n{bad}"), "x").is_err(),
                "{bad}"
            );
        }
        let c = NodeConfig::parse("[train]\nmodel = \"small\"", "x").unwrap();
        assert_eq!(c.train.model, ModelPreset::Small);
        assert_eq!(c.train.model.gpt(), parcae_model::GptConfig::small());
        let c = NodeConfig::parse(
            "[train]\nmodel = \"gpt2-124m\"\nd_model = 64\nn_heads = 4\nd_ff = 256",
            "x",
        )
        .unwrap();
        let gpt = c.model();
        assert_eq!(
            (
                gpt.d_model,
                gpt.n_heads,
                gpt.d_ff,
                gpt.n_blocks,
                gpt.vocab_size
            ),
            (64, 4, 256, 12, 50_257)
        );
        assert_eq!(gpt.gelu, parcae_model::Gelu::Tanh);
        let e = NodeConfig::parse("[train]\nmodel = \"gpt2-124m\"\nd_model = 100", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("n_heads 12 does not divide d_model 100"), "{e}");
        let e = NodeConfig::parse("[train]\nmodel = \"huge\"", "x").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("huge") && text.contains("tiny") && text.contains("small"),
            "{text}"
        );
    }
}
