//! The preemption notice as gossiped between nodes.
//!
//! A notice announces that `node` will disappear at `deadline_unix_ms`. It travels on a signed
//! gossipsub topic, and the network actor only accepts a notice whose gossip signer *is* `node`:
//! a node can announce its own departure, never someone else's.

use std::time::{Duration, SystemTime};

use libp2p::PeerId;
use parcae_consensus::codec::{self, CodecError};
use serde::{Deserialize, Serialize};

use crate::clock::{self, unix_ms};

/// Largest encoded notice accepted from the wire.
pub const MAX_NOTICE_BYTES: usize = 512;

/// What told the node that it is going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoticeSource {
    /// SIGTERM or SIGINT from the operating system or an operator.
    Signal,
    /// AWS IMDSv2 `spot/instance-action`.
    Aws,
    /// GCE metadata `instance/preempted`.
    Gce,
    /// Azure Scheduled Events (`Preempt`, `Terminate`).
    Azure,
}

/// A gossiped preemption notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// Peer id bytes of the leaving node.
    pub node: Vec<u8>,
    /// When the node will be gone, in milliseconds since the Unix epoch.
    pub deadline_unix_ms: u64,
    /// When the notice was issued, for propagation measurements.
    pub issued_unix_ms: u64,
    /// What produced the notice.
    pub source: NoticeSource,
}

/// Why a gossiped notice was refused.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    /// The bytes are not a notice.
    #[error("undecodable notice: {0}")]
    Codec(#[from] CodecError),
    /// The notice names another node than its signer.
    #[error("notice for {named} signed by {signer}")]
    WrongSigner {
        /// The node named in the notice (or its raw bytes if they are not a peer id).
        named: String,
        /// The gossip signer.
        signer: PeerId,
    },
}

impl Notice {
    /// A notice for `node` leaving `grace` from now.
    pub fn new(node: PeerId, grace: Duration, source: NoticeSource) -> Self {
        Self::with_deadline(node, clock::now() + grace, source)
    }

    /// A notice for `node` leaving at `deadline` (as the cloud provider announced it).
    pub fn with_deadline(node: PeerId, deadline: SystemTime, source: NoticeSource) -> Self {
        Self {
            node: node.to_bytes(),
            deadline_unix_ms: unix_ms(deadline),
            issued_unix_ms: clock::now_ms(),
            source,
        }
    }

    /// Wire encoding.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode::<_, MAX_NOTICE_BYTES>(self)
    }

    /// Decodes a notice received from `signer` and checks that it is about the signer itself.
    pub fn decode_from(bytes: &[u8], signer: PeerId) -> Result<Self, NoticeError> {
        let notice: Notice = codec::decode::<_, MAX_NOTICE_BYTES>(bytes)?;
        if notice.node != signer.to_bytes() {
            let named = PeerId::from_bytes(&notice.node)
                .map(|p| p.to_string())
                .unwrap_or_else(|_| format!("{:?}", notice.node));
            return Err(NoticeError::WrongSigner { named, signer });
        }
        Ok(notice)
    }

    /// The leaving node's peer id (valid after [`Notice::decode_from`]).
    pub fn peer(&self) -> Option<PeerId> {
        PeerId::from_bytes(&self.node).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_only_accepted_from_its_node() {
        let me = PeerId::random();
        let other = PeerId::random();
        let n = Notice::new(me, Duration::from_secs(30), NoticeSource::Signal);
        assert!(n.deadline_unix_ms >= n.issued_unix_ms + 30_000);
        let bytes = n.encode().unwrap();
        assert_eq!(Notice::decode_from(&bytes, me).unwrap(), n);
        assert!(matches!(
            Notice::decode_from(&bytes, other),
            Err(NoticeError::WrongSigner { .. })
        ));
        assert!(matches!(
            Notice::decode_from(&[0xff; 3], me),
            Err(NoticeError::Codec(_))
        ));
    }
}
