//! `parcae-node run`'s command line, and the files it names loaded into [`RunOptions`].

use std::net::SocketAddr;
use std::path::PathBuf;

use libp2p::Multiaddr;

use super::options::RunOptions;
use crate::config::{ConfigError, DeviceChoice, NodeConfig, NoticeProvider};
use crate::key::KeyError;
use crate::keyring::KeyRing;

/// The command line of `parcae-node run` as clap parses it; [`RunArgs::load`] reads the files
/// it names into [`RunOptions`]. Every flag can also come from the environment variable named
/// after it (`PARCAE_` and the flag in upper snake case); lists there are comma-separated.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Directory for the identity key, the raft log and the remembered members (created if
    /// missing).
    #[arg(long, env = "PARCAE_DATA_DIR")]
    pub data_dir: PathBuf,
    /// libp2p listen address, e.g. /ip4/0.0.0.0/tcp/7000 (repeatable).
    #[arg(long, env = "PARCAE_LISTEN", value_delimiter = ',', required = true)]
    pub listen: Vec<Multiaddr>,
    /// Where to find the cluster (repeatable): /ip4/A/tcp/P, /ip6/A/tcp/P, /dns4/NAME/tcp/P,
    /// /dns6/NAME/tcp/P or /dns/NAME/tcp/P, with or without /p2p/PEER_ID. Without any (and
    /// without --bootstrap-file), the node founds a new cluster unless its data directory
    /// already holds one; a node that already belongs to a cluster finds it again through the
    /// members it remembers.
    #[arg(long, env = "PARCAE_BOOTSTRAP", value_delimiter = ',', num_args = 1..)]
    pub bootstrap: Vec<Multiaddr>,
    /// A file of bootstrap addresses, one per line (`#` starts a comment), read again every
    /// few seconds while the node is connected to no member.
    #[arg(long, env = "PARCAE_BOOTSTRAP_FILE")]
    pub bootstrap_file: Option<PathBuf>,
    /// File holding the cluster key (see `keygen`). A key made by `keygen` into FILE.next on
    /// every member is rotated in without stopping training (see `docs/architecture.md`, "Rotating the cluster key").
    #[arg(long, env = "PARCAE_CLUSTER_KEY")]
    pub cluster_key: PathBuf,
    /// Address of the HTTP server (/status, /steps, /metrics, /healthz, /readyz).
    #[arg(long, env = "PARCAE_STATUS_ADDR")]
    pub status_addr: SocketAddr,
    /// Optional TOML configuration file.
    #[arg(long, env = "PARCAE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where preemption notices come from besides SIGTERM: `auto` probes the AWS, GCE and Azure
    /// metadata services at start and polls the one that answers (overrides the config file's
    /// `[notices] provider`, whose default is `auto`).
    #[arg(long, env = "PARCAE_NOTICE", value_enum)]
    pub notice: Option<NoticeProvider>,
    /// Sets a damaged raft log aside (with the identity key, into DATA_DIR/set-aside-TIME)
    /// and rejoins the cluster as a new member through the seeds or the remembered members.
    #[arg(long, env = "PARCAE_RESYNC")]
    pub resync: bool,
    /// Exit (code 0) once the job's step limit is reached and its last checkpoint is complete
    /// in the job's store, instead of idling in `finished`.
    #[arg(long, env = "PARCAE_EXIT_WHEN_DONE")]
    pub exit_when_done: bool,
    /// Another checkpoint store of the job (a directory or an `s3://`, `gs://`, `az://` URL):
    /// its newest complete checkpoint is copied into the job's store at start, every part
    /// checked, so that a new cluster, or one whose training stopped for want of a checkpoint,
    /// resumes from it (overrides `[train] restore`).
    #[arg(long, env = "PARCAE_RESTORE")]
    pub restore: Option<String>,
    /// What the stage trains on: `cpu`, `cuda` or `cuda:N` (overrides the config file's
    /// `[device] kind` and `index`; `cuda` needs a build with the `cuda` feature).
    #[arg(long, env = "PARCAE_DEVICE")]
    pub device: Option<DeviceChoice>,
    /// The cloud zone this node runs in, e.g. `us-east-1a` (overrides `[placement] zone`):
    /// listed in the membership, where the planner tells zones apart.
    #[arg(long, env = "PARCAE_ZONE")]
    pub zone: Option<String>,
    /// The instance type this node runs on, e.g. `p3.2xlarge` (overrides `[placement]
    /// instance_type`).
    #[arg(long, env = "PARCAE_INSTANCE_TYPE")]
    pub instance_type: Option<String>,
}

/// A file the command line names could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The configuration file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster key file.
    #[error(transparent)]
    Key(#[from] KeyError),
}

impl RunArgs {
    /// Loads the cluster key and the configuration (defaults without a file); the options of a
    /// node that runs no trainer yet.
    pub fn load(self) -> Result<RunOptions, ArgsError> {
        let mut config = match &self.config {
            Some(path) => NodeConfig::load(path)?,
            None => NodeConfig::default(),
        };
        if let Some(provider) = self.notice {
            config.notices.provider = provider;
        }
        if self.restore.is_some() {
            config.train.restore = self.restore;
        }
        if let Some(device) = self.device {
            config.device.choose(device);
            config.device.validate()?;
        }
        if let Some(zone) = self.zone {
            config.placement.zone = zone;
        }
        if let Some(instance_type) = self.instance_type {
            config.placement.instance_type = instance_type;
        }
        config.placement.validate()?;
        let keys = KeyRing::load(&self.cluster_key)?;
        Ok(
            RunOptions::new(self.data_dir, keys, self.listen, self.status_addr, config)
                .seeds(self.bootstrap, self.bootstrap_file)
                .resync(self.resync)
                .exit_when_done(self.exit_when_done),
        )
    }
}
