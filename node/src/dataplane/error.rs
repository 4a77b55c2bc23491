//! Why a data-plane exchange failed.

use thiserror::Error;

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
