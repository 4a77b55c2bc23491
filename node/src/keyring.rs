//! The cluster keys a node admits peers with, and their rotation.
//!
//! A cluster key copied to every VM outlives the VMs, so it must be replaceable without
//! stopping training. The operator stages the next key beside the key file, as `KEY.next`
//! (made by `parcae-node keygen`), on every member. Each node re-reads that file, admits peers
//! with either key from then on (the admission handshake and the data plane offer both), and
//! lists both fingerprints in its membership record. Once every member that is not lost lists
//! the staged key, the leader proposes `RotateKey` ([`rotation_due`]); when it applies, each
//! node keeps only the new key, writes it over the key file (atomically) and removes
//! `KEY.next`, so a restart uses it. From then on a joiner must hold the new key (the
//! replicated state refuses others), and the old key admits nobody.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use parcae_consensus::ControlState;
use parcae_consensus::state::{KeyId, MemberStatus};

use crate::key::{ClusterKey, KeyError};

/// The keys held: the one in force and, during a rotation, the staged one.
#[derive(Clone)]
struct Keys {
    current: ClusterKey,
    staged: Option<ClusterKey>,
}

/// A node's cluster keys, shared by the libp2p admission, the data plane and the control
/// driver; cheap to clone.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<RwLock<Keys>>,
    /// The key file: `None` for a ring made in code (nothing staged, nothing written).
    file: Option<PathBuf>,
}

/// What [`KeyRing::settle`] did once a key was in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The ring already held only that key (or that key and a newer staged one).
    Unchanged,
    /// The staged key became the key in force; the old one was dropped.
    Promoted,
    /// This node does not hold the key in force: it can no longer admit anyone.
    NotHeld,
}

impl From<ClusterKey> for KeyRing {
    fn from(key: ClusterKey) -> Self {
        Self {
            keys: Arc::new(RwLock::new(Keys {
                current: key,
                staged: None,
            })),
            file: None,
        }
    }
}

impl KeyRing {
    /// Reads the key file and, if present, its staged successor `PATH.next`.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let ring = Self {
            keys: Arc::new(RwLock::new(Keys {
                current: ClusterKey::load(path)?,
                staged: None,
            })),
            file: Some(path.to_owned()),
        };
        ring.reload_staged()?;
        Ok(ring)
    }

    /// Where the next key is staged: the key file's name with `.next` appended.
    pub fn staged_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".next");
        PathBuf::from(name)
    }

    fn read(&self) -> Keys {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Keys> {
        self.keys.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every key held, the one in force first.
    pub fn keys(&self) -> Vec<ClusterKey> {
        let keys = self.read();
        std::iter::once(keys.current).chain(keys.staged).collect()
    }

    /// The fingerprints of [`Self::keys`], as the membership record lists them.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys().iter().map(ClusterKey::id).collect()
    }

    /// The staged key's fingerprint, while a rotation is under way.
    pub fn staged(&self) -> Option<KeyId> {
        self.read().staged.as_ref().map(ClusterKey::id)
    }

    /// Re-reads `PATH.next`: a new staged key is held from now on (true when that changed the
    /// ring). No file leaves the ring as it is; a file that does not parse is an error naming it.
    pub fn reload_staged(&self) -> Result<bool, KeyError> {
        let Some(file) = &self.file else {
            return Ok(false);
        };
        let path = Self::staged_path(file);
        if !path.exists() {
            return Ok(false);
        }
        Ok(self.stage(ClusterKey::load(&path)?))
    }

    /// Holds `key` as the staged next key (replacing another staged one); true when that
    /// changed the ring. A library user stages a key this way; `parcae-node` through `KEY.next`.
    pub fn stage(&self, key: ClusterKey) -> bool {
        let mut keys = self.write();
        if keys.current == key || keys.staged.as_ref() == Some(&key) {
            return false;
        }
        keys.staged = Some(key);
        true
    }

    /// The key `in_force` is the cluster's now: a staged key of that fingerprint becomes the
    /// only key, written over the key file, and `PATH.next` is removed. A failure to write
    /// leaves the ring promoted in memory (the node keeps working; a restart reads both files
    /// and settles again) and is returned.
    pub fn settle(&self, in_force: KeyId) -> Result<Settled, KeyError> {
        let promoted = {
            let mut keys = self.write();
            match &keys.staged {
                Some(staged) if staged.id() == in_force => {
                    let staged = staged.clone();
                    keys.current = staged.clone();
                    keys.staged = None;
                    staged
                }
                _ if keys.current.id() == in_force => return Ok(Settled::Unchanged),
                _ => return Ok(Settled::NotHeld),
            }
        };
        if let Some(file) = &self.file {
            promoted.replace(file)?;
            let next = Self::staged_path(file);
            match std::fs::remove_file(&next) {
                Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                    return Err(KeyError::Io {
                        path: next.display().to_string(),
                        source,
                    });
                }
                _ => {}
            }
        }
        Ok(Settled::Promoted)
    }
}

/// The leader's rotation decision: `RotateKey` to the key it has staged once every member that
/// is not lost lists it (the leader is a member, so it holds it too). A lost member is not
/// waited for; coming back, it must hold the new key.
pub fn rotation_due(state: &ControlState, staged: Option<KeyId>) -> Option<KeyId> {
    let key = staged?;
    let everyone = state
        .members
        .values()
        .filter(|m| m.status != MemberStatus::Lost)
        .all(|m| m.peer.keys.contains(&key));
    (everyone && state.cluster_key != Some(key)).then_some(key)
}

#[cfg(test)]
mod tests {
    use parcae_consensus::state::PeerInfo;
    use parcae_consensus::{Command, NodeId};

    use super::*;

    fn stage(path: &Path, key: &ClusterKey) {
        key.store(&KeyRing::staged_path(path)).unwrap();
    }

    #[test]
    fn a_staged_key_is_held_beside_the_current_one_and_settles_into_the_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let (old, new) = (ClusterKey::generate(), ClusterKey::generate());
        old.store(&path).unwrap();
        let ring = KeyRing::load(&path).unwrap();
        assert_eq!(ring.ids(), vec![old.id()]);
        assert!(!ring.reload_staged().unwrap());
        stage(&path, &new);
        assert!(ring.reload_staged().unwrap());
        assert!(!ring.reload_staged().unwrap());
        assert_eq!(ring.ids(), vec![old.id(), new.id()]);
        assert_eq!(ring.staged(), Some(new.id()));
        // Another node's copy of the ring is the same ring.
        let shared = ring.clone();
        assert_eq!(shared.settle(old.id()).unwrap(), Settled::Unchanged);
        assert_eq!(ring.settle(new.id()).unwrap(), Settled::Promoted);
        assert_eq!(shared.keys(), vec![new.clone()]);
        assert_eq!(ClusterKey::load(&path).unwrap(), new);
        assert!(!KeyRing::staged_path(&path).exists());
        assert_eq!(ring.settle(new.id()).unwrap(), Settled::Unchanged);
        assert_eq!(ring.settle(old.id()).unwrap(), Settled::NotHeld);
        // A restart finds the new key alone.
        assert_eq!(KeyRing::load(&path).unwrap().ids(), vec![new.id()]);
    }

    #[test]
    fn a_bad_staged_file_is_refused_naming_it_and_the_ring_keeps_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let old = ClusterKey::generate();
        old.store(&path).unwrap();
        let ring = KeyRing::load(&path).unwrap();
        std::fs::write(KeyRing::staged_path(&path), "not a key").unwrap();
        let error = ring.reload_staged().unwrap_err().to_string();
        assert!(error.contains("cluster.key.next"), "{error}");
        assert_eq!(ring.ids(), vec![old.id()]);
        assert!(KeyRing::load(&path).is_err());
    }

    #[test]
    fn the_leader_rotates_once_every_member_that_is_not_lost_holds_the_staged_key() {
        let (old, new) = ([1; 8], [2; 8]);
        let join = |n: u8, keys: Vec<KeyId>| Command::Join {
            node: NodeId::from_peer_bytes(&[n]),
            peer: PeerInfo {
                peer_id: vec![n],
                keys,
                ..PeerInfo::default()
            },
        };
        let mut state = ControlState::default();
        for n in 1..=3 {
            state.apply(&join(n, vec![old])).unwrap();
        }
        assert_eq!(rotation_due(&state, None), None);
        state.apply(&join(1, vec![old, new])).unwrap();
        assert_eq!(rotation_due(&state, Some(new)), None);
        state.apply(&join(2, vec![new])).unwrap();
        state
            .apply(&Command::Lost {
                node: NodeId::from_peer_bytes(&[3]),
            })
            .unwrap();
        assert_eq!(rotation_due(&state, Some(new)), Some(new));
        state.apply(&Command::RotateKey { key: new }).unwrap();
        assert_eq!(rotation_due(&state, Some(new)), None);
    }
}
