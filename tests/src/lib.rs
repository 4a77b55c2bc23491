//! Harness for multi-process tests: real `parcae-node` processes on 127.0.0.1.
//!
//! Finding the binary: `CARGO_BIN_EXE_*` only exists inside the crate that owns a binary, so this
//! crate looks for `parcae-node` in the profile directory of its own executable
//! (`target/<profile>/`), after
//! asking cargo to build it once per test process (`$CARGO build --workspace --bin
//! parcae-node`, a no-op when up to date). `PARCAE_NODE_BIN` overrides both.
//!
//! Every spawned process is supervised by the testnet's [`parcae_testnet::supervise`]: killed
//! (SIGKILL) and reaped when its [`NodeProcess`] is dropped, and killed by the kernel if the test
//! process dies, so a failing assertion never leaves nodes behind. Tests that start clusters take [`serial`] so
//! that at most one cluster runs at a time on a small machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use parcae_api::client::Client;
use parcae_api::{RoleView, StatusSnapshot, StepRecord};
use parcae_testnet::launch::NodeLaunch;
use parcae_testnet::supervise::{ChildId, Spawn, Supervisor, log_tail};

/// Serialises cluster tests within one test binary.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether this executable is a test (`target/<profile>/deps/<test>`) rather than a bench
/// binary (`target/<profile>/<bin>`).
fn running_as_test() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.file_name()? == "deps"))
        .unwrap_or(false)
}

/// `target/<profile>` of this executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let mut dir = exe.parent().expect("executable directory").to_path_buf();
    if running_as_test() {
        dir.pop();
    }
    dir
}

/// Runs cargo with `args` (e.g. `build --workspace --example x`) in this executable's profile
/// and returns `target/<profile>/<relative>`.
fn build(args: &[&str], relative: &str) -> PathBuf {
    let dir = profile_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(args);
    if dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo build");
    assert!(status.success(), "cargo {args:?} failed");
    let bin = dir.join(relative);
    assert!(bin.exists(), "{} not found after build", bin.display());
    bin
}

/// Path of the `parcae-node` binary (built on first use; `PARCAE_NODE_BIN` overrides).
///
/// A test builds it with `cargo test --workspace --no-run --test cli` (the binary of the node
/// package's CLI test): exactly the feature set of `cargo test --workspace`, so inside a
/// workspace test run nothing is built, where `cargo build` would resolve features without
/// the dev-dependencies and rebuild Burn. A bench binary builds it like itself, with
/// `cargo build --workspace`.
pub fn node_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("PARCAE_NODE_BIN") {
            return PathBuf::from(p);
        }
        if running_as_test() {
            build(
                &["test", "--workspace", "--no-run", "--test", "cli"],
                "parcae-node",
            )
        } else {
            build(
                &["build", "--workspace", "--bin", "parcae-node"],
                "parcae-node",
            )
        }
    })
    .clone()
}

/// Path of an example of the `parcae-node` crate: `cargo test --workspace` builds examples, so
/// it is there in a workspace run; otherwise it is built here.
pub fn node_example(name: &str) -> PathBuf {
    let built = profile_dir().join("examples").join(name);
    if built.exists() {
        return built;
    }
    build(
        &["build", "--workspace", "--example", name],
        &format!("examples/{name}"),
    )
}

/// A free TCP port on 127.0.0.1 for a node process to bind (below the ephemeral range, so
/// that no node's outgoing connection takes it before the node binds it).
pub fn free_port() -> u16 {
    parcae_testnet::ports::reserve_loopback_port().expect("free port")
}

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The client the harness reads node APIs with: a node that takes longer than a second to
/// answer reads as not answering.
fn api_client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| Client::with_timeout(Duration::from_millis(1000)))
}

/// Fetches `http://addr/path` with a short timeout; `None` on any failure.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(1000)))
            .build(),
    );
    let mut resp = agent.get(&format!("http://{addr}{path}")).call().ok()?;
    resp.body_mut().read_to_string().ok()
}

/// A `parcae-node run` process, supervised as the testnet supervises its nodes
/// ([`parcae_testnet::supervise`]: its own process group, SIGKILL if this test process dies).
pub struct NodeProcess {
    supervisor: Supervisor,
    child: Option<ChildId>,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its HTTP status address.
    pub status_addr: SocketAddr,
    /// Its libp2p listen address (without `/p2p`).
    pub listen: String,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    args: Vec<String>,
}

impl NodeProcess {
    /// Starts `parcae-node` as `launch` says.
    pub fn spawn(launch: &NodeLaunch<'_>) -> Self {
        let data_dir = launch.data_dir.to_path_buf();
        let log = data_dir.with_extension("log");
        let mut node = Self {
            supervisor: Supervisor::default(),
            child: None,
            data_dir,
            status_addr: launch.status_addr,
            listen: launch.listen.to_string(),
            log,
            args: launch.args(),
        };
        node.start();
        node
    }

    fn start(&mut self) {
        let level = std::env::var("PARCAE_TEST_LOG").unwrap_or_else(|_| "info".into());
        let child = self
            .supervisor
            .spawn(&Spawn {
                program: &node_binary(),
                args: &self.args,
                env: &[("RUST_LOG", level)],
                log: &self.log,
            })
            .expect("spawning parcae-node");
        self.child = Some(child);
    }

    /// Starts the process again with the same arguments (same data dir and ports).
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// `GET /status`, read through the node's own API types.
    pub fn status(&self) -> Option<StatusSnapshot> {
        api_client().status(self.status_addr).ok()
    }

    /// `GET /steps`: the committed steps applied on this node.
    pub fn steps(&self) -> Option<Vec<StepRecord>> {
        api_client().steps(self.status_addr).ok()
    }

    /// The node's peer id (from `/status`).
    pub fn peer_id(&self) -> Option<String> {
        Some(self.status()?.peer_id).filter(|p| !p.is_empty())
    }

    /// `listen/p2p/peer id`, for `--bootstrap`.
    pub fn p2p_addr(&self) -> Option<String> {
        Some(format!("{}/p2p/{}", self.listen, self.peer_id()?))
    }

    /// Sends a signal (e.g. `Signal::SIGTERM`) to the running process.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(child) = self.child {
            self.supervisor.signal(child, sig);
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            self.supervisor.kill(child);
        }
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child?;
        let status = wait_for(timeout, || self.supervisor.try_exit(child))?;
        self.child = None;
        Some(status)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        match self.child {
            Some(child) if self.supervisor.try_exit(child).is_none() => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// The last `lines` lines of the node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

/// A set of nodes sharing one cluster key in one temporary directory.
pub struct TestCluster {
    /// Temporary directory holding keys, data dirs and logs.
    pub dir: tempfile::TempDir,
    /// The cluster key file.
    pub key: PathBuf,
    /// The config file given to every node.
    pub config: PathBuf,
    /// The nodes, in start order.
    pub nodes: Vec<NodeProcess>,
}

/// Configuration used by the control-plane tests: fast raft timing and planning, short grace,
/// no training.
pub const TEST_CONFIG: &str = "grace_secs = 4.0\n[raft]\ntick_ms = 100\nelection_ticks = 10\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n[planner]\ninterval_secs = 1.0\n[train]\nenabled = false\n";

/// Raft and grace settings of the training tests (the `[train]` and `[planner]` sections are
/// added by each test).
pub const TRAIN_BASE_CONFIG: &str = "grace_secs = 10.0\n[raft]\ntick_ms = 100\nelection_ticks = 10\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n";

impl TestCluster {
    /// A cluster directory with a fresh key and `config` (TOML) for every node.
    pub fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("cluster.key");
        parcae_node::key::ClusterKey::generate()
            .store(&key)
            .expect("key");
        let config_path = dir.path().join("node.toml");
        std::fs::write(&config_path, config).expect("config");
        Self {
            dir,
            key,
            config: config_path,
            nodes: Vec::new(),
        }
    }

    /// Starts node `nodes.len()`, bootstrapping through `bootstrap` (p2p addresses); uses
    /// `key` instead of the cluster key when given.
    pub fn spawn(&mut self, bootstrap: &[String], key: Option<&Path>) -> usize {
        let config = self.config.clone();
        self.spawn_with(bootstrap, key, &config)
    }

    /// Like [`TestCluster::spawn`] with a node-specific config text.
    pub fn spawn_with_config(&mut self, bootstrap: &[String], config: &str) -> usize {
        let path = self
            .dir
            .path()
            .join(format!("node{}.toml", self.nodes.len()));
        std::fs::write(&path, config).expect("config");
        self.spawn_with(bootstrap, None, &path)
    }

    fn spawn_with(&mut self, bootstrap: &[String], key: Option<&Path>, config: &Path) -> usize {
        let i = self.nodes.len();
        let data_dir = self.dir.path().join(format!("node{i}"));
        let listen = format!("/ip4/127.0.0.1/tcp/{}", free_port());
        let status: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        self.nodes.push(NodeProcess::spawn(&NodeLaunch {
            data_dir: &data_dir,
            listen: &listen,
            status_addr: status,
            cluster_key: key.unwrap_or(&self.key),
            config,
            bootstrap,
        }));
        i
    }

    /// Starts a founder and `n - 1` nodes bootstrapping through it; returns when every node
    /// answers `/status`.
    pub fn start(config: &str, n: usize) -> Self {
        let mut c = Self::new(config);
        c.spawn(&[], None);
        let founder = wait_for(Duration::from_secs(20), || c.nodes[0].p2p_addr())
            .unwrap_or_else(|| panic!("the founder does not answer /status\n{}", c.logs()));
        for _ in 1..n {
            c.spawn(std::slice::from_ref(&founder), None);
        }
        for (i, node) in c.nodes.iter().enumerate() {
            if wait_for(Duration::from_secs(20), || node.status()).is_none() {
                panic!("node{i} does not answer /status\n{}", c.logs());
            }
        }
        c
    }

    /// Statuses of the running nodes (index, status).
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
            let mut leader = None;
            let mut view: Option<Vec<String>> = None;
            for &i in indices {
                let s = self.nodes[i].status()?;
                let l = s.leader.clone()?;
                if leader.get_or_insert(l.clone()) != &l {
                    return None;
                }
                let mut ids: Vec<String> = s
                    .members
                    .iter()
                    .filter(|m| m.status.is_healthy())
                    .map(|m| m.peer_id.clone())
                    .collect();
                ids.sort();
                if ids.len() != members || view.get_or_insert(ids.clone()) != &ids {
                    return None;
                }
            }
            let leaders = indices
                .iter()
                .filter(|&&i| {
                    self.nodes[i]
                        .status()
                        .is_some_and(|s| s.role == RoleView::Leader)
                })
                .count();
            (leaders == 1).then(|| leader.expect("checked"))
        })
    }

    /// Index of the node whose peer id is `peer`.
    pub fn index_of(&self, peer: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.peer_id().as_deref() == Some(peer))
    }

    /// Log tails of every node, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("--- node{i} ---\n{}", n.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
