//! Where a node looks for its cluster while no member is connected: the seeds it was given,
//! a bootstrap file read again while it is alone, each seed's dial schedule, and the peer
//! found at each seed that named none.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

use super::seeds::{self, Seed};
use crate::retry::Retry;

/// First delay before an unreachable peer (a seed, a member) is dialled again.
pub const REDIAL_MIN: Duration = Duration::from_millis(500);
/// Longest delay between dials of one unreachable peer.
pub const REDIAL_MAX: Duration = Duration::from_secs(2);
/// How often a bootstrap file is read again while the node is alone.
const SEED_FILE_REREAD: Duration = Duration::from_secs(2);

/// Where the node looks for its cluster, and what it learned dialling there.
pub struct SeedSource {
    /// Seeds from the command line and the members remembered from the last run.
    pub seeds: Vec<Seed>,
    /// A bootstrap file, read again every [`SEED_FILE_REREAD`] while the node is alone.
    pub file: Option<PathBuf>,
}

/// The seeds, their dial schedules, and the peers found at them.
pub struct SeedDialer {
    fixed: Vec<Seed>,
    file: Option<PathBuf>,
    from_file: Vec<Seed>,
    file_read: Option<Instant>,
    file_error: Option<String>,
    retry: HashMap<Seed, Retry>,
    /// The addresses each name seed resolved to last.
    resolved: HashMap<Seed, Vec<IpAddr>>,
    /// The peer that answered at each seed without a peer id.
    found: HashMap<Seed, PeerId>,
}

impl SeedDialer {
    /// The seeds to dial at `now`: those whose peer is not `connected` and whose backoff ran
    /// out (each of them is then attempted); the bootstrap file is read again first when due.
    pub fn due(&mut self, now: Instant, connected: &HashSet<PeerId>) -> Vec<Seed> {
        self.refresh_file(now);
        let candidates: HashSet<Seed> = self
            .all()
            .filter(|s| self.peer(s).is_none_or(|p| !connected.contains(&p)))
            .cloned()
            .collect();
        candidates
            .into_iter()
            .filter(|s| {
                let retry = self
                    .retry
                    .entry(s.clone())
                    .or_insert_with(|| Retry::new(REDIAL_MIN, REDIAL_MAX));
                let due = retry.due(now);
                if due {
                    retry.attempted(now);
                }
                due
            })
            .collect()
    }

    /// Records the addresses the name of `seed` resolved to.
    pub fn resolved(&mut self, seed: Seed, ips: Vec<IpAddr>) {
        self.resolved.insert(seed, ips);
    }

    /// Dials nothing yet.
    pub fn new(source: SeedSource) -> Self {
        Self {
            fixed: source.seeds,
            file: source.file,
            from_file: Vec::new(),
            file_read: None,
            file_error: None,
            retry: HashMap::new(),
            resolved: HashMap::new(),
            found: HashMap::new(),
        }
    }

    /// Reads the bootstrap file again when it is due; a file that became unreadable or invalid
    /// keeps the seeds it gave last (and is logged once per new error).
    fn refresh_file(&mut self, now: Instant) {
        let Some(path) = &self.file else { return };
        if self
            .file_read
            .is_some_and(|t| now.duration_since(t) < SEED_FILE_REREAD)
        {
            return;
        }
        self.file_read = Some(now);
        match seeds::read_file(path) {
            Ok(seeds) => {
                self.file_error = None;
                self.from_file = seeds;
            }
            Err(e) => {
                let e = e.to_string();
                if self.file_error.as_ref() != Some(&e) {
                    tracing::warn!("{e}; keeping the seeds it gave before");
                }
                self.file_error = Some(e);
            }
        }
    }

    /// The seeds given and those of the bootstrap file.
    fn all(&self) -> impl Iterator<Item = &Seed> {
        self.fixed.iter().chain(&self.from_file)
    }

    /// The peer at `seed`, when known (named by the address or found by dialling it).
    pub fn peer(&self, seed: &Seed) -> Option<PeerId> {
        seed.peer.or_else(|| self.found.get(seed).copied())
    }

    /// Records the peer that answered a dial of `addr`, for the seed that address belongs to.
    pub fn learn(&mut self, addr: &Multiaddr, peer: PeerId) {
        let Some((ip, port)) = ip_port(addr) else {
            return;
        };
        let matching: Vec<Seed> = self
            .all()
            .filter(|s| s.port == port && s.peer.is_none())
            .filter(|s| {
                s.ip() == Some(ip) || self.resolved.get(*s).is_some_and(|r| r.contains(&ip))
            })
            .cloned()
            .collect();
        for seed in matching {
            self.found.insert(seed, peer);
        }
    }
}

/// The IP and TCP port of a dialled address.
pub fn ip_port(addr: &Multiaddr) -> Option<(IpAddr, u16)> {
    let mut ip = None;
    for p in addr.iter() {
        match p {
            Protocol::Ip4(a) => ip = Some(IpAddr::V4(a)),
            Protocol::Ip6(a) => ip = Some(IpAddr::V6(a)),
            Protocol::Tcp(port) => return ip.map(|ip| (ip, port)),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialled_address_teaches_the_peer_of_the_seed_it_belongs_to() {
        let ip4 = Seed::parse(&"/ip4/10.0.0.1/tcp/7000".parse().unwrap()).unwrap();
        let name = Seed::parse(&"/dns4/seed.internal/tcp/7000".parse().unwrap()).unwrap();
        let mut dialer = SeedDialer::new(SeedSource {
            seeds: vec![ip4.clone(), name.clone()],
            file: None,
        });
        dialer
            .resolved
            .insert(name.clone(), vec!["10.0.0.2".parse().unwrap()]);
        let (a, b) = (PeerId::random(), PeerId::random());
        dialer.learn(&"/ip4/10.0.0.1/tcp/7000".parse().unwrap(), a);
        dialer.learn(
            &format!("/ip4/10.0.0.2/tcp/7000/p2p/{b}").parse().unwrap(),
            b,
        );
        dialer.learn(&"/ip4/10.0.0.3/tcp/7000".parse().unwrap(), PeerId::random());
        dialer.learn(&"/ip4/10.0.0.1/tcp/7001".parse().unwrap(), PeerId::random());
        assert_eq!(dialer.peer(&ip4), Some(a));
        assert_eq!(dialer.peer(&name), Some(b));
    }

    #[test]
    fn a_bootstrap_file_that_breaks_keeps_its_last_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seeds");
        std::fs::write(&path, "/ip4/10.0.0.1/tcp/7000\n").unwrap();
        let mut dialer = SeedDialer::new(SeedSource {
            seeds: Vec::new(),
            file: Some(path.clone()),
        });
        let start = Instant::now();
        dialer.refresh_file(start);
        assert_eq!(dialer.all().count(), 1);
        std::fs::write(&path, "/ip4/10.0.0.1/tcp/7000\n/ip4/10.0.0.2/tcp/7000\n").unwrap();
        dialer.refresh_file(start + Duration::from_millis(10));
        assert_eq!(
            dialer.all().count(),
            1,
            "read again only after the interval"
        );
        dialer.refresh_file(start + SEED_FILE_REREAD);
        assert_eq!(dialer.all().count(), 2);
        std::fs::write(&path, "garbage\n").unwrap();
        dialer.refresh_file(start + SEED_FILE_REREAD * 2);
        assert_eq!(dialer.all().count(), 2);
        assert!(dialer.file_error.as_deref().unwrap().contains("line 1"));
    }
}
