//! The assembly itself: where the node finds its cluster, who it is (coming back as a new
//! member after a graceful exit or a resync), then the status server, the trainer and the
//! actors, each on its thread, until the actor system stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use libp2p::Multiaddr;
use libp2p::identity::Keypair;
use parcae_api::{TrainingPhase, TrainingView};
use parcae_consensus::ControlState;

use super::options::{JobAdopter, NodeError, RunOptions};
use crate::config::{NodeConfig, PlanStrategy};
use crate::control::driver::Outlets;
use crate::control::{
    ControlDriver, ControlHandle, ControlPlane, RaftSetup, TrainerReady, known_peers, open_node,
};
use crate::data_dir::DataDir;
use crate::http::serve_http;
use crate::identity;
use crate::metrics::Metrics;
use crate::net::actor::Network;
use crate::net::seed_dialer::SeedSource;
use crate::net::seeds;
use crate::net::swarm::build_swarm;
use crate::notices::NoticeWatcher;
use crate::planner::Planner;
use crate::process::exit_on_panic;
use crate::resync::{self, ResyncError};
use crate::status::{Published, Status, StatusSnapshot};
use crate::train::{TrainerContext, TrainerStarted};

/// Runs a node until it exits; returns the process exit code. Any panic ends the process
/// ([`exit_on_panic`]).
pub fn run(opts: RunOptions) -> Result<i32, NodeError> {
    run_to_exit(opts).map(|exit| exit.code)
}

/// How a node's run ended.
pub struct NodeExit {
    /// The actor system's exit code (0: it left the cluster or its job is done).
    pub code: i32,
    /// It stopped because its job was done ([`RunOptions::exit_when_done`]).
    pub finished: bool,
    /// The replicated state as this node applied it last.
    pub state: Arc<ControlState>,
}

/// [`run`], returning how the node ended and what it knew then.
pub fn run_to_exit(mut opts: RunOptions) -> Result<NodeExit, NodeError> {
    exit_on_panic();
    let (launcher, adopter) = (opts.trainer.take(), opts.adopter.take());
    let data_dir = DataDir::new(&opts.data_dir);
    let seeds = seed_source(&opts, &data_dir)?;
    let found_cluster = seeds.seeds.is_empty() && opts.bootstrap_file.is_none();
    if adopter.is_some() && found_cluster {
        return Err(NodeError::NothingToAdopt);
    }
    come_back_as_new_member_if_due(&opts, &data_dir, found_cluster)?;
    let keypair = identity::load_or_create(&data_dir)?;
    let peer_id = keypair.public().to_peer_id();
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
    let status = system.block_on(async { Status::new(cells).start() });
    let control = ControlPlane::new();
    let handle = control.handle();
    let applied = handle.state();
    let finished = Arc::new(AtomicBool::new(false));
    let parts = Parts {
        keypair: &keypair,
        data_dir: &data_dir,
        opts: &opts,
        handle: &handle,
        status: &status,
        metrics: &metrics,
        finished: &finished,
    };
    let trainer = match launcher {
        Some(launch) => Some(launch(parts.trainer_context())?),
        None => None,
    };
    let adoption = adopter.map(|adopter| {
        let ctx = parts.trainer_context();
        let refused = status.clone().recipient();
        let driver = handle.driver().clone();
        move || launch_adopted(adopter, ctx, driver, refused)
    });
    if let Some(t) = &trainer {
        tracing::info!(addr = %t.data_addr, "data plane listening");
    }
    let setup = RaftSetup {
        peer_id,
        identity: keypair.clone(),
        found_cluster,
        listen: opts.listen.clone(),
        data_dir,
        data_addr: trainer.as_ref().map(|t| t.data_addr),
        job: trainer.as_ref().map(|t| t.job.digest()),
        keys: opts.cluster_key.clone(),
    };
    let actors = Actors {
        config: opts.config,
        listen: opts.listen,
        seeds,
        control,
        handle,
        status,
        metrics,
    };
    let raft_node = open_node(&setup, &actors.config)?;
    let swarm = build_swarm(keypair, opts.cluster_key, &actors.config.net_limits())?;
    let arbiters = (Arbiter::new(), Arbiter::new());
    system.block_on(async { actors.start(raft_node, setup, swarm, &arbiters) });
    if let Some(adoption) = adoption {
        std::thread::Builder::new()
            .name("job-adoption".into())
            .spawn(adoption)?;
    }
    let code = system.run_with_code()?;
    let state = applied.borrow().clone();
    Ok(NodeExit {
        code,
        finished: finished.load(Ordering::SeqCst),
        state,
    })
}

/// Where the node looks for its cluster: the seeds given (a bootstrap file must be readable
/// now), then the members it remembers from its last run.
fn seed_source(opts: &RunOptions, data_dir: &DataDir) -> Result<SeedSource, NodeError> {
    let mut given = seeds::parse_all("--bootstrap", &opts.bootstrap)?;
    if let Some(file) = &opts.bootstrap_file {
        seeds::read_file(file)?;
    }
    given.extend(known_peers::load(&data_dir.known_peers()));
    Ok(SeedSource {
        seeds: given,
        file: opts.bootstrap_file.clone(),
    })
}

/// After a graceful exit (the cluster retired this identity) or with `--resync`: sets the raft
/// state and identity aside, so that the node rejoins as a new member. It needs a cluster to
/// rejoin through.
fn come_back_as_new_member_if_due(
    opts: &RunOptions,
    data_dir: &DataDir,
    found_cluster: bool,
) -> Result<(), NodeError> {
    let left = resync::left_before(data_dir);
    if !(opts.resync || left) {
        return Ok(());
    }
    if found_cluster {
        return Err(ResyncError::NoSeeds(data_dir.known_peers()).into());
    }
    if left {
        tracing::warn!(
            "this node left the cluster when it last ran; it comes back under a new identity"
        );
    }
    let stamp = crate::clock::now_secs();
    let aside = resync::set_aside(data_dir, stamp)?;
    tracing::warn!(aside = %aside.display(), "raft state and identity set aside; rejoining as a new member");
    Ok(())
}

/// What a trainer is given from the node being assembled.
struct Parts<'a> {
    keypair: &'a Keypair,
    data_dir: &'a DataDir,
    opts: &'a RunOptions,
    handle: &'a ControlHandle,
    status: &'a Addr<Status>,
    metrics: &'a Arc<Metrics>,
    /// Set when the trainer stopped the node because the job was done.
    finished: &'a Arc<AtomicBool>,
}

impl Parts<'_> {
    fn trainer_context(&self) -> TrainerContext {
        let config = &self.opts.config;
        let publish = self.status.clone().recipient();
        let reports = self.handle.clone();
        TrainerContext {
            me: parcae_consensus::NodeId::from_peer_bytes(
                &self.keypair.public().to_peer_id().to_bytes(),
            ),
            keypair: self.keypair.clone(),
            keys: self.opts.cluster_key.clone(),
            data_dir: self.data_dir.clone(),
            bind_ip: listen_ip(&self.opts.listen),
            data_port: config.train.data_port,
            view: self.handle.state(),
            submit: Arc::new(move |c| reports.submit(c)),
            publish: Box::new(move |v| publish.do_send(v)),
            peer_timeout: config.peer_timeout(),
            restart_on_change: config.planner.strategy == PlanStrategy::Reactive,
            metrics: self.metrics.clone(),
            stop_when_done: self.opts.exit_when_done.then(|| self.stop()),
        }
    }

    /// Stops the node's actor system as done.
    fn stop(&self) -> Box<dyn FnOnce() + Send> {
        let (system, finished) = (System::current(), self.finished.clone());
        Box::new(move || {
            finished.store(true, Ordering::SeqCst);
            system.stop_with_code(0);
        })
    }
}

/// The actors of a node, before they start.
struct Actors {
    config: NodeConfig,
    listen: Vec<Multiaddr>,
    seeds: SeedSource,
    control: ControlPlane,
    handle: ControlHandle,
    status: Addr<Status>,
    metrics: Arc<Metrics>,
}

impl Actors {
    /// Starts the network and the control driver on arbiters of their own (`arbiters`), and
    /// the notice watcher and the planner on the system's.
    fn start(
        self,
        raft_node: parcae_consensus::RaftNode,
        setup: RaftSetup,
        swarm: libp2p::Swarm<crate::net::swarm::Behaviour>,
        (net_arbiter, control_arbiter): &(Arbiter, Arbiter),
    ) {
        let events = self.handle.driver().clone().recipient();
        let (listen, seeds, net_metrics) = (self.listen, self.seeds, self.metrics.clone());
        let limits = self.config.net_limits();
        let net = Network::start_in_arbiter(&net_arbiter.handle(), move |_| {
            Network::new(swarm, listen, seeds, events, net_metrics, &limits)
        });
        let (driver_config, driver_status, metrics) =
            (self.config.clone(), self.status.clone(), self.metrics);
        self.control
            .start(&control_arbiter.handle(), move |watches| {
                let out = Outlets {
                    watches,
                    status: driver_status,
                    metrics,
                };
                ControlDriver::new(raft_node, setup, driver_config, net, out)
            });
        NoticeWatcher::new(
            &self.config,
            self.handle.driver().clone().recipient(),
            self.status.clone().recipient(),
            self.handle.driver().clone().recipient(),
        )
        .start();
        Planner::new(self.handle, self.status, &self.config).start();
    }
}

/// Waits until this node applied the cluster's job, makes the trainer for it and starts it;
/// then the node's membership record gets the data plane's address and the job's digest, and
/// the planner may give it a slot. A job this node cannot train leaves it refused, with the
/// reason in `/status`.
fn launch_adopted(
    adopter: JobAdopter,
    ctx: TrainerContext,
    driver: Addr<ControlDriver>,
    refused: Recipient<TrainingView>,
) {
    let mut view = ctx.view.clone();
    let applied = futures::executor::block_on(view.wait_for(|s| s.job.is_some()))
        .ok()
        .and_then(|s| s.job.clone());
    let Some(job) = applied else {
        return;
    };
    tracing::info!("adopting the cluster's job");
    let started = adopter(&job)
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
