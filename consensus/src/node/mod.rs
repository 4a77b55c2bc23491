//! [`RaftNode`]: the transport-agnostic raft driver.
//!
//! It owns a raft-rs `RawNode` over [`DiskStorage`] and the applied [`ControlState`]. The caller
//! feeds it (`tick`, `step`, `propose`, `read_index`, `transfer_leader`), calls
//! [`RaftNode::drive`] once per batch of inputs, then sends [`RaftNode::take_messages`] and
//! consumes [`RaftNode::take_events`]. `drive` follows raft-rs's ready order exactly: send
//! messages, install the snapshot, apply committed entries, persist entries and hard state (one
//! fsync), send persisted messages, advance, then the light ready (commit index, messages,
//! committed entries) and `advance_apply`.
//!
//! On the leader, `drive` also runs the [membership planner](crate::membership) and proposes the
//! configuration change or leader transfer it asks for.

mod apply;
mod config;
mod error;
mod handle;
mod maintenance;
mod types;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use futures::channel::oneshot;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Message, MessageType};
use raft::{RawNode, SnapshotStatus, StateRole};

pub use config::RaftConfig;
pub use error::{ProposeError, RaftError, ReadError, StepError};
pub use handle::{ProposalHandle, ReadHandle};
pub use types::{Metrics, NodeEvent, NodeStatus, Outbound, Role};

use crate::codec::CodecError;
use crate::ids::NodeId;
use crate::membership::RaftConf;
use crate::state::{Command, ControlState, PeerInfo, RaftRole, StateEvent};
use crate::storage::DiskStorage;

/// Most undelivered events kept; older ones are dropped (and counted) if the caller never takes
/// them.
const MAX_PENDING_EVENTS: usize = 100_000;

struct PendingProposal {
    term: u64,
    tx: oneshot::Sender<Result<Vec<StateEvent>, ProposeError>>,
}

struct PendingRead {
    deadline_tick: u64,
    index: Option<u64>,
    tx: oneshot::Sender<Result<u64, ReadError>>,
}

/// The raft driver; see the [module docs](self).
pub struct RaftNode {
    raw: RawNode<DiskStorage>,
    config: RaftConfig,
    state: ControlState,
    applied_conf: ConfState,
    last_snapshot_index: u64,
    proposals: BTreeMap<u64, PendingProposal>,
    reads: BTreeMap<u64, PendingRead>,
    next_read_id: u64,
    ticks: u64,
    outbox: Vec<Outbound>,
    events: VecDeque<NodeEvent>,
    metrics: Metrics,
    last_role: Option<(Role, Option<NodeId>, u64)>,
}

impl RaftNode {
    /// Opens the node stored in `dir`: recovers the log, hard state and the latest snapshot;
    /// committed entries after the snapshot are re-applied by the next [`drive`](Self::drive)
    /// (and reported again as events). An empty directory gives an uninitialized node that waits
    /// for a leader to send it the state after its `Join` was committed.
    pub fn open(dir: &Path, config: RaftConfig) -> Result<RaftNode, RaftError> {
        let storage = Self::open_storage(dir, &config)?;
        Self::with_storage(storage, config)
    }

    /// Validates `config` and opens the durable storage in `dir`.
    fn open_storage(dir: &Path, config: &RaftConfig) -> Result<DiskStorage, RaftError> {
        config.validate().map_err(RaftError::Config)?;
        Ok(DiskStorage::open(dir, config.storage)?)
    }

    /// Creates a new cluster in the empty directory `dir`. Every bootstrap member must call this
    /// with the same `members` (same order): the first `min(max_voters, n)` (rounded down to odd)
    /// become voters, the others learners. Fails if `dir` already holds a raft state.
    pub fn bootstrap(
        dir: &Path,
        config: RaftConfig,
        members: &[PeerInfo],
    ) -> Result<RaftNode, RaftError> {
        let storage = Self::open_storage(dir, &config)?;
        Self::bootstrap_storage(storage, config, members)
    }

    /// Opens the node in `dir` if it holds a raft state, otherwise bootstraps a new cluster
    /// there with `members` (see [`bootstrap`](Self::bootstrap)). For the first node of a
    /// cluster, which must come back as the same cluster after a restart.
    pub fn open_or_bootstrap(
        dir: &Path,
        config: RaftConfig,
        members: &[PeerInfo],
    ) -> Result<RaftNode, RaftError> {
        Self::open_or_found(dir, config, Some(members)).map(|(node, _)| node)
    }

    /// Opens the node in `dir`; when its storage holds no raft state yet and `found` names
    /// members, founds a new cluster there with them (see [`bootstrap`](Self::bootstrap)).
    /// Returns the node and whether it founded. The decision is the storage's, not whether
    /// the directory exists: a founder killed after creating its directory and before writing
    /// the first state founds again instead of waiting forever in a cluster of nobody.
    pub fn open_or_found(
        dir: &Path,
        config: RaftConfig,
        found: Option<&[PeerInfo]>,
    ) -> Result<(RaftNode, bool), RaftError> {
        let storage = Self::open_storage(dir, &config)?;
        match found {
            Some(members) if !storage.is_initialized() => {
                Ok((Self::bootstrap_storage(storage, config, members)?, true))
            }
            _ => Ok((Self::with_storage(storage, config)?, false)),
        }
    }

    fn bootstrap_storage(
        mut storage: DiskStorage,
        config: RaftConfig,
        members: &[PeerInfo],
    ) -> Result<RaftNode, RaftError> {
        if members.is_empty() {
            return Err(RaftError::Config(
                "bootstrap needs at least one member".into(),
            ));
        }
        let n = members.len().min(config.max_voters);
        let voter_count = n - (1 - n % 2);
        let roles: Vec<(PeerInfo, RaftRole)> = members
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let role = if i < voter_count {
                    RaftRole::Voter
                } else {
                    RaftRole::Learner
                };
                (p.clone(), role)
            })
            .collect();
        let state = ControlState::bootstrap(&roles);
        let ids: Vec<u64> = state.members.keys().map(|id| id.0).collect();
        if ids.len() != members.len() || !ids.contains(&config.id.0) {
            return Err(RaftError::Config(
                "bootstrap members must be distinct and include this node".into(),
            ));
        }
        let mut cs = ConfState::default();
        for (peer, role) in &roles {
            let id = NodeId::from_peer_bytes(&peer.peer_id).0;
            match role {
                RaftRole::Voter => cs.voters.push(id),
                _ => cs.learners.push(id),
            }
        }
        let data = state.encode_snapshot().map_err(RaftError::Snapshot)?;
        storage.bootstrap(cs, data)?;
        Self::with_storage(storage, config)
    }

    fn with_storage(storage: DiskStorage, config: RaftConfig) -> Result<RaftNode, RaftError> {
        let snapshot = storage.latest_snapshot();
        let state = if snapshot.get_data().is_empty() {
            ControlState::default()
        } else {
            ControlState::decode_snapshot(snapshot.get_data()).map_err(RaftError::Snapshot)?
        };
        let applied_conf = snapshot.get_metadata().get_conf_state().clone();
        let last_snapshot_index = snapshot.get_metadata().index;
        let logger = crate::logger::raft_logger(config.id.0);
        let raw = RawNode::new(&config.to_raft(), storage, &logger)?;
        Ok(RaftNode {
            raw,
            config,
            state,
            applied_conf,
            last_snapshot_index,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            next_read_id: 0,
            ticks: 0,
            outbox: Vec::new(),
            events: VecDeque::new(),
            metrics: Metrics::default(),
            last_role: None,
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// The applied control state (linearizable after a [`ReadHandle`] resolved).
    pub fn state(&self) -> &ControlState {
        &self.state
    }

    /// Counters.
    pub fn metrics(&self) -> Metrics {
        self.metrics
    }

    /// Role, leader, term, indexes and configuration.
    pub fn status(&self) -> NodeStatus {
        let (role, leader, term) = self.role_view();
        let conf = RaftConf::from_conf_state(&self.applied_conf);
        NodeStatus {
            id: self.config.id,
            role,
            leader,
            term,
            commit: self.raw.raft.raft_log.committed,
            applied: self.raw.raft.raft_log.applied,
            voters: conf.voters.into_iter().collect(),
            learners: conf.learners.into_iter().collect(),
        }
    }

    /// Whether this node leads the current term.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The known leader.
    pub fn leader(&self) -> Option<NodeId> {
        let id = self.raw.raft.leader_id;
        (id != raft::INVALID_ID).then_some(NodeId(id))
    }

    /// Number of log entries held on disk (shrinks with snapshots).
    pub fn log_len(&self) -> u64 {
        self.raw.store().entry_count()
    }

    /// Advances the logical clock by one tick (elections, heartbeats, read timeouts).
    pub fn tick(&mut self) {
        self.ticks += 1;
        self.raw.tick();
        let now = self.ticks;
        let expired: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.deadline_tick <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(r) = self.reads.remove(&id) {
                let _ = r.tx.send(Err(ReadError::Timeout));
            }
        }
    }

    /// Starts an election now (e.g. right after bootstrapping a single node).
    pub fn campaign(&mut self) -> Result<(), RaftError> {
        self.raw.campaign().map_err(RaftError::from)
    }

    /// Feeds an inbound raft message from the authenticated peer `from`. Refuses (and counts)
    /// oversized and malformed bytes, forged senders, messages for another node, node-local
    /// message types, and election messages (vote, pre-vote, timeout-now) from peers outside the
    /// applied raft configuration. Other messages from unknown senders go to raft, which ignores
    /// stale terms and refuses responses from unknown peers: a lagging node must accept a leader
    /// that joined after its applied index, so admission of strangers is left to the transport.
    pub fn step(&mut self, from: NodeId, bytes: &[u8]) -> Result<(), StepError> {
        if bytes.len() > self.config.max_message_bytes {
            self.metrics.oversized_messages += 1;
            return Err(StepError::TooLarge {
                len: bytes.len(),
                max: self.config.max_message_bytes,
            });
        }
        let msg = Message::parse_from_bytes(bytes).map_err(|e| {
            self.metrics.malformed_messages += 1;
            StepError::Malformed(e.to_string())
        })?;
        if let Err(e) = self.check_message(from, &msg) {
            self.metrics.refused_messages += 1;
            return Err(e);
        }
        self.raw.step(msg).map_err(|e| {
            self.metrics.raft_step_errors += 1;
            StepError::Raft(e.to_string())
        })
    }

    fn check_message(&self, from: NodeId, msg: &Message) -> Result<(), StepError> {
        if raft::raw_node::is_local_msg(msg.get_msg_type()) {
            return Err(StepError::LocalMessage(msg.get_msg_type()));
        }
        if msg.from != from.0 {
            return Err(StepError::WrongSender {
                claimed: msg.from,
                actual: from,
            });
        }
        if msg.to != self.config.id.0 {
            return Err(StepError::WrongRecipient(msg.to));
        }
        // A member that left keeps the cluster key but not its voice: nothing it sends counts.
        if self.state.is_retired(from) {
            return Err(StepError::Retired(from));
        }
        // Only election traffic is refused from senders outside the applied configuration:
        // refusing a vote is always safe, and it keeps removed or foreign nodes from forcing
        // elections. Leader traffic must pass: a lagging node cannot know members added after
        // its applied index (a new leader among them), and refusing it would wedge the node
        // forever. Keeping strangers out altogether is the transport's job (cluster key).
        let election = matches!(
            msg.get_msg_type(),
            MessageType::MsgRequestVote
                | MessageType::MsgRequestPreVote
                | MessageType::MsgTimeoutNow
        );
        let prs = self.raw.raft.prs();
        let initialized = prs.iter().next().is_some();
        if election
            && initialized
            && prs.get(from.0).is_none()
            && !self.applied_conf_contains(from.0)
        {
            return Err(StepError::NonMember(from));
        }
        Ok(())
    }

    fn applied_conf_contains(&self, id: u64) -> bool {
        let cs = &self.applied_conf;
        cs.voters
            .iter()
            .chain(&cs.learners)
            .chain(&cs.voters_outgoing)
            .chain(&cs.learners_next)
            .any(|&v| v == id)
    }

    /// Proposes a command. Only the leader accepts proposals; elsewhere this fails at once with
    /// [`ProposeError::NotLeader`] and the leader hint. The handle resolves once the entry is
    /// applied here (call [`drive`](Self::drive) to make progress).
    pub fn propose(&mut self, command: &Command) -> Result<ProposalHandle, ProposeError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(ProposeError::NotLeader {
                leader: self.leader(),
            });
        }
        let data = command.encode().map_err(|e| match e {
            CodecError::TooLarge { len, max } => {
                self.metrics.oversized_proposals += 1;
                ProposeError::TooLarge { len, max }
            }
            other => ProposeError::Encode(other),
        })?;
        let before = self.raw.raft.raft_log.last_index();
        self.raw
            .propose(Vec::new(), data)
            .map_err(|_| ProposeError::Dropped)?;
        let index = self.raw.raft.raft_log.last_index();
        if index == before {
            return Err(ProposeError::Dropped);
        }
        let (tx, rx) = oneshot::channel();
        self.proposals.insert(
            index,
            PendingProposal {
                term: self.raw.raft.term,
                tx,
            },
        );
        Ok(ProposalHandle { index, rx })
    }

    /// Requests a linearizable read: the handle resolves once this node has applied everything
    /// committed before the request, after which [`state`](Self::state) may be read. Works on
    /// followers too (forwarded to the leader); fails after `read_timeout_ticks`.
    pub fn read_index(&mut self) -> ReadHandle {
        let id = self.next_read_id;
        self.next_read_id += 1;
        let mut ctx = self.config.id.0.to_be_bytes().to_vec();
        ctx.extend_from_slice(&id.to_be_bytes());
        self.raw.read_index(ctx);
        let (tx, rx) = oneshot::channel();
        self.reads.insert(
            id,
            PendingRead {
                deadline_tick: self.ticks + self.config.read_timeout_ticks,
                index: None,
                tx,
            },
        );
        ReadHandle { rx }
    }

    /// Asks the leader to hand leadership to `to` (a caught-up voter). Only meaningful on the
    /// leader; elsewhere fails with the leader hint.
    pub fn transfer_leader(&mut self, to: NodeId) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader {
                leader: self.leader(),
            });
        }
        self.raw.transfer_leader(to.0);
        Ok(())
    }

    /// Tells raft that messages to `to` could not be delivered (so it probes instead of
    /// streaming).
    pub fn report_unreachable(&mut self, to: NodeId) {
        self.raw.report_unreachable(to.0);
    }

    /// Outbound messages produced so far; send each to its peer (order per peer matters little:
    /// raft tolerates loss and reordering).
    pub fn take_messages(&mut self) -> Vec<Outbound> {
        std::mem::take(&mut self.outbox)
    }

    /// Events produced so far, in log order.
    pub fn take_events(&mut self) -> Vec<NodeEvent> {
        self.events.drain(..).collect()
    }

    /// Processes everything raft has ready (persisting, applying, queueing messages), then lets
    /// the leader plan membership. Call after each batch of `tick`/`step`/`propose`.
    pub fn drive(&mut self) -> Result<(), RaftError> {
        loop {
            while self.raw.has_ready() {
                self.handle_ready()?;
            }
            self.note_role();
            self.maybe_snapshot();
            if !self.plan_membership() {
                return Ok(());
            }
        }
    }

    fn handle_ready(&mut self) -> Result<(), RaftError> {
        let mut rd = self.raw.ready();
        self.queue_messages(rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone())?;
        }
        self.apply_entries(rd.take_committed_entries());
        self.raw.mut_store().append(rd.entries(), rd.hs())?;
        self.queue_messages(rd.take_persisted_messages());
        let read_states = rd.take_read_states();
        self.on_read_states(read_states);
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.raw.mut_store().set_commit(commit)?;
        }
        self.queue_messages(light.take_messages());
        self.apply_entries(light.take_committed_entries());
        self.raw.advance_apply();
        self.serve_reads();
        Ok(())
    }

    fn queue_messages(&mut self, msgs: Vec<Message>) {
        for msg in msgs {
            let to = msg.to;
            let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
            match msg.write_to_bytes() {
                Ok(bytes) => self.outbox.push(Outbound {
                    to: NodeId(to),
                    bytes,
                }),
                Err(e) => tracing::error!(to, error = %e, "cannot encode raft message"),
            }
            // Snapshots are small and sent whole: report them finished when handed to the
            // transport. If one is lost, the follower's next rejection triggers a new one.
            if is_snapshot {
                self.raw.report_snapshot(to, SnapshotStatus::Finish);
            }
        }
    }

    fn on_read_states(&mut self, states: Vec<raft::ReadState>) {
        for rs in states {
            let ctx = &rs.request_ctx;
            if ctx.len() != 16 || ctx[..8] != self.config.id.0.to_be_bytes() {
                continue;
            }
            let mut id = [0u8; 8];
            id.copy_from_slice(&ctx[8..]);
            if let Some(r) = self.reads.get_mut(&u64::from_be_bytes(id)) {
                r.index = Some(rs.index);
            }
        }
    }

    fn serve_reads(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        let ready: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.index.is_some_and(|i| i <= applied))
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            if let Some(r) = self.reads.remove(&id) {
                let _ = r.tx.send(Ok(applied));
            }
        }
    }

    fn push_event(&mut self, event: NodeEvent) {
        if self.events.len() >= MAX_PENDING_EVENTS {
            self.events.pop_front();
            self.metrics.dropped_events += 1;
        }
        self.events.push_back(event);
    }

    fn role_view(&self) -> (Role, Option<NodeId>, u64) {
        let raft = &self.raw.raft;
        let role = match raft.state {
            StateRole::Leader => Role::Leader,
            StateRole::Candidate => Role::Candidate,
            StateRole::PreCandidate => Role::PreCandidate,
            StateRole::Follower if raft.promotable() => Role::Follower,
            StateRole::Follower => Role::Learner,
        };
        (role, self.leader(), raft.term)
    }

    fn note_role(&mut self) {
        let view = self.role_view();
        if self.last_role != Some(view) {
            self.last_role = Some(view);
            let (role, leader, term) = view;
            self.push_event(NodeEvent::RoleChanged { role, leader, term });
        }
    }
}

#[cfg(test)]
mod tests;
