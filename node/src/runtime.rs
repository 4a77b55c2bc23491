//! Assembles a node: identity, swarm, HTTP status server and the actors, then runs until the
//! node leaves (exit code 0) or fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use libp2p::Multiaddr;

use crate::config::NodeConfig;
use crate::identity::{self, IdentityError};
use crate::key::ClusterKey;
use crate::metrics::Metrics;
use crate::net::actor::{MissingPeerId, Network, split_peer_addr};
use crate::net::swarm::{SwarmError, build_swarm};
use crate::planner::Planner;
use crate::raft::{Raft, RaftActorError, RaftSetup, open_node};
use crate::status::{HttpError, Status, StatusSnapshot, serve_http};
use crate::watch::NoticeWatcher;

/// Directory of the raft log inside the data directory.
pub const RAFT_DIR: &str = "raft";

/// What `parcae-node run` was given.
#[derive(Debug)]
pub struct RunOptions {
    /// Data directory (identity key, raft log).
    pub data_dir: PathBuf,
    /// libp2p listen addresses.
    pub listen: Vec<Multiaddr>,
    /// Bootstrap peers, each ending in `/p2p/<peer id>`.
    pub bootstrap: Vec<Multiaddr>,
    /// The cluster key.
    pub cluster_key: ClusterKey,
    /// HTTP status address.
    pub status_addr: SocketAddr,
    /// Tuning.
    pub config: NodeConfig,
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Identity key problem.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Bad bootstrap address.
    #[error(transparent)]
    Bootstrap(#[from] MissingPeerId),
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
}

/// Runs a node until it exits; returns the process exit code.
pub fn run(opts: RunOptions) -> Result<i32, NodeError> {
    let keypair = identity::load_or_create(&opts.data_dir)?;
    let peer_id = keypair.public().to_peer_id();
    let bootstrap = opts
        .bootstrap
        .iter()
        .map(split_peer_addr)
        .collect::<Result<Vec<_>, _>>()?;
    tracing::info!(%peer_id, key = %opts.cluster_key.fingerprint(), "starting node");

    let metrics = Arc::new(Metrics::default());
    let initial = serde_json::to_string(&StatusSnapshot::initial(peer_id.to_string()))
        .unwrap_or_else(|_| "{}".into());
    let json = Arc::new(RwLock::new(initial));
    let http = serve_http(opts.status_addr, json.clone(), metrics.clone())?;
    tracing::info!(%http, "status server listening");

    let setup = RaftSetup {
        peer_id,
        dir: opts.data_dir.join(RAFT_DIR),
        found_cluster: bootstrap.is_empty(),
        listen: opts.listen.clone(),
        bootstrap: bootstrap.iter().map(|(p, _)| *p).collect(),
    };
    let raft_node = open_node(&setup, &opts.config)?;
    let swarm = build_swarm(keypair, opts.cluster_key, &opts.config.net_limits())?;

    let system = System::new();
    let config = opts.config;
    let listen = opts.listen;
    system.block_on(async move {
        let status = Status::new(json).start();
        let net_arbiter = Arbiter::new();
        let raft = Raft::create(|ctx| {
            let events = ctx.address().recipient();
            let net_metrics = metrics.clone();
            let net = Network::start_in_arbiter(&net_arbiter.handle(), move |_| {
                Network::new(swarm, listen, bootstrap, events, net_metrics)
            });
            Raft::new(raft_node, setup, config.clone(), net, status, metrics)
        });
        NoticeWatcher::new(&config, raft.clone().recipient()).start();
        Planner::new(raft, Duration::from_secs_f64(config.planner.interval_secs)).start();
    });
    Ok(system.run_with_code()?)
}
