//! A cluster of real `parcae-node` processes on 127.0.0.1, the one harness behind the
//! testnet's runs, the multi-process tests and the benchmarks.
//!
//! It makes the cluster key with the binary's own `keygen`, gives node `k` the data directory
//! `<dir>/node<k>`, the config `<dir>/node<k>.toml` and the log `<dir>/node<k>.log`, and starts
//! nodes as a cluster forms: the first node founds it, every later one bootstraps through the
//! p2p address that a live node reports on `/status`. What a node's life means to a run
//! (notices, deadlines, crashes against expected exits) is the caller's.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use parcae_api::client::Client;
use parcae_api::{RoleView, StatusSnapshot};

use crate::clock_skew::ClockSkew;
use crate::error::TestnetError;
use crate::interrupt::Interrupt;
use crate::launch::NodeLaunch;
use crate::netns::{self, Network};
use crate::node_process::{NodeProcess, wait_for};
use crate::supervise::log_tail;

/// How long a new node may take to serve its p2p address on `/status`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines quoted in errors.
const TAIL_LINES: usize = 20;

/// Where nodes listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// Status and p2p ports below the OS's ephemeral range, free when picked.
    Ephemeral,
    /// Node `k`: status on `base + 2k`, p2p on `base + 2k + 1`.
    Base(u16),
    /// Every node in a network namespace of its own ([`crate::netns`]): the same ports on an
    /// address of its own. Needs root.
    Namespaces,
}

/// Everything the cluster starts its nodes with.
pub struct ClusterSetup {
    /// The `parcae-node` executable.
    pub program: PathBuf,
    /// The directory for key, configs, data and logs; `None`: a temporary directory removed
    /// when the cluster is dropped.
    pub dir: Option<PathBuf>,
    /// The configuration (TOML) of a node started without one of its own.
    pub config: String,
    /// Port plan.
    pub ports: Ports,
    /// Environment added to every node's.
    pub env: Vec<(&'static str, String)>,
    /// Skewed wall clocks on some nodes (the clock nemesis).
    pub clock_skew: Option<ClockSkew>,
    /// The client that reads the nodes' API.
    pub client: Client,
    /// Stops every wait of the harness.
    pub interrupt: Interrupt,
}

/// The running cluster. Dropping it kills every node (then removes a temporary directory).
pub struct LocalCluster {
    /// Every node started, in start order (index = `k` of `node<k>`).
    pub nodes: Vec<NodeProcess>,
    /// The nodes' namespaces with [`Ports::Namespaces`] (dropped after the nodes are killed).
    network: Option<Network>,
    setup: ClusterSetup,
    dir: PathBuf,
    key: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl LocalCluster {
    /// Creates the directory and the cluster key; starts nothing.
    pub fn create(setup: ClusterSetup) -> Result<Self, TestnetError> {
        let io = |what: &str, source| TestnetError::Io {
            what: what.to_string(),
            source,
        };
        let (dir, temp) = match &setup.dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp =
                    tempfile::tempdir().map_err(|e| io("creating the cluster directory", e))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating the cluster directory", e))?;
        let key = dir.join("cluster.key");
        let out = Command::new(&setup.program)
            .arg("keygen")
            .arg("--out")
            .arg(&key)
            .output()
            .map_err(|e| TestnetError::NodeBinary {
                path: setup.program.clone(),
                reason: format!("cannot run it: {e}"),
            })?;
        if !out.status.success() || !key.is_file() {
            return Err(TestnetError::NodeBinary {
                path: setup.program.clone(),
                reason: format!(
                    "`parcae-node keygen` failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let network = match setup.ports {
            Ports::Namespaces => Some(Network::create()?),
            Ports::Ephemeral | Ports::Base(_) => None,
        };
        Ok(Self {
            nodes: Vec::new(),
            network,
            setup,
            dir,
            key,
            _temp: temp,
        })
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node `k`'s data directory in cluster directory `dir`.
    pub fn data_dir_in(dir: &Path, k: usize) -> PathBuf {
        dir.join(format!("node{k}"))
    }

    /// The cluster key file every node is started with unless told otherwise.
    pub fn key(&self) -> &Path {
        &self.key
    }

    /// The client that reads the nodes' API.
    pub fn client(&self) -> &Client {
        &self.setup.client
    }

    /// Starts node `nodes.len()` with the cluster's configuration, bootstrapping through
    /// `bootstrap` (p2p addresses; none: it founds a cluster), with `key` instead of the
    /// cluster key when given.
    pub fn spawn(
        &mut self,
        bootstrap: &[String],
        key: Option<&Path>,
    ) -> Result<usize, TestnetError> {
        let config = self.setup.config.clone();
        self.spawn_node(bootstrap, &[], key, &config)
    }

    /// Like [`LocalCluster::spawn`] with a configuration of the node's own.
    pub fn spawn_with_config(
        &mut self,
        bootstrap: &[String],
        config: &str,
    ) -> Result<usize, TestnetError> {
        self.spawn_node(bootstrap, &[], None, config)
    }

    /// Starts node `nodes.len()` with the cluster's configuration and `args` added to its
    /// command line as given (e.g. `--bootstrap ADDR` without a peer id, `--bootstrap-file`).
    pub fn spawn_with_args(&mut self, args: &[String]) -> Result<usize, TestnetError> {
        let config = self.setup.config.clone();
        self.spawn_node(&[], args, None, &config)
    }

    fn spawn_node(
        &mut self,
        bootstrap: &[String],
        extra: &[String],
        key: Option<&Path>,
        config: &str,
    ) -> Result<usize, TestnetError> {
        let k = self.nodes.len();
        let name = format!("node{k}");
        let (status_addr, listen) = self.ports_for(k)?;
        let config_path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&config_path, config).map_err(|source| TestnetError::Io {
            what: format!("{name}: writing its config"),
            source,
        })?;
        let netns = self
            .network
            .as_ref()
            .and_then(|n| n.namespace(k))
            .map(str::to_string);
        let launch = NodeLaunch {
            data_dir: &Self::data_dir_in(&self.dir, k),
            listen: &listen,
            status_addr,
            cluster_key: key.unwrap_or(&self.key),
            config: &config_path,
            bootstrap,
            extra,
        };
        let node = NodeProcess::spawn(
            name.clone(),
            &self.setup.program,
            &launch,
            netns,
            self.setup
                .env
                .iter()
                .cloned()
                .chain(self.setup.clock_skew.and_then(|s| s.env_of(k)))
                .collect(),
            self.setup.client.clone(),
        )
        .map_err(|e| TestnetError::NodeBinary {
            path: self.setup.program.clone(),
            reason: format!("cannot start {name}: {e}"),
        })?;
        self.nodes.push(node);
        Ok(k)
    }

    fn ports_for(&mut self, k: usize) -> Result<(SocketAddr, String), TestnetError> {
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        match self.setup.ports {
            Ports::Namespaces => {
                let network = self.network.as_mut().ok_or(TestnetError::Netns {
                    step: format!("node{k}"),
                    reason: "the cluster was made without its network".into(),
                })?;
                let ip = network.node(k)?;
                Ok((
                    SocketAddr::from((ip, netns::STATUS_PORT)),
                    format!("/ip4/{ip}/tcp/{}", netns::P2P_PORT),
                ))
            }
            Ports::Ephemeral => {
                let reserve = |what: &str| {
                    crate::ports::reserve_loopback_port().map_err(|source| TestnetError::Io {
                        what: format!("reserving a {what} port for node{k}"),
                        source,
                    })
                };
                let status = reserve("status")?;
                let p2p = reserve("p2p")?;
                Ok((loopback(status), format!("/ip4/127.0.0.1/tcp/{p2p}")))
            }
            Ports::Base(base) => {
                let offset = u16::try_from(2 * k).ok();
                let status = offset.and_then(|o| base.checked_add(o));
                let p2p = status.and_then(|s| s.checked_add(1));
                let (Some(status), Some(p2p)) = (status, p2p) else {
                    return Err(TestnetError::PortRange { base, node: k });
                };
                for (port, what) in [(status, "status"), (p2p, "p2p")] {
                    if TcpListener::bind(loopback(port)).is_err() {
                        return Err(TestnetError::PortInUse {
                            port,
                            what: format!("{what} of node{k}"),
                        });
                    }
                }
                Ok((loopback(status), format!("/ip4/127.0.0.1/tcp/{p2p}")))
            }
        }
    }

    /// Cuts (`cut`) or heals the network between nodes `a` and `b` ([`Ports::Namespaces`]).
    pub fn set_link(&self, a: usize, b: usize, cut: bool) -> Result<(), TestnetError> {
        let network = self.network.as_ref().ok_or(TestnetError::Netns {
            step: format!("cutting node{a} from node{b}"),
            reason: "the nodes share the host's network (start the run with --netns)".into(),
        })?;
        network.set_link(a, b, cut)
    }

    /// Slows node `k`'s link to `rate_kbit` both ways, or (`None`) restores it (a run with
    /// `--netns`; see [`crate::netns::Network::set_slow`]).
    pub fn set_slow_link(&self, k: usize, rate_kbit: Option<u32>) -> Result<(), TestnetError> {
        let network = self.network.as_ref().ok_or(TestnetError::Netns {
            step: format!("slowing node{k}'s link"),
            reason: "the nodes share the host's network (start the run with --netns)".into(),
        })?;
        network.set_slow(k, rate_kbit)
    }

    /// Starts `count` nodes with the cluster's configuration (see
    /// [`LocalCluster::start_nodes_with`]).
    pub fn start_nodes(&mut self, count: usize) -> Result<Vec<usize>, TestnetError> {
        let config = self.setup.config.clone();
        self.start_nodes_with(count, &|_| true, &mut |_| Ok(config.clone()))
    }

    /// Starts `count` nodes, node `k` with the configuration `config_for(k)`: the very first
    /// node of the cluster founds it and is waited for; the others bootstrap through the
    /// oldest node that `may_bootstrap` allows and that served its p2p address. Returns when
    /// every new node serves its p2p address on `/status`.
    pub fn start_nodes_with(
        &mut self,
        count: usize,
        may_bootstrap: &dyn Fn(usize) -> bool,
        config_for: &mut dyn FnMut(usize) -> Result<String, TestnetError>,
    ) -> Result<Vec<usize>, TestnetError> {
        let mut started = Vec::with_capacity(count);
        // The first node, or the first after every earlier one is gone (a whole-cluster
        // outage), founds a new cluster.
        let founding =
            !(0..self.nodes.len()).any(|i| may_bootstrap(i) && self.nodes[i].p2p.is_some());
        if founding && count > 0 {
            let config = config_for(0)?;
            let founder = self.spawn_node(&[], &[], None, &config)?;
            self.wait_serving(&[founder])?;
            started.push(founder);
        }
        if started.len() == count {
            return Ok(started);
        }
        let bootstrap = (0..self.nodes.len())
            .filter(|&i| may_bootstrap(i))
            .find_map(|i| self.nodes[i].p2p.clone())
            .ok_or(TestnetError::NoLiveNode)?;
        let mut batch = Vec::with_capacity(count - started.len());
        for _ in started.len()..count {
            let config = config_for(self.nodes.len())?;
            batch.push(self.spawn_node(std::slice::from_ref(&bootstrap), &[], None, &config)?);
        }
        self.wait_serving(&batch)?;
        started.extend(batch);
        Ok(started)
    }

    /// Waits until every node of `idx` serves `/status` with its p2p address (recorded in
    /// [`NodeProcess::p2p`]); a node that exits meanwhile is a crash at start.
    pub fn wait_serving(&mut self, idx: &[usize]) -> Result<(), TestnetError> {
        let limit = crate::time_factor::scaled(START_TIMEOUT);
        let end = Instant::now() + limit;
        let mut pending: Vec<usize> = idx.to_vec();
        while !pending.is_empty() {
            self.setup.interrupt.check()?;
            let mut still = Vec::with_capacity(pending.len());
            for i in pending {
                if let Some(status) = self.nodes[i].try_exit() {
                    return Err(self.crashed(i, &status.to_string()));
                }
                match self.nodes[i].p2p_addr() {
                    Some(addr) => self.nodes[i].p2p = Some(addr),
                    None => still.push(i),
                }
            }
            pending = still;
            if let Some(&i) = pending.first()
                && Instant::now() >= end
            {
                let n = &self.nodes[i];
                return Err(TestnetError::NodeSilent {
                    node: n.name.clone(),
                    addr: n.status_addr.to_string(),
                    secs: limit.as_secs(),
                    log: n.log.clone(),
                    tail: log_tail(&n.log, TAIL_LINES),
                });
            }
            if !pending.is_empty() {
                self.setup
                    .interrupt
                    .sleep_until(Instant::now() + Duration::from_millis(100))?;
            }
        }
        Ok(())
    }

    /// The error for node `i` having exited with `exit` while it should be starting.
    pub fn crashed(&self, i: usize, exit: &str) -> TestnetError {
        let n = &self.nodes[i];
        TestnetError::NodeCrashed {
            node: n.name.clone(),
            exit: exit.to_string(),
            log: n.log.clone(),
            tail: log_tail(&n.log, TAIL_LINES),
        }
    }

    /// Statuses of the nodes that answer (index, status).
    pub fn statuses(&self) -> Vec<(usize, StatusSnapshot)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i, n.status()?)))
            .collect()
    }

    /// Waits until the nodes at `indices` agree on one leader and on a membership of exactly
    /// `members` healthy entries; returns the leader's peer id.
    pub fn wait_converged(
        &self,
        indices: &[usize],
        members: usize,
        timeout: Duration,
    ) -> Option<String> {
        wait_for(timeout, || {
            let statuses = indices
                .iter()
                .map(|&i| self.nodes[i].status())
                .collect::<Option<Vec<_>>>()?;
            converged(&statuses, members)
        })
    }

    /// Index of the node whose peer id is `peer`.
    pub fn index_of(&self, peer: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.peer_id().as_deref() == Some(peer))
    }

    /// The ends of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, n.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Kills every node.
    pub fn kill_all(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }
}

/// The leader's peer id when `statuses` name one leader, exactly one of them is that leader,
/// and all see the same `members` healthy members.
fn converged(statuses: &[StatusSnapshot], members: usize) -> Option<String> {
    let leader = statuses.first()?.leader.clone()?;
    fn healthy(s: &StatusSnapshot) -> Vec<&str> {
        let mut ids: Vec<&str> = s
            .members
            .iter()
            .filter(|m| m.status.is_healthy())
            .map(|m| m.peer_id.as_str())
            .collect();
        ids.sort_unstable();
        ids
    }
    let view = healthy(&statuses[0]);
    let agree = statuses
        .iter()
        .all(|s| s.leader.as_ref() == Some(&leader) && healthy(s) == view);
    let leaders = statuses
        .iter()
        .filter(|s| s.role == RoleView::Leader)
        .count();
    (agree && view.len() == members && leaders == 1).then_some(leader)
}
