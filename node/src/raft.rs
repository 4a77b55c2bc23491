//! The `Raft` actor: drives `parcae_consensus::RaftNode` over the network and is the node's
//! control centre.
//!
//! * ticks raft every `tick_ms`, steps inbound raft messages, sends outbound ones through
//!   [`Network`] and calls `drive` after every batch;
//! * keeps this node's membership record current: until the replicated state lists it (with its
//!   current addresses), it sends `Join` to the leader, or to any connected peer, which relays;
//! * on a notice ([`LeaveRequested`]): gossips it, proposes `Notice`, and exits at the deadline;
//! * as leader: proposes `Notice` for gossiped notices, `Lost` for members unreachable longer
//!   than `lost_timeout_ms`, and `Leave` for leaving members that are gone after their deadline;
//! * publishes a [`StatusSnapshot`] to the [`Status`] actor whenever it changes.
//!
//! Inbound bytes are untrusted: an undecodable frame, or a raft message that is oversized,
//! malformed or forged, disconnects the sending peer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use libp2p::{Multiaddr, PeerId};
use parcae_consensus::state::{Capabilities, MemberStatus, PeerInfo, RaftRole};
use parcae_consensus::{
    Command, NodeEvent, NodeId, ProposalHandle, ProposeError, RaftNode, Role, StepError,
};

use crate::config::NodeConfig;
use crate::metrics::Metrics;
use crate::net::actor::{
    DisconnectPeer, KeepConnected, NetEvent, Network, PublishNotice, SendControl,
};
use crate::notice::{Notice, unix_ms};
use crate::status::{MemberView, NoticeView, RoleView, Status, StatusSnapshot, StepRecord};
use crate::watch::LeaveRequested;
use crate::wire::{ControlMessage, MAX_RAFT_MESSAGE};

/// How often the membership record is checked and a `Join` re-sent if needed.
const JOIN_RETRY: Duration = Duration::from_secs(1);
/// Commit latencies kept for quantiles.
const LATENCY_WINDOW: usize = 10_000;
/// Notices kept for `/status`.
const MAX_NOTICES_SHOWN: usize = 256;

/// Why the raft actor could not start.
#[derive(Debug, thiserror::Error)]
pub enum RaftActorError {
    /// The raft node could not be opened or bootstrapped.
    #[error("raft: {0}")]
    Raft(#[from] parcae_consensus::RaftError),
}

/// A command to propose on behalf of another actor (the planner); answered once the command is
/// accepted for replication (not when it commits).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), String>")]
pub struct ProposeCommand(pub Command);

/// What the planner needs to plan; `None` unless this node leads.
#[derive(Debug, Message)]
#[rtype(result = "Option<PlanningInput>")]
pub struct GetPlanningInput;

/// The leader's view for planning.
#[derive(Debug, Clone, MessageResponse)]
pub struct PlanningInput {
    /// The last availability interval recorded in the replicated state.
    pub last_interval: Option<u64>,
    /// Members that can take work now.
    pub healthy_members: u32,
    /// The replicated state (cloned).
    pub state: parcae_consensus::ControlState,
}

/// Where the node keeps its raft state and who it is.
pub struct RaftSetup {
    /// Local peer id.
    pub peer_id: PeerId,
    /// Raft directory.
    pub dir: PathBuf,
    /// Whether to create a new cluster when the directory is empty (no bootstrap peers given).
    pub found_cluster: bool,
    /// Listen addresses as configured (used until the real ones are known).
    pub listen: Vec<Multiaddr>,
    /// Bootstrap peers (relays for the `Join`).
    pub bootstrap: Vec<PeerId>,
    /// The trainer's data-plane address, recorded in the membership.
    pub data_addr: Option<std::net::SocketAddr>,
}

/// The actor.
pub struct Raft {
    node: RaftNode,
    me: PeerId,
    my_id: NodeId,
    config: NodeConfig,
    net: Addr<Network>,
    status: Addr<Status>,
    metrics: Arc<Metrics>,
    listen_addrs: Vec<Multiaddr>,
    bootstrap: Vec<PeerId>,
    connected: HashSet<PeerId>,
    /// When each member was last seen disconnected or silent (absent: reachable or never
    /// checked).
    unreachable_since: HashMap<NodeId, Instant>,
    /// When each peer last sent a control frame: a frozen or cut-off process keeps its TCP
    /// connections open, so being connected alone does not prove it is alive.
    last_heard: HashMap<NodeId, Instant>,
    /// When the leader last re-admitted a lost member that came back.
    rejoin_proposed: HashMap<NodeId, Instant>,
    peers_by_id: HashMap<NodeId, PeerId>,
    leaving: Option<SystemTime>,
    notices: VecDeque<NoticeView>,
    pending: Vec<(Instant, ProposalHandle)>,
    commit_latency_us: VecDeque<u64>,
    last_status: Option<StatusSnapshot>,
    members_version: Option<Vec<(NodeId, Vec<String>)>>,
    data_addr: Option<String>,
    view: tokio::sync::watch::Sender<Arc<parcae_consensus::ControlState>>,
    view_applied: u64,
}

/// Opens the raft node in `setup.dir`, founding a one-member cluster there when the directory is
/// new and no bootstrap peers were given.
pub fn open_node(setup: &RaftSetup, config: &NodeConfig) -> Result<RaftNode, RaftActorError> {
    let my_id = NodeId::from_peer_bytes(&setup.peer_id.to_bytes());
    let mut raft_config = parcae_consensus::RaftConfig::new(my_id);
    raft_config.election_tick = config.raft.election_ticks;
    raft_config.heartbeat_tick = config.raft.heartbeat_ticks;
    raft_config.max_voters = config.max_voters;
    raft_config.max_message_bytes = MAX_RAFT_MESSAGE;
    let mut node = if !setup.dir.exists() && setup.found_cluster {
        let me = peer_info(
            &setup.peer_id,
            &setup.listen,
            setup.data_addr.map(|a| a.to_string()),
        );
        let mut node = RaftNode::bootstrap(&setup.dir, raft_config, &[me])?;
        node.campaign()?;
        tracing::info!("founded a new cluster");
        node
    } else {
        RaftNode::open(&setup.dir, raft_config)?
    };
    node.drive()?;
    Ok(node)
}

impl Raft {
    /// The actor around an opened raft node.
    pub fn new(
        node: RaftNode,
        setup: RaftSetup,
        config: NodeConfig,
        net: Addr<Network>,
        status: Addr<Status>,
        metrics: Arc<Metrics>,
        view: tokio::sync::watch::Sender<Arc<parcae_consensus::ControlState>>,
    ) -> Self {
        Self {
            data_addr: setup.data_addr.map(|a| a.to_string()),
            view,
            view_applied: 0,
            my_id: node.id(),
            node,
            me: setup.peer_id,
            config,
            net,
            status,
            metrics,
            listen_addrs: setup.listen,
            bootstrap: setup.bootstrap,
            connected: HashSet::new(),
            unreachable_since: HashMap::new(),
            last_heard: HashMap::new(),
            rejoin_proposed: HashMap::new(),
            peers_by_id: HashMap::new(),
            leaving: None,
            notices: VecDeque::new(),
            pending: Vec::new(),
            commit_latency_us: VecDeque::new(),
            last_status: None,
            members_version: None,
        }
    }

    /// Runs raft's ready loop and everything that depends on its output.
    fn drive(&mut self, ctx: &mut Context<Self>) {
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
            match ControlMessage::Raft(out.bytes).encode() {
                Ok(frame) => self.net.do_send(SendControl { to: peer, frame }),
                Err(e) => tracing::error!("cannot encode raft message: {e}"),
            }
        }
        for event in self.node.take_events() {
            self.on_node_event(event);
        }
        self.poll_pending();
        self.sync_membership_view();
        self.publish_view();
        self.publish_status(ctx);
    }

    /// Hands the applied state to the trainer whenever something was applied.
    fn publish_view(&mut self) {
        let applied = self.node.status().applied;
        if applied != self.view_applied || self.view.borrow().members.is_empty() {
            self.view_applied = applied;
            self.view.send_replace(Arc::new(self.node.state().clone()));
        }
    }

    fn on_node_event(&mut self, event: NodeEvent) {
        match event {
            NodeEvent::RoleChanged { role, leader, term } => {
                tracing::info!(?role, leader = ?leader.and_then(|l| self.peer_of(l)), term, "raft role");
                if role == Role::Leader {
                    // Give every member a fresh grace period before it can be declared lost.
                    let now = Instant::now();
                    self.unreachable_since.clear();
                    let ids: Vec<NodeId> = self.node.state().members.keys().copied().collect();
                    self.last_heard.extend(ids.into_iter().map(|id| (id, now)));
                    for (id, _) in self.node.state().members.iter() {
                        if let Some(peer) = self.peer_of(*id)
                            && !self.connected.contains(&peer)
                        {
                            self.unreachable_since.insert(*id, now);
                        }
                    }
                }
            }
            NodeEvent::Applied {
                index,
                command,
                outcome,
            } => {
                if let (
                    Ok(_),
                    Some(Command::StepCommitted {
                        step,
                        epoch,
                        sample_start,
                        samples,
                        loss,
                        ..
                    }),
                ) = (&outcome, &command)
                {
                    self.status.do_send(StepRecord {
                        step: *step,
                        epoch: *epoch,
                        sample_start: *sample_start,
                        samples: *samples,
                        loss: *loss,
                    });
                }
                if let Err(rejection) = &outcome {
                    tracing::debug!(
                        index,
                        kind = command.as_ref().map(|c| c.kind()),
                        "command rejected: {rejection:?}"
                    );
                }
            }
            NodeEvent::ConfChanged {
                voters, learners, ..
            } => tracing::info!(
                voters = voters.len(),
                learners = learners.len(),
                "raft configuration changed"
            ),
            NodeEvent::SnapshotInstalled { index } => tracing::info!(index, "installed snapshot"),
        }
    }

    fn poll_pending(&mut self) {
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

    /// Keeps the peer-id map and the network's keep-connected set in line with the membership.
    fn sync_membership_view(&mut self) {
        let members: Vec<(NodeId, Vec<String>)> = self
            .node
            .state()
            .members
            .iter()
            .map(|(id, m)| (*id, m.peer.addrs.clone()))
            .collect();
        if self.members_version.as_ref() == Some(&members) {
            return;
        }
        let mut keep = Vec::new();
        for (id, m) in self.node.state().members.iter() {
            let Ok(peer) = PeerId::from_bytes(&m.peer.peer_id) else {
                continue;
            };
            self.peers_by_id.insert(*id, peer);
            let addrs: Vec<Multiaddr> =
                m.peer.addrs.iter().filter_map(|a| a.parse().ok()).collect();
            if peer != self.me && m.status != MemberStatus::Lost {
                keep.push((peer, addrs));
            }
        }
        self.metrics.members.set(members.len() as u64);
        self.members_version = Some(members);
        self.net.do_send(KeepConnected(keep));
    }

    fn peer_of(&self, id: NodeId) -> Option<PeerId> {
        if id == self.my_id {
            return Some(self.me);
        }
        self.peers_by_id.get(&id).copied().or_else(|| {
            self.node
                .state()
                .members
                .get(&id)
                .and_then(|m| PeerId::from_bytes(&m.peer.peer_id).ok())
        })
    }

    fn node_id(peer: &PeerId) -> NodeId {
        NodeId::from_peer_bytes(&peer.to_bytes())
    }

    /// Proposes `command` here if leading, else sends it towards the leader.
    fn propose_or_forward(&mut self, command: Command, ctx: &mut Context<Self>) {
        self.metrics.raft_proposals_total.inc();
        match self.node.propose(&command) {
            Ok(handle) => {
                self.pending.push((Instant::now(), handle));
                self.drive(ctx);
            }
            Err(ProposeError::NotLeader { leader }) => {
                let target = leader
                    .and_then(|l| self.peer_of(l))
                    .filter(|p| *p != self.me)
                    .or_else(|| self.relay_peer());
                let (Some(to), Ok(bytes)) = (target, command.encode()) else {
                    tracing::debug!(
                        kind = command.kind(),
                        "no leader or relay to send the proposal to yet"
                    );
                    return;
                };
                if let Ok(frame) = ControlMessage::Propose(bytes).encode() {
                    self.net.do_send(SendControl { to, frame });
                }
            }
            Err(e) => tracing::warn!(kind = command.kind(), "proposal failed: {e}"),
        }
    }

    /// A connected peer to relay through when no leader is known: bootstrap peers first.
    fn relay_peer(&self) -> Option<PeerId> {
        self.bootstrap
            .iter()
            .find(|p| self.connected.contains(p))
            .or_else(|| self.connected.iter().next())
            .copied()
    }

    /// Sends `Join` until the replicated state lists this node, healthy, at its current addresses.
    fn maintain_membership(&mut self, ctx: &mut Context<Self>) {
        if self.leaving.is_some() {
            return;
        }
        let addrs: Vec<String> = self.listen_addrs.iter().map(|a| a.to_string()).collect();
        let current = self.node.state().members.get(&self.my_id).is_some_and(|m| {
            m.status.is_healthy() && m.peer.addrs == addrs && m.peer.data_addr == self.data_addr
        });
        if !current {
            let peer = peer_info(&self.me, &self.listen_addrs, self.data_addr.clone());
            self.propose_or_forward(
                Command::Join {
                    node: self.my_id,
                    peer,
                },
                ctx,
            );
        }
    }

    /// Leader duties on every tick: lost detection and forgetting departed members.
    fn leader_duties(&mut self, ctx: &mut Context<Self>) {
        if !self.node.is_leader() {
            return;
        }
        let now = Instant::now();
        let lost_after = Duration::from_millis(self.config.raft.lost_timeout_ms);
        let now_ms = unix_ms(SystemTime::now());
        let mut commands = Vec::new();
        for (id, m) in self.node.state().members.iter() {
            if *id == self.my_id {
                continue;
            }
            let Some(peer) = self.peer_of(*id) else {
                continue;
            };
            let heard = self
                .last_heard
                .get(id)
                .is_some_and(|t| now.duration_since(*t) < lost_after);
            if self.connected.contains(&peer) && heard {
                self.unreachable_since.remove(id);
                // Back after being declared lost (a healed partition, a resumed process): it
                // may have been removed from raft and cannot learn that it must re-join, so
                // the leader re-admits it with its recorded identity.
                if m.status == MemberStatus::Lost
                    && self
                        .rejoin_proposed
                        .get(id)
                        .is_none_or(|t| now.duration_since(*t) >= JOIN_RETRY)
                {
                    self.rejoin_proposed.insert(*id, now);
                    commands.push(Command::Join {
                        node: *id,
                        peer: m.peer.clone(),
                    });
                }
                continue;
            }
            let since = *self.unreachable_since.entry(*id).or_insert(now);
            match m.status {
                MemberStatus::Leaving { deadline_ms } if deadline_ms <= now_ms => {
                    commands.push(Command::Leave { node: *id });
                }
                MemberStatus::Active | MemberStatus::Spare
                    if now.duration_since(since) >= lost_after =>
                {
                    commands.push(Command::Lost { node: *id });
                }
                _ => {}
            }
        }
        for command in commands {
            if let Some(id) = match &command {
                Command::Lost { node } | Command::Leave { node } => Some(*node),
                _ => None,
            } {
                tracing::info!(node = ?self.peer_of(id), kind = command.kind(), "leader marks member");
                // Do not propose again until it is seen again or the grace restarts.
                self.unreachable_since
                    .insert(id, now + Duration::from_secs(3600));
            }
            self.propose_or_forward(command, ctx);
        }
    }

    fn on_control(&mut self, from: PeerId, frame: Vec<u8>, ctx: &mut Context<Self>) {
        // Answers must reach a sender we may not know from the membership yet (a new node
        // learns its leader's peer id this way before it has any state).
        self.peers_by_id.insert(Self::node_id(&from), from);
        self.last_heard.insert(Self::node_id(&from), Instant::now());
        let message = match ControlMessage::decode(&frame) {
            Ok(m) => m,
            Err(e) => return self.punish(from, format!("undecodable control frame: {e}")),
        };
        match message {
            ControlMessage::Raft(bytes) => match self.node.step(Self::node_id(&from), &bytes) {
                Ok(()) => self.drive(ctx),
                Err(
                    e @ (StepError::TooLarge { .. }
                    | StepError::Malformed(_)
                    | StepError::WrongSender { .. }),
                ) => self.punish(from, format!("bad raft message: {e}")),
                Err(e) => tracing::debug!(peer = %from, "raft message refused: {e}"),
            },
            ControlMessage::Propose(bytes) => self.on_proposal(from, from.to_bytes(), &bytes, ctx),
            ControlMessage::Forwarded { origin, command } => {
                if self
                    .node
                    .state()
                    .members
                    .contains_key(&Self::node_id(&from))
                {
                    self.on_proposal(from, origin, &command, ctx);
                } else {
                    self.punish(from, "relayed a proposal without being a member".into());
                }
            }
        }
    }

    /// A node asks for a change about itself: check it, then propose or relay it.
    fn on_proposal(
        &mut self,
        from: PeerId,
        origin: Vec<u8>,
        bytes: &[u8],
        ctx: &mut Context<Self>,
    ) {
        let command = match Command::decode(bytes) {
            Ok(c) => c,
            Err(e) => return self.punish(from, format!("undecodable proposal: {e}")),
        };
        let origin_id = NodeId::from_peer_bytes(&origin);
        let state = self.node.state();
        let allowed = match &command {
            Command::Join { node, peer } => *node == origin_id && peer.peer_id == origin,
            Command::Notice { node, .. }
            | Command::Leave { node }
            | Command::CostReport { node, .. } => *node == origin_id,
            // Training reports come from nodes of the plan they ran under.
            Command::StepCommitted { epoch, .. } => state
                .plan
                .as_ref()
                .is_some_and(|p| p.epoch == *epoch && p.assignment.contains_key(&origin_id)),
            Command::Checkpointed { holders, .. } => {
                holders.contains(&origin_id) && state.members.contains_key(&origin_id)
            }
            _ => false,
        };
        if !allowed {
            return self.punish(
                from,
                format!("{} proposal not about its sender", command.kind()),
            );
        }
        if self.node.is_leader() {
            self.propose_or_forward(command, ctx);
        } else if let Some(leader) = self.node.leader().and_then(|l| self.peer_of(l))
            && leader != self.me
            && leader != from
        {
            let relay = ControlMessage::Forwarded {
                origin,
                command: bytes.to_vec(),
            };
            if let Ok(frame) = relay.encode() {
                self.net.do_send(SendControl { to: leader, frame });
            }
        }
    }

    fn punish(&mut self, peer: PeerId, reason: String) {
        self.net.do_send(DisconnectPeer { peer, reason });
    }

    fn record_notice(&mut self, notice: &Notice, received: u64) {
        let Some(peer) = notice.peer() else { return };
        if self.notices.len() == MAX_NOTICES_SHOWN {
            self.notices.pop_front();
        }
        self.notices.push_back(NoticeView {
            peer_id: peer.to_string(),
            deadline_unix_ms: notice.deadline_unix_ms,
            issued_unix_ms: notice.issued_unix_ms,
            received_unix_ms: received,
        });
    }

    fn publish_status(&mut self, _ctx: &mut Context<Self>) {
        let st = self.node.status();
        let state = self.node.state();
        let voters: HashSet<NodeId> = st.voters.iter().copied().collect();
        let members = state
            .members
            .iter()
            .map(|(id, m)| MemberView {
                peer_id: PeerId::from_bytes(&m.peer.peer_id)
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                voter: voters.contains(id) || m.role == RaftRole::Voter && voters.is_empty(),
                status: match m.status {
                    MemberStatus::Active => "active",
                    MemberStatus::Spare => "spare",
                    MemberStatus::Leaving { .. } => "leaving",
                    MemberStatus::Lost => "lost",
                },
                deadline_unix_ms: match m.status {
                    MemberStatus::Leaving { deadline_ms } => Some(deadline_ms),
                    _ => None,
                },
            })
            .collect();
        let mut lat: Vec<u64> = self.commit_latency_us.iter().copied().collect();
        lat.sort_unstable();
        let snapshot = StatusSnapshot {
            peer_id: self.me.to_string(),
            role: match st.role {
                Role::Leader => RoleView::Leader,
                Role::Follower => RoleView::Follower,
                Role::Candidate | Role::PreCandidate => RoleView::Candidate,
                Role::Learner => RoleView::Learner,
            },
            leader: st
                .leader
                .and_then(|l| self.peer_of(l))
                .map(|p| p.to_string()),
            term: st.term,
            members,
            epoch: state.plan.as_ref().map_or(0, |p| p.epoch),
            config: state
                .plan
                .as_ref()
                .map(|p| (p.data_parallel, p.pipeline_stages)),
            step: state.progress.last_committed_step.unwrap_or(0),
            loss: state.progress.recent_losses.back().map(|l| l.loss),
            samples: state.progress.sample_cursor,
            commit_index: st.commit,
            applied_index: st.applied,
            listen_addrs: self.listen_addrs.iter().map(|a| a.to_string()).collect(),
            data_addr: self.data_addr.clone(),
            connected_peers: self.connected.iter().map(|p| p.to_string()).collect(),
            leaving_deadline_unix_ms: self.leaving.map(unix_ms),
            notices: self.notices.iter().cloned().collect(),
            commit_latency_us: crate::status::LatencySummary::of_sorted(&lat),
        };
        self.metrics.raft_term.set(st.term);
        self.metrics
            .raft_is_leader
            .set(u64::from(st.role == Role::Leader));
        self.metrics.raft_commit_index.set(st.commit);
        self.metrics.raft_applied_index.set(st.applied);
        let m = self.node.metrics();
        self.metrics.raft_refused_messages.set(
            m.oversized_messages + m.malformed_messages + m.refused_messages + m.raft_step_errors,
        );
        self.metrics.raft_rejected_commands.set(m.rejected_commands);
        self.metrics
            .raft_membership_proposals
            .set(m.membership_proposals);
        self.metrics
            .raft_snapshots_installed
            .set(m.snapshots_installed);
        if self.last_status.as_ref() != Some(&snapshot) {
            self.status.do_send(snapshot.clone());
            self.last_status = Some(snapshot);
        }
    }
}

/// This node's identity and addresses as recorded in the membership.
fn peer_info(peer: &PeerId, addrs: &[Multiaddr], data_addr: Option<String>) -> PeerInfo {
    PeerInfo {
        peer_id: peer.to_bytes(),
        addrs: addrs.iter().map(|a| a.to_string()).collect(),
        data_addr,
        caps: Capabilities::default(),
    }
}

impl Actor for Raft {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let tick = Duration::from_millis(self.config.raft.tick_ms);
        ctx.run_interval(tick, |act, ctx| {
            act.node.tick();
            act.leader_duties(ctx);
            act.drive(ctx);
        });
        ctx.run_interval(JOIN_RETRY, |act, ctx| act.maintain_membership(ctx));
        self.drive(ctx);
    }
}

impl Handler<NetEvent> for Raft {
    type Result = ();

    fn handle(&mut self, event: NetEvent, ctx: &mut Context<Self>) {
        match event {
            NetEvent::Listening(addr) => {
                let mut base = addr.clone();
                base.pop();
                if !self.listen_addrs.contains(&base) {
                    // Replace configured addresses (port 0, unspecified IPs) with real ones.
                    self.listen_addrs.retain(|a| !is_placeholder(a));
                    self.listen_addrs.push(base);
                    self.maintain_membership(ctx);
                }
            }
            NetEvent::Connected(peer) => {
                self.connected.insert(peer);
                self.peers_by_id.insert(Self::node_id(&peer), peer);
                self.unreachable_since.remove(&Self::node_id(&peer));
                if !self.node.state().members.contains_key(&self.my_id) {
                    self.maintain_membership(ctx);
                }
            }
            NetEvent::Disconnected(peer) => {
                self.connected.remove(&peer);
                self.unreachable_since
                    .entry(Self::node_id(&peer))
                    .or_insert_with(Instant::now);
            }
            NetEvent::Control { from, frame } => self.on_control(from, frame, ctx),
            NetEvent::Notice { from, notice } => {
                self.record_notice(&notice, unix_ms(SystemTime::now()));
                tracing::info!(peer = %from, deadline = notice.deadline_unix_ms, "preemption notice received");
                if self.node.is_leader() {
                    self.propose_or_forward(
                        Command::Notice {
                            node: Self::node_id(&from),
                            deadline_ms: notice.deadline_unix_ms,
                        },
                        ctx,
                    );
                }
                self.publish_status(ctx);
            }
            NetEvent::SendFailed(peer) => self.node.report_unreachable(Self::node_id(&peer)),
        }
    }
}

/// Whether a configured listen address cannot be dialled as is (port 0 or unspecified IP).
fn is_placeholder(addr: &Multiaddr) -> bool {
    use libp2p::multiaddr::Protocol;
    addr.iter().any(|p| match p {
        Protocol::Tcp(0) => true,
        Protocol::Ip4(ip) => ip.is_unspecified(),
        Protocol::Ip6(ip) => ip.is_unspecified(),
        _ => false,
    })
}

impl Handler<LeaveRequested> for Raft {
    type Result = ();

    fn handle(&mut self, msg: LeaveRequested, ctx: &mut Context<Self>) {
        if self.leaving.is_some() {
            return;
        }
        self.leaving = Some(msg.deadline);
        let grace = msg
            .deadline
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let notice = Notice::with_deadline(self.me, msg.deadline, msg.source);
        self.record_notice(&notice, notice.issued_unix_ms);
        match notice.encode() {
            Ok(bytes) => {
                let net = self.net.clone();
                actix::spawn(async move {
                    match net.send(PublishNotice(bytes)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("notice not gossiped: {e}"),
                        Err(e) => tracing::warn!("network actor gone: {e}"),
                    }
                });
            }
            Err(e) => tracing::error!("cannot encode notice: {e}"),
        }
        tracing::warn!(source = ?msg.source, ?grace, "leaving the cluster");
        self.propose_or_forward(
            Command::Notice {
                node: self.my_id,
                deadline_ms: notice.deadline_unix_ms,
            },
            ctx,
        );
        ctx.run_later(grace, |_, _| {
            tracing::info!("grace period over: exiting");
            System::current().stop_with_code(0);
        });
    }
}

/// Commands from the trainer (step reports, checkpoints, cost reports): proposed here when
/// leading, else forwarded to the leader.
impl StreamHandler<Command> for Raft {
    fn handle(&mut self, command: Command, ctx: &mut Context<Self>) {
        self.propose_or_forward(command, ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<ProposeCommand> for Raft {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: ProposeCommand, ctx: &mut Context<Self>) -> Self::Result {
        self.metrics.raft_proposals_total.inc();
        let handle = self.node.propose(&msg.0).map_err(|e| e.to_string())?;
        self.pending.push((Instant::now(), handle));
        self.drive(ctx);
        Ok(())
    }
}

impl Handler<GetPlanningInput> for Raft {
    type Result = Option<PlanningInput>;

    fn handle(&mut self, _: GetPlanningInput, _: &mut Context<Self>) -> Self::Result {
        if !self.node.is_leader() {
            return None;
        }
        let state = self.node.state().clone();
        Some(PlanningInput {
            last_interval: state.availability.back().map(|s| s.interval),
            healthy_members: state
                .members
                .values()
                .filter(|m| m.status.is_healthy())
                .count() as u32,
            state,
        })
    }
}
