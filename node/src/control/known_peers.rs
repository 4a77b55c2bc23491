//! The members this node knew last, kept in its data directory: a node restarted with no
//! `--bootstrap` at all dials them (as seeds, see [`crate::net::seeds`]) and any one live member
//! is enough to find the cluster again. The file is only a hint: one that cannot be read or
//! parsed is logged and ignored, never fatal.

use std::path::Path;

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

use crate::data_dir::write_atomic;
use crate::net::seeds::{self, MAX_SEEDS, Seed};

/// The addresses to remember of the members `(peer, addresses)`: each with `/p2p/<id>`, at
/// most [`MAX_SEEDS`], those that are no seed shape (e.g. a relay circuit) left out.
pub fn remembered(members: &[(PeerId, Vec<Multiaddr>)]) -> Vec<Multiaddr> {
    members
        .iter()
        .flat_map(|(peer, addrs)| {
            addrs.iter().map(move |a| {
                let mut a = a.clone();
                if !matches!(a.iter().last(), Some(Protocol::P2p(_))) {
                    a.push(Protocol::P2p(*peer));
                }
                a
            })
        })
        .filter(|a| Seed::parse(a).is_ok())
        .take(MAX_SEEDS)
        .collect()
}

/// Writes the list atomically: a crash leaves the old list or the new one, never half of one.
pub fn store(path: &Path, addrs: &[Multiaddr]) -> std::io::Result<()> {
    let text: String = addrs.iter().map(|a| format!("{a}\n")).collect();
    write_atomic(path, text.as_bytes())
}

/// The seeds remembered at `path`; none when there is no file, and none (logged) when it
/// cannot be read or parsed.
pub fn load(path: &Path) -> Vec<Seed> {
    if !path.exists() {
        return Vec::new();
    }
    match seeds::read_file(path) {
        Ok(seeds) => seeds,
        Err(e) => {
            tracing::warn!("ignoring the remembered members: {e}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_remembered_with_their_ids_and_read_back_as_seeds() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let members = vec![
            (
                a,
                vec![
                    "/ip4/10.0.0.1/tcp/7000".parse().unwrap(),
                    format!("/ip4/127.0.0.1/tcp/7000/p2p/{a}").parse().unwrap(),
                ],
            ),
            (
                b,
                vec![
                    "/dns4/b.internal/tcp/7000".parse().unwrap(),
                    "/ip4/10.0.0.2/udp/7000/quic-v1".parse().unwrap(),
                ],
            ),
        ];
        let addrs = remembered(&members);
        assert_eq!(addrs.len(), 3, "the QUIC address is no seed: {addrs:?}");
        let dir = tempfile::tempdir().unwrap();
        let file = crate::data_dir::DataDir::new(dir.path()).known_peers();
        store(&file, &addrs).unwrap();
        let seeds = load(&file);
        assert_eq!(seeds.len(), 3);
        assert_eq!(seeds[0].peer, Some(a));
        assert_eq!(seeds[1].peer, Some(a));
        assert_eq!(seeds[2].peer, Some(b));
    }

    #[test]
    fn a_missing_or_broken_file_gives_no_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let file = crate::data_dir::DataDir::new(dir.path()).known_peers();
        assert!(load(&file).is_empty());
        std::fs::write(&file, "not an address\n").unwrap();
        assert!(load(&file).is_empty());
    }
}
