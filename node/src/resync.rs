//! Coming back as a new member. `parcae-node run --resync` is the way back for a node whose
//! raft log is damaged: its raft state cannot be trusted, and a node that comes back under its
//! old identity with less log than it acknowledged could break raft's promises (a vote or an
//! entry it forgot). A node that left gracefully does the same by itself at its next start
//! (a machine restarted after its preemption, as GCE allows): the cluster retired its identity
//! for good ([`ControlState::retired`](parcae_consensus::ControlState::retired)). Either way the
//! raft directory and the identity key are set aside — moved, never deleted, for an operator to
//! look at — and the node rejoins through its seeds or the members it remembers.

use std::path::{Path, PathBuf};

use crate::identity::IDENTITY_FILE;
use crate::runtime::RAFT_DIR;

/// Written in the data directory when the node leaves gracefully.
pub const LEFT_MARKER: &str = "left";

/// Records that this node left the cluster, so its next start comes back as a new member.
pub fn mark_left(data_dir: &Path) -> std::io::Result<()> {
    crate::fsutil::write_private_atomic(&data_dir.join(LEFT_MARKER), b"left the cluster\n")
}

/// Whether this node left the cluster when it last ran.
pub fn left_before(data_dir: &Path) -> bool {
    data_dir.join(LEFT_MARKER).exists()
}

/// Why the damaged state could not be set aside.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    /// Nothing to rejoin through.
    #[error(
        "--resync rejoins an existing cluster, but no seed is given (--bootstrap, --bootstrap-file) and no member is remembered in {0}"
    )]
    NoSeeds(PathBuf),
    /// Moving the state failed.
    #[error("setting {path} aside: {source}")]
    Move {
        /// What was being moved.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// Moves `DATA_DIR/raft`, `DATA_DIR/node.key` and the [`LEFT_MARKER`] (those present) into a
/// new `DATA_DIR/set-aside-<stamp>` and returns that folder.
pub fn set_aside(data_dir: &Path, stamp: u64) -> Result<PathBuf, ResyncError> {
    let aside = data_dir.join(format!("set-aside-{stamp}"));
    let moved = |path: PathBuf| move |source| ResyncError::Move { path, source };
    std::fs::create_dir_all(&aside).map_err(moved(aside.clone()))?;
    for name in [RAFT_DIR, IDENTITY_FILE, LEFT_MARKER] {
        let from = data_dir.join(name);
        if from.exists() {
            std::fs::rename(&from, aside.join(name)).map_err(moved(from.clone()))?;
        }
    }
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raft_state_and_the_identity_move_aside_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(RAFT_DIR)).unwrap();
        std::fs::write(dir.path().join(RAFT_DIR).join("1.raftlog"), b"log").unwrap();
        std::fs::write(dir.path().join(IDENTITY_FILE), b"key").unwrap();
        std::fs::write(dir.path().join("known-peers"), b"peers").unwrap();
        mark_left(dir.path()).unwrap();
        assert!(left_before(dir.path()));
        let aside = set_aside(dir.path(), 42).unwrap();
        assert!(!left_before(dir.path()));
        assert_eq!(aside, dir.path().join("set-aside-42"));
        assert!(!dir.path().join(RAFT_DIR).exists());
        assert!(!dir.path().join(IDENTITY_FILE).exists());
        assert_eq!(
            std::fs::read(aside.join(RAFT_DIR).join("1.raftlog")).unwrap(),
            b"log"
        );
        assert_eq!(std::fs::read(aside.join(IDENTITY_FILE)).unwrap(), b"key");
        assert!(dir.path().join("known-peers").exists());
        // A second resync (the first found nothing to rejoin, say) sets aside what is there.
        let again = set_aside(dir.path(), 43).unwrap();
        assert!(again.exists());
    }
}
