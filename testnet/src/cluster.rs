//! The life of a testnet run's nodes: a [`LocalCluster`] of `parcae-node` processes, each in
//! a [`Phase`] (up, leaving by a deadline after a notice, gone), with its notice delivered as
//! the run's [`NoticeMode`] says, and exits told apart (a crash at start is an error, a leaving
//! node's exit is expected, any other exit a warning).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use parcae_api::StatusSnapshot;
use parcae_api::client::Client;
use parcae_testnet::clock_skew::ClockSkew;
use parcae_testnet::disks::Disks;
use parcae_testnet::error::TestnetError;
use parcae_testnet::imds::FakeMetadata;
use parcae_testnet::interrupt::Interrupt;
use parcae_testnet::local_cluster::{ClusterSetup, LocalCluster, Ports};
use parcae_testnet::node_process::NodeProcess;

use crate::failover;
use crate::node_config::{self, Dialect, NodeSettings};

/// An exit this soon after the start is a crash at start, not a preemption.
const STARTUP_WINDOW: Duration = Duration::from_secs(10);

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
    /// Frozen (SIGSTOP) by the scenario: still a member as far as it knows, answering nothing.
    Paused,
    /// Exited or killed.
    Gone,
}

/// What the run knows of one node beyond its process.
struct Member {
    phase: Phase,
    imds: Option<FakeMetadata>,
    /// The zone it was started in (an index into the run's zones), if the run has zones.
    zone: Option<usize>,
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
    /// Each node's checkpoints on a disk of this size that the run can fill (none: the host's).
    pub checkpoint_disk_mib: Option<u64>,
    /// Skewed wall clocks on some nodes.
    pub clock_skew: Option<ClockSkew>,
}

/// The running cluster. Dropping it kills every node.
pub struct Cluster {
    settings: NodeSettings,
    notice: NoticeMode,
    dialect: Dialect,
    interrupt: Interrupt,
    local: LocalCluster,
    members: Vec<Member>,
    /// Declared after `local`: unmounted after the nodes are killed.
    disks: Option<Disks>,
}

impl Cluster {
    /// Creates the cluster key and checks which config keys the node accepts; starts nothing.
    pub fn create(opts: ClusterOptions, interrupt: Interrupt) -> Result<Self, TestnetError> {
        let (dialect, refusal) = node_config::probe(&opts.bin, &opts.dir, &opts.settings)?;
        if let Some(refusal) = refusal {
            eprintln!(
                "warning: {} does not accept the [train] and planner.strategy config keys \
                 ({refusal}); the nodes run without training settings",
                opts.bin.display()
            );
        }
        let rust_log = std::env::var("PARCAE_NODE_LOG").unwrap_or_else(|_| "info".into());
        let env = vec![
            ("RUST_LOG", rust_log),
            // Several nodes share one machine: each gets its share of the cores.
            ("RAYON_NUM_THREADS", opts.settings.threads.to_string()),
            // Plain log files.
            ("NO_COLOR", "1".to_string()),
        ];
        let local = LocalCluster::create(ClusterSetup {
            program: opts.bin,
            dir: Some(opts.dir),
            config: node_config::render(&opts.settings, dialect, 0, None, None),
            ports: opts.ports,
            env,
            clock_skew: opts.clock_skew,
            client: Client::default(),
            interrupt: interrupt.clone(),
        })?;
        Ok(Self {
            settings: opts.settings,
            notice: opts.notice,
            dialect,
            interrupt,
            local,
            members: Vec::new(),
            disks: opts.checkpoint_disk_mib.map(Disks::new).transpose()?,
        })
    }

    /// The HTTP client shared by everything that reads the nodes.
    pub fn client(&self) -> &Client {
        self.local.client()
    }

    /// Node `i`'s process.
    pub fn node(&self, i: usize) -> &NodeProcess {
        &self.local.nodes[i]
    }

    /// Node `i`'s phase.
    pub fn phase(&self, i: usize) -> Phase {
        self.members[i].phase
    }

    /// Phases of every node started, in start order.
    pub fn phases(&self) -> impl Iterator<Item = Phase> + '_ {
        self.members.iter().map(|m| m.phase)
    }

    /// Indices of the nodes that are up and not leaving.
    pub fn up(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].phase == Phase::Up)
            .collect()
    }

    /// Indices of every node still running (up or leaving).
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].phase != Phase::Gone)
            .collect()
    }

    /// Indices of the running nodes that can answer (not paused).
    pub fn answering(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| !matches!(self.members[i].phase, Phase::Gone | Phase::Paused))
            .collect()
    }

    /// The node that says it leads, among the nodes that are up, and its status.
    pub fn leader(&self) -> Option<(usize, StatusSnapshot)> {
        let statuses: Vec<(usize, StatusSnapshot)> = self
            .up()
            .into_iter()
            .filter_map(|i| Some((i, self.status(i)?)))
            .collect();
        failover::leader(&statuses).cloned()
    }

    /// Starts `count` nodes (the very first node founds the cluster, the others bootstrap
    /// through the oldest node that is up), each with its own metadata server when notices
    /// come that way, and waits until each serves `/status`.
    pub fn start_nodes(&mut self, count: usize) -> Result<Vec<usize>, TestnetError> {
        self.start_nodes_in(count, None)
    }

    /// Indices of the nodes up in zone `zone`.
    pub fn up_in(&self, zone: usize) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].phase == Phase::Up && self.members[i].zone == Some(zone))
            .collect()
    }

    /// [`Cluster::start_nodes`] in zone `zone` of the run's zones (`[placement] zone`), or
    /// without one.
    pub fn start_nodes_in(
        &mut self,
        count: usize,
        zone: Option<usize>,
    ) -> Result<Vec<usize>, TestnetError> {
        let Self {
            settings,
            notice,
            dialect,
            local,
            members,
            disks,
            ..
        } = self;
        let up: Vec<bool> = members.iter().map(|m| m.phase == Phase::Up).collect();
        let cluster_dir = local.dir().to_path_buf();
        let mut config_for = |k: usize| -> Result<String, TestnetError> {
            if let Some(disks) = disks.as_mut() {
                disks.mount(&LocalCluster::data_dir_in(&cluster_dir, k))?;
            }
            let imds = match notice {
                NoticeMode::Sigterm | NoticeMode::None => None,
                NoticeMode::Metadata => {
                    Some(FakeMetadata::aws().map_err(|source| TestnetError::Io {
                        what: format!("node{k}: starting its metadata server"),
                        source,
                    })?)
                }
            };
            let url = imds.as_ref().map(FakeMetadata::url);
            let config = node_config::render(settings, *dialect, k, url, zone);
            members.push(Member {
                phase: Phase::Up,
                imds,
                zone,
            });
            Ok(config)
        };
        // Nodes started in this call (index past `up`) are up; the founder is one of them.
        let may_bootstrap = |i: usize| up.get(i).copied().unwrap_or(true);
        local.start_nodes_with(count, &may_bootstrap, &mut config_for)
    }

    /// Waits until one node reports a leader and `members` healthy members.
    pub fn wait_formed(&self, members: usize, timeout: Duration) -> Result<(), TestnetError> {
        let end = Instant::now() + timeout;
        let mut last = String::from("no node answered /status");
        while Instant::now() < end {
            self.interrupt.check()?;
            for &i in &self.up() {
                if let Some(s) = self.status(i) {
                    if s.leader.is_some() && s.healthy_members() >= members {
                        return Ok(());
                    }
                    last = format!(
                        "{} sees leader {:?} and {} healthy members (want {members})",
                        self.node(i).name,
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

    /// The status of node `i` (if it answers).
    pub fn status(&self, i: usize) -> Option<StatusSnapshot> {
        self.node(i).status()
    }

    /// Delivers a preemption notice to node `i`: it must be gone at `deadline` (wall clock
    /// `deadline_wall` for the metadata service).
    pub fn notify(&mut self, i: usize, deadline: Instant, deadline_wall: SystemTime) {
        let member = &mut self.members[i];
        if member.phase != Phase::Up {
            return;
        }
        match (&member.imds, self.notice) {
            (Some(imds), _) => imds.arm(deadline_wall),
            (None, NoticeMode::None) => {}
            (None, _) => self.local.nodes[i].signal(nix::sys::signal::Signal::SIGTERM),
        }
        member.phase = Phase::Leaving { deadline };
    }

    /// Freezes node `i` (SIGSTOP to its process group) if it is up: a VM stalled by its host.
    pub fn pause(&mut self, i: usize) {
        if self.members[i].phase == Phase::Up {
            self.local.nodes[i].signal(nix::sys::signal::Signal::SIGSTOP);
            self.members[i].phase = Phase::Paused;
        }
    }

    /// Wakes paused node `i` (SIGCONT): it carries on from where it was frozen.
    pub fn resume(&mut self, i: usize) {
        if self.members[i].phase == Phase::Paused {
            self.local.nodes[i].signal(nix::sys::signal::Signal::SIGCONT);
            self.members[i].phase = Phase::Up;
        }
    }

    /// Cuts (`cut`) or heals the network between nodes `a` and `b` (a run with `--netns`).
    pub fn set_link(&self, a: usize, b: usize, cut: bool) -> Result<(), TestnetError> {
        self.local.set_link(a, b, cut)
    }

    /// Slows node `i`'s link to `rate_kbit` both ways, or (`None`) restores it.
    pub fn set_slow_link(&self, i: usize, rate_kbit: Option<u32>) -> Result<(), TestnetError> {
        self.local.set_slow_link(i, rate_kbit)
    }

    /// Fills node `i`'s checkpoint disk (a run with size-limited disks); returns the ballast's
    /// bytes.
    pub fn fill_disk(&self, i: usize) -> Result<u64, TestnetError> {
        Disks::fill(&self.node(i).data_dir)
    }

    /// Empties node `i`'s checkpoint disk again.
    pub fn free_disk(&self, i: usize) {
        Disks::free(&self.node(i).data_dir);
    }

    /// Wakes every paused node (a run's end reads every node).
    pub fn resume_all(&mut self) {
        for i in 0..self.members.len() {
            self.resume(i);
        }
    }

    /// SIGKILLs node `i` (no notice) and reaps it.
    pub fn kill(&mut self, i: usize) {
        self.local.nodes[i].kill();
        self.gone(i);
    }

    fn gone(&mut self, i: usize) {
        self.members[i].phase = Phase::Gone;
        self.members[i].imds = None;
    }

    /// Reaps exited nodes. A node that exits within its first seconds is an error (crash at
    /// start); a leaving node exiting is expected; any other exit is returned as a warning.
    pub fn reap(&mut self) -> Result<Vec<String>, TestnetError> {
        let mut warnings = Vec::new();
        for i in self.running() {
            let node = &mut self.local.nodes[i];
            let young = node.age() < STARTUP_WINDOW;
            let Some(status) = node.try_exit() else {
                continue;
            };
            let was = self.members[i].phase;
            self.gone(i);
            match was {
                Phase::Leaving { .. } => {}
                _ if young => return Err(self.local.crashed(i, &status.to_string())),
                _ => warnings.push(format!(
                    "{} exited unexpectedly ({status}); see {}",
                    self.node(i).name,
                    self.node(i).log.display()
                )),
            }
        }
        Ok(warnings)
    }

    /// Kills every node.
    pub fn shutdown(&mut self) {
        self.local.kill_all();
        for i in 0..self.members.len() {
            self.gone(i);
        }
    }
}
