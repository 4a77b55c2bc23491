//! The node's libp2p identity, persisted in its data directory.
//!
//! The peer id is derived from this key and is how the raft membership names a node, so a node
//! restarted with the same data directory must come back with the same key: the first start
//! writes `node.key` (libp2p's protobuf key encoding, owner-only permissions, atomically), later
//! starts read it.

use std::path::{Path, PathBuf};

use libp2p::identity::Keypair;

use crate::data_dir::{DataDir, write_atomic};

/// Largest identity file accepted (an encoded ed25519 key is 68 bytes).
const MAX_IDENTITY_FILE: u64 = 4096;

/// Why the identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The data directory or the key file could not be accessed.
    #[error("identity key {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The key file is larger than any valid key.
    #[error("identity key {path}: file is {len} bytes, larger than {MAX_IDENTITY_FILE}")]
    TooLarge {
        /// The offending file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// The key file is empty (written by a version that did not write it atomically and was
    /// killed meanwhile).
    #[error(
        "identity key {path} is empty: remove it and the raft directory beside it to start as a new member"
    )]
    Empty {
        /// The offending file.
        path: PathBuf,
    },
    /// The key file does not hold a valid libp2p key.
    #[error("identity key {path}: {source}")]
    Decode {
        /// The offending file.
        path: PathBuf,
        /// The decoding error.
        source: libp2p::identity::DecodingError,
    },
}

/// Loads the identity from `data_dir`, or creates the directory and a new ed25519 identity.
pub fn load_or_create(data_dir: &DataDir) -> Result<Keypair, IdentityError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IdentityError::Io { path, source }
    };
    std::fs::create_dir_all(data_dir.root()).map_err(io(data_dir.root()))?;
    let path = data_dir.identity();
    match std::fs::metadata(&path) {
        Ok(meta) => {
            if meta.len() == 0 {
                return Err(IdentityError::Empty { path });
            }
            if meta.len() > MAX_IDENTITY_FILE {
                return Err(IdentityError::TooLarge {
                    path,
                    len: meta.len(),
                });
            }
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            Keypair::from_protobuf_encoding(&bytes)
                .map_err(|source| IdentityError::Decode { path, source })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|source| IdentityError::Decode {
                    path: path.clone(),
                    source,
                })?;
            write_atomic(&path, &bytes).map_err(io(&path))?;
            Ok(key)
        }
        Err(e) => Err(io(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(&DataDir::new(dir.path().join("d"))).unwrap();
        let second = load_or_create(&DataDir::new(dir.path().join("d"))).unwrap();
        assert_eq!(first.public().to_peer_id(), second.public().to_peer_id());
        let other = load_or_create(&DataDir::new(dir.path().join("e"))).unwrap();
        assert_ne!(first.public().to_peer_id(), other.public().to_peer_id());
    }

    #[test]
    fn corrupt_identity_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path());
        std::fs::write(dir.identity(), b"not a key").unwrap();
        assert!(matches!(
            load_or_create(&dir),
            Err(IdentityError::Decode { .. })
        ));
        std::fs::write(dir.identity(), b"").unwrap();
        let empty = load_or_create(&dir).unwrap_err();
        assert!(matches!(empty, IdentityError::Empty { .. }));
        assert!(empty.to_string().contains("is empty: remove it"), "{empty}");
    }
}
