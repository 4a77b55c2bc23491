//! The cluster key: the shared secret that decides who may join a cluster.
//!
//! Every node of one cluster is started with the same 32-byte key (made by `parcae-node keygen`).
//! It never travels over the network: peers prove that they hold it through the admission
//! handshake in [`crate::net::admission`]. The file format is one line of 64 hex digits so that
//! operators can create, copy and compare keys with ordinary tools.

use std::fmt;
use std::path::Path;

use parcae_consensus::state::KeyId;
use sha2::{Digest, Sha256};

/// Length of a cluster key in bytes.
pub const CLUSTER_KEY_LEN: usize = 32;

/// Why a cluster key could not be loaded or stored.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read or written.
    #[error("cluster key file {path}: {source}")]
    Io {
        /// The file that failed.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not hold exactly 64 hex digits.
    #[error("cluster key file {path}: expected {expected} hex digits, found {found} characters")]
    Length {
        /// The file that failed.
        path: String,
        /// Number of hex digits expected.
        expected: usize,
        /// Number of characters found (after trimming whitespace).
        found: usize,
    },
    /// The file holds a character that is not a hex digit.
    #[error("cluster key file {path}: invalid hex character at position {position}")]
    Hex {
        /// The file that failed.
        path: String,
        /// Zero-based position of the offending character.
        position: usize,
    },
}

/// A 32-byte pre-shared cluster key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; CLUSTER_KEY_LEN]);

impl ClusterKey {
    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: [u8; CLUSTER_KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// Draws a fresh key from the operating system's random source.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// The raw key bytes, for the admission MAC.
    pub fn as_bytes(&self) -> &[u8; CLUSTER_KEY_LEN] {
        &self.0
    }

    /// The key's public fingerprint: the first 8 bytes of its SHA-256. Membership records list
    /// the keys a member holds by it, and the data plane names the key it offers by it.
    pub fn id(&self) -> KeyId {
        let digest = Sha256::digest(self.0);
        let mut id = KeyId::default();
        let len = id.len();
        id.copy_from_slice(&digest[..len]);
        id
    }

    /// [`Self::id`] in hex: safe to log, so that operators can check that two nodes use the
    /// same key.
    pub fn fingerprint(&self) -> String {
        hex::encode(self.id())
    }

    /// Parses the file format: 64 hex digits, surrounding whitespace ignored.
    pub fn parse(text: &str, path: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.len() != CLUSTER_KEY_LEN * 2 {
            return Err(KeyError::Length {
                path: path.to_owned(),
                expected: CLUSTER_KEY_LEN * 2,
                found: text.chars().count(),
            });
        }
        let mut out = [0u8; CLUSTER_KEY_LEN];
        hex::decode_to_slice(text, &mut out).map_err(|e| match e {
            hex::FromHexError::InvalidHexCharacter { index, .. } => KeyError::Hex {
                path: path.to_owned(),
                position: index,
            },
            hex::FromHexError::OddLength | hex::FromHexError::InvalidStringLength => {
                KeyError::Length {
                    path: path.to_owned(),
                    expected: CLUSTER_KEY_LEN * 2,
                    found: text.chars().count(),
                }
            }
        })?;
        Ok(Self(out))
    }

    /// Reads a key file.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// Writes the key file, readable by its owner only, refusing to overwrite an existing file
    /// (overwriting would silently lock this node out of its cluster).
    pub fn store(&self, path: &Path) -> Result<(), KeyError> {
        crate::data_dir::write_private_new(path, format!("{}\n", hex::encode(self.0)).as_bytes())
            .map_err(|source| KeyError::Io {
                path: path.display().to_string(),
                source,
            })
    }

    /// Writes the key file over an existing one, whole or not at all (a rotated key replaces
    /// the one it rotated out).
    pub fn replace(&self, path: &Path) -> Result<(), KeyError> {
        crate::data_dir::write_atomic(path, format!("{}\n", hex::encode(self.0)).as_bytes())
            .map_err(|source| KeyError::Io {
                path: path.display().to_string(),
                source,
            })
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey(fingerprint {})", self.fingerprint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let key = ClusterKey::generate();
        key.store(&path).unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap(), key);
        assert!(matches!(key.store(&path), Err(KeyError::Io { .. })));
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(
            ClusterKey::parse("abcd", "k"),
            Err(KeyError::Length { found: 4, .. })
        ));
        let mut text = "0".repeat(64);
        text.replace_range(10..11, "g");
        assert!(matches!(
            ClusterKey::parse(&text, "k"),
            Err(KeyError::Hex { position: 10, .. })
        ));
        let key = ClusterKey::parse(&format!("  {}\n", "ab".repeat(32)), "k").unwrap();
        assert_eq!(key.as_bytes(), &[0xab; 32]);
    }

    #[test]
    fn fingerprint_does_not_reveal_key() {
        let key = ClusterKey::from_bytes([7; 32]);
        assert_eq!(key.fingerprint().len(), 16);
        assert!(!format!("{key:?}").contains("0707"));
    }
}
