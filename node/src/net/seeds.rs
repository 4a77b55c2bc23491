//! Seeds: the addresses a node dials to find its cluster while it is connected to no member.
//!
//! A VM booted from a template cannot know the peer id of another VM's freshly made identity,
//! so a seed is an address with or without `/p2p/<id>`: `/ip4/A/tcp/P`, `/ip6/A/tcp/P`,
//! `/dns4/NAME/tcp/P`, `/dns6/NAME/tcp/P` or `/dns/NAME/tcp/P` (every address the name resolves
//! to). Admission stays the cluster key's job (see [`super::admission`]): whoever answers at a
//! seed address and holds the key is a peer, whatever its id. Seeds come from `--bootstrap`, a
//! `--bootstrap-file` (re-read while the node is alone) and the members this node remembers from
//! its last run ([`crate::control::known_peers`]).

use std::net::IpAddr;

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

/// Most seeds taken from one source (a file, the command line, the remembered members).
pub const MAX_SEEDS: usize = 1024;
/// Largest bootstrap file read, in bytes.
pub const MAX_SEED_FILE: u64 = 256 * 1024;
/// Most addresses one name resolves to that are dialled.
pub const MAX_RESOLVED: usize = 16;

/// A host to dial: an IP address, or a DNS name and which address families it may resolve to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SeedHost {
    /// A literal IPv4 or IPv6 address.
    Ip(IpAddr),
    /// A name resolved at every dial attempt (a VM replaced behind a name keeps the name).
    Name {
        /// The DNS name.
        name: String,
        /// Which families of the resolved addresses are dialled.
        family: Family,
    },
}

/// The address families a `/dns*` component admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `/dns4`.
    V4,
    /// `/dns6`.
    V6,
    /// `/dns`: both.
    Any,
}

impl Family {
    /// Whether `ip` is of this family.
    pub fn admits(self, ip: &IpAddr) -> bool {
        match self {
            Self::V4 => ip.is_ipv4(),
            Self::V6 => ip.is_ipv6(),
            Self::Any => true,
        }
    }
}

/// One seed: where to dial, and the peer id when the address named one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Seed {
    /// The host.
    pub host: SeedHost,
    /// The TCP port.
    pub port: u16,
    /// The peer expected there, when known (`/p2p/<id>`).
    pub peer: Option<PeerId>,
}

/// Why a seed address was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SeedError {
    /// The address is not `/ip4|/ip6|/dns|/dns4|/dns6` then `/tcp/PORT`, then optionally
    /// `/p2p/ID`.
    #[error(
        "bootstrap address {0}: expected /ip4/A/tcp/P, /ip6/A/tcp/P, /dns4/NAME/tcp/P, /dns6/NAME/tcp/P or /dns/NAME/tcp/P, optionally ending in /p2p/<peer id>"
    )]
    Shape(String),
    /// Port 0 cannot be dialled.
    #[error("bootstrap address {0}: port 0 cannot be dialled")]
    PortZero(String),
    /// A line of a bootstrap file is not a multiaddr.
    #[error("{file} line {line}: {reason}")]
    Line {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// More seeds than [`MAX_SEEDS`].
    #[error("{0}: more than {MAX_SEEDS} bootstrap addresses")]
    TooMany(String),
    /// The bootstrap file could not be read.
    #[error("bootstrap file {file}: {reason}")]
    File {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
}

impl Seed {
    /// Parses a `--bootstrap` address (see the module doc for the accepted shapes).
    pub fn parse(addr: &Multiaddr) -> Result<Self, SeedError> {
        let shape = || SeedError::Shape(addr.to_string());
        let mut parts = addr.iter();
        let host = match parts.next() {
            Some(Protocol::Ip4(ip)) => SeedHost::Ip(ip.into()),
            Some(Protocol::Ip6(ip)) => SeedHost::Ip(ip.into()),
            Some(Protocol::Dns(name)) => name_host(name.as_ref(), Family::Any).ok_or_else(shape)?,
            Some(Protocol::Dns4(name)) => name_host(name.as_ref(), Family::V4).ok_or_else(shape)?,
            Some(Protocol::Dns6(name)) => name_host(name.as_ref(), Family::V6).ok_or_else(shape)?,
            _ => return Err(shape()),
        };
        let Some(Protocol::Tcp(port)) = parts.next() else {
            return Err(shape());
        };
        if port == 0 {
            return Err(SeedError::PortZero(addr.to_string()));
        }
        let peer = match parts.next() {
            None => None,
            Some(Protocol::P2p(peer)) => Some(peer),
            Some(_) => return Err(shape()),
        };
        if parts.next().is_some() {
            return Err(shape());
        }
        Ok(Self { host, port, peer })
    }

    /// The address to dial for one IP of this seed, with `/p2p/<id>` when the peer is known.
    pub fn dial_addr(&self, ip: IpAddr) -> Multiaddr {
        let mut addr = Multiaddr::from(ip).with(Protocol::Tcp(self.port));
        if let Some(peer) = self.peer {
            addr.push(Protocol::P2p(peer));
        }
        addr
    }

    /// The literal IP, when the host is not a name.
    pub fn ip(&self) -> Option<IpAddr> {
        match self.host {
            SeedHost::Ip(ip) => Some(ip),
            SeedHost::Name { .. } => None,
        }
    }
}

fn name_host(name: &str, family: Family) -> Option<SeedHost> {
    (!name.is_empty()).then(|| SeedHost::Name {
        name: name.to_owned(),
        family,
    })
}

/// Parses many addresses (the command line, the remembered members), at most [`MAX_SEEDS`];
/// empty ones (`PARCAE_BOOTSTRAP=` on a founding VM, a trailing comma) are skipped.
pub fn parse_all<'a>(
    what: &str,
    addrs: impl IntoIterator<Item = &'a Multiaddr>,
) -> Result<Vec<Seed>, SeedError> {
    let mut seeds = Vec::new();
    for addr in addrs.into_iter().filter(|a| !a.is_empty()) {
        if seeds.len() == MAX_SEEDS {
            return Err(SeedError::TooMany(what.to_owned()));
        }
        seeds.push(Seed::parse(addr)?);
    }
    Ok(seeds)
}

/// Parses a bootstrap file: one address per line; blank lines and lines starting with `#` are
/// skipped; every other line must be a seed address.
pub fn parse_file(file: &str, text: &str) -> Result<Vec<Seed>, SeedError> {
    let mut seeds = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if seeds.len() == MAX_SEEDS {
            return Err(SeedError::TooMany(file.to_owned()));
        }
        let bad = |reason: String| SeedError::Line {
            file: file.to_owned(),
            line: i + 1,
            reason,
        };
        let addr: Multiaddr = line.parse().map_err(|e| bad(format!("{line:?}: {e}")))?;
        seeds.push(Seed::parse(&addr).map_err(|e| bad(e.to_string()))?);
    }
    Ok(seeds)
}

/// Reads and parses a bootstrap file, refusing one larger than [`MAX_SEED_FILE`].
pub fn read_file(path: &std::path::Path) -> Result<Vec<Seed>, SeedError> {
    use std::io::Read;
    let name = path.display().to_string();
    let fail = |reason: String| SeedError::File {
        file: name.clone(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_SEED_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > MAX_SEED_FILE {
        return Err(fail(format!("larger than {MAX_SEED_FILE} bytes")));
    }
    parse_file(&name, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(s: &str) -> Result<Seed, SeedError> {
        Seed::parse(&s.parse().unwrap())
    }

    #[test]
    fn every_documented_shape_is_a_seed_with_or_without_a_peer_id() {
        let peer = PeerId::random();
        let ip4 = seed("/ip4/10.0.0.7/tcp/7000").unwrap();
        assert_eq!(ip4.host, SeedHost::Ip("10.0.0.7".parse().unwrap()));
        assert_eq!((ip4.port, ip4.peer), (7000, None));
        let ip6 = seed(&format!("/ip6/::1/tcp/7000/p2p/{peer}")).unwrap();
        assert_eq!(ip6.peer, Some(peer));
        assert_eq!(
            ip6.dial_addr(ip6.ip().unwrap()).to_string(),
            format!("/ip6/::1/tcp/7000/p2p/{peer}")
        );
        for (addr, family) in [
            ("/dns4/seed.example/tcp/1", Family::V4),
            ("/dns6/seed.example/tcp/1", Family::V6),
            ("/dns/seed.example/tcp/1", Family::Any),
        ] {
            assert_eq!(
                seed(addr).unwrap().host,
                SeedHost::Name {
                    name: "seed.example".into(),
                    family
                }
            );
        }
    }

    #[test]
    fn other_shapes_are_refused_with_the_address_named() {
        for bad in [
            "/ip4/1.2.3.4/udp/7000",
            "/ip4/1.2.3.4",
            "/tcp/7000",
            "/ip4/1.2.3.4/tcp/7000/ws",
        ] {
            let e = seed(bad).unwrap_err();
            assert!(matches!(e, SeedError::Shape(_)), "{bad}: {e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert_eq!(
            seed("/ip4/1.2.3.4/tcp/0"),
            Err(SeedError::PortZero("/ip4/1.2.3.4/tcp/0".into()))
        );
    }

    #[test]
    fn empty_entries_are_skipped() {
        let addrs: Vec<Multiaddr> = vec![
            Multiaddr::empty(),
            "/ip4/10.0.0.1/tcp/7000".parse().unwrap(),
        ];
        assert_eq!(parse_all("--bootstrap", &addrs).unwrap().len(), 1);
    }

    #[test]
    fn families_admit_their_addresses() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert!(Family::V4.admits(&v4) && !Family::V4.admits(&v6));
        assert!(Family::V6.admits(&v6) && !Family::V6.admits(&v4));
        assert!(Family::Any.admits(&v4) && Family::Any.admits(&v6));
    }

    #[test]
    fn a_file_skips_comments_and_names_the_bad_line() {
        let text = "# seeds\n\n/ip4/10.0.0.1/tcp/7000\n  /dns4/b.internal/tcp/7000  \n";
        let seeds = parse_file("seeds.txt", text).unwrap();
        assert_eq!(seeds.len(), 2);
        assert_eq!(seeds[1].port, 7000);
        let e = parse_file("seeds.txt", "/ip4/10.0.0.1/tcp/7000\nnot an address\n").unwrap_err();
        assert!(
            matches!(e, SeedError::Line { line: 2, .. }),
            "{e}: the second line is the bad one"
        );
        let e = parse_file("seeds.txt", "/ip4/10.0.0.1/udp/7000\n").unwrap_err();
        assert!(e.to_string().contains("seeds.txt line 1"), "{e}");
    }

    #[test]
    fn counts_and_sizes_are_bounded() {
        let many = "/ip4/10.0.0.1/tcp/7000\n".repeat(MAX_SEEDS + 1);
        assert!(matches!(parse_file("f", &many), Err(SeedError::TooMany(_))));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seeds");
        std::fs::write(&path, "#".repeat(MAX_SEED_FILE as usize + 1)).unwrap();
        assert!(matches!(read_file(&path), Err(SeedError::File { .. })));
        let missing = read_file(&dir.path().join("missing")).unwrap_err();
        assert!(missing.to_string().contains("missing"), "{missing}");
    }
}
