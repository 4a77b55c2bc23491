//! Coming back as a new member. `parcae-node run --resync` is the way back for a node whose
//! raft log is damaged: its raft state cannot be trusted, and a node that comes back under its
//! old identity with less log than it acknowledged could break raft's promises (a vote or an
//! entry it forgot). A node that left gracefully does the same by itself at its next start
//! (a machine restarted after its preemption, as GCE allows): the cluster retired its identity
//! for good ([`ControlState::retired`](parcae_consensus::ControlState::retired)). Either way the
//! raft directory and the identity key are set aside — moved, never deleted, for an operator to
//! look at — and the node rejoins through its seeds or the members it remembers.

use std::path::PathBuf;

use crate::data_dir::{DataDir, write_atomic};

/// Records that this node left the cluster, so its next start comes back as a new member.
pub fn mark_left(data_dir: &DataDir) -> std::io::Result<()> {
    write_atomic(&data_dir.left_marker(), b"left the cluster\n")
}

/// Whether this node left the cluster when it last ran.
pub fn left_before(data_dir: &DataDir) -> bool {
    data_dir.left_marker().exists()
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

/// Moves the member's state ([`DataDir::member_state`]: the raft log, the identity and the
/// mark of its exit, those present) into a new `DATA_DIR/set-aside-<stamp>` and returns that
/// folder.
pub fn set_aside(data_dir: &DataDir, stamp: u64) -> Result<PathBuf, ResyncError> {
    let aside = data_dir.set_aside(stamp);
    let moved = |path: PathBuf| move |source| ResyncError::Move { path, source };
    std::fs::create_dir_all(&aside).map_err(moved(aside.clone()))?;
    for from in data_dir.member_state() {
        let Some(name) = from.file_name() else {
            continue;
        };
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
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path());
        std::fs::create_dir(dir.raft()).unwrap();
        std::fs::write(dir.raft().join("1.raftlog"), b"log").unwrap();
        std::fs::write(dir.identity(), b"key").unwrap();
        std::fs::write(dir.known_peers(), b"peers").unwrap();
        mark_left(&dir).unwrap();
        assert!(left_before(&dir));
        let aside = set_aside(&dir, 42).unwrap();
        assert!(!left_before(&dir));
        assert_eq!(aside, tmp.path().join("set-aside-42"));
        assert!(!dir.raft().exists());
        assert!(!dir.identity().exists());
        assert_eq!(
            std::fs::read(aside.join("raft").join("1.raftlog")).unwrap(),
            b"log"
        );
        assert_eq!(std::fs::read(aside.join("node.key")).unwrap(), b"key");
        assert!(dir.known_peers().exists());
        // A second resync (the first found nothing to rejoin, say) sets aside what is there.
        let again = set_aside(&dir, 43).unwrap();
        assert!(again.exists());
    }
}
