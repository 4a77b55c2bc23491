//! A node's data directory: every file in it is named here, and written here whole or not at
//! all.
//!
//! ```text
//! DATA_DIR/
//!   node.key          libp2p identity (0600; the peer id across restarts)
//!   raft/             raft-engine log
//!   known-peers       the members known last (seeds at the next start)
//!   left              the mark of a graceful exit (the next start rejoins as a new member)
//!   checkpoints/      this node's and peers' checkpoint parts (the fast tier)
//!   store/            the job's durable checkpoint store, when no other location is set
//!   set-aside-STAMP/  raft state and identity set aside by a resync
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

/// A node's data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// The data directory at `root` (created by the first write of the identity).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The libp2p identity key.
    pub fn identity(&self) -> PathBuf {
        self.root.join("node.key")
    }

    /// The raft log's directory.
    pub fn raft(&self) -> PathBuf {
        self.root.join("raft")
    }

    /// The members known last.
    pub fn known_peers(&self) -> PathBuf {
        self.root.join("known-peers")
    }

    /// The mark a graceful exit leaves.
    pub fn left_marker(&self) -> PathBuf {
        self.root.join("left")
    }

    /// Checkpoint parts on this node's disk.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join(CHECKPOINTS)
    }

    /// The job's durable store when no other location is configured.
    pub fn store(&self) -> PathBuf {
        self.root.join("store")
    }

    /// Where a resync at `stamp` (seconds since the epoch) sets the member's state aside.
    pub fn set_aside(&self, stamp: u64) -> PathBuf {
        self.root.join(format!("set-aside-{stamp}"))
    }

    /// What makes this node the member it is, and goes aside when it rejoins as a new one:
    /// the raft log, the identity and the mark of its exit.
    pub fn member_state(&self) -> [PathBuf; 3] {
        [self.raft(), self.identity(), self.left_marker()]
    }
}

/// The checkpoint directory's name, for tools given a data directory or the directory itself
/// (`parcae-node export`).
pub const CHECKPOINTS: &str = "checkpoints";

/// Creates `path` (which must not exist yet) with `bytes`, readable and writable by the owner
/// only, and syncs it to disk: secrets must neither leak to other users nor be lost on a crash.
pub fn write_private_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Writes `path` whole or not at all, owner-only: `bytes` go to a temporary file beside it
/// (`NAME.tmp`, a leftover of a crash replaced), synced, then renamed over `path`, and the
/// directory synced. A crash leaves the old file or the new one, never a half-written one; a
/// write that fails (a full disk) removes its temporary file, whose space the next try needs.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    if let Err(e) = write_private_new(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `report` as pretty JSON to `path`, whole or not at all (the reports of the node's
/// measuring tools: profile, smoke, train-bench).
pub fn write_report(path: &Path, report: &impl serde::Serialize) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    write_atomic(path, json.as_bytes())
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_leaves_the_whole_file_private_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        std::fs::write(path.with_extension("tmp"), b"a crash left this").unwrap();
        write_atomic(&path, b"secret").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        assert!(!path.with_extension("tmp").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_failed_atomic_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should go: the rename over it fails, as the write into a
        // full disk would, after the temporary file was written.
        let path = dir.path().join("ckpt-3-0-2.state");
        std::fs::create_dir(&path).unwrap();
        assert!(write_atomic(&path, b"checkpoint").is_err());
        assert!(!path.with_extension("tmp").exists());
        assert!(path.is_dir(), "what was there is untouched");
    }

    #[test]
    fn every_file_of_the_data_directory_is_inside_it_and_named_once() {
        let dir = DataDir::new("/d");
        let files = [
            dir.identity(),
            dir.raft(),
            dir.known_peers(),
            dir.left_marker(),
            dir.checkpoints(),
            dir.store(),
            dir.set_aside(7),
        ];
        assert!(files.iter().all(|f| f.parent() == Some(Path::new("/d"))));
        let names: std::collections::BTreeSet<_> = files.iter().collect();
        assert_eq!(names.len(), files.len());
        assert_eq!(dir.identity(), Path::new("/d/node.key"));
    }
}
