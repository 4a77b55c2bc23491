//! raft-rs [`Storage`] over raft-engine: a durable log, hard state and snapshot.
//!
//! Layout: raft-engine "raft group" 1 holds the log entries, group 2 the metadata (hard state and
//! the latest snapshot, data included). Keeping them in separate groups lets a received snapshot
//! wipe the log (`Command::Clean`) without touching the metadata.
//!
//! The configuration state reported by [`Storage::initial_state`] is the snapshot's: on restart
//! raft replays the committed entries after the snapshot, configuration changes included, exactly
//! like etcd's `MemoryStorage`. So no separately persisted configuration can disagree with the
//! replayed log.
//!
//! Reads are served from an in-memory copy of the uncompacted log (bounded by the snapshot
//! interval), loaded once at open on a fresh thread. Why: raft-engine 0.4 caches decoded blocks
//! in a thread-local keyed only by file position, so two engines used from one thread (the
//! in-process test clusters and benchmarks) could read each other's blocks; a fresh thread has an
//! empty cache, and memory reads never touch it. raft-engine stays the durable source of truth.
//!
//! Durability: every write goes through `Engine::write(batch, sync)`; with `sync = true` (the
//! default) it is fsync'd before the call returns, which raft requires before messages that
//! depend on it are sent. `sync = false` exists for randomized in-process tests only.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError as RaftStorageError};
use raft_engine::{Command as EngineCommand, Engine, LogBatch, MessageExt, RecoveryMode};

mod damage;
mod error;

pub use error::StorageError;

const ENTRY_GROUP: u64 = 1;
const META_GROUP: u64 = 2;
const KEY_HARD_STATE: &[u8] = b"hard_state";
const KEY_SNAPSHOT: &[u8] = b"snapshot";

/// Storage options.
#[derive(Debug, Clone, Copy)]
pub struct StorageOptions {
    /// fsync every write. Must be `true` outside of tests.
    pub sync: bool,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions { sync: true }
    }
}

struct EntryExt;

impl MessageExt for EntryExt {
    type Entry = Entry;

    fn index(e: &Entry) -> u64 {
        e.index
    }
}

/// Durable raft storage on raft-engine.
pub struct DiskStorage {
    engine: Engine,
    sync: bool,
    hard_state: HardState,
    snapshot: Snapshot,
    /// The uncompacted log, `entries[i].index == first index + i`.
    entries: VecDeque<Entry>,
    /// Set when raft asked for a snapshot the store cannot serve (older than requested, or
    /// taken before the recipient joined); the driver then takes a fresh one.
    snapshot_wanted: AtomicBool,
}

impl DiskStorage {
    /// Opens (or creates) the store in `dir` and recovers its state: a torn last write is
    /// dropped, any other damage is [`StorageError::Corrupt`].
    pub fn open(dir: &Path, options: StorageOptions) -> Result<DiskStorage, StorageError> {
        let dir_str = dir
            .to_str()
            .ok_or_else(|| StorageError::BadPath(dir.to_path_buf()))?
            .to_owned();
        let engine = match Engine::open(damage::config(
            dir_str.clone(),
            RecoveryMode::AbsoluteConsistency,
        )) {
            Ok(engine) => engine,
            Err(refusal @ (raft_engine::Error::Corruption(_) | raft_engine::Error::Codec(_))) => {
                damage::check_tail(dir, &refusal)?;
                tracing::warn!(
                    dir = %dir.display(),
                    "raft log ends in a torn write ({refusal}); dropping it"
                );
                Engine::open(damage::config(
                    dir_str,
                    RecoveryMode::TolerateTailCorruption,
                ))?
            }
            Err(e) => return Err(e.into()),
        };
        let hard_state = engine
            .get_message::<HardState>(META_GROUP, KEY_HARD_STATE)?
            .unwrap_or_default();
        let snapshot = engine
            .get_message::<Snapshot>(META_GROUP, KEY_SNAPSHOT)?
            .unwrap_or_default();
        let mut storage = DiskStorage {
            engine,
            sync: options.sync,
            hard_state,
            snapshot,
            entries: VecDeque::new(),
            snapshot_wanted: AtomicBool::new(false),
        };
        // A crash between storing a snapshot and compacting leaves entries the snapshot covers.
        storage.compact_to_snapshot();
        storage.entries = storage.load_entries()?.into();
        Ok(storage)
    }

    /// Whether a raft state exists (bootstrapped, or received from a leader).
    pub fn is_initialized(&self) -> bool {
        self.snapshot.get_metadata().get_conf_state() != &ConfState::default()
    }

    /// Initializes a new cluster's store: a snapshot at index 1, term 1 with the initial
    /// configuration and state. Every bootstrap member must be given the same arguments; nodes
    /// added later start empty and receive that state by snapshot.
    pub fn bootstrap(&mut self, conf_state: ConfState, data: Vec<u8>) -> Result<(), StorageError> {
        if self.is_initialized() || self.last_index_inner() > 0 {
            return Err(StorageError::AlreadyInitialized);
        }
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let meta = snapshot.mut_metadata();
        meta.index = 1;
        meta.term = 1;
        meta.set_conf_state(conf_state);
        let hs = HardState {
            term: 1,
            commit: 1,
            ..HardState::default()
        };
        let mut batch = LogBatch::default();
        batch.put_message(META_GROUP, KEY_SNAPSHOT.to_vec(), &snapshot)?;
        batch.put_message(META_GROUP, KEY_HARD_STATE.to_vec(), &hs)?;
        self.engine.write(&mut batch, true)?;
        self.snapshot = snapshot;
        self.hard_state = hs;
        Ok(())
    }

    /// Persists new log entries (overwriting any conflicting tail) and the hard state, in one
    /// write.
    pub fn append(
        &mut self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<(), StorageError> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let mut batch = LogBatch::default();
        if !entries.is_empty() {
            batch.add_entries::<EntryExt>(ENTRY_GROUP, entries)?;
        }
        if let Some(hs) = hard_state {
            batch.put_message(META_GROUP, KEY_HARD_STATE.to_vec(), hs)?;
        }
        self.engine.write(&mut batch, self.sync)?;
        if let Some(hs) = hard_state {
            self.hard_state = hs.clone();
        }
        if let Some(first) = entries.first() {
            // Mirror raft-engine: a conflicting tail is replaced.
            while self.entries.back().is_some_and(|e| e.index >= first.index) {
                self.entries.pop_back();
            }
            self.entries.extend(entries.iter().cloned());
        }
        Ok(())
    }

    /// Records an updated commit index (from a light ready). Not fsync'd on its own: a commit
    /// index is recoverable from the quorum, raft only needs it not to exceed the durable log,
    /// which holds because the entries were persisted first; the next synced write makes it
    /// durable too.
    pub fn set_commit(&mut self, commit: u64) -> Result<(), StorageError> {
        let mut hs = self.hard_state.clone();
        hs.commit = commit;
        let mut batch = LogBatch::default();
        batch.put_message(META_GROUP, KEY_HARD_STATE.to_vec(), &hs)?;
        self.engine.write(&mut batch, false)?;
        self.hard_state = hs;
        Ok(())
    }

    /// Installs a snapshot received from the leader: the log is discarded, the hard state moves
    /// to the snapshot.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> Result<(), StorageError> {
        let meta = snapshot.get_metadata();
        if meta.index < self.snapshot.get_metadata().index {
            return Err(StorageError::StaleSnapshot {
                stored: self.snapshot.get_metadata().index,
                got: meta.index,
            });
        }
        let mut hs = self.hard_state.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = meta.index;
        let mut batch = LogBatch::default();
        batch.add_command(ENTRY_GROUP, EngineCommand::Clean);
        batch.put_message(META_GROUP, KEY_SNAPSHOT.to_vec(), &snapshot)?;
        batch.put_message(META_GROUP, KEY_HARD_STATE.to_vec(), &hs)?;
        self.engine.write(&mut batch, self.sync)?;
        self.snapshot = snapshot;
        self.hard_state = hs;
        self.entries.clear();
        Ok(())
    }

    /// Stores a snapshot of the applied state at `index` and compacts the log up to it.
    /// `conf_state` must be the configuration as of `index`.
    pub fn create_snapshot(
        &mut self,
        index: u64,
        conf_state: ConfState,
        data: Vec<u8>,
    ) -> Result<(), raft::Error> {
        let stored = self.snapshot.get_metadata().index;
        if index <= stored {
            return Ok(());
        }
        let term = self.term(index)?;
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf_state);
        let mut batch = LogBatch::default();
        batch
            .put_message(META_GROUP, KEY_SNAPSHOT.to_vec(), &snapshot)
            .map_err(to_raft_error)?;
        self.engine
            .write(&mut batch, self.sync)
            .map_err(to_raft_error)?;
        self.snapshot = snapshot;
        self.compact_to_snapshot();
        // Rewrites or drops log files that only hold compacted entries.
        self.engine.purge_expired_files().map_err(to_raft_error)?;
        Ok(())
    }

    /// Whether raft asked for a newer snapshot since the last call (clears the request).
    pub fn take_snapshot_request(&self) -> bool {
        self.snapshot_wanted.swap(false, Ordering::Relaxed)
    }

    /// The latest stored snapshot (data included).
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The persisted hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Number of log entries currently held (after compaction).
    pub fn entry_count(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Reads the whole stored log on a fresh thread (see the module docs on the block cache).
    fn load_entries(&self) -> Result<Vec<Entry>, StorageError> {
        let (Some(first), Some(last)) = (
            self.engine.first_index(ENTRY_GROUP),
            self.engine.last_index(ENTRY_GROUP),
        ) else {
            return Ok(Vec::new());
        };
        let engine = &self.engine;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let mut out = Vec::with_capacity((last + 1 - first) as usize);
                    engine.fetch_entries_to::<EntryExt>(
                        ENTRY_GROUP,
                        first,
                        last + 1,
                        None,
                        &mut out,
                    )?;
                    Ok(out)
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn compact_to_snapshot(&mut self) {
        let index = self.snapshot.get_metadata().index;
        if self
            .engine
            .first_index(ENTRY_GROUP)
            .is_some_and(|f| f <= index)
        {
            self.engine.compact_to(ENTRY_GROUP, index + 1);
        }
        while self.entries.front().is_some_and(|e| e.index <= index) {
            self.entries.pop_front();
        }
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    fn first_index_inner(&self) -> u64 {
        self.entries
            .front()
            .map_or(self.snapshot_index() + 1, |e| e.index)
    }

    fn last_index_inner(&self) -> u64 {
        self.entries
            .back()
            .map_or(self.snapshot_index(), |e| e.index)
    }

    fn entry(&self, index: u64) -> Option<&Entry> {
        let first = self.entries.front()?.index;
        self.entries
            .get(usize::try_from(index.checked_sub(first)?).ok()?)
    }
}

fn to_raft_error(e: impl std::error::Error + Send + Sync + 'static) -> raft::Error {
    raft::Error::Store(RaftStorageError::Other(Box::new(e)))
}

impl Storage for DiskStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.snapshot.get_metadata().get_conf_state().clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index_inner() {
            return Err(raft::Error::Store(RaftStorageError::Compacted));
        }
        if high > self.last_index_inner() + 1 {
            return Err(raft::Error::Store(RaftStorageError::Unavailable));
        }
        let mut entries: Vec<Entry> = (low..high).filter_map(|i| self.entry(i).cloned()).collect();
        if entries.len() as u64 != high - low {
            return Err(raft::Error::Store(RaftStorageError::Unavailable));
        }
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let meta = self.snapshot.get_metadata();
        if idx == meta.index {
            return Ok(meta.term);
        }
        if idx < self.first_index_inner() {
            return Err(raft::Error::Store(RaftStorageError::Compacted));
        }
        if idx > self.last_index_inner() {
            return Err(raft::Error::Store(RaftStorageError::Unavailable));
        }
        self.entry(idx)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(RaftStorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_index_inner())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index_inner())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let cs = self.snapshot.get_metadata().get_conf_state();
        let has_recipient = cs
            .voters
            .iter()
            .chain(&cs.learners)
            .chain(&cs.voters_outgoing)
            .chain(&cs.learners_next)
            .any(|&id| id == to);
        // A node added after the stored snapshot would refuse it (raft-rs checks that the
        // recipient is in the snapshot's configuration).
        if self.snapshot_index() < request_index || !has_recipient {
            self.snapshot_wanted.store(true, Ordering::Relaxed);
            return Err(raft::Error::Store(
                RaftStorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        let mut e = Entry {
            index,
            term,
            ..Entry::default()
        };
        e.set_data(vec![index as u8; 8].into());
        e
    }

    fn voters(ids: &[u64]) -> ConfState {
        let mut cs = ConfState::default();
        cs.set_voters(ids.to_vec());
        cs
    }

    #[test]
    fn bootstrap_append_restart_compact_and_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = DiskStorage::open(dir.path(), StorageOptions::default()).unwrap();
            assert!(!s.is_initialized());
            s.bootstrap(voters(&[1]), b"init".to_vec()).unwrap();
            assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (2, 1));
            let ents: Vec<Entry> = (2..=10).map(|i| entry(i, 2)).collect();
            let hs = HardState {
                term: 2,
                commit: 8,
                ..HardState::default()
            };
            s.append(&ents, Some(&hs)).unwrap();
            // A conflicting tail from a new leader replaces entries 9 and 10.
            s.append(&[entry(9, 3)], None).unwrap();
            assert_eq!(s.last_index().unwrap(), 9);
            assert_eq!(s.term(9).unwrap(), 3);
        }
        let mut s = DiskStorage::open(dir.path(), StorageOptions::default()).unwrap();
        assert!(s.is_initialized());
        let st = s.initial_state().unwrap();
        assert_eq!((st.hard_state.term, st.hard_state.commit), (2, 8));
        assert_eq!(st.conf_state.voters, vec![1]);
        assert_eq!(s.last_index().unwrap(), 9);
        let got = s
            .entries(2, 10, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(got.len(), 8);
        assert_eq!(got[7].term, 3);
        s.create_snapshot(6, voters(&[1, 2]), b"state@6".to_vec())
            .unwrap();
        assert_eq!(s.first_index().unwrap(), 7);
        assert_eq!(s.term(6).unwrap(), 2);
        assert!(matches!(
            s.entries(5, 8, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(RaftStorageError::Compacted))
        ));
        drop(s);
        let s = DiskStorage::open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(s.first_index().unwrap(), 7);
        assert_eq!(s.latest_snapshot().get_data(), b"state@6");
        assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2]);
    }

    /// A store in `dir` holding entries 2..=41 written one append (one batch) each, closed.
    fn forty_appends(dir: &Path) -> std::path::PathBuf {
        let mut s = DiskStorage::open(dir, StorageOptions::default()).unwrap();
        s.bootstrap(voters(&[1]), b"init".to_vec()).unwrap();
        for i in 2..=41 {
            s.append(&[entry(i, 2)], None).unwrap();
        }
        drop(s);
        let mut logs: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
            .collect();
        logs.sort();
        logs.pop().expect("a log file")
    }

    #[test]
    fn a_torn_last_write_is_dropped_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let log = forty_appends(dir.path());
        let len = std::fs::metadata(&log).unwrap().len();
        // The machine died 5 bytes before the end of the last append.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let s = DiskStorage::open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(s.last_index().unwrap(), 40);
        assert!(
            !dir.path()
                .with_file_name(format!(
                    "{}.check",
                    dir.path().file_name().unwrap().to_string_lossy()
                ))
                .exists()
        );
    }

    #[test]
    fn damage_in_the_middle_of_the_log_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = forty_appends(dir.path());
        let mut bytes = std::fs::read(&log).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle..middle + 64]
            .iter_mut()
            .for_each(|b| *b ^= 0x5A);
        std::fs::write(&log, &bytes).unwrap();
        let err = DiskStorage::open(dir.path(), StorageOptions::default())
            .err()
            .expect("a damaged log must not open");
        match &err {
            StorageError::Corrupt { file, offset, .. } => {
                assert_eq!(file, &log);
                assert!(*offset <= middle as u64, "{err}");
            }
            other => panic!("expected Corrupt, got {other}"),
        }
        assert!(err.to_string().contains(&log.display().to_string()));
        // Nothing was truncated: the evidence stays for an operator.
        assert_eq!(std::fs::read(&log).unwrap(), bytes);
    }

    #[test]
    fn received_snapshot_replaces_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), StorageOptions { sync: false }).unwrap();
        s.append(&[entry(1, 1), entry(2, 1)], None).unwrap();
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 50;
        snap.mut_metadata().term = 4;
        snap.mut_metadata().set_conf_state(voters(&[1, 2, 3]));
        s.apply_snapshot(snap.clone()).unwrap();
        assert_eq!(
            (s.first_index().unwrap(), s.last_index().unwrap()),
            (51, 50)
        );
        assert_eq!(s.hard_state().commit, 50);
        s.append(&[entry(51, 4)], None).unwrap();
        assert_eq!(s.last_index().unwrap(), 51);
        snap.mut_metadata().index = 40;
        assert!(matches!(
            s.apply_snapshot(snap),
            Err(StorageError::StaleSnapshot {
                stored: 50,
                got: 40
            })
        ));
    }
}
