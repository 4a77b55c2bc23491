//! One `parcae-node run` process, as every harness starts and watches it: the testnet's
//! clusters, the multi-process tests and the benchmarks.
//!
//! The process is supervised ([`crate::supervise`]): its own process group, SIGKILL when its
//! harness dies, killed and reaped when this value is dropped. Its status is read through the
//! node's own API types ([`parcae_api`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use parcae_api::client::Client;
use parcae_api::{StatusSnapshot, StepRecord};

use crate::launch::NodeLaunch;
use crate::supervise::{ChildId, Spawn, Supervisor, log_tail};

/// A running (or exited) node process and what it was started with.
pub struct NodeProcess {
    /// `node<k>`.
    pub name: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its HTTP status address.
    pub status_addr: SocketAddr,
    /// Its libp2p listen address (without `/p2p`).
    pub listen: String,
    /// Its log file (stdout and stderr): the data directory with the extension `log`.
    pub log: PathBuf,
    /// Its p2p address with `/p2p/<id>`, once it served it on `/status`.
    pub p2p: Option<String>,
    program: PathBuf,
    args: Vec<String>,
    /// The network namespace it runs in (`ip netns exec`), if not the host's.
    netns: Option<String>,
    env: Vec<(&'static str, String)>,
    client: Client,
    supervisor: Supervisor,
    child: Option<ChildId>,
}

impl NodeProcess {
    /// Starts `program` (a `parcae-node`) as `launch` says, in network namespace `netns` (the
    /// host's: `None`), with `env` added to its environment; `client` reads its API.
    pub fn spawn(
        name: String,
        program: &Path,
        launch: &NodeLaunch<'_>,
        netns: Option<String>,
        env: Vec<(&'static str, String)>,
        client: Client,
    ) -> std::io::Result<Self> {
        let data_dir = launch.data_dir.to_path_buf();
        let mut node = Self {
            name,
            log: data_dir.with_extension("log"),
            data_dir,
            status_addr: launch.status_addr,
            listen: launch.listen.to_string(),
            p2p: None,
            program: program.to_path_buf(),
            args: launch.args(),
            netns,
            env,
            client,
            supervisor: Supervisor::default(),
            child: None,
        };
        node.start()?;
        Ok(node)
    }

    fn start(&mut self) -> std::io::Result<()> {
        // `ip netns exec` execs the node in place: the child (and its process group) is it.
        let (program, args) = match &self.netns {
            Some(ns) => {
                let mut args = vec!["netns".into(), "exec".into(), ns.clone()];
                args.push(self.program.display().to_string());
                args.extend(self.args.iter().cloned());
                (PathBuf::from("ip"), args)
            }
            None => (self.program.clone(), self.args.clone()),
        };
        let child = self.supervisor.spawn(&Spawn {
            program: &program,
            args: &args,
            env: &self.env,
            log: &self.log,
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the process and starts it again with the same arguments (same data directory
    /// and ports), as a machine that reboots.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.p2p = None;
        self.start()
    }

    /// Kills the process and starts it again on the same data directory and ports, with its
    /// arguments changed by `edit` (e.g. the bootstrap flags dropped).
    pub fn restart_with_args(
        &mut self,
        edit: impl FnOnce(&mut Vec<String>),
    ) -> std::io::Result<()> {
        edit(&mut self.args);
        self.restart()
    }

    /// `GET /status`; `None` when the node does not answer in the client's timeout.
    pub fn status(&self) -> Option<StatusSnapshot> {
        self.client.status(self.status_addr).ok()
    }

    /// `GET /steps`: the committed steps applied on this node.
    pub fn steps(&self) -> Option<Vec<StepRecord>> {
        self.client.steps(self.status_addr).ok()
    }

    /// The node's peer id (from `/status`).
    pub fn peer_id(&self) -> Option<String> {
        Some(self.status()?.peer_id).filter(|p| !p.is_empty())
    }

    /// Its p2p address with `/p2p/<id>` (from `/status`), for `--bootstrap`.
    pub fn p2p_addr(&self) -> Option<String> {
        self.status()?.p2p_addr()
    }

    /// Sends a signal (e.g. `Signal::SIGTERM`) to the running process.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(child) = self.child {
            self.supervisor.signal(child, sig);
        }
    }

    /// Kills the process (SIGKILL) and reaps it; a no-op once it has exited.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            self.supervisor.kill(child);
        }
    }

    /// The exit status if the process has exited since the last look (it is then reaped).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let status = self.supervisor.try_exit(self.child?)?;
        self.child = None;
        Some(status)
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child?;
        wait_for(timeout, || self.try_exit())
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.is_some() && self.try_exit().is_none()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.supervisor.pid(self.child?)
    }

    /// Time since the process was (last) started.
    pub fn age(&self) -> Duration {
        self.child
            .map_or(Duration::ZERO, |child| self.supervisor.age(child))
    }

    /// The last `lines` lines of the node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

/// Polls `f` every 50 ms until it returns `Some` or `timeout` (stretched by the time factor,
/// [`crate::time_factor`]) passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = std::time::Instant::now() + crate::time_factor::scaled(timeout);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
