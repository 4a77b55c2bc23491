//! Assembles a node: identity, swarm, HTTP status server and the actors, then runs until the
//! node leaves (exit code 0) or fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use libp2p::Multiaddr;
use parcae_api::{TrainingPhase, TrainingView};
use parcae_consensus::state::Job;

use crate::config::{ConfigError, NodeConfig, NoticeProvider, PlanStrategy};
use crate::control::driver::Outlets;
use crate::control::{
    ControlDriver, ControlPlane, RaftActorError, RaftSetup, TrainerReady, known_peers, open_node,
};
use crate::http::{HttpError, serve_http};
use crate::identity::{self, IdentityError};
use crate::key::KeyError;
use crate::keyring::KeyRing;
use crate::metrics::Metrics;
use crate::net::actor::{Network, SeedSource};
use crate::net::seeds::{self, SeedError};
use crate::net::swarm::{SwarmError, build_swarm};
use crate::planner::Planner;
use crate::resync::{self, ResyncError};
use crate::status::{Published, Status, StatusSnapshot};
use crate::train::{TrainError, TrainerContext, TrainerLauncher, TrainerStarted};
use crate::watch::NoticeWatcher;

/// Directory of the raft log inside the data directory.
pub const RAFT_DIR: &str = "raft";

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
    /// Another checkpoint store of the job (a directory or an `s3://`, `gs://`, `az://` URL):
    /// its newest complete checkpoint is copied into the job's store at start, every part
    /// checked, so that a new cluster, or one whose training stopped for want of a checkpoint,
    /// resumes from it (overrides `[train] restore`).
    #[arg(long, env = "PARCAE_RESTORE")]
    pub restore: Option<String>,
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
        Ok(RunOptions {
            cluster_key: KeyRing::load(&self.cluster_key)?,
            data_dir: self.data_dir,
            listen: self.listen,
            bootstrap: self.bootstrap,
            bootstrap_file: self.bootstrap_file,
            status_addr: self.status_addr,
            resync: self.resync,
            config,
            trainer: None,
            adopt: None,
        })
    }
}

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
    /// The trainer to run beside the control plane (`None`: control plane only).
    pub trainer: Option<TrainerLauncher>,
    /// Instead of `trainer`: makes the trainer from the cluster's job once this node has
    /// applied it (`[train] job = "adopt"`).
    pub adopt: Option<JobAdopter>,
}

/// Makes a node's trainer from the job its cluster trains; the error says why this node
/// cannot train it.
pub type JobAdopter = Box<dyn FnOnce(&Job) -> Result<TrainerLauncher, String> + Send>;

/// How often a node that adopts the job looks for it in its applied state.
const JOB_POLL: std::time::Duration = std::time::Duration::from_millis(200);

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
    /// `[train] job = "adopt"` on a node that founds a cluster.
    #[error(
        "[train] job = \"adopt\" takes the job from the cluster, but this node founds one: \
         give it --bootstrap, or its own job (job = \"own\")"
    )]
    NothingToAdopt,
}

/// Logs through `tracing` to stderr, filtered by `RUST_LOG` (default `info`): what the binary
/// and programs built on [`crate::Trainer`] do first.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Exit code of a node that panicked ([`exit_on_panic`]).
pub const PANIC_EXIT_CODE: i32 = 70;

/// Makes any panic, on any thread, end the process with [`PANIC_EXIT_CODE`] after the usual
/// report. A panic in an actor or a connection task stops only that task: the process would
/// stay up with its ports open and its status frozen, a zombie no supervisor restarts.
pub fn exit_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!("panic: {info}; the node exits");
        std::process::exit(PANIC_EXIT_CODE);
    }));
}

/// Runs a node until it exits; returns the process exit code. Any panic ends the process
/// ([`exit_on_panic`]).
pub fn run(opts: RunOptions) -> Result<i32, NodeError> {
    exit_on_panic();
    let mut given = seeds::parse_all("--bootstrap", &opts.bootstrap)?;
    if let Some(file) = &opts.bootstrap_file {
        seeds::read_file(file)?;
    }
    let remembered = known_peers::path(&opts.data_dir);
    given.extend(known_peers::load(&remembered));
    let found_cluster = given.is_empty() && opts.bootstrap_file.is_none();
    if opts.adopt.is_some() && found_cluster {
        return Err(NodeError::NothingToAdopt);
    }
    let left = resync::left_before(&opts.data_dir);
    if opts.resync || left {
        if found_cluster {
            return Err(ResyncError::NoSeeds(remembered).into());
        }
        if left {
            tracing::warn!(
                "this node left the cluster when it last ran; it comes back under a new identity"
            );
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = resync::set_aside(&opts.data_dir, stamp)?;
        tracing::warn!(aside = %aside.display(), "raft state and identity set aside; rejoining as a new member");
    }
    let keypair = identity::load_or_create(&opts.data_dir)?;
    let peer_id = keypair.public().to_peer_id();
    let seeds = SeedSource {
        seeds: given,
        file: opts.bootstrap_file.clone(),
    };
    let fingerprints: Vec<String> = opts.cluster_key.ids().iter().map(hex::encode).collect();
    tracing::info!(%peer_id, keys = ?fingerprints, seeds = seeds.seeds.len(), "starting node");

    let metrics = Arc::new(Metrics::default());
    let initial = serde_json::to_string(&StatusSnapshot::initial(peer_id.to_string()))
        .unwrap_or_else(|_| "{}".into());
    let cells = Published {
        status: Arc::new(RwLock::new(initial)),
        ..Published::default()
    };
    let system = System::new();
    let http = serve_http(opts.status_addr, cells.clone(), metrics.clone())?;
    tracing::info!(%http, "status server listening");

    let config = opts.config;
    let listen = opts.listen;
    let status = system.block_on(async { Status::new(cells).start() });
    let control = ControlPlane::new();
    let handle = control.handle();
    let context = || {
        let publish = status.clone().recipient();
        let reports = handle.clone();
        TrainerContext {
            me: parcae_consensus::NodeId::from_peer_bytes(&peer_id.to_bytes()),
            keypair: keypair.clone(),
            keys: opts.cluster_key.clone(),
            data_dir: opts.data_dir.clone(),
            bind_ip: listen_ip(&listen),
            data_port: config.train.data_port,
            view: handle.state(),
            submit: Arc::new(move |c| reports.submit(c)),
            publish: Box::new(move |v| publish.do_send(v)),
            peer_timeout: config.peer_timeout(),
            restart_on_change: config.planner.strategy == PlanStrategy::Reactive,
            metrics: metrics.clone(),
        }
    };
    let trainer = match opts.trainer {
        Some(launch) => Some(launch(context())?),
        None => None,
    };
    let adoption = opts.adopt.map(|adopt| {
        let ctx = context();
        let refused = status.clone().recipient();
        let driver = handle.driver().clone();
        move || launch_adopted(adopt, ctx, driver, refused)
    });
    if let Some(t) = &trainer {
        tracing::info!(addr = %t.data_addr, "data plane listening");
    }
    let setup = RaftSetup {
        peer_id,
        identity: keypair.clone(),
        dir: opts.data_dir.join(RAFT_DIR),
        found_cluster,
        listen: listen.clone(),
        known_peers: remembered,
        data_dir: opts.data_dir.clone(),
        data_addr: trainer.as_ref().map(|t| t.data_addr),
        job: trainer.as_ref().map(|t| t.job.digest()),
        keys: opts.cluster_key.clone(),
    };
    let raft_node = open_node(&setup, &config)?;
    let swarm = build_swarm(keypair, opts.cluster_key, &config.net_limits())?;
    let net_arbiter = Arbiter::new();
    let control_arbiter = Arbiter::new();
    system.block_on(async move {
        let events = handle.driver().clone().recipient();
        let net_metrics = metrics.clone();
        let net = Network::start_in_arbiter(&net_arbiter.handle(), move |_| {
            Network::new(swarm, listen, seeds, events, net_metrics)
        });
        let driver_config = config.clone();
        let driver_status = status.clone();
        control.start(&control_arbiter.handle(), move |watches| {
            let out = Outlets {
                watches,
                status: driver_status,
                metrics,
            };
            ControlDriver::new(raft_node, setup, driver_config, net, out)
        });
        NoticeWatcher::new(
            &config,
            handle.driver().clone().recipient(),
            status.clone().recipient(),
        )
        .start();
        Planner::new(handle, status, &config).start();
    });
    if let Some(adoption) = adoption {
        std::thread::Builder::new()
            .name("job-adoption".into())
            .spawn(adoption)?;
    }
    Ok(system.run_with_code()?)
}

/// Waits until this node applied the cluster's job, makes the trainer for it and starts it;
/// then the node's membership record gets the data plane's address and the job's digest, and
/// the planner may give it a slot. A job this node cannot train leaves it refused, with the
/// reason in `/status`.
fn launch_adopted(
    adopt: JobAdopter,
    ctx: TrainerContext,
    driver: Addr<ControlDriver>,
    refused: Recipient<TrainingView>,
) {
    let job = loop {
        if let Some(job) = ctx.view.borrow().job.clone() {
            break job;
        }
        std::thread::sleep(JOB_POLL);
    };
    tracing::info!("adopting the cluster's job");
    let started = adopt(&job)
        .and_then(|launch| launch(ctx).map_err(|e| e.to_string()))
        .map_err(|e| format!("this node cannot train the cluster's job: {e}"));
    match started {
        Ok(TrainerStarted { data_addr, job }) => {
            tracing::info!(addr = %data_addr, "data plane listening");
            driver.do_send(TrainerReady {
                data_addr,
                job: job.digest(),
            });
        }
        Err(error) => {
            tracing::error!("{error}");
            refused.do_send(TrainingView {
                phase: TrainingPhase::Refused,
                error: Some(error),
                ..TrainingView::default()
            });
        }
    }
}

/// The IP the data plane binds and advertises: the first IP of the libp2p listen addresses; for
/// an unspecified one (`0.0.0.0`) it binds everything and advertises the address of the
/// interface that routes outwards.
fn listen_ip(listen: &[Multiaddr]) -> std::net::IpAddr {
    use libp2p::multiaddr::Protocol;
    let ip = listen
        .iter()
        .flat_map(|a| a.iter())
        .find_map(|p| match p {
            Protocol::Ip4(ip) => Some(std::net::IpAddr::V4(ip)),
            Protocol::Ip6(ip) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        })
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    if !ip.is_unspecified() {
        return ip;
    }
    std::net::UdpSocket::bind((ip, 0))
        .and_then(|s| {
            s.connect(("192.0.2.1", 9))?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(ip)
}
