//! The run loop shared by `run`, `compare` and `chaos`: start the initial nodes, wait for the
//! cluster to form, then until the scenario's end act on its schedule, enforce notice
//! deadlines with SIGKILL, poll the cluster once per second, and notice crashes and signals.

use std::time::{Duration, Instant, SystemTime};

use crate::cluster::{Cluster, Phase};
use crate::monitor::{Event, EventKind, Monitor};
use crate::progress::Progress;
use parcae_api::StepRecord;
use parcae_testnet::clock_skew::ClockSkew;
use parcae_testnet::error::TestnetError;
use parcae_testnet::interrupt::Interrupt;

/// How long the initial cluster may take to form.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds between polls.
const POLL_SECS: f64 = 1.0;
/// Seconds between polls while a killed leader has no successor yet (the failover's
/// resolution).
const FAILOVER_POLL_SECS: f64 = 0.2;
/// The least time a poll is given: a poll ends by the next action, so that a slow node's read
/// cannot delay it (a slow link restored seconds late would last longer than asked), and one
/// due sooner than this waits until after the action.
const MIN_POLL_SECS: f64 = 0.5;

/// A zone of a run: its name (`[placement] zone` of its nodes), its emulated device's speed,
/// and how many of the initial nodes start in it.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneStart {
    /// The zone's name.
    pub name: String,
    /// Its nodes' emulated device speed against the profiled one.
    pub speed: f64,
    /// Nodes started in it before the replay.
    pub initial: usize,
}

/// A script of availability changes.
pub trait Scenario {
    /// Nodes running before the replay clock starts.
    fn initial_nodes(&self) -> usize;
    /// Seconds of replay.
    fn duration_secs(&self) -> f64;
    /// When (seconds since the start) the next action is due, if any is left.
    fn next_action(&self) -> Option<f64>;
    /// Performs the action that is due.
    fn act(&mut self, ctx: &mut Ctx<'_>) -> Result<(), TestnetError>;
    /// Nodes the scenario wants at `t`.
    fn target(&self, t: f64) -> u32;
    /// Planning intervals the replay spans, and the one `t` falls in (for the progress bar).
    fn interval_at(&self, t: f64) -> (u64, u64);
    /// The size of the disk each node's checkpoints must be written to, when the scenario fills
    /// disks (none: the host's disk).
    fn checkpoint_disk_mib(&self) -> Option<u64> {
        None
    }
    /// The skewed wall clocks of some nodes, when the scenario skews clocks.
    fn clock_skew(&self) -> Option<ClockSkew> {
        None
    }
    /// Whether the job's store keeps every checkpoint, for the replay check after the run.
    fn keeps_every_checkpoint(&self) -> bool {
        false
    }
    /// The run's zones (none: the nodes have no zone), the founder's first.
    fn zones(&self) -> Vec<ZoneStart> {
        Vec::new()
    }
    /// Whether the run ends as soon as every node has finished the job's steps (a job with a
    /// step limit, `run --samples`), not at the end of the replay.
    fn ends_with_the_job(&self) -> bool {
        false
    }
}

/// What a scenario acts on.
pub struct Ctx<'a> {
    /// The cluster.
    pub cluster: &'a mut Cluster,
    /// The observations (a node's committed steps are read before it is killed).
    pub monitor: &'a mut Monitor,
    start: Instant,
    start_wall: SystemTime,
}

impl Ctx<'_> {
    /// Seconds since the replay started.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Tells node `i` that it is preempted at `deadline` seconds since the start.
    pub fn notify(&mut self, i: usize, deadline: f64) {
        self.record(EventKind::Notice);
        let offset = Duration::from_secs_f64(deadline.max(0.0));
        self.cluster
            .notify(i, self.start + offset, self.start_wall + offset);
    }

    /// SIGKILLs node `i` without notice, after reading its committed steps.
    pub fn kill(&mut self, i: usize) {
        self.record(EventKind::Kill);
        self.monitor.observe_steps_of(self.cluster, i);
        self.cluster.kill(i);
    }

    /// Starts `count` new nodes (none when 0), in zone `zone` of the run's zones if given.
    pub fn start_nodes(&mut self, count: usize, zone: Option<usize>) -> Result<(), TestnetError> {
        if count > 0 {
            self.record(EventKind::Arrival);
            self.cluster.start_nodes_in(count, zone)?;
        }
        Ok(())
    }

    fn record(&mut self, kind: EventKind) {
        let t = self.now();
        self.monitor.events.push(Event { t, kind });
    }

    /// Freezes node `i` (SIGSTOP) if it is up.
    pub fn pause(&mut self, i: usize) {
        self.cluster.pause(i);
    }

    /// Wakes paused node `i` (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        self.cluster.resume(i);
    }

    /// SIGKILLs the cluster's leader without notice and times the failover (`false` when no
    /// node leads right now).
    pub fn kill_leader(&mut self) -> bool {
        let t = self.now();
        self.monitor.kill_leader(self.cluster, t)
    }
}

/// What a run observed.
pub struct Observed {
    /// Everything polled.
    pub monitor: Monitor,
    /// The final committed sequence (longest `/steps` of a node at the end).
    pub final_seq: Vec<StepRecord>,
    /// Unexpected node exits.
    pub warnings: Vec<String>,
}

/// Runs `scenario` on `cluster`.
pub fn execute(
    cluster: &mut Cluster,
    scenario: &mut dyn Scenario,
    interrupt: &Interrupt,
    progress: &mut Progress,
) -> Result<Observed, TestnetError> {
    let initial = scenario.initial_nodes();
    progress.message(&format!("starting {initial} nodes"));
    let zones = scenario.zones();
    if zones.is_empty() {
        cluster.start_nodes(initial)?;
    }
    for (zone, start) in zones.into_iter().enumerate() {
        cluster.start_nodes_in(start.initial, Some(zone))?;
    }
    cluster.wait_formed(initial, FORM_TIMEOUT)?;
    let mut monitor = Monitor::default();
    let mut warnings = Vec::new();
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let end = scenario.duration_secs();
    let mut next_poll: f64 = 0.0;
    loop {
        interrupt.check()?;
        for w in cluster.reap()? {
            progress.println(&format!("warning: {w}"));
            warnings.push(w);
        }
        let mut ctx = Ctx {
            cluster,
            monitor: &mut monitor,
            start,
            start_wall,
        };
        enforce_deadlines(&mut ctx);
        let t = ctx.now();
        if t >= end {
            break;
        }
        if let Some(due) = scenario.next_action()
            && due <= t
        {
            scenario.act(&mut ctx)?;
            if monitor.awaiting_leader() {
                next_poll = next_poll.min(t);
            }
            continue;
        }
        // The next action or notice deadline, which a poll must not delay: a poll ends by it,
        // and waits until after it when it is too close.
        let due = [scenario.next_action(), next_deadline(cluster, start)]
            .into_iter()
            .flatten()
            .reduce(f64::min);
        let within = due.map_or(f64::INFINITY, |due| due - t);
        let poll_now = t >= next_poll && within >= MIN_POLL_SECS;
        if poll_now {
            let within = Duration::try_from_secs_f64(within).unwrap_or(Duration::MAX);
            monitor.poll(cluster, t, scenario.target(t), within);
            if let Some(sample) = monitor.last() {
                let (pos, len) = scenario.interval_at(t);
                progress.update(pos, len, sample);
            }
            let every = if monitor.awaiting_leader() {
                FAILOVER_POLL_SECS
            } else {
                POLL_SECS
            };
            while next_poll <= t {
                next_poll += every;
            }
            if scenario.ends_with_the_job() && monitor.job_finished() {
                break;
            }
        }
        let wake = [(next_poll > t).then_some(next_poll), due, Some(end)]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        interrupt.sleep_until(start + Duration::from_secs_f64(wake.max(0.0)))?;
    }
    // A node the scenario froze would answer none of the final reads.
    cluster.resume_all();
    let t = start.elapsed().as_secs_f64();
    progress.message("collecting the committed steps");
    let final_seq = monitor.finish(cluster, t);
    Ok(Observed {
        monitor,
        final_seq,
        warnings,
    })
}

/// SIGKILLs leaving nodes whose deadline passed (reading their steps first).
fn enforce_deadlines(ctx: &mut Ctx<'_>) {
    let now = Instant::now();
    for i in ctx.cluster.running() {
        if let Phase::Leaving { deadline } = ctx.cluster.phase(i)
            && deadline <= now
        {
            ctx.kill(i);
        }
    }
}

/// The earliest pending notice deadline, in seconds since `start`.
fn next_deadline(cluster: &Cluster, start: Instant) -> Option<f64> {
    cluster
        .phases()
        .filter_map(|phase| match phase {
            Phase::Leaving { deadline } => {
                Some(deadline.saturating_duration_since(start).as_secs_f64())
            }
            _ => None,
        })
        .reduce(f64::min)
}
