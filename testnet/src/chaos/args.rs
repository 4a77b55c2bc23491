//! The options of `parcae-testnet chaos`, read by the run and by its schedule.

use crate::node_args::{NodeArgs, OutputArgs, STRATEGIES};

/// Options of `chaos`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds of chaos.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) duration: u64,
    /// Seconds between two kills.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) kill_every: u64,
    /// Nodes kept running.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub(super) nodes: u32,
    /// Planning strategy of the nodes.
    #[arg(long, default_value = "liveput", value_parser = STRATEGIES)]
    pub(super) strategy: String,
    /// Zones to spread the nodes over (`[placement] zone`), e.g. `a,b`: the nodes start in
    /// turn over them, and a killed node's replacement starts in the zone that misses the most
    /// (with `--sync diloco:H`, each zone is a group that the kills cut into mid-round).
    #[arg(long, value_delimiter = ',')]
    pub(super) zones: Vec<String>,
    /// Seconds after the start at which every node is SIGKILLed at once.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) outage_at: Option<u64>,
    /// Seconds the cluster stays down before new nodes start.
    #[arg(long, default_value_t = 20, requires = "outage_at", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) outage_secs: u64,
    /// Seconds between two pauses: a node (the leader the first time) is frozen with SIGSTOP.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) pause_every: Option<u64>,
    /// Seconds a paused node stays frozen before SIGCONT wakes it.
    #[arg(long, default_value_t = 15, requires = "pause_every", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) pause_secs: u64,
    /// Seconds between two network splits (majority/minority, one node isolated, a bridge
    /// node; needs --netns).
    #[arg(long, requires = "netns", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) partition_every: Option<u64>,
    /// Seconds a split lasts before the network heals.
    #[arg(long, default_value_t = 20, requires = "partition_every", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) partition_secs: u64,
    /// Seconds between two full disks: the checkpoint disk (a tmpfs of 256 MiB, needs root) of
    /// a node that writes checkpoints is filled with a ballast file.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) disk_full_every: Option<u64>,
    /// Seconds a disk stays full before the ballast is removed.
    #[arg(long, default_value_t = 20, requires = "disk_full_every", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) disk_full_secs: u64,
    /// Seconds by which every third node's wall clock is off, from the founder on, alternately
    /// ahead and behind (beyond 300, outside the freshness window of signed proposals).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) clock_skew: Option<u64>,
    /// Seconds between two slow links: a node's link to the others is cut to
    /// --slow-link-kbit both ways, what its queue cannot hold dropped (needs --netns).
    #[arg(long, requires = "netns", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) slow_link_every: Option<u64>,
    /// Seconds a link stays slow.
    #[arg(long, default_value_t = 20, requires = "slow_link_every", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) slow_link_secs: u64,
    /// The slow link's rate, kbit/s.
    #[arg(long, default_value_t = 1000, requires = "slow_link_every", value_parser = clap::value_parser!(u32).range(64..=10_000_000))]
    pub(super) slow_link_kbit: u32,
    #[command(flatten)]
    pub(super) node: NodeArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}
