//! Opening the raft node at start: its storage in the data directory, founding a one-member
//! cluster there when the storage holds no raft state and the node has nowhere to join.

use libp2p::{Multiaddr, PeerId};
use parcae_consensus::{NodeId, RaftNode};

use crate::config::NodeConfig;
use crate::control::membership::peer_info;
use crate::data_dir::DataDir;
use crate::keyring::KeyRing;
use crate::wire::MAX_RAFT_MESSAGE;

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum RaftActorError {
    /// The raft node could not be opened or bootstrapped.
    #[error("raft: {0}")]
    Raft(#[from] parcae_consensus::RaftError),
    /// The raft log is damaged before its end.
    #[error(
        "{0}. This node will not start on it: run `parcae-node run --resync` on the same data directory to set the damaged raft state aside and rejoin the cluster as a new member"
    )]
    DamagedLog(parcae_consensus::storage::StorageError),
}

/// Where the node keeps its raft state and who it is.
pub struct RaftSetup {
    /// Local peer id.
    pub peer_id: PeerId,
    /// The identity `peer_id` is made from: it signs this node's proposals.
    pub identity: libp2p::identity::Keypair,
    /// Whether to create a new cluster when the storage holds no raft state (no seeds given and
    /// no members remembered).
    pub found_cluster: bool,
    /// Listen addresses as configured (used until the real ones are known).
    pub listen: Vec<Multiaddr>,
    /// The trainer's data-plane address, recorded in the membership.
    pub data_addr: Option<std::net::SocketAddr>,
    /// The digest of the job the trainer trains, recorded in the membership.
    pub job: Option<parcae_consensus::state::Digest32>,
    /// The data directory: the raft log, the members known last
    /// ([`crate::control::known_peers`]), and the mark a graceful exit leaves
    /// ([`crate::resync::mark_left`]).
    pub data_dir: DataDir,
    /// The cluster keys, listed in the membership and rotated by the driver.
    pub keys: KeyRing,
}

/// Opens the raft node in the data directory's raft log, founding a one-member cluster there when its storage
/// holds no raft state and `setup.found_cluster` says so.
pub fn open_node(setup: &RaftSetup, config: &NodeConfig) -> Result<RaftNode, RaftActorError> {
    let my_id = NodeId::from_peer_bytes(&setup.peer_id.to_bytes());
    let mut raft_config = parcae_consensus::RaftConfig::new(my_id);
    raft_config.election_tick = config.raft.election_ticks;
    raft_config.heartbeat_tick = config.raft.heartbeat_ticks;
    raft_config.snapshot_interval = config.raft.snapshot_interval;
    raft_config.max_voters = config.max_voters;
    raft_config.max_message_bytes = MAX_RAFT_MESSAGE;
    let me = peer_info(
        &setup.peer_id,
        &setup.listen,
        setup.data_addr.map(|a| a.to_string()),
        setup.job,
        setup.keys.ids(),
        config.capabilities(),
    );
    let found = setup.found_cluster.then_some(std::slice::from_ref(&me));
    let (mut node, founded) = RaftNode::open_or_found(&setup.data_dir.raft(), raft_config, found)
        .map_err(|e| match e {
        parcae_consensus::RaftError::Storage(
            damage @ parcae_consensus::storage::StorageError::Corrupt { .. },
        ) => RaftActorError::DamagedLog(damage),
        other => other.into(),
    })?;
    if founded {
        node.campaign()?;
        tracing::info!("founded a new cluster");
    }
    node.drive()?;
    Ok(node)
}
