//! In-process cluster over a simulated network, driven by a seed: message loss, delay (and thus
//! reordering), duplication, partitions, crashes and restarts from each node's raft-engine
//! directory. Invariants are checked as the simulation runs: at most one leader per term, and
//! every node applies the same command at the same index (prefix property).

use std::collections::{BTreeMap, BTreeSet};

use parcae_consensus::state::PeerInfo;
use parcae_consensus::{
    Command, NodeEvent, NodeId, ProposalHandle, ProposeError, RaftConfig, RaftNode, StorageOptions,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tempfile::TempDir;

/// Network fault rates.
#[derive(Debug, Clone, Copy)]
pub struct NetFaults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Messages are delivered after 0..=max_delay ticks (random, so they reorder).
    pub max_delay: u64,
}

impl NetFaults {
    pub const NONE: NetFaults = NetFaults {
        drop: 0.0,
        duplicate: 0.0,
        max_delay: 0,
    };
}

struct InFlight {
    at: u64,
    from: NodeId,
    to: NodeId,
    bytes: Vec<u8>,
}

pub struct SimNode {
    peer: PeerInfo,
    dir: TempDir,
    pub node: Option<RaftNode>,
    /// Index -> command applied there (None: undecodable), over all incarnations.
    pub applied: BTreeMap<u64, Option<Command>>,
}

pub struct Sim {
    pub rng: ChaCha8Rng,
    pub now: u64,
    pub faults: NetFaults,
    config: RaftConfig,
    pub nodes: BTreeMap<NodeId, SimNode>,
    in_flight: Vec<InFlight>,
    /// Nodes cut off from the others (both directions).
    partition: Option<BTreeSet<NodeId>>,
    /// Term -> leader seen in that term.
    pub leaders: BTreeMap<u64, NodeId>,
    /// Proposals acknowledged as applied: index -> command.
    pub acked: BTreeMap<u64, Command>,
    pending: Vec<(ProposalHandle, Command)>,
    next_peer: u32,
}

pub fn peer(i: u32) -> PeerInfo {
    PeerInfo {
        peer_id: format!("peer-{i}").into_bytes(),
        addrs: vec![format!("/ip4/127.0.0.1/tcp/{}", 4000 + i)],
        ..PeerInfo::default()
    }
}

pub fn id_of(p: &PeerInfo) -> NodeId {
    NodeId::from_peer_bytes(&p.peer_id)
}

/// Small tick counts keep the randomized tests fast.
pub fn test_config(sync: bool) -> RaftConfig {
    RaftConfig {
        election_tick: 10,
        heartbeat_tick: 2,
        snapshot_interval: 64,
        read_timeout_ticks: 40,
        catch_up_slack: 16,
        storage: StorageOptions { sync },
        ..RaftConfig::default()
    }
}

impl Sim {
    /// A cluster of `n` nodes bootstrapped together.
    pub fn bootstrap(seed: u64, n: u32, config: RaftConfig, faults: NetFaults) -> Sim {
        let mut sim = Sim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            faults,
            config,
            nodes: BTreeMap::new(),
            in_flight: Vec::new(),
            partition: None,
            leaders: BTreeMap::new(),
            acked: BTreeMap::new(),
            pending: Vec::new(),
            next_peer: n,
        };
        let peers: Vec<PeerInfo> = (0..n).map(peer).collect();
        for p in &peers {
            let dir = tempfile::tempdir().unwrap();
            let node = RaftNode::bootstrap(dir.path(), sim.config_for(id_of(p)), &peers).unwrap();
            sim.nodes.insert(
                id_of(p),
                SimNode {
                    peer: p.clone(),
                    dir,
                    node: Some(node),
                    applied: BTreeMap::new(),
                },
            );
        }
        sim
    }

    fn config_for(&self, id: NodeId) -> RaftConfig {
        RaftConfig {
            id,
            ..self.config.clone()
        }
    }

    /// Starts a new node with an empty directory (it still has to `Join`).
    pub fn add_empty_node(&mut self) -> PeerInfo {
        let p = peer(self.next_peer);
        self.next_peer += 1;
        let dir = tempfile::tempdir().unwrap();
        let node = RaftNode::open(dir.path(), self.config_for(id_of(&p))).unwrap();
        self.nodes.insert(
            id_of(&p),
            SimNode {
                peer: p.clone(),
                dir,
                node: Some(node),
                applied: BTreeMap::new(),
            },
        );
        p
    }

    /// Identity of a node started by the simulation.
    pub fn peer_info(&self, id: NodeId) -> PeerInfo {
        self.nodes[&id].peer.clone()
    }

    pub fn live(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.node.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn node(&self, id: NodeId) -> &RaftNode {
        self.nodes[&id].node.as_ref().expect("node is running")
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut RaftNode {
        self.nodes
            .get_mut(&id)
            .unwrap()
            .node
            .as_mut()
            .expect("node is running")
    }

    /// The live leader with the highest term.
    pub fn leader(&self) -> Option<NodeId> {
        self.live()
            .into_iter()
            .filter(|id| self.node(*id).is_leader())
            .max_by_key(|id| self.node(*id).status().term)
    }

    pub fn crash(&mut self, id: NodeId) {
        self.nodes.get_mut(&id).unwrap().node = None;
    }

    pub fn restart(&mut self, id: NodeId) {
        let config = self.config_for(id);
        let sn = self.nodes.get_mut(&id).unwrap();
        assert!(sn.node.is_none(), "restart of a running node");
        sn.node = Some(RaftNode::open(sn.dir.path(), config).unwrap());
    }

    pub fn partition(&mut self, group: BTreeSet<NodeId>) {
        self.partition = Some(group);
    }

    pub fn heal(&mut self) {
        self.partition = None;
    }

    fn linked(&self, a: NodeId, b: NodeId) -> bool {
        match &self.partition {
            Some(g) => g.contains(&a) == g.contains(&b),
            None => true,
        }
    }

    /// Proposes on the current leader and tracks the handle.
    pub fn propose(&mut self, cmd: Command) -> Result<u64, ProposeError> {
        let leader = self
            .leader()
            .ok_or(ProposeError::NotLeader { leader: None })?;
        let node = self.node_mut(leader);
        let handle = node.propose(&cmd)?;
        node.drive().unwrap();
        let index = handle.index();
        self.pending.push((handle, cmd));
        Ok(index)
    }

    /// One tick of the world: every live node ticks, due messages are delivered, every node is
    /// driven, outputs are routed, invariants are checked.
    pub fn tick(&mut self) {
        self.now += 1;
        for id in self.live() {
            self.node_mut(id).tick();
        }
        let now = self.now;
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|m| m.at <= now);
        self.in_flight = later;
        due.shuffle(&mut self.rng);
        for m in due {
            if !self.linked(m.from, m.to) {
                continue;
            }
            if let Some(Some(node)) = self.nodes.get_mut(&m.to).map(|n| n.node.as_mut()) {
                // Refusals (e.g. from a removed node) are part of the game; counted by the node.
                let _ = node.step(m.from, &m.bytes);
            }
        }
        for id in self.live() {
            self.node_mut(id).drive().unwrap();
        }
        self.route_and_check();
    }

    fn route_and_check(&mut self) {
        for id in self.live() {
            let msgs = self.node_mut(id).take_messages();
            for m in msgs {
                if self.rng.random::<f64>() < self.faults.drop {
                    continue;
                }
                let copies = if self.rng.random::<f64>() < self.faults.duplicate {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let delay = self.rng.random_range(0..=self.faults.max_delay);
                    self.in_flight.push(InFlight {
                        at: self.now + delay.max(1),
                        from: id,
                        to: m.to,
                        bytes: m.bytes.clone(),
                    });
                }
            }
            let events = self.node_mut(id).take_events();
            let sn = self.nodes.get_mut(&id).unwrap();
            for ev in events {
                if let NodeEvent::Applied { index, command, .. } = ev
                    && let Some(prev) = sn.applied.insert(index, command.as_deref().cloned())
                {
                    assert_eq!(
                        prev.as_ref(),
                        command.as_deref(),
                        "node {id} re-applied a different entry at {index}"
                    );
                }
            }
            let status = self.node(id).status();
            if status.role == parcae_consensus::Role::Leader {
                let prev = self.leaders.insert(status.term, id);
                assert!(
                    prev.is_none() || prev == Some(id),
                    "two leaders in term {}: {prev:?} and {id}",
                    status.term
                );
            }
        }
        let mut still = Vec::new();
        for (mut h, cmd) in std::mem::take(&mut self.pending) {
            match h.try_outcome() {
                None => still.push((h, cmd)),
                Some(Ok(_)) => {
                    self.acked.insert(h.index(), cmd);
                }
                Some(Err(_)) => {}
            }
        }
        self.pending = still;
        self.check_prefix();
    }

    /// Every pair of nodes agrees on every index both applied.
    fn check_prefix(&self) {
        let mut reference: BTreeMap<u64, (&Option<Command>, NodeId)> = BTreeMap::new();
        for (id, sn) in &self.nodes {
            for (index, cmd) in &sn.applied {
                match reference.get(index) {
                    Some((other, who)) => assert_eq!(
                        *other, cmd,
                        "nodes {who} and {id} applied different commands at {index}"
                    ),
                    None => {
                        reference.insert(*index, (cmd, *id));
                    }
                }
            }
        }
        for (index, cmd) in &self.acked {
            if let Some((applied, who)) = reference.get(index) {
                assert_eq!(
                    applied.as_ref(),
                    Some(cmd),
                    "acked entry {index} differs on {who}"
                );
            }
        }
    }

    pub fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.tick();
        }
    }

    /// Ticks until `cond` holds; returns the ticks used, or `None` after `max` ticks.
    pub fn run_until(&mut self, max: u64, mut cond: impl FnMut(&Sim) -> bool) -> Option<u64> {
        for t in 0..max {
            if cond(self) {
                return Some(t);
            }
            self.tick();
        }
        cond(self).then_some(max)
    }

    /// All live nodes applied the same index and hold equal states.
    pub fn converged(&self) -> bool {
        let live = self.live();
        let Some(first) = live.first() else {
            return true;
        };
        let applied = self.node(*first).status().applied;
        let digest = self.node(*first).state().digest();
        live.iter().all(|id| {
            let n = self.node(*id);
            n.status().applied == applied && n.state().digest() == digest
        })
    }

    /// Proposals still waiting.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}
