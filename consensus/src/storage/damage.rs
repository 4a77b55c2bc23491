//! Telling a torn tail from a damaged log. raft-engine's `TolerateTailCorruption` drops
//! everything from the first broken batch of the newest file on, which is right for a write
//! the machine died in (never fsync'd, so never acknowledged) and silent loss for a flipped
//! block in the middle (everything after it was acknowledged). So the store opens in
//! `AbsoluteConsistency`; when that fails, a scratch copy is opened tolerating the tail, and
//! the bytes it dropped are read: if the broken batch reaches the end of the file (or nothing
//! but zeros follows it), the last write was cut and the tail may go; if whole data follows the
//! broken batch, the log is damaged and the node refuses to start on it.

use std::path::{Path, PathBuf};

use raft_engine::{Config, Engine, RecoveryMode};

use super::error::StorageError;

/// raft-engine's batch header: `len << 8 | compression` and the footer offset, big-endian.
const BATCH_HEADER_LEN: usize = 16;

/// What the bytes from a broken batch to the end of its file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// The last write, cut short: dropping it loses nothing acknowledged.
    Torn,
    /// Data follows the broken batch: dropping it would lose acknowledged entries.
    Damaged,
}

/// Classifies `rest`, the bytes of a file from its first broken batch to its end.
pub fn classify(rest: &[u8]) -> Tail {
    if rest.len() < BATCH_HEADER_LEN || rest.iter().all(|&b| b == 0) {
        return Tail::Torn;
    }
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&rest[at..at + 8]);
        u64::from_be_bytes(bytes)
    };
    let len = usize::try_from(word(0) >> 8).unwrap_or(usize::MAX);
    let footer = usize::try_from(word(8)).unwrap_or(usize::MAX);
    let header_sane = (BATCH_HEADER_LEN..=len).contains(&footer);
    if !header_sane {
        return Tail::Damaged;
    }
    match rest.get(len..) {
        None => Tail::Torn,
        Some(after) if after.iter().all(|&b| b == 0) => Tail::Torn,
        Some(_) => Tail::Damaged,
    }
}

/// The store's raft-engine configuration in `dir` with `mode`.
pub fn config(dir: String, mode: RecoveryMode) -> Config {
    Config {
        dir,
        target_file_size: raft_engine::ReadableSize::mb(8),
        purge_threshold: raft_engine::ReadableSize::mb(64),
        recovery_mode: mode,
        ..Config::default()
    }
}

/// After `AbsoluteConsistency` refused `dir` with `refusal`: `Ok` when only a torn tail is
/// broken (opening with `TolerateTailCorruption` then drops just that), else the
/// [`StorageError::Corrupt`] that names the file and offset.
pub fn check_tail(dir: &Path, refusal: &raft_engine::Error) -> Result<(), StorageError> {
    let scratch = scratch_dir(dir);
    let verdict = inspect(dir, &scratch, refusal);
    let _ = std::fs::remove_dir_all(&scratch);
    verdict
}

fn inspect(dir: &Path, scratch: &Path, refusal: &raft_engine::Error) -> Result<(), StorageError> {
    let corrupt = |file: &Path, offset: u64, reason: String| StorageError::Corrupt {
        file: file.to_path_buf(),
        offset,
        reason,
    };
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(|e| io(scratch, e))?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        if entry.file_type().map_err(|e| io(dir, e))?.is_file() {
            let copy = scratch.join(entry.file_name());
            let len = std::fs::copy(entry.path(), &copy).map_err(|e| io(&entry.path(), e))?;
            files.push((entry.path(), copy, len));
        }
    }
    let scratch_str = scratch
        .to_str()
        .ok_or_else(|| StorageError::BadPath(scratch.to_path_buf()))?
        .to_owned();
    if let Err(e) = Engine::open(config(scratch_str, RecoveryMode::TolerateTailCorruption)) {
        return Err(corrupt(
            dir,
            0,
            format!("{refusal}; not in the newest file: {e}"),
        ));
    }
    for (original, copy, len) in files {
        let kept = std::fs::metadata(&copy).map_err(|e| io(&copy, e))?.len();
        if kept >= len {
            continue;
        }
        let bytes = std::fs::read(&original).map_err(|e| io(&original, e))?;
        let rest = bytes.get(kept as usize..).unwrap_or_default();
        return match classify(rest) {
            Tail::Torn => Ok(()),
            Tail::Damaged => Err(corrupt(
                &original,
                kept,
                format!(
                    "{refusal}; {} bytes of data follow the broken batch",
                    len - kept
                ),
            )),
        };
    }
    Err(corrupt(dir, 0, refusal.to_string()))
}

fn scratch_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".check");
    dir.with_file_name(name)
}

fn io(path: &Path, e: std::io::Error) -> StorageError {
    StorageError::Inspect {
        path: path.to_path_buf(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: u64, footer: u64) -> Vec<u8> {
        let mut h = (len << 8).to_be_bytes().to_vec();
        h.extend(footer.to_be_bytes());
        h
    }

    #[test]
    fn a_cut_last_write_is_a_torn_tail() {
        assert_eq!(classify(&[]), Tail::Torn);
        assert_eq!(classify(&[1, 2, 3]), Tail::Torn);
        assert_eq!(classify(&[0; 4096]), Tail::Torn);
        // The header says 100 bytes; only 40 reached the disk.
        let mut cut = header(100, 90);
        cut.extend([7u8; 24]);
        assert_eq!(classify(&cut), Tail::Torn);
        // All 100 bytes are there but the pages after the first were never written.
        let mut zeroed = header(100, 90);
        zeroed.extend([0u8; 84]);
        zeroed.extend([0u8; 500]);
        assert_eq!(classify(&zeroed), Tail::Torn);
    }

    #[test]
    fn data_after_the_broken_batch_is_damage() {
        let mut two = header(100, 90);
        two.extend([7u8; 84]);
        two.extend(header(50, 40));
        two.extend([9u8; 34]);
        assert_eq!(classify(&two), Tail::Damaged);
        // A garbled header with data behind it.
        let mut garbled = vec![0xAB; 16];
        garbled.extend([1u8; 200]);
        assert_eq!(classify(&garbled), Tail::Damaged);
    }
}
