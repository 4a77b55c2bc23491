//! A local cluster of `parcae-node` processes: key, configs, starting nodes that bootstrap to
//! a live one, notices, kills, and telling crashes from expected exits.
//!
//! Node `k` lives in `<run dir>/node<k>` with its config `node<k>.toml` and log `node<k>.log`.
//! The first node founds the cluster; every later one bootstraps through the p2p address that
//! a live node reports on `/status`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use parcae_api::StatusSnapshot;
use parcae_api::client::Client;
use parcae_testnet::imds::FakeImds;
use parcae_testnet::launch::NodeLaunch;
use parcae_testnet::supervise::{ChildId, Spawn, Supervisor, log_tail};

use crate::error::TestnetError;
use crate::node_config::{self, Dialect, NodeSettings};
use crate::process::Interrupt;

/// How long a new node may take to serve `/status`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// An exit this soon after the start is a crash at start, not a preemption.
const STARTUP_WINDOW: Duration = Duration::from_secs(10);
/// Log lines quoted in errors.
const TAIL_LINES: usize = 20;

/// How nodes learn that they are preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NoticeMode {
    /// SIGTERM `grace` seconds before the deadline.
    Sigterm,
    /// A fake AWS metadata server per node announcing the deadline.
    Metadata,
    /// No notice: the node is SIGKILLed at its deadline, which is all that a system without
    /// a notice handler (the reactive baseline) ever sees of a preemption.
    None,
}

/// Where nodes listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// Status ports below the OS's ephemeral range, free when picked; p2p on port 0.
    Ephemeral,
    /// Node `k`: status on `base + 2k`, p2p on `base + 2k + 1`.
    Base(u16),
}

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running and part of the replayed availability.
    Up,
    /// Notified; must be gone by `deadline`.
    Leaving {
        /// When the testnet SIGKILLs it if it is still there.
        deadline: Instant,
    },
    /// Exited or killed.
    Gone,
}

/// One node process.
pub struct Node {
    /// `node<k>`.
    pub name: String,
    /// Its `/status` address.
    pub status_addr: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
    /// Its p2p address with `/p2p/<id>`, once it served `/status`.
    pub p2p: Option<String>,
    /// Its life phase.
    pub phase: Phase,
    child: ChildId,
    imds: Option<FakeImds>,
}

/// Everything a cluster needs to start nodes.
pub struct ClusterOptions {
    /// The node binary.
    pub bin: PathBuf,
    /// The run directory.
    pub dir: PathBuf,
    /// Shared node settings.
    pub settings: NodeSettings,
    /// How notices are delivered.
    pub notice: NoticeMode,
    /// Port plan.
    pub ports: Ports,
}

/// The running cluster. Dropping it kills every node.
pub struct Cluster {
    opts: ClusterOptions,
    key: PathBuf,
    dialect: Dialect,
    supervisor: Supervisor,
    client: Client,
    interrupt: Interrupt,
    /// Every node started, in start order (index = `k` of `node<k>`).
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Creates the cluster key and checks which config keys the node accepts; starts nothing.
    pub fn create(opts: ClusterOptions, interrupt: Interrupt) -> Result<Self, TestnetError> {
        let key = opts.dir.join("cluster.key");
        let out = Command::new(&opts.bin)
            .arg("keygen")
            .arg("--out")
            .arg(&key)
            .output()
            .map_err(|e| TestnetError::NodeBinary {
                path: opts.bin.clone(),
                reason: format!("cannot run it: {e}"),
            })?;
        if !out.status.success() || !key.is_file() {
            return Err(TestnetError::NodeBinary {
                path: opts.bin.clone(),
                reason: format!(
                    "`parcae-node keygen` failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let (dialect, refusal) = node_config::probe(&opts.bin, &opts.dir, &opts.settings)?;
        if let Some(refusal) = refusal {
            eprintln!(
                "warning: {} does not accept the [train] and planner.strategy config keys \
                 ({refusal}); the nodes run without training settings",
                opts.bin.display()
            );
        }
        Ok(Self {
            opts,
            key,
            dialect,
            supervisor: Supervisor::default(),
            client: Client::default(),
            interrupt,
            nodes: Vec::new(),
        })
    }

    /// The HTTP client shared by everything that reads the nodes.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Indices of the nodes that are up and not leaving.
    pub fn up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].phase == Phase::Up)
            .collect()
    }

    /// Indices of every node still running (up or leaving).
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].phase != Phase::Gone)
            .collect()
    }

    /// Starts `count` nodes (the very first node founds the cluster) and waits until each
    /// serves `/status`.
    pub fn start_nodes(&mut self, count: usize) -> Result<Vec<usize>, TestnetError> {
        let mut started = Vec::with_capacity(count);
        let mut remaining = count;
        if self.nodes.is_empty() && remaining > 0 {
            let founder = self.spawn(None)?;
            self.wait_started(&[founder])?;
            started.push(founder);
            remaining -= 1;
        }
        if remaining == 0 {
            return Ok(started);
        }
        let bootstrap = self.bootstrap_addr().ok_or(TestnetError::NoLiveNode)?;
        let mut batch = Vec::with_capacity(remaining);
        for _ in 0..remaining {
            batch.push(self.spawn(Some(&bootstrap))?);
        }
        self.wait_started(&batch)?;
        started.extend(batch);
        Ok(started)
    }

    /// Waits until one node reports a leader and `members` healthy members.
    pub fn wait_formed(&self, members: usize, timeout: Duration) -> Result<(), TestnetError> {
        let end = Instant::now() + timeout;
        let mut last = String::from("no node answered /status");
        while Instant::now() < end {
            self.interrupt.check()?;
            for &i in &self.up() {
                if let Ok(s) = self.client.status(self.nodes[i].status_addr) {
                    if s.leader.is_some() && s.healthy_members() >= members {
                        return Ok(());
                    }
                    last = format!(
                        "{} sees leader {:?} and {} healthy members (want {members})",
                        self.nodes[i].name,
                        s.leader,
                        s.healthy_members()
                    );
                }
            }
            self.interrupt
                .sleep_until(Instant::now() + Duration::from_millis(250))?;
        }
        Err(TestnetError::NoCluster {
            secs: timeout.as_secs(),
            detail: last,
        })
    }

    /// A p2p address to bootstrap through: the oldest node that is up.
    fn bootstrap_addr(&self) -> Option<String> {
        self.up()
            .into_iter()
            .find_map(|i| self.nodes[i].p2p.clone())
    }

    /// The status of node `i` (if it answers).
    pub fn status(&self, i: usize) -> Option<StatusSnapshot> {
        self.client.status(self.nodes[i].status_addr).ok()
    }

    fn ports_for(&self, k: usize) -> Result<(SocketAddr, String), TestnetError> {
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        match self.opts.ports {
            Ports::Ephemeral => {
                let port = parcae_testnet::ports::reserve_loopback_port().map_err(|source| {
                    TestnetError::Io {
                        what: format!("reserving a status port for node{k}"),
                        source,
                    }
                })?;
                Ok((loopback(port), "/ip4/127.0.0.1/tcp/0".into()))
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

    /// Starts node `k = nodes.len()`, bootstrapping through `bootstrap` when given.
    fn spawn(&mut self, bootstrap: Option<&str>) -> Result<usize, TestnetError> {
        let k = self.nodes.len();
        let name = format!("node{k}");
        let (status_addr, listen) = self.ports_for(k)?;
        let dir = &self.opts.dir;
        let io = |what: &str, source: std::io::Error| TestnetError::Io {
            what: format!("{name}: {what}"),
            source,
        };
        let imds = match self.opts.notice {
            NoticeMode::Sigterm | NoticeMode::None => None,
            NoticeMode::Metadata => {
                Some(FakeImds::start().map_err(|e| io("starting its metadata server", e))?)
            }
        };
        let config = dir.join(format!("{name}.toml"));
        let text = node_config::render(
            &self.opts.settings,
            self.dialect,
            imds.as_ref().map(FakeImds::url),
        );
        std::fs::write(&config, text).map_err(|e| io("writing its config", e))?;
        let args = NodeLaunch {
            data_dir: &dir.join(&name),
            listen: &listen,
            status_addr,
            cluster_key: &self.key,
            config: &config,
            bootstrap: &bootstrap
                .map(str::to_string)
                .into_iter()
                .collect::<Vec<_>>(),
        }
        .args();
        let log = dir.join(format!("{name}.log"));
        let rust_log = std::env::var("PARCAE_NODE_LOG").unwrap_or_else(|_| "info".into());
        let env = [
            ("RUST_LOG", rust_log),
            // Several nodes share one machine: each gets its share of the cores.
            ("RAYON_NUM_THREADS", self.opts.settings.threads.to_string()),
            // Plain log files.
            ("NO_COLOR", "1".to_string()),
        ];
        let child = self
            .supervisor
            .spawn(&Spawn {
                program: &self.opts.bin,
                args: &args,
                env: &env,
                log: &log,
            })
            .map_err(|e| TestnetError::NodeBinary {
                path: self.opts.bin.clone(),
                reason: format!("cannot start {name}: {e}"),
            })?;
        self.nodes.push(Node {
            name,
            status_addr,
            log,
            p2p: None,
            phase: Phase::Up,
            child,
            imds,
        });
        Ok(k)
    }

    /// Waits until every node of `idx` serves `/status` with its p2p address.
    fn wait_started(&mut self, idx: &[usize]) -> Result<(), TestnetError> {
        let end = Instant::now() + START_TIMEOUT;
        let mut pending: Vec<usize> = idx.to_vec();
        while !pending.is_empty() {
            self.interrupt.check()?;
            let mut still = Vec::with_capacity(pending.len());
            for i in pending {
                if let Some(status) = self.supervisor.try_exit(self.nodes[i].child) {
                    self.nodes[i].phase = Phase::Gone;
                    return Err(self.crashed(i, &status.to_string()));
                }
                match self.status(i).and_then(|s| s.p2p_addr()) {
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
                    secs: START_TIMEOUT.as_secs(),
                    log: n.log.clone(),
                    tail: log_tail(&n.log, TAIL_LINES),
                });
            }
            if !pending.is_empty() {
                self.interrupt
                    .sleep_until(Instant::now() + Duration::from_millis(100))?;
            }
        }
        Ok(())
    }

    fn crashed(&self, i: usize, exit: &str) -> TestnetError {
        let n = &self.nodes[i];
        TestnetError::NodeCrashed {
            node: n.name.clone(),
            exit: exit.to_string(),
            log: n.log.clone(),
            tail: log_tail(&n.log, TAIL_LINES),
        }
    }

    /// Delivers a preemption notice to node `i`: it must be gone at `deadline` (wall clock
    /// `deadline_wall` for the metadata service).
    pub fn notify(&mut self, i: usize, deadline: Instant, deadline_wall: SystemTime) {
        let node = &mut self.nodes[i];
        if node.phase != Phase::Up {
            return;
        }
        match (&node.imds, self.opts.notice) {
            (Some(imds), _) => imds.arm(deadline_wall),
            (None, NoticeMode::None) => {}
            (None, _) => self
                .supervisor
                .signal(node.child, nix::sys::signal::Signal::SIGTERM),
        }
        node.phase = Phase::Leaving { deadline };
    }

    /// SIGKILLs node `i` (no notice) and reaps it.
    pub fn kill(&mut self, i: usize) {
        self.supervisor.kill(self.nodes[i].child);
        self.nodes[i].phase = Phase::Gone;
        self.nodes[i].imds = None;
    }

    /// Reaps exited nodes. A node that exits within its first seconds is an error (crash at
    /// start); a leaving node exiting is expected; any other exit is returned as a warning.
    pub fn reap(&mut self) -> Result<Vec<String>, TestnetError> {
        let mut warnings = Vec::new();
        for i in self.running() {
            let child = self.nodes[i].child;
            let young = self.supervisor.age(child) < STARTUP_WINDOW;
            let Some(status) = self.supervisor.try_exit(child) else {
                continue;
            };
            let was = self.nodes[i].phase;
            self.nodes[i].phase = Phase::Gone;
            self.nodes[i].imds = None;
            match was {
                Phase::Leaving { .. } => {}
                _ if young => return Err(self.crashed(i, &status.to_string())),
                _ => warnings.push(format!(
                    "{} exited unexpectedly ({status}); see {}",
                    self.nodes[i].name,
                    self.nodes[i].log.display()
                )),
            }
        }
        Ok(warnings)
    }

    /// Kills every node.
    pub fn shutdown(&mut self) {
        self.supervisor.kill_all();
        for n in &mut self.nodes {
            n.phase = Phase::Gone;
            n.imds = None;
        }
    }
}
