//! Stage checkpoints on local disk: this node's own and those peers sent it for safekeeping.
//!
//! A checkpoint is one state buffer of `parcae-model` (per-layer CRCs inside) written to a
//! temporary file, fsynced and renamed, so a crash leaves either the old or the new file. The
//! newest [`KEEP`] checkpoints of each layer range are kept.

use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use parcae_consensus::state::Digest32;
use sha2::{Digest, Sha256};

/// A checkpoint file could not be written, read or pruned.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint storage {}: {source}", path.display())]
pub struct CheckpointError {
    /// The file or directory involved.
    pub path: PathBuf,
    /// What the file system said.
    pub source: std::io::Error,
}

/// Checkpoints kept per layer range.
pub const KEEP: usize = 2;

/// The directory of checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

fn io(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError {
        path: path.to_path_buf(),
        source,
    }
}

impl CheckpointStore {
    /// Checkpoints under `dir` (created on first save).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, steps: u64, layers: &Range<usize>) -> PathBuf {
        self.dir.join(format!(
            "ckpt-{steps}-{}-{}.state",
            layers.start, layers.end
        ))
    }

    /// Writes a checkpoint durably and returns its digest.
    pub fn save(
        &self,
        steps: u64,
        layers: &Range<usize>,
        bytes: &[u8],
    ) -> Result<Digest32, CheckpointError> {
        fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let path = self.path(steps, layers);
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(&self.dir, e))?;
        self.prune(layers)?;
        Ok(Sha256::digest(bytes).into())
    }

    /// Reads a checkpoint.
    pub fn load(&self, steps: u64, layers: &Range<usize>) -> Result<Vec<u8>, CheckpointError> {
        let path = self.path(steps, layers);
        fs::read(&path).map_err(|e| io(&path, e))
    }

    /// The stored checkpoints as `(steps, layers)`, newest first.
    pub fn list(&self) -> Vec<(u64, Range<usize>)> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, Range<usize>)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_name(&e.file_name().to_string_lossy()))
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.start.cmp(&b.1.start)));
        out
    }

    fn prune(&self, layers: &Range<usize>) -> Result<(), CheckpointError> {
        let same: Vec<u64> = self
            .list()
            .into_iter()
            .filter(|(_, r)| r == layers)
            .map(|(s, _)| s)
            .collect();
        for steps in same.into_iter().skip(KEEP) {
            let path = self.path(steps, layers);
            fs::remove_file(&path).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

fn parse_name(name: &str) -> Option<(u64, Range<usize>)> {
    let rest = name.strip_prefix("ckpt-")?.strip_suffix(".state")?;
    let mut parts = rest.split('-');
    let steps = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    (parts.next().is_none() && start < end).then_some((steps, start..end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_loads_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("ckpt"));
        for steps in 1..=4u64 {
            store.save(steps, &(0..2), &[steps as u8; 8]).unwrap();
        }
        store.save(3, &(2..4), b"other").unwrap();
        assert_eq!(store.load(4, &(0..2)).unwrap(), vec![4u8; 8]);
        assert_eq!(store.list(), vec![(4, 0..2), (3, 0..2), (3, 2..4)]);
        assert!(store.load(1, &(0..2)).is_err());
        assert_eq!(parse_name("ckpt-1-3-2.state"), None);
        assert_eq!(parse_name("ckpt-x-0-2.state"), None);
    }
}
