//! The raft driver: the one owner of `parcae_consensus::RaftNode`, on an arbiter of its own.
//!
//! Its handlers only move data into the node (inbound raft messages, proposals, ticks, network
//! events) and schedule one ready cycle; actix drains the whole mailbox before it runs that
//! cycle, so a burst of messages costs one `drive` (and one fsync), as in raft-rs's
//! `five_mem_node`. The ready cycle, in order: `RaftNode::drive` (persist, apply, in raft's
//! `on_ready` order), send raft's messages, publish what was applied (the state on a watch
//! channel, committed steps to `/steps`), then the `/status` projection and the gauges.
//!
//! Every decision is a pure function of another module: [`authorize`](super::authorize) for
//! proposals from peers, [`liveness`](super::liveness) for lost members,
//! [`membership`](super::membership) for this node's `Join` and notice dedup, and
//! [`project`](super::project) for `/status`. What comes in from the network and the notice
//! watcher is handled in `inbound`; the cluster keys' rotation in `keys`; opening the raft
//! storage at start in `open`.

mod inbound;
mod keys;
mod open;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use libp2p::{Multiaddr, PeerId};
use parcae_consensus::state::{MemberStatus, StateEvent};
use parcae_consensus::{Command, NodeEvent, NodeId, ProposalHandle, ProposeError, RaftNode, Role};

use super::authorize::authorize;
use super::known_peers;
use super::liveness::Liveness;
use super::membership::{NoticesInFlight, dialable, join_needed, peer_info};
use super::peer_clocks::PeerClocks;
use super::project::{LocalView, PeerNames, project};
use super::proof;
use super::proposal::{Propose, ProposeFailed, Routed, Watches};
use crate::clock::{self, unix_ms};
use crate::config::NodeConfig;
use crate::data_dir::DataDir;
use crate::keyring::KeyRing;
use crate::metrics::Metrics;
use crate::net::actor::Network;
use crate::net::messages::{KeepConnected, RefusePeers, SendControl};
use crate::retry::Retry;
use crate::status::{
    ClockRefusalView, NoticeView, Status, StatusSnapshot, StepsRewound, StepsSkipped, step_record,
};
use crate::wire::ControlMessage;

/// How often this node's membership record is checked against what it should say.
const JOIN_CHECK: Duration = Duration::from_millis(250);
/// First delay before a `Join` that has not taken effect is proposed again.
const JOIN_RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest delay between proposals of one `Join`.
const JOIN_RETRY_MAX: Duration = Duration::from_secs(4);
/// Election timeouts without a known leader after which this node re-announces itself (see
/// [`join_needed`]).
const LEADERLESS_PATIENCE: u32 = 3;
/// Commit latencies kept for quantiles.
const LATENCY_WINDOW: usize = 10_000;
/// Notices kept for `/status`.
const MAX_NOTICES_SHOWN: usize = 256;
/// Clock refusals kept for `/status`.
const MAX_CLOCK_REFUSALS_SHOWN: usize = 16;
/// Addresses of a joining node dialled back at most.
const MAX_DIAL_BACK_ADDRS: usize = 8;
/// How often the staged cluster key file is read again and the leader checks whether a key
/// rotation is due.
const KEY_CHECK: Duration = Duration::from_secs(2);

pub use open::{RaftActorError, RaftSetup, open_node};

/// Where the driver publishes what it applied.
pub struct Outlets {
    /// The applied state (the trainer's and the planner's view) and the leadership.
    pub watches: Watches,
    /// `/status` and `/steps`.
    pub status: Addr<Status>,
    /// Gauges and counters.
    pub metrics: Arc<Metrics>,
}

/// The actor.
pub struct ControlDriver {
    node: RaftNode,
    me: PeerId,
    /// Signs what this node proposes through others ([`proof`]).
    identity: libp2p::identity::Keypair,
    my_id: NodeId,
    config: NodeConfig,
    net: Addr<Network>,
    out: Outlets,
    listen_addrs: Vec<Multiaddr>,
    data_dir: DataDir,
    data_addr: Option<String>,
    job: Option<parcae_consensus::state::Digest32>,
    connected: HashSet<PeerId>,
    peer_clocks: PeerClocks,
    liveness: Liveness,
    /// When this node's `Join` may be proposed again.
    join_retry: Retry,
    /// When this node last knew a leader.
    leader_seen: Instant,
    notices_in_flight: NoticesInFlight,
    leaving: Option<SystemTime>,
    notices: VecDeque<NoticeView>,
    clock_refusals: VecDeque<ClockRefusalView>,
    pending: Vec<(Instant, ProposalHandle)>,
    commit_latency_us: VecDeque<u64>,
    last_status: Option<StatusSnapshot>,
    /// The peers' names on `/status`, kept between its projections.
    peer_names: PeerNames,
    members_version: Option<Vec<(NodeId, Vec<String>, bool)>>,
    published_applied: Option<u64>,
    ready_scheduled: bool,
    /// The cluster keys ([`crate::keyring`]).
    keys: KeyRing,
    /// The last problem with the keys that was logged (each is logged once, not every check).
    key_problem: Option<String>,
}

/// Runs one ready cycle; sent by the driver to itself, so it runs after the mailbox is drained.
#[derive(Message)]
#[rtype(result = "()")]
struct Ready;

impl ControlDriver {
    /// The driver around an opened raft node.
    pub fn new(
        node: RaftNode,
        setup: RaftSetup,
        config: NodeConfig,
        net: Addr<Network>,
        out: Outlets,
    ) -> Self {
        Self {
            data_addr: setup.data_addr.map(|a| a.to_string()),
            job: setup.job,
            my_id: node.id(),
            node,
            me: setup.peer_id,
            identity: setup.identity,
            config,
            net,
            out,
            listen_addrs: dialable(setup.listen),
            data_dir: setup.data_dir,
            connected: HashSet::new(),
            peer_clocks: PeerClocks::default(),
            liveness: Liveness::default(),
            join_retry: Retry::new(JOIN_RETRY_MIN, JOIN_RETRY_MAX),
            leader_seen: Instant::now(),
            notices_in_flight: NoticesInFlight::default(),
            leaving: None,
            notices: VecDeque::new(),
            clock_refusals: VecDeque::new(),
            pending: Vec::new(),
            commit_latency_us: VecDeque::new(),
            last_status: None,
            peer_names: PeerNames::default(),
            members_version: None,
            published_applied: None,
            ready_scheduled: false,
            keys: setup.keys,
            key_problem: None,
        }
    }

    /// Asks for one ready cycle once the mailbox is drained.
    fn schedule_ready(&mut self, ctx: &mut Context<Self>) {
        if !self.ready_scheduled {
            self.ready_scheduled = true;
            ctx.notify(Ready);
        }
    }

    /// The ready cycle.
    fn on_ready(&mut self) {
        if let Err(e) = self.node.drive() {
            tracing::error!("raft drive failed, stopping: {e}");
            System::current().stop_with_code(3);
            return;
        }
        for out in self.node.take_messages() {
            let Some(peer) = self.peer_of(out.to) else {
                tracing::debug!(to = %out.to, "no peer id for raft recipient");
                continue;
            };
            self.send_control(peer, ControlMessage::Raft(out.bytes));
        }
        for event in self.node.take_events() {
            self.on_node_event(event);
        }
        self.record_commit_latencies();
        self.sync_membership_view();
        self.publish_state();
        self.publish_status();
    }

    fn send_control(&self, to: PeerId, message: ControlMessage) {
        match message.encode() {
            Ok(frame) => self.net.do_send(SendControl { to, frame }),
            Err(e) => tracing::error!("cannot encode a control message: {e}"),
        }
    }

    /// Hands the applied state to its subscribers whenever something was applied.
    fn publish_state(&mut self) {
        let applied = self.node.status().applied;
        if self.published_applied != Some(applied) {
            self.published_applied = Some(applied);
            self.out
                .watches
                .state
                .send_replace(Arc::new(self.node.state().clone()));
        }
        let now = self.node.is_leader();
        self.out
            .watches
            .leading
            .send_if_modified(|leading| std::mem::replace(leading, now) != now);
    }

    fn on_node_event(&mut self, event: NodeEvent) {
        match event {
            NodeEvent::RoleChanged { role, leader, term } => {
                tracing::info!(?role, leader = ?leader.and_then(|l| self.peer_of(l)), term, "raft role");
                if role == Role::Leader {
                    let connected: HashSet<NodeId> = self.connected.iter().map(node_id).collect();
                    self.liveness.became_leader(
                        self.node.state(),
                        |id| connected.contains(&id),
                        Instant::now(),
                    );
                }
            }
            NodeEvent::Applied {
                index,
                command,
                outcome,
            } => match (&outcome, command.as_deref()) {
                (Ok(_), Some(c @ Command::StepCommitted { .. })) => {
                    if let Some(record) = step_record(c, self.node.state()) {
                        self.out.status.do_send(record);
                    }
                }
                (Ok(events), _) => {
                    for event in events {
                        if let StateEvent::RolledBack { from_step, to_step } = event {
                            tracing::warn!(
                                from_step,
                                to_step,
                                "rolled back to the newest complete checkpoint"
                            );
                            self.out.status.do_send(StepsRewound {
                                next_step: *to_step,
                            });
                        }
                    }
                }
                (Err(rejection), _) => tracing::debug!(
                    index,
                    kind = command.as_ref().map(|c| c.kind()),
                    "command rejected: {rejection:?}"
                ),
            },
            NodeEvent::ConfChanged {
                voters, learners, ..
            } => tracing::info!(
                voters = voters.len(),
                learners = learners.len(),
                "raft configuration changed"
            ),
            NodeEvent::SnapshotInstalled { index } => {
                tracing::info!(index, "installed snapshot");
                self.out.status.do_send(StepsSkipped);
            }
        }
    }

    fn record_commit_latencies(&mut self) {
        let now = Instant::now();
        let mut done = Vec::new();
        self.pending
            .retain_mut(|(started, handle)| match handle.try_outcome() {
                None => true,
                Some(outcome) => {
                    if outcome.is_ok() {
                        done.push(now.duration_since(*started).as_micros() as u64);
                    }
                    false
                }
            });
        for us in done {
            if self.commit_latency_us.len() == LATENCY_WINDOW {
                self.commit_latency_us.pop_front();
            }
            self.commit_latency_us.push_back(us);
        }
    }

    /// Keeps the network's keep-connected set and the remembered members in line with the
    /// membership.
    fn sync_membership_view(&mut self) {
        // Whether a member is lost is part of the view: a lost member that rejoins at the same
        // addresses must be dialled again (a leader it never knew can reach it no other way).
        let members: Vec<(NodeId, Vec<String>, bool)> = self
            .node
            .state()
            .members
            .iter()
            .map(|(id, m)| (*id, m.peer.addrs.clone(), m.status == MemberStatus::Lost))
            .collect();
        if self.members_version.as_ref() == Some(&members) {
            return;
        }
        let keep: Vec<(PeerId, Vec<Multiaddr>)> = self
            .node
            .state()
            .members
            .values()
            .filter(|m| m.status != MemberStatus::Lost)
            .filter_map(|m| {
                let peer = PeerId::from_bytes(&m.peer.peer_id).ok()?;
                let addrs: Vec<Multiaddr> =
                    m.peer.addrs.iter().filter_map(|a| a.parse().ok()).collect();
                (peer != self.me).then_some((peer, addrs))
            })
            .collect();
        self.out.metrics.members.set(members.len() as u64);
        self.members_version = Some(members);
        if !keep.is_empty()
            && let Err(e) = known_peers::store(
                &self.data_dir.known_peers(),
                &known_peers::remembered(&keep),
            )
        {
            let path = self.data_dir.known_peers();
            tracing::warn!(path = %path.display(), "cannot remember the members: {e}");
        }
        self.net.do_send(KeepConnected(keep));
        let state = self.node.state();
        if state.is_retired(self.my_id) {
            tracing::error!(
                "this node's identity left the cluster and is refused there; restart it with --resync to come back as a new member"
            );
        }
        let retired = state
            .retired
            .iter()
            .filter_map(|r| PeerId::from_bytes(&r.peer_id).ok())
            .collect();
        self.net.do_send(RefusePeers(retired));
    }

    /// The peer id of a raft id: this node, a member, or a peer that sent a control frame.
    fn peer_of(&self, id: NodeId) -> Option<PeerId> {
        if id == self.my_id {
            return Some(self.me);
        }
        self.node
            .state()
            .members
            .get(&id)
            .and_then(|m| PeerId::from_bytes(&m.peer.peer_id).ok())
            .or_else(|| self.connected.iter().find(|p| node_id(p) == id).copied())
    }

    /// The one way a command enters raft: proposed here when leading; otherwise sent to the
    /// leader (or a relay while no leader is known) if a peer may propose it at all, since a
    /// leader's decision (a plan, a loss) forwarded would get this node disconnected.
    fn propose(
        &mut self,
        command: Command,
        ctx: &mut Context<Self>,
    ) -> Result<Routed, ProposeFailed> {
        self.out.metrics.raft_proposals_total.inc();
        if self.node.is_leader()
            && let Command::Notice { node, deadline_ms } = command
            && !self
                .notices_in_flight
                .admit(self.node.state(), node, deadline_ms, Instant::now())
        {
            return Ok(Routed::AlreadyOnItsWay);
        }
        match self.node.propose(&command) {
            Ok(handle) => {
                self.pending.push((Instant::now(), handle));
                self.schedule_ready(ctx);
                Ok(Routed::Proposed)
            }
            Err(ProposeError::NotLeader { leader }) => {
                authorize(self.node.state(), &self.me.to_bytes(), &command)
                    .map_err(|_| ProposeFailed::NotLeader)?;
                let to = leader
                    .and_then(|l| self.peer_of(l))
                    .filter(|p| *p != self.me)
                    .or_else(|| self.relay_peer())
                    .ok_or(ProposeFailed::NoRoute)?;
                let bytes = command.encode().map_err(ProposeFailed::Encode)?;
                let signed = proof::sign(&self.identity, bytes, clock::now_ms())
                    .map_err(ProposeFailed::Sign)?;
                self.send_control(to, ControlMessage::Propose(signed));
                Ok(Routed::Forwarded)
            }
            Err(e) => Err(ProposeFailed::Raft(e)),
        }
    }

    /// [`Self::propose`] for commands nobody waits on: failures are logged.
    fn propose_logged(&mut self, command: Command, ctx: &mut Context<Self>) {
        let kind = command.kind();
        if let Err(e) = self.propose(command, ctx) {
            tracing::debug!(kind, "not proposed: {e}");
        }
    }

    /// A connected peer to relay through when no leader is known: members first (they know
    /// the leader sooner than a peer that is joining too).
    fn relay_peer(&self) -> Option<PeerId> {
        let members = &self.node.state().members;
        self.connected
            .iter()
            .find(|p| members.contains_key(&node_id(p)))
            .or_else(|| self.connected.iter().next())
            .copied()
    }

    /// Sends `Join` until the replicated state lists this node, healthy, at its current
    /// addresses, job and keys.
    fn maintain_membership(&mut self, ctx: &mut Context<Self>) {
        self.settle_keys();
        if self.leaving.is_some() {
            return;
        }
        let now = Instant::now();
        if self.node.leader().is_some() {
            self.leader_seen = now;
        }
        let me = peer_info(
            &self.me,
            &self.listen_addrs,
            self.data_addr.clone(),
            self.job,
            self.keys.ids(),
            self.config.capabilities(),
        );
        let leaderless = now.saturating_duration_since(self.leader_seen);
        let patience = self.config.raft_election_timeout() * LEADERLESS_PATIENCE;
        let Some(join) = join_needed(self.node.state(), &me, leaderless, patience) else {
            self.join_retry.reset();
            return;
        };
        if self.join_retry.due(now) {
            self.join_retry.attempted(now);
            // Our clock again, ahead of the `Join` on the same stream: the one sent when the
            // connection came up is lost with a duplicate connection that closes (a dial each
            // way), and without it a peer whose clock is minutes off refuses every `Join`.
            for &peer in &self.connected {
                self.send_control(peer, ControlMessage::Clock(clock::now_ms()));
            }
            self.propose_logged(join, ctx);
        }
    }

    /// The leader's duty on every tick: members lost, gone, or back.
    fn check_liveness(&mut self, ctx: &mut Context<Self>) {
        if !self.node.is_leader() {
            return;
        }
        let connected: HashSet<NodeId> = self.connected.iter().map(node_id).collect();
        let commands = self.liveness.check(
            self.node.state(),
            self.my_id,
            |id| connected.contains(&id),
            Instant::now(),
            clock::now_ms(),
            self.config.lost_timeout(),
        );
        for command in commands {
            tracing::info!(kind = command.kind(), "leader marks member");
            self.propose_logged(command, ctx);
        }
    }

    fn publish_status(&mut self) {
        let st = self.node.status();
        let mut latencies: Vec<u64> = self.commit_latency_us.iter().copied().collect();
        latencies.sort_unstable();
        let notices: Vec<NoticeView> = self.notices.iter().cloned().collect();
        let clock_refusals: Vec<ClockRefusalView> = self.clock_refusals.iter().cloned().collect();
        let local = LocalView {
            me: self.me,
            leader: st.leader.and_then(|l| self.peer_of(l)),
            listen_addrs: self.listen_addrs.iter().map(|a| a.to_string()).collect(),
            data_addr: self.data_addr.clone(),
            connected: self.connected.iter().copied().collect(),
            leaving_deadline_unix_ms: self.leaving.map(unix_ms),
            notices: &notices,
            clock_refusals: &clock_refusals,
            sorted_commit_latency_us: &latencies,
            keys_held: self.keys.ids(),
        };
        let snapshot = project(local, &st, self.node.state(), &mut self.peer_names);
        let gauges = &self.out.metrics;
        gauges.raft_term.set(st.term);
        gauges
            .raft_is_leader
            .set(u64::from(st.role == Role::Leader));
        gauges.raft_commit_index.set(st.commit);
        gauges.raft_applied_index.set(st.applied);
        let m = self.node.metrics();
        gauges.raft_refused_messages.set(
            m.oversized_messages + m.malformed_messages + m.refused_messages + m.raft_step_errors,
        );
        gauges.raft_rejected_commands.set(m.rejected_commands);
        gauges.raft_membership_proposals.set(m.membership_proposals);
        gauges.raft_snapshots_installed.set(m.snapshots_installed);
        if self.last_status.as_ref() != Some(&snapshot) {
            self.out.status.do_send(snapshot.clone());
            self.last_status = Some(snapshot);
        }
    }
}

fn node_id(peer: &PeerId) -> NodeId {
    NodeId::from_peer_bytes(&peer.to_bytes())
}

impl Actor for ControlDriver {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let tick = Duration::from_millis(self.config.raft.tick_ms);
        ctx.run_interval(tick, |act, ctx| {
            act.node.tick();
            act.check_liveness(ctx);
            act.schedule_ready(ctx);
        });
        ctx.run_interval(JOIN_CHECK, |act, ctx| act.maintain_membership(ctx));
        ctx.run_interval(KEY_CHECK, |act, ctx| act.check_keys(ctx));
        self.schedule_ready(ctx);
    }
}

impl Handler<Ready> for ControlDriver {
    type Result = ();

    fn handle(&mut self, _: Ready, _: &mut Context<Self>) {
        self.ready_scheduled = false;
        self.on_ready();
    }
}

/// The trainer started after the node did (it adopted the cluster's job): the membership
/// record is to carry its data plane's address and its job.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TrainerReady {
    /// The data plane's address.
    pub data_addr: std::net::SocketAddr,
    /// The digest of the job the trainer trains.
    pub job: parcae_consensus::state::Digest32,
}

impl Handler<TrainerReady> for ControlDriver {
    type Result = ();

    fn handle(&mut self, ready: TrainerReady, ctx: &mut Context<Self>) {
        self.data_addr = Some(ready.data_addr.to_string());
        self.job = Some(ready.job);
        self.join_retry.reset();
        self.maintain_membership(ctx);
    }
}

impl Handler<Propose> for ControlDriver {
    type Result = Result<Routed, ProposeFailed>;

    fn handle(&mut self, Propose(command): Propose, ctx: &mut Context<Self>) -> Self::Result {
        self.propose(command, ctx)
    }
}
