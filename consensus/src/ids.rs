//! Raft node ids derived from libp2p peer ids.
//!
//! raft-rs names nodes by non-zero `u64`; the node crate names them by libp2p `PeerId`. The
//! mapping is a pure function of the peer id bytes (the first 8 bytes of a domain-separated
//! SHA-256), so every node computes the same id without coordination. A `Join` carries the full
//! peer id bytes and the state machine checks that they hash to the joining id and that no other
//! peer already owns it, so a (astronomically unlikely) collision is refused, never merged.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Domain separator so that the id hash cannot collide with other uses of SHA-256 in the project.
const NODE_ID_DOMAIN: &[u8] = b"parcae-node-id/v1";

/// A raft node id: non-zero, stable for a given peer id.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct NodeId(pub u64);

impl NodeId {
    /// Derives the raft id of the peer whose libp2p `PeerId::to_bytes()` are `peer_id_bytes`.
    pub fn from_peer_bytes(peer_id_bytes: &[u8]) -> NodeId {
        let mut hasher = Sha256::new();
        hasher.update(NODE_ID_DOMAIN);
        hasher.update(peer_id_bytes);
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        // raft-rs reserves 0 as "no node"; remap that one value.
        NodeId(u64::from_be_bytes(first).max(1))
    }

    /// The raw id as raft-rs wants it.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_deterministic_and_non_zero() {
        let a = NodeId::from_peer_bytes(b"peer-a");
        assert_eq!(a, NodeId::from_peer_bytes(b"peer-a"));
        assert_ne!(a, NodeId::from_peer_bytes(b"peer-b"));
        assert_ne!(a.get(), 0);
        assert_eq!(format!("{a}").len(), 16);
    }
}
