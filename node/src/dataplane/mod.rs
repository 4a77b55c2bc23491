//! The data plane: encrypted, authenticated bulk channels between cluster members for tensors
//! and stage state, kept off the libp2p connections that carry raft and notices.
//!
//! libp2p's pnet + noise + yamux stack moved a loopback transfer at 0.08x raw TCP in the
//! project's prototype; a stage handoff of a few hundred MB must not be slower than the
//! 10 Gb/s links of Parcae's evaluation. This channel is plain TCP with AES-256-GCM records
//! (hardware AES through ring), keyed by a Noise `XXpsk3` handshake (`snow`) that
//! * proves both ends hold the cluster key (the pre-shared key),
//! * binds the libp2p identities of both ends (each signs its static Noise key), so a member
//!   cannot impersonate another and a relay can neither read nor inject, and
//! * derives per-direction keys from ephemeral Diffie-Hellman: a recorded session cannot be
//!   decrypted later, not even with the cluster key.
//!
//! Its parts, bottom up: `handshake` (keying and admission), `channel` (records framed by
//! tokio-util's `LengthDelimitedCodec`, messages made of records), [`protocol`] (the request
//! that opens a connection, replies, and the one round [`protocol::Header`] of every training
//! message), [`server`] (the endpoint: links for the trainer, state and checkpoints served
//! concurrently with training, disk work on tokio's blocking pool), [`client`] (asking another
//! member's endpoint), [`links`] (a plan epoch's pipeline and ring links) and [`collective`]
//! (the ring all-reduce). Nothing here knows the model: the trainer hands bytes in and out.

mod channel;
pub mod client;
pub mod collective;
mod handshake;
pub mod limits;
pub mod links;
pub mod protocol;
pub mod server;

pub use channel::{SecureReader, SecureStream, SecureWriter};
pub use handshake::{accept, connect};

use thiserror::Error;

/// Largest record on the wire (plaintext), bytes.
pub const MAX_RECORD: usize = 1 << 20;

/// Why a data-plane exchange failed.
#[derive(Debug, Error)]
pub enum DataplaneError {
    /// Socket failure.
    #[error("data plane i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer is not speaking this protocol.
    #[error("data plane handshake: {0}")]
    Handshake(&'static str),
    /// The peer did not prove knowledge of the cluster key.
    #[error("data plane peer does not hold the cluster key")]
    WrongClusterKey,
    /// The peer's identity is not the expected one or not allowed.
    #[error("data plane peer {0} is not admitted")]
    NotAdmitted(String),
    /// A record failed authentication (tampering, truncation, reordering).
    #[error("data plane record failed authentication")]
    BadRecord,
    /// A peer broke the protocol (undecodable or unexpected message, wrong round, size or
    /// order).
    #[error("data plane protocol: {0}")]
    Protocol(String),
    /// A message of another plan epoch arrived: the sender follows an older or newer plan.
    #[error("stale: {0}")]
    Stale(String),
    /// A peer refused a request, or the membership gives no way to reach it.
    #[error("peer: {0}")]
    Peer(String),
    /// A peer did not answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// Checkpoint storage on this node failed.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Blocking work of the data plane (disk, hashing) did not finish.
    #[error("data plane task failed: {0}")]
    Task(String),
    /// A message is larger than the receiver accepts.
    #[error("data plane message of {got} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced size.
        got: u64,
        /// Limit.
        max: u64,
    },
}
