//! Failures of the durable store.

/// Failures of the durable store.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// raft-engine failed (I/O, corruption).
    #[error("raft-engine: {0}")]
    Engine(#[from] raft_engine::Error),
    /// A stored protobuf could not be encoded or decoded.
    #[error("stored protobuf: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
    /// The directory path is not valid UTF-8 (raft-engine takes a `String`).
    #[error("data directory {0:?} is not valid UTF-8")]
    BadPath(std::path::PathBuf),
    /// The log is damaged before its end: opening it would silently drop entries this node
    /// acknowledged ([`super::damage`] tells this from a torn last write, which is dropped).
    #[error("raft log {file} is damaged at byte {offset}, before its end ({reason})")]
    Corrupt {
        /// The damaged file (or the directory when the file is not known).
        file: std::path::PathBuf,
        /// Where its first broken batch starts.
        offset: u64,
        /// What raft-engine reported and what follows the broken batch.
        reason: String,
    },
    /// Reading or copying the store to inspect a damaged log failed.
    #[error("inspecting raft log {path:?}: {source}")]
    Inspect {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Bootstrapping a store that already holds a raft state.
    #[error("storage is already initialized")]
    AlreadyInitialized,
    /// A snapshot older than the one already stored.
    #[error("snapshot at index {got} is older than the stored one at {stored}")]
    StaleSnapshot {
        /// Index of the stored snapshot.
        stored: u64,
        /// Index of the offered snapshot.
        got: u64,
    },
}
