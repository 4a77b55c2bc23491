//! The node's control-channel messages (inside the length-prefixed frames of
//! [`crate::net::codec`]), encoded with the project codec (`parcae_consensus::codec`).

use parcae_consensus::codec::{self, CodecError};
use serde::{Deserialize, Serialize};

/// Largest raft message accepted (must match `RaftConfig::max_message_bytes`).
pub const MAX_RAFT_MESSAGE: usize = 16 << 20;
/// Largest encoded control message: a raft message plus envelope slack.
pub const MAX_CONTROL_MESSAGE: usize = MAX_RAFT_MESSAGE + 4096;

/// An encoded command and its origin's proof ([`crate::control::proof`] signs and verifies
/// it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedProposal {
    /// The encoded `Command`.
    pub command: Vec<u8>,
    /// When the origin signed it (unix ms).
    pub signed_unix_ms: u64,
    /// The origin's libp2p public key (protobuf encoding).
    pub public_key: Vec<u8>,
    /// The origin's signature over the label, the time and the command.
    pub signature: Vec<u8>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlMessage {
    /// A raft protobuf message, opaque here.
    Raft(Vec<u8>),
    /// A command signed by the sender (about itself: `Join`, `Notice`, `Leave`, its reports),
    /// for the leader.
    Propose(SignedProposal),
    /// A `Propose` relayed unchanged by a member that is not the leader; its origin is the
    /// signer, whoever relays it.
    Forwarded(SignedProposal),
    /// The sender's wall clock in milliseconds since the Unix epoch, sent once on each new
    /// connection, so that the receiver reads the sender's signed times on the sender's clock.
    Clock(u64),
}

impl ControlMessage {
    /// Encodes the message.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode::<_, MAX_CONTROL_MESSAGE>(self)
    }

    /// Decodes an untrusted frame.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        codec::decode::<_, MAX_CONTROL_MESSAGE>(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let m = ControlMessage::Forwarded(SignedProposal {
            command: vec![3],
            signed_unix_ms: 1,
            public_key: vec![1, 2],
            signature: vec![4],
        });
        assert_eq!(ControlMessage::decode(&m.encode().unwrap()).unwrap(), m);
        assert!(ControlMessage::decode(&[0xff, 0xff, 0xff]).is_err());
        assert!(ControlMessage::decode(&[]).is_err());
    }
}
