//! Elections, leader crash, reads, leader transfer and snapshot catch-up.

use parcae_consensus::{Command, ReadError, Role};

use crate::sim::{NetFaults, Sim, test_config};

fn tick_cmd(interval: u64) -> Command {
    Command::AvailabilityTick {
        interval,
        count: 3,
        pools: Vec::new(),
    }
}

/// Proposes `count` commands on the leader, one per tick, and waits until all are acknowledged.
fn propose_and_wait(sim: &mut Sim, first: u64, count: u64) {
    for i in first..first + count {
        sim.run_until(200, |s| s.leader().is_some())
            .expect("a leader");
        sim.propose(tick_cmd(i)).unwrap();
        sim.tick();
    }
    sim.run_until(300, |s| s.pending() == 0)
        .expect("proposals resolve");
}

/// Elections take at most this many ticks. The randomized timeout lies in
/// `[election_tick, 2 * election_tick)`; pre-vote adds a round, and with check-quorum a peer that
/// still holds the old leader's lease (or just became pre-candidate) refuses a pre-vote, which
/// costs another timeout. raft-rs draws its timeouts from its own unseeded RNG, so the bound has
/// headroom: observed worst cases are 2 to 4.5 election timeouts.
fn election_bound(config: &parcae_consensus::RaftConfig) -> u64 {
    10 * config.election_tick as u64
}

#[test]
fn leader_elected_within_bound_and_new_one_after_leader_crash() {
    let mut worst = (0, 0);
    for seed in 0..10 {
        let config = test_config(false);
        let bound = election_bound(&config);
        let mut sim = Sim::bootstrap(100 + seed, 3, config, NetFaults::NONE);
        let first = sim
            .run_until(bound, |s| s.leader().is_some())
            .expect("leader elected");
        let leaders = sim
            .live()
            .iter()
            .filter(|id| sim.node(**id).is_leader())
            .count();
        assert_eq!(leaders, 1);
        propose_and_wait(&mut sim, 0, 3);
        let old = sim.leader().unwrap();
        sim.crash(old);
        let second = sim
            .run_until(bound, |s| s.leader().is_some_and(|l| l != old))
            .expect("new leader after crash");
        worst = (worst.0.max(first), worst.1.max(second));
    }
    eprintln!(
        "worst election: {} ticks at start, {} ticks after a leader crash",
        worst.0, worst.1
    );
}

#[test]
fn committed_commands_survive_leader_crash_with_fsync() {
    let config = test_config(true);
    let bound = election_bound(&config);
    let mut sim = Sim::bootstrap(1, 3, config, NetFaults::NONE);
    sim.run_until(bound, |s| s.leader().is_some())
        .expect("leader elected");
    propose_and_wait(&mut sim, 0, 20);
    assert_eq!(sim.acked.len(), 20);
    let old = sim.leader().unwrap();
    let old_term = sim.node(old).status().term;
    sim.crash(old);
    sim.run_until(bound, |s| s.leader().is_some_and(|l| l != old))
        .expect("new leader after crash");
    let new = sim.leader().unwrap();
    assert!(sim.node(new).status().term > old_term);
    propose_and_wait(&mut sim, 20, 10);
    sim.restart(old);
    sim.run_until(400, |s| s.converged()).expect("converges");
    // Every acknowledged command is in every node's state, the restarted one included.
    for id in sim.live() {
        let intervals: Vec<u64> = sim
            .node(id)
            .state()
            .availability
            .iter()
            .map(|a| a.interval)
            .collect();
        assert_eq!(intervals, (0..30).collect::<Vec<_>>(), "node {id}");
    }
}

#[test]
fn read_index_is_served_on_followers_and_times_out_without_quorum() {
    let mut sim = Sim::bootstrap(2, 3, test_config(false), NetFaults::NONE);
    sim.run_until(100, |s| s.leader().is_some()).unwrap();
    propose_and_wait(&mut sim, 0, 5);
    let leader = sim.leader().unwrap();
    let follower = sim.live().into_iter().find(|id| *id != leader).unwrap();
    let commit = sim.node(leader).status().commit;
    let mut h = sim.node_mut(follower).read_index();
    sim.run_until(50, |_| false);
    let at = h.try_outcome().expect("read served").unwrap();
    assert!(at >= commit, "read at {at} before commit {commit}");
    assert_eq!(sim.node(follower).state().availability.len(), 5);

    // A leader cut off from its quorum cannot serve linearizable reads.
    sim.partition([leader].into_iter().collect());
    let mut h = sim.node_mut(leader).read_index();
    sim.run(60);
    assert_eq!(h.try_outcome(), Some(Err(ReadError::Timeout)));
}

#[test]
fn leader_transfer_moves_leadership() {
    let mut sim = Sim::bootstrap(3, 3, test_config(false), NetFaults::NONE);
    sim.run_until(100, |s| s.leader().is_some()).unwrap();
    propose_and_wait(&mut sim, 0, 3);
    let leader = sim.leader().unwrap();
    let target = sim.live().into_iter().find(|id| *id != leader).unwrap();
    sim.node_mut(leader).transfer_leader(target).unwrap();
    sim.run_until(50, |s| {
        s.leader() == Some(target) && s.node(leader).leader() == Some(target)
    })
    .expect("transfer completes");
    assert_eq!(sim.node(leader).status().role, Role::Follower);
    assert_eq!(sim.node(leader).status().leader, Some(target));
}

#[test]
fn lagging_node_catches_up_through_snapshot_after_compaction() {
    let mut config = test_config(false);
    config.snapshot_interval = 20;
    let mut sim = Sim::bootstrap(4, 3, config, NetFaults::NONE);
    sim.run_until(100, |s| s.leader().is_some()).unwrap();
    let leader = sim.leader().unwrap();
    let lagging = sim.live().into_iter().find(|id| *id != leader).unwrap();
    sim.crash(lagging);
    propose_and_wait(&mut sim, 0, 120);
    let l = sim.node(leader);
    assert!(l.metrics().snapshots_created >= 3);
    assert!(l.log_len() < 40, "log compacted to {} entries", l.log_len());
    sim.restart(lagging);
    sim.run_until(300, |s| s.converged())
        .expect("lagging node converges");
    let n = sim.node(lagging);
    assert!(
        n.metrics().snapshots_installed >= 1,
        "caught up through a snapshot"
    );
    assert_eq!(n.state().availability.len(), 120);
}

#[test]
fn leader_without_quorum_bounds_its_uncommitted_log() {
    let mut config = test_config(false);
    config.max_size_per_msg = 512;
    config.max_uncommitted_bytes = 1024;
    let mut sim = Sim::bootstrap(5, 3, config, NetFaults::NONE);
    sim.run_until(100, |s| s.leader().is_some()).unwrap();
    propose_and_wait(&mut sim, 0, 2);
    let leader = sim.leader().unwrap();
    sim.partition([leader].into_iter().collect());
    let node = sim.node_mut(leader);
    let mut accepted = 0;
    let refused = (100..1100).find_map(|i| match node.propose(&tick_cmd(i)) {
        Ok(_) => {
            accepted += 1;
            None
        }
        Err(e) => Some(e),
    });
    assert_eq!(refused, Some(parcae_consensus::ProposeError::Dropped));
    assert!(
        accepted > 10 && accepted < 200,
        "{accepted} proposals accepted"
    );
}
