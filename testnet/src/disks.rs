//! Checkpoint disks that fill up, for `chaos --disk-full-every`: each node's checkpoint
//! directory is a tmpfs of fixed size mounted before the node starts, which the testnet fills
//! with a ballast file (written until the file system refuses more) and empties again later.
//!
//! Only the checkpoint directory is size-limited: the node's raft log and identity stay on the
//! host's disk, so the fault is the one the node must survive without losing the cluster's
//! trust, a checkpoint write that fails. Mounting needs root; every mount is detached when the
//! value is dropped (after the nodes are killed).

use std::io::Write;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::TestnetError;

/// The node's checkpoint directory inside its data directory (`parcae_node::data_dir`).
pub const CHECKPOINTS: &str = "checkpoints";
/// The ballast file's name (not a checkpoint's name: the node ignores it).
const BALLAST: &str = "ballast.fill";
/// Bytes of ballast written at a time.
const CHUNK: usize = 1 << 20;

/// The mounted checkpoint directories of one cluster.
#[derive(Debug)]
pub struct Disks {
    mib: u64,
    mounts: Vec<PathBuf>,
}

impl Disks {
    /// Disks of `mib` MiB each (none mounted yet). Needs root.
    pub fn new(mib: u64) -> Result<Self, TestnetError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(TestnetError::Disk {
                dir: PathBuf::new(),
                reason: "size-limited checkpoint disks are tmpfs mounts, which need root \
                         (CAP_SYS_ADMIN): run as root, or drop --disk-full-every"
                    .into(),
            });
        }
        Ok(Self {
            mib,
            mounts: Vec::new(),
        })
    }

    /// Mounts a disk at `data_dir`'s checkpoint directory (made if missing).
    pub fn mount(&mut self, data_dir: &Path) -> Result<(), TestnetError> {
        let dir = data_dir.join(CHECKPOINTS);
        let failed = |reason: String| TestnetError::Disk {
            dir: dir.clone(),
            reason,
        };
        std::fs::create_dir_all(&dir).map_err(|e| failed(e.to_string()))?;
        let options = format!("size={}m,mode=0700", self.mib);
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| failed(format!("mounting a tmpfs of {} MiB: {e}", self.mib)))?;
        self.mounts.push(dir);
        Ok(())
    }

    /// Fills `data_dir`'s checkpoint disk; returns the ballast's bytes.
    pub fn fill(data_dir: &Path) -> Result<u64, TestnetError> {
        let path = data_dir.join(CHECKPOINTS).join(BALLAST);
        let failed = |reason: String| TestnetError::Disk {
            dir: path.clone(),
            reason,
        };
        let mut file = std::fs::File::create(&path).map_err(|e| failed(e.to_string()))?;
        let zeros = vec![0u8; CHUNK];
        let mut written = 0u64;
        loop {
            match file.write(&zeros) {
                Ok(0) => return Ok(written),
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => return Ok(written),
                Err(e) => return Err(failed(e.to_string())),
            }
        }
    }

    /// Empties `data_dir`'s checkpoint disk of its ballast.
    pub fn free(data_dir: &Path) {
        let _ = std::fs::remove_file(data_dir.join(CHECKPOINTS).join(BALLAST));
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for dir in &self.mounts {
            // Detached: a process still holding a file does not keep the mount busy.
            let _ = umount2(dir, MntFlags::MNT_DETACH);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_fills_to_its_size_refuses_more_and_empties_again() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: tmpfs mounts need root");
            return;
        }
        let data = tempfile::tempdir().unwrap();
        let mut disks = Disks::new(4).unwrap();
        if let Err(e) = disks.mount(data.path()) {
            // A container's root may lack CAP_SYS_ADMIN; any other failure is one.
            assert!(e.to_string().contains("EPERM"), "{e}");
            eprintln!("skipped: {e}");
            return;
        }
        let written = Disks::fill(data.path()).unwrap();
        assert!(
            (3 << 20..=4 << 20).contains(&written),
            "{written} bytes in a 4 MiB disk"
        );
        let more = std::fs::write(
            data.path().join(CHECKPOINTS).join("ckpt-1-0-2.state"),
            [1u8; 8192],
        );
        assert!(more.is_err(), "a full disk refuses a checkpoint");
        Disks::free(data.path());
        std::fs::write(
            data.path().join(CHECKPOINTS).join("ckpt-1-0-2.state"),
            [1u8; 8192],
        )
        .unwrap();
        drop(disks);
        assert!(
            !data
                .path()
                .join(CHECKPOINTS)
                .join("ckpt-1-0-2.state")
                .exists(),
            "unmounted: the file lived on the tmpfs"
        );
    }
}
