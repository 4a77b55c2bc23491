//! What a node runs with, and why it could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

use libp2p::Multiaddr;
use parcae_consensus::state::Job;

use crate::config::{ConfigError, NodeConfig};
use crate::control::RaftActorError;
use crate::http::HttpError;
use crate::identity::IdentityError;
use crate::key::KeyError;
use crate::keyring::KeyRing;
use crate::net::seeds::SeedError;
use crate::net::swarm::SwarmError;
use crate::resync::ResyncError;
use crate::train::{TrainError, TrainerLauncher};

/// What a node runs with.
pub struct RunOptions {
    /// Data directory (identity key, raft log).
    pub data_dir: PathBuf,
    /// libp2p listen addresses.
    pub listen: Vec<Multiaddr>,
    /// Seed addresses (see [`crate::net::seeds`]).
    pub bootstrap: Vec<Multiaddr>,
    /// A file of seed addresses, read again while the node is alone.
    pub bootstrap_file: Option<PathBuf>,
    /// The cluster keys: the key file's, and a staged next key ([`crate::keyring`]).
    pub cluster_key: KeyRing,
    /// HTTP status address.
    pub status_addr: SocketAddr,
    /// Set the raft state and identity aside and rejoin as a new member ([`crate::resync`]).
    pub resync: bool,
    /// Tuning.
    pub config: NodeConfig,
    /// Stop when the job is done ([`crate::train::finish`]) instead of idling.
    pub exit_when_done: bool,
    /// The trainer to run beside the control plane (`None`: control plane only).
    pub(crate) trainer: Option<TrainerLauncher>,
    /// Instead of `trainer`: makes the trainer from the cluster's job once this node has
    /// applied it (`[train] job = "adopt"`).
    pub(crate) adopter: Option<JobAdopter>,
}

impl RunOptions {
    /// A node at `data_dir` admitting peers with `cluster_key`, listening on `listen`, serving
    /// its status at `status_addr`, with `config`: it founds a cluster unless given seeds
    /// ([`RunOptions::seeds`]) or its data directory remembers members.
    pub fn new(
        data_dir: PathBuf,
        cluster_key: KeyRing,
        listen: Vec<Multiaddr>,
        status_addr: SocketAddr,
        config: NodeConfig,
    ) -> Self {
        Self {
            data_dir,
            listen,
            bootstrap: Vec::new(),
            bootstrap_file: None,
            cluster_key,
            status_addr,
            resync: false,
            config,
            exit_when_done: false,
            trainer: None,
            adopter: None,
        }
    }

    /// Seed addresses to join the cluster through, and a file of more.
    pub fn seeds(self, bootstrap: Vec<Multiaddr>, bootstrap_file: Option<PathBuf>) -> Self {
        Self {
            bootstrap,
            bootstrap_file,
            ..self
        }
    }

    /// Whether to set the raft state and identity aside and rejoin as a new member.
    pub fn resync(self, resync: bool) -> Self {
        Self { resync, ..self }
    }

    /// Whether the node stops when its job is done (a training loop's `fit`) or idles then (a
    /// service whose `/status` shows the finished job).
    pub fn exit_when_done(self, exit_when_done: bool) -> Self {
        Self {
            exit_when_done,
            ..self
        }
    }

    /// The node runs `trainer` beside its control plane.
    pub fn with_trainer(self, trainer: TrainerLauncher) -> Self {
        Self {
            trainer: Some(trainer),
            ..self
        }
    }

    /// The node makes its trainer from the cluster's job once it applied it
    /// (`[train] job = "adopt"`).
    pub fn adopting(self, adopter: JobAdopter) -> Self {
        Self {
            adopter: Some(adopter),
            ..self
        }
    }
}

/// Makes a node's trainer from the job its cluster trains; the error says why this node
/// cannot train it.
pub type JobAdopter = Box<dyn FnOnce(&Job) -> Result<TrainerLauncher, String> + Send>;

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Identity key problem.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Bad bootstrap address or file.
    #[error(transparent)]
    Bootstrap(#[from] SeedError),
    /// Swarm construction failed.
    #[error(transparent)]
    Swarm(#[from] SwarmError),
    /// Raft could not be opened.
    #[error(transparent)]
    Raft(#[from] RaftActorError),
    /// HTTP server failed.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The actor system failed.
    #[error("actor system: {0}")]
    System(#[from] std::io::Error),
    /// The trainer could not start.
    #[error("trainer: {0}")]
    Trainer(#[from] TrainError),
    /// `--resync` could not set the damaged state aside.
    #[error(transparent)]
    Resync(#[from] ResyncError),
    /// [`crate::Trainer`] was not told the cluster key's file.
    #[error("the node needs the cluster key: give the Trainer its file with .key_file(PATH)")]
    NoKeyFile,
    /// The cluster key file could not be loaded.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The configuration file could not be loaded.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `[train] job = "adopt"` on a node that founds a cluster.
    #[error(
        "[train] job = \"adopt\" takes the job from the cluster, but this node founds one: \
         give it --bootstrap, or its own job (job = \"own\")"
    )]
    NothingToAdopt,
    /// The node stopped with a failure's exit code.
    #[error("the node stopped with exit code {0} (its log says why)")]
    Stopped(i32),
}
