//! Watching a running cluster: once per second every running node's `/status` (for the
//! migrations it reports) and the leader's `/steps`, every few seconds every node's `/steps`,
//! and a timeline of what the leader reports for the progress line and the plots.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;
use crate::failover::{self, LeaderFailover};
use crate::ledger::{MigrationLedger, StepLedger};
use crate::outer_rounds::OuterLedger;
use crate::resources::ResourceLedger;
use parcae_api::client::Client;
use parcae_api::{EmulatedView, EstimateView, StatusSnapshot, StepRecord, TrainingPhase};

/// Every node's `/steps` is read on every this many polls (the leader's on every poll).
const ALL_STEPS_EVERY: u64 = 5;
/// Timeout of the final reads: busy nodes on a small machine may take seconds to answer, and
/// a missed answer would make the final sequence look shorter than what was committed.
const FINAL_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a poll waits for a node (polls come once a second).
const POLL_TIMEOUT: Duration = Duration::from_millis(1500);

/// One point of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the replay started.
    pub t: f64,
    /// Node processes running.
    pub running: u32,
    /// Nodes the trace asks for.
    pub target: u32,
    /// Plan epoch.
    pub epoch: u64,
    /// `(D, P)` of the plan.
    pub config: Option<(u32, u32)>,
    /// Last committed step.
    pub step: u64,
    /// Global sample cursor.
    pub samples: u64,
    /// Loss of the last committed step.
    pub loss: Option<f64>,
}

/// What a scenario did to the cluster (the causes a reconfiguration answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A preemption notice reached a node.
    Notice,
    /// A node was SIGKILLed (at its notice's deadline, or without notice).
    Kill,
    /// New nodes were started.
    Arrival,
}

/// One scenario action, `t` seconds into the replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// Seconds since the replay started.
    pub t: f64,
    /// What happened.
    pub kind: EventKind,
}

/// Accumulates everything seen during a run.
#[derive(Default)]
pub struct Monitor {
    /// Committed steps seen.
    pub steps: StepLedger,
    /// Reconfigurations seen.
    pub migrations: MigrationLedger,
    /// One sample per poll.
    pub timeline: Vec<Sample>,
    /// The leader's latest throughput estimates (its measured cost model).
    pub estimates: Vec<EstimateView>,
    /// Each node's latest emulated-accelerator pacing, by peer id (kept after it is gone).
    pub emulated: BTreeMap<String, EmulatedView>,
    /// Each node process's latest all-reduce bytes, all and across zones, by its index and pid
    /// (kept after it is gone; a restarted node counts from zero again).
    pub all_reduce: BTreeMap<(usize, Option<u32>), (u64, u64)>,
    /// The outer weights each node showed after its DiLoCo rounds.
    pub outer: OuterLedger,
    /// Whether the last poll found every node that trains finished with the job.
    finished: bool,
    /// Memory and CPU of the node processes and of the testnet.
    pub resources: ResourceLedger,
    /// The leader killed on purpose, if any, and the failover that followed.
    pub failover: Option<LeaderFailover>,
    /// The scenario's actions, in time order.
    pub events: Vec<Event>,
    polls: u64,
}

impl Monitor {
    /// Polls the cluster at time `t` while the trace asks for `target` nodes, reading every
    /// node at once and giving up on what has not answered `within` (a node behind a slow link
    /// may take seconds; the scenario's next fault waits for the poll to end).
    pub fn poll(&mut self, cluster: &Cluster, t: f64, target: u32, within: Duration) {
        let started = Instant::now();
        let deadline = started + within.min(POLL_TIMEOUT);
        let running = cluster.running();
        let pids: Vec<u32> = running
            .iter()
            .filter_map(|&i| cluster.node(i).pid())
            .collect();
        self.resources.observe(&pids);
        let answering = cluster.answering();
        let addrs: Vec<SocketAddr> = answering
            .iter()
            .map(|&i| cluster.node(i).status_addr)
            .collect();
        let client = client_until(deadline);
        let statuses: Vec<(usize, StatusSnapshot)> = answering
            .into_iter()
            .zip(read_each(&addrs, |a| client.status(a).ok()))
            .filter_map(|(i, s)| Some((i, s?)))
            .collect();
        for (i, s) in &statuses {
            self.migrations.observe(&s.migrations, t);
            if let Some(e) = s.training.as_ref().and_then(|t| t.emulated.as_ref()) {
                self.emulated.insert(s.peer_id.clone(), e.clone());
            }
            self.observe_training(cluster, *i, s);
        }
        if let Some(f) = &mut self.failover {
            f.observe(t + started.elapsed().as_secs_f64(), &statuses);
        }
        let phases: Vec<TrainingPhase> = statuses
            .iter()
            .filter_map(|(_, s)| Some(s.training.as_ref()?.phase))
            .collect();
        self.finished = !phases.is_empty() && phases.iter().all(|p| *p == TrainingPhase::Finished);
        let leader = leader_of(&statuses);
        let all = self.polls.is_multiple_of(ALL_STEPS_EVERY);
        let leader_index = leader.map(|(l, _)| l);
        let steps_of: Vec<SocketAddr> = statuses
            .iter()
            .filter(|(i, _)| all || Some(*i) == leader_index)
            .map(|(i, _)| cluster.node(*i).status_addr)
            .collect();
        let client = client_until(deadline);
        for list in read_each(&steps_of, |a| client.steps(a).ok())
            .into_iter()
            .flatten()
        {
            self.steps.observe(&list);
        }
        self.polls += 1;
        let view = leader.map(|(_, s)| s);
        if let Some(t) = view.and_then(|s| s.training.as_ref())
            && !t.estimates.is_empty()
        {
            self.estimates = t.estimates.clone();
        }
        self.timeline.push(Sample {
            t,
            running: running.len() as u32,
            target,
            epoch: view.map_or(0, |s| s.epoch),
            config: view.and_then(|s| s.config),
            step: view.map_or(0, |s| s.step),
            samples: view.map_or(0, |s| s.samples),
            loss: view.and_then(|s| s.loss),
        });
    }

    /// Keeps node `i`'s all-reduce bytes and last round's outer weights as its status `s`
    /// reports them.
    fn observe_training(&mut self, cluster: &Cluster, i: usize, s: &StatusSnapshot) {
        if let Some(t) = &s.training {
            if let Some(outer) = &t.outer {
                self.outer.observe(&s.peer_id, outer);
            }
            let key = (i, cluster.node(i).pid());
            let seen = self.all_reduce.entry(key).or_default();
            seen.0 = seen.0.max(t.allreduce_bytes);
            seen.1 = seen.1.max(t.allreduce_cross_zone_bytes);
        }
    }

    /// Whether every node that trains said at the last poll that the job is done.
    pub fn job_finished(&self) -> bool {
        self.finished
    }

    /// Bytes every node process sent in all-reduces, all and across zones.
    pub fn all_reduce_bytes(&self) -> (u64, u64) {
        self.all_reduce
            .values()
            .fold((0, 0), |(a, c), (x, y)| (a + x, c + y))
    }

    /// Reads node `i`'s `/steps` (e.g. right before it is killed).
    pub fn observe_steps_of(&mut self, cluster: &Cluster, i: usize) {
        if let Ok(list) = cluster.client().steps(cluster.node(i).status_addr) {
            self.steps.observe(&list);
        }
    }

    /// Final reading of every running node. The final committed sequence is the longest
    /// `/steps` list (the node with the full history), re-read until it reaches the highest
    /// step seen anywhere: nodes keep training while they are read one after the other, so
    /// a list read a moment earlier than another may simply not have applied the newest steps
    /// yet. Only a step that does not show up within [`FINAL_TIMEOUT`] counts as missing.
    pub fn finish(&mut self, cluster: &Cluster, t: f64) -> Vec<StepRecord> {
        let patient = Client::with_timeout(FINAL_TIMEOUT);
        let mut longest: Option<(usize, Vec<StepRecord>)> = None;
        for i in cluster.running() {
            let addr = cluster.node(i).status_addr;
            if let Ok(s) = patient.status(addr) {
                self.migrations.observe(&s.migrations, t);
                self.observe_training(cluster, i, &s);
            }
            if let Ok(list) = patient.steps(addr) {
                self.steps.observe(&list);
                if longest.as_ref().is_none_or(|(_, l)| list.len() > l.len()) {
                    longest = Some((i, list));
                }
            }
        }
        let Some((source, mut list)) = longest else {
            return Vec::new();
        };
        let addr = cluster.node(source).status_addr;
        let target = self.steps.last_step();
        let end = Instant::now() + FINAL_TIMEOUT;
        loop {
            list.sort_by_key(|r| r.step);
            if list.last().map(|r| r.step) >= target || Instant::now() >= end {
                return self.steps.with_earlier(list);
            }
            std::thread::sleep(Duration::from_millis(200));
            if let Ok(newer) = patient.steps(addr) {
                self.steps.observe(&newer);
                list = newer;
            }
        }
    }

    /// The latest sample.
    pub fn last(&self) -> Option<&Sample> {
        self.timeline.last()
    }

    /// Whether a leader was killed and no new one was seen yet.
    pub fn awaiting_leader(&self) -> bool {
        self.failover.as_ref().is_some_and(LeaderFailover::pending)
    }

    /// SIGKILLs the node of `cluster` that says it leads, `t` seconds into the replay (after
    /// reading its committed steps), and times the failover; `false` when no node leads.
    pub fn kill_leader(&mut self, cluster: &mut Cluster, t: f64) -> bool {
        let Some((i, status)) = cluster.leader() else {
            return false;
        };
        self.failover = Some(LeaderFailover::new(t, status.peer_id));
        self.events.push(Event {
            t,
            kind: EventKind::Kill,
        });
        self.observe_steps_of(cluster, i);
        cluster.kill(i);
        true
    }
}

/// A client whose requests give up at `deadline` (at once when it passed).
fn client_until(deadline: Instant) -> Client {
    Client::with_timeout(deadline.saturating_duration_since(Instant::now()))
}

/// `read` of every address, each in its own thread, so that one slow node holds up no other.
fn read_each<T: Send>(
    addrs: &[SocketAddr],
    read: impl Fn(SocketAddr) -> Option<T> + Sync,
) -> Vec<Option<T>> {
    let read = &read;
    std::thread::scope(|s| {
        let reads: Vec<_> = addrs.iter().map(|&a| s.spawn(move || read(a))).collect();
        reads.into_iter().map(|r| r.join().ok().flatten()).collect()
    })
}

/// The node that the most nodes name as leader and that answered, with its status; when no
/// one names a leader that answered, the node with the highest epoch.
fn leader_of(statuses: &[(usize, StatusSnapshot)]) -> Option<(usize, &StatusSnapshot)> {
    failover::leader(statuses)
        .or_else(|| statuses.iter().max_by_key(|(_, s)| (s.epoch, s.step)))
        .map(|(i, s)| (*i, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_api::RoleView;

    #[test]
    fn the_leader_is_the_node_that_says_so() {
        let s = |id: &str, role, leader: &str, epoch| StatusSnapshot {
            peer_id: id.into(),
            role,
            leader: Some(leader.into()),
            epoch,
            ..StatusSnapshot::default()
        };
        let list = vec![
            (0, s("a", RoleView::Follower, "b", 5)),
            (3, s("b", RoleView::Leader, "b", 4)),
        ];
        assert_eq!(leader_of(&list).map(|(i, _)| i), Some(3));
        let headless = vec![
            (0, s("a", RoleView::Follower, "x", 5)),
            (1, s("c", RoleView::Candidate, "x", 6)),
        ];
        assert_eq!(leader_of(&headless).map(|(i, _)| i), Some(1));
        assert!(leader_of(&[]).is_none());
    }
}
