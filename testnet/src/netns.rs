//! A network the testnet can cut: every node in a network namespace of its own, joined to the
//! others by a veth pair to one bridge in the host's namespace, which also carries the
//! harness's own requests to the nodes' status API.
//!
//! Nodes address each other by their namespace addresses (`10.X.0.k+1`, the same ports in
//! every namespace), so a fault here is a fault of the network, not of a process. A link from
//! `a` to `b` is cut by giving `a` a permanent neighbour entry for `b`'s address with a MAC
//! that no interface has: `a`'s frames to `b` leave and vanish on the bridge, as packets do in a
//! real partition (no error, no reset: TCP retransmits until it times out). Cutting both
//! directions of every pair across two sides splits the cluster; healing deletes the entries.
//! (The kernels this runs on may lack `tc netem` and the classifiers, so nothing here depends on
//! them.)
//!
//! Everything is made with `ip` (iproute2) as root and removed when the value is dropped;
//! what a harness that was SIGKILLed left behind is removed by the next one.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::error::TestnetError;

/// The status API's port in every namespace.
pub const STATUS_PORT: u16 = 7000;
/// The libp2p port in every namespace.
pub const P2P_PORT: u16 = 7001;
/// Namespaces a harness can make (the last octets of a /16, the bridge's address apart).
const MAX_NODES: usize = 250 * 250;
/// A MAC no interface has (locally administered): frames sent to it are lost on the bridge.
const NOWHERE_MAC: &str = "02:00:00:00:00:00";

/// The bridge and the namespaces of one harness.
#[derive(Debug)]
pub struct Network {
    /// `pt<pid>`: the prefix of every name.
    tag: String,
    /// Second octet of the harness's `10.X.0.0/16`.
    octet: u8,
    /// Namespaces made so far; node `k`'s is `namespaces[k]`.
    namespaces: Vec<String>,
}

impl Network {
    /// Makes the bridge (after removing what dead harnesses left behind). Needs root.
    pub fn create() -> Result<Self, TestnetError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(TestnetError::Netns {
                step: "checking privileges".into(),
                reason: "--netns creates network namespaces, veth pairs and a bridge, which \
                         needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): run as root, or drop \
                         --netns"
                    .into(),
            });
        }
        remove_orphans();
        let pid = std::process::id();
        let network = Self {
            tag: format!("pt{pid}"),
            octet: subnet_octet(pid),
            namespaces: Vec::new(),
        };
        let bridge = network.bridge();
        let gateway = format!("{}/16", network.gateway());
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &gateway, "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        Ok(network)
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    /// The bridge's address: the host's side of the network.
    fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, 255, 254)
    }

    /// Node `k`'s address.
    pub fn address(&self, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, (k / 250) as u8, (k % 250 + 1) as u8)
    }

    /// Node `k`'s namespace (`None` before [`Network::node`] made it).
    pub fn namespace(&self, k: usize) -> Option<&str> {
        self.namespaces.get(k).map(String::as_str)
    }

    /// Node `k`'s address, once its namespace (and those of the nodes before it) is made,
    /// with the address on a veth pair to the bridge.
    pub fn node(&mut self, k: usize) -> Result<Ipv4Addr, TestnetError> {
        if k >= MAX_NODES {
            return Err(TestnetError::Netns {
                step: format!("node{k}"),
                reason: format!("at most {MAX_NODES} namespaces per run"),
            });
        }
        while self.namespaces.len() <= k {
            self.add_namespace()?;
        }
        Ok(self.address(k))
    }

    fn add_namespace(&mut self) -> Result<(), TestnetError> {
        let k = self.namespaces.len();
        let ns = format!("{}-n{k}", self.tag);
        let host_end = format!("{}v{k}", self.tag);
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        let address = format!("{}/16", self.address(k));
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["link", "set", &host_end, "master", &self.bridge(), "up"])?;
        ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])
    }

    /// Cuts (`cut`) or heals the link between nodes `a` and `b`, both directions.
    pub fn set_link(&self, a: usize, b: usize, cut: bool) -> Result<(), TestnetError> {
        for (from, to) in [(a, b), (b, a)] {
            let (Some(ns), target) = (self.namespace(from), self.address(to).to_string()) else {
                continue;
            };
            if cut {
                ip(&[
                    "-n",
                    ns,
                    "neigh",
                    "replace",
                    &target,
                    "lladdr",
                    NOWHERE_MAC,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ])?;
            } else {
                // Absent already (never cut, or the namespace's node restarted): healed.
                let _ = ip(&["-n", ns, "neigh", "del", &target, "dev", "eth0"]);
            }
        }
        Ok(())
    }
}

impl Network {
    /// Slows node `k`'s link to the bridge to `rate_kbit` both ways, or (`None`) restores it.
    /// The kernel's token bucket (`tc qdisc tbf`) on each end of the veth pair sends at that
    /// rate, queues [`SLOW_LINK_QUEUE`] of traffic and drops the rest, so TCP sees a slow and
    /// lossy path (this kernel has no `netem` for fixed delays or random loss).
    pub fn set_slow(&self, k: usize, rate_kbit: Option<u32>) -> Result<(), TestnetError> {
        let Some(ns) = self.namespace(k) else {
            return Ok(());
        };
        let host_end = format!("{}v{k}", self.tag);
        for (netns, dev) in [(&["-n", ns][..], "eth0"), (&[][..], host_end.as_str())] {
            let qdisc = ["qdisc", "replace", "dev", dev, "root"];
            match rate_kbit {
                Some(rate) => {
                    let rate = format!("{rate}kbit");
                    let shape = ["tbf", "rate", &rate, "burst", SLOW_LINK_BURST];
                    let queue = ["latency", SLOW_LINK_QUEUE];
                    tool("tc", &[netns, &qdisc, &shape, &queue].concat())?;
                }
                None => {
                    let _ = tool(
                        "tc",
                        &[netns, &["qdisc", "del", "dev", dev, "root"]].concat(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// Traffic a slow link queues (as time at its rate) before it drops.
const SLOW_LINK_QUEUE: &str = "50ms";
/// A slow link's bucket: a few full frames.
const SLOW_LINK_BURST: &str = "8kb";

impl Drop for Network {
    fn drop(&mut self) {
        // A namespace outlives its name while a process still holds it, and its veth pair
        // with it: the host ends are deleted by name, which deletes the pairs.
        for (k, ns) in self.namespaces.iter().enumerate() {
            let _ = ip(&["link", "del", &format!("{}v{k}", self.tag)]);
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

/// Runs `ip ARGS`; its stderr is the error.
fn ip(args: &[&str]) -> Result<(), TestnetError> {
    tool("ip", args)
}

/// Runs iproute2's `program` (`ip` or `tc`) with `args`.
fn tool(program: &str, args: &[&str]) -> Result<(), TestnetError> {
    let step = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| TestnetError::Netns {
            step: step.clone(),
            reason: format!("cannot run `{program}` (Debian: apt install iproute2): {e}"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TestnetError::Netns {
            step,
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The second octet of harness `pid`'s `10.X.0.0/16`: spread over 16..=239 so that two
/// harnesses running at once rarely share one.
fn subnet_octet(pid: u32) -> u8 {
    16 + (u64::from(pid).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 % 224
}

/// The harness process whose namespace, bridge or veth `name` is (`pt<pid>-n<k>`, `pt<pid>br`,
/// `pt<pid>v<k>`; `ip link` may show a veth as `pt<pid>v<k>@if2`).
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("pt")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let tail = &rest[digits.len()..];
    let node = |t: &str| {
        let k = t.split('@').next().unwrap_or("");
        !k.is_empty() && k.chars().all(|c| c.is_ascii_digit())
    };
    let ours = tail == "br"
        || tail.strip_prefix("-n").is_some_and(node)
        || tail.strip_prefix('v').is_some_and(node);
    ours.then(|| digits.parse().ok()).flatten()
}

/// Removes the namespaces and bridges of harnesses that are no longer running.
fn remove_orphans() {
    let dead = |name: &str| {
        owner(name).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let listed = |args: &[&str]| -> String {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    // `ip netns list` lines read `pt123-n0 (id: 4)`.
    let namespaces = listed(&["netns", "list"]);
    for ns in namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        if dead(ns) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
    // `ip -o link show` lines read `12: pt123br: <BROADCAST,...> ...` (a veth's name followed
    // by `@if2`).
    let links = listed(&["-o", "link", "show"]);
    for name in links.lines().filter_map(|l| l.split(": ").nth(1)) {
        if dead(name) {
            let _ = ip(&["link", "del", name.split('@').next().unwrap_or(name)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::*;

    /// Runs `f` on a thread that entered namespace `ns` (sockets it makes stay there).
    fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// How long `bytes` take over TCP from node `from` to node `to`.
    fn transfer(network: &Network, from: usize, to: usize, bytes: usize) -> Duration {
        let (ns_from, ns_to) = (
            network.namespace(from).unwrap(),
            network.namespace(to).unwrap(),
        );
        let listener = in_namespace(ns_to, || {
            TcpListener::bind((network.address(to), 0)).unwrap()
        });
        let addr = listener.local_addr().unwrap();
        let receiver = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got.len()
        });
        let started = Instant::now();
        in_namespace(ns_from, || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&vec![7u8; bytes]).unwrap();
        });
        assert_eq!(receiver.join().unwrap(), bytes);
        started.elapsed()
    }

    /// A slow link carries its rate both ways and is fast again once restored: 256 KiB take
    /// about 2 s at 1 Mbit/s, a few milliseconds on the bridge. Namespaces need root: as
    /// another user the test says so and returns.
    #[test]
    fn a_slow_link_is_slow_both_ways_until_restored() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: namespaces need root");
            return;
        }
        let mut network = match Network::create() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        network.node(1).unwrap();
        let bytes = 256 << 10;
        let fast = transfer(&network, 0, 1, bytes);
        network.set_slow(0, Some(1000)).unwrap();
        let (out, back) = (
            transfer(&network, 0, 1, bytes),
            transfer(&network, 1, 0, bytes),
        );
        network.set_slow(0, None).unwrap();
        let restored = transfer(&network, 0, 1, bytes);
        let at_rate = Duration::from_secs_f64(bytes as f64 * 8.0 / 1e6);
        for slow in [out, back] {
            assert!(slow > at_rate.mul_f64(0.8), "{slow:?} at 1 Mbit/s");
        }
        for quick in [fast, restored] {
            assert!(quick < at_rate / 4, "{quick:?} unshaped");
        }
    }

    #[test]
    fn names_belong_to_the_harness_that_made_them() {
        assert_eq!(owner("pt4242-n3"), Some(4242));
        assert_eq!(owner("pt4242br"), Some(4242));
        assert_eq!(owner("pt4242v3@if2"), Some(4242));
        assert_eq!(owner("pt4242v"), None);
        assert_eq!(owner("pt4242-nx"), None);
        assert_eq!(owner("ptx-n3"), None);
        assert_eq!(owner("netns1"), None);
    }

    #[test]
    fn addresses_are_distinct_and_inside_the_harness_subnet() {
        let network = Network {
            tag: "pt1".into(),
            octet: subnet_octet(1),
            namespaces: Vec::new(),
        };
        let mut seen: Vec<Ipv4Addr> = (0..600).map(|k| network.address(k)).collect();
        seen.push(network.gateway());
        let count = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), count);
        for a in seen {
            let [ten, octet, _, last] = a.octets();
            assert_eq!((ten, octet), (10, network.octet));
            assert!((1..=254).contains(&last), "{a}");
        }
        for pid in [1, 2, 40_000, 4_194_303] {
            assert!((16..=239).contains(&subnet_octet(pid)));
        }
    }
}
