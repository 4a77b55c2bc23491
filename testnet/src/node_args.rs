//! The options every subcommand that starts nodes shares: how the nodes run (`NodeArgs`) and
//! where the results go (`OutputArgs`), with the strategies the nodes may plan by.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use parcae_outer::{SyncMode, Wire};
use parcae_strategies::cost::objective::ObjectiveKind;

use crate::cluster::NoticeMode;
use crate::gpus::{self, DeviceArg};
use crate::node_config::{CPU_GLOBAL_BATCH, Emulate, NodeSettings};

/// Planning strategies of the node (`[planner] strategy`).
pub const STRATEGIES: [&str; 3] = ["liveput", "liveput-predict", REACTIVE];
/// The reactive baseline's name.
pub const REACTIVE: &str = "reactive";
/// How long a member may be unreachable before the leader declares it lost, ms: the nodes'
/// failure detector, which finds a kill without notice.
pub const LOST_TIMEOUT_MS: u64 = 2000;

/// How the nodes are run (shared by every subcommand).
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// The parcae-node executable (default: $PARCAE_NODE_BIN, else parcae-node next to this
    /// executable, built first when started by `cargo run`).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Wall-clock seconds of one planning interval (each trace interval is replayed in this).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub interval_secs: u64,
    /// Seconds between a preemption notice and the node's deadline (SIGKILL).
    #[arg(long, default_value_t = 3.0)]
    pub grace_secs: f64,
    /// How preemption notices reach the nodes.
    #[arg(long, value_enum, default_value = "sigterm")]
    pub notice: NoticeMode,
    /// Model the nodes train.
    #[arg(long, default_value = "tiny", value_parser = ["tiny", "small", "gpt2-124m", "gpt2-355m"])]
    pub model: String,
    /// Training data: `synthetic` or a text file.
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// Seed of the model, the data order and the choice of preempted nodes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop training after this many steps (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_steps: u64,
    /// Stop training after this many committed samples (the job's step limit: whole steps,
    /// rounded up).
    #[arg(long, conflicts_with = "max_steps", value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: Option<u64>,
    /// How replicas in different zones agree: `step` (every step, over every replica) or
    /// `diloco:H` (inside each zone every step, between zones every H steps through DiLoCo's
    /// outer step; `[train] sync`).
    #[arg(long, default_value = "step")]
    pub sync: SyncMode,
    /// DiLoCo's outer learning rate (default: the node's, the paper's 0.7).
    #[arg(long, requires = "outer_momentum")]
    pub outer_lr: Option<f32>,
    /// DiLoCo's outer momentum (default: the node's, the paper's 0.9).
    #[arg(long, requires = "outer_lr")]
    pub outer_momentum: Option<f32>,
    /// The form DiLoCo's pseudo-gradients cross zones in: f32, bf16 or int8 (`[train]
    /// pseudo_gradient`).
    #[arg(long, default_value = "f32")]
    pub pseudo_gradient: Wire,
    /// Compute threads of each node (`RAYON_NUM_THREADS`; a node cuts its micro-batches into as
    /// many lanes). Keep nodes x threads within the machine's cores: the default 1 suits
    /// six nodes on two.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,
    /// Emulate a GPU of this profiled model on every node: a built-in of Parcae's (e.g.
    /// `gpt-1.5b` on its V100s) or a profile file (`PROFILE.json`, `parcae-node profile` on a
    /// real card). The nodes train its layer list at a small width and pace the work to the
    /// profiled times.
    #[arg(long)]
    pub emulate: Option<String>,
    /// Emulated durations are divided by this (with --emulate).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// What the nodes train on: `cpu`, `cuda` (the visible GPUs, node k on GPU k mod their
    /// number) or `cuda:N` (every node on GPU N). CUDA needs a node built with the `cuda`
    /// feature (`cargo build --release -p parcae-node --features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Pin every plan to `D`x`P` (data-parallel pipelines x stages, e.g. `1x3`) instead of
    /// the strategy's choice: with `D` = 1 every node is the only holder of its stage, so a
    /// kill takes a whole stage (and the cluster rolls back to a checkpoint).
    #[arg(long, value_parser = parse_pin)]
    pub pin: Option<[u32; 2]>,
    /// First port: node k serves /status on BASE+2k and p2p on BASE+2k+1 (default: ephemeral).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1024..))]
    pub base_port: Option<u16>,
    /// Every node in a network namespace of its own, joined to the others through a bridge, so
    /// that `chaos --partition-every` cuts the network itself (needs root).
    #[arg(long, conflicts_with = "base_port")]
    pub netns: bool,
    /// What the nodes' plans over zones (`--zones`) are after: the most samples, or the most
    /// samples per dollar of nodes and egress (`[planner] objective`; needs --price-spot).
    #[arg(long, value_enum, default_value = "samples")]
    pub objective: ObjectiveKind,
    /// Keep every all-reduce across zones one flat ring (`[planner] all_reduce_by_zone =
    /// false`), as before the all-reduce by zone: to measure what it saves.
    #[arg(long)]
    pub flat_rings: bool,
    /// The spot prices of `--price-spot` (`run` and `compare` take them from their price
    /// flags): with --objective samples-per-dollar, each zone's (or pool's) is given to the
    /// nodes' planners (`[planner] zone_prices`).
    #[arg(skip)]
    pub spot_prices: Vec<String>,
    /// Directory for the run directories (default: a fresh temporary directory, removed
    /// after a successful run).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// Where results go.
#[derive(clap::Args, Debug, Clone)]
pub struct OutputArgs {
    /// Fail (exit code 2) unless every run trained with a falling loss, lost no committed step
    /// and trained no sample twice (for CI).
    #[arg(long)]
    pub check: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write PNG plots into this directory (created if missing).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Parses `DxP` (e.g. `1x3`): both between 1 and 64.
fn parse_pin(text: &str) -> Result<[u32; 2], String> {
    let bad = || format!("{text:?}: expected DxP with D, P >= 1, e.g. 1x3");
    let (d, p) = text.split_once('x').ok_or_else(bad)?;
    let dim = |s: &str| {
        s.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=64).contains(n))
    };
    Ok([dim(d).ok_or_else(bad)?, dim(p).ok_or_else(bad)?])
}

impl NodeArgs {
    /// Checks what clap cannot.
    pub fn validate(&self) -> Result<()> {
        if !(self.grace_secs.is_finite() && (0.0..=600.0).contains(&self.grace_secs)) {
            bail!("--grace-secs must be between 0 and 600");
        }
        if self.data != "synthetic" && !Path::new(&self.data).is_file() {
            bail!("--data {}: no such file", self.data);
        }
        if self.emulate.is_some() && self.device != DeviceArg::Cpu {
            bail!(
                "--emulate paces CPU work to a profiled GPU; it cannot be combined with --device cuda"
            );
        }
        if self.sync == SyncMode::Auto {
            bail!(
                "--sync auto: the nodes do not choose the mode yet (`simulate --sync auto` \
                 does); give step or diloco:H"
            );
        }
        if self.sync == SyncMode::Step && self.outer_lr.is_some() {
            bail!(
                "--outer-lr and --outer-momentum set DiLoCo's outer step: use them with --sync diloco:H"
            );
        }
        if self.sync == SyncMode::Step && self.pseudo_gradient != Wire::F32 {
            bail!(
                "--pseudo-gradient {} sets how DiLoCo's rounds cross zones: use it with --sync diloco:H",
                self.pseudo_gradient
            );
        }
        if self.objective == ObjectiveKind::SamplesPerDollar && self.spot_prices.is_empty() {
            bail!("--objective samples-per-dollar needs --price-spot for every zone of --zones");
        }
        if self.netns && self.notice == NoticeMode::Metadata {
            bail!(
                "--notice metadata cannot reach nodes in namespaces (the fake metadata servers \
                 listen on the host's loopback); use --notice sigterm or none with --netns"
            );
        }
        Ok(())
    }

    pub fn settings(&self, strategy: &str, max_nodes: u32) -> Result<NodeSettings> {
        let data = if self.data == "synthetic" {
            self.data.clone()
        } else {
            std::fs::canonicalize(&self.data)
                .with_context(|| format!("--data {}", self.data))?
                .display()
                .to_string()
        };
        let emulate = self
            .emulate
            .as_deref()
            .map(|p| Emulate::new(p, self.time_scale))
            .transpose()
            .map_err(|e| anyhow::anyhow!("--emulate: {e}"))?;
        let batch = emulate
            .as_ref()
            .map_or(CPU_GLOBAL_BATCH, |e| e.global_batch);
        Ok(NodeSettings {
            grace_secs: self.grace_secs,
            interval_secs: self.interval_secs as f64,
            lost_timeout_ms: LOST_TIMEOUT_MS,
            strategy: strategy.to_string(),
            max_nodes,
            model: self.model.clone(),
            data,
            seed: self.seed,
            max_steps: self
                .samples
                .map_or(self.max_steps, |n| n.div_ceil(u64::from(batch))),
            threads: self.threads,
            emulate,
            devices: self.device.devices(gpus::visible),
            checkpoint_store: None,
            keep_checkpoints: None,
            pin: self.pin,
            zones: Vec::new(),
            zone_prices: Vec::new(),
            flat_rings: self.flat_rings,
            sync: self.sync,
            outer: self.outer_lr.zip(self.outer_momentum),
            pseudo_gradient: self.pseudo_gradient,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_is_d_by_p() {
        assert_eq!(parse_pin("1x3"), Ok([1, 3]));
        for bad in ["0x3", "1x", "3", "1x65", "axb"] {
            assert!(parse_pin(bad).unwrap_err().contains(bad));
        }
    }
}
