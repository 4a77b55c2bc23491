//! Cluster formation, leader failure, graceful leave and restart with real `parcae-node`
//! processes on 127.0.0.1 (see the harness in `parcae_tests`).

use std::time::{Duration, Instant};

use parcae_api::MemberState;
use parcae_tests::{
    TEST_CONFIG, new_cluster_with_clock_skew, new_cluster_with_env, node_binary, secs, serial,
    start_cluster, wait_for,
};

#[test]
fn five_nodes_form_a_cluster_and_survive_leader_kill() {
    let _serial = serial();
    // Build (or find) the binary first: the 10 s budget is for the cluster, not for cargo.
    let _ = node_binary();
    let started = Instant::now();
    // Each node says where it runs (from the environment, as a VM's unit file sets it).
    let mut c = new_cluster_with_env(
        TEST_CONFIG,
        vec![
            ("PARCAE_ZONE", "us-east-1a".into()),
            ("PARCAE_INSTANCE_TYPE", "p3.2xlarge".into()),
        ],
    );
    if let Err(e) = c.start_nodes(5) {
        panic!("starting 5 nodes: {e}\n{}", c.logs());
    }
    let all: Vec<usize> = (0..5).collect();
    let leader = c
        .wait_converged(&all, 5, secs(10).saturating_sub(started.elapsed()))
        .unwrap_or_else(|| panic!("no single leader with 5 members within 10 s\n{}", c.logs()));
    // Every node lists the same 5 members (checked by wait_converged) and they are ours.
    let mut ids: Vec<String> = c.nodes.iter().filter_map(|n| n.peer_id()).collect();
    ids.sort();
    let s0 = c.nodes[0].status().expect("status");
    let mut listed: Vec<String> = s0.members.iter().map(|m| m.peer_id.clone()).collect();
    listed.sort();
    assert_eq!(listed, ids);
    for m in &s0.members {
        let p = &m.placement;
        assert_eq!(
            (p.zone.as_str(), p.instance_type.as_str(), p.device.as_str()),
            ("us-east-1a", "p3.2xlarge", "cpu"),
            "{m:?}"
        );
    }

    // Let the planner commit a few availability ticks, then kill the leader.
    let li = c.index_of(&leader).expect("leader index");
    let committed = wait_for(Duration::from_secs(5), || {
        let s = c.nodes[li].status()?;
        let ci = s.commit_index;
        (ci >= 10).then_some(ci)
    })
    .expect("leader commits");
    c.nodes[li].kill();
    let killed = Instant::now();
    let rest: Vec<usize> = all.iter().copied().filter(|&i| i != li).collect();
    let new_leader = wait_for(Duration::from_secs(5), || {
        let s = c.nodes[rest[0]].status()?;
        let l = s.leader.clone()?;
        (l != leader && s.term > 0).then_some(l)
    })
    .unwrap_or_else(|| panic!("no new leader within 5 s\n{}", c.logs()));
    eprintln!("new leader after {:?}", killed.elapsed());
    assert_ne!(new_leader, leader);

    // The old leader is marked lost; every committed entry survives on the survivors.
    wait_for(Duration::from_secs(10), || {
        rest.iter()
            .all(|&i| {
                c.nodes[i].status().is_some_and(|s| {
                    s.member(&leader)
                        .is_some_and(|m| m.status == MemberState::Lost)
                        && s.commit_index >= committed
                        && s.members.len() == 5
                })
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("old leader not marked lost everywhere\n{}", c.logs()));
}

#[test]
fn sigterm_on_a_voter_gossips_the_notice_and_promotes_the_learner() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 6);
    let all: Vec<usize> = (0..6).collect();
    let leader = c
        .wait_converged(&all, 6, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("6 nodes did not converge\n{}", c.logs()));
    // 5 voters and 1 learner, agreed by the leader.
    let li = c.index_of(&leader).expect("leader");
    let (learner, victim) = wait_for(Duration::from_secs(10), || {
        let s = c.nodes[li].status()?;
        let members = &s.members;
        let learners: Vec<_> = members.iter().filter(|m| !m.voter).collect();
        if members.len() != 6 || learners.len() != 1 {
            return None;
        }
        let learner = learners[0].peer_id.clone();
        let victim = members
            .iter()
            .find(|m| m.voter && m.peer_id != leader)?
            .peer_id
            .clone();
        Some((learner, victim))
    })
    .unwrap_or_else(|| panic!("no 5 voters + 1 learner\n{}", c.logs()));
    let vi = c.index_of(&victim).expect("victim");

    c.nodes[vi].signal(nix::sys::signal::Signal::SIGTERM);
    let others: Vec<usize> = all.iter().copied().filter(|&i| i != vi).collect();
    let propagation: Vec<u64> = wait_for(Duration::from_secs(3), || {
        others
            .iter()
            .map(|&i| {
                let s = c.nodes[i].status()?;
                let n = s.notices.iter().find(|n| n.peer_id == victim)?;
                Some(n.received_unix_ms - n.issued_unix_ms)
            })
            .collect::<Option<Vec<u64>>>()
    })
    .unwrap_or_else(|| panic!("notice did not reach every node\n{}", c.logs()));
    eprintln!("notice propagation per node (ms): {propagation:?}");
    assert!(
        propagation.iter().all(|&ms| ms < 1000),
        "notice took >= 1 s somewhere: {propagation:?}"
    );

    // The learner becomes a voter while the victim is still running.
    wait_for(Duration::from_secs(3), || {
        let s = c.nodes[li].status()?;
        let promoted = s.member(&learner)?.voter;
        let demoted = s.member(&victim)?.status == MemberState::Leaving;
        (promoted && demoted).then_some(())
    })
    .unwrap_or_else(|| panic!("learner not promoted\n{}", c.logs()));
    assert!(
        c.nodes[vi].running(),
        "victim exited before its replacement was promoted"
    );

    let exit = c.nodes[vi]
        .wait_exit(Duration::from_secs(10))
        .expect("victim exits after its grace period");
    assert!(exit.success(), "graceful leave exits 0, got {exit:?}");
    // Once it is gone the leader forgets it.
    wait_for(Duration::from_secs(6), || {
        let s = c.nodes[li].status()?;
        s.member(&victim).is_none().then_some(())
    })
    .unwrap_or_else(|| panic!("departed node not removed\n{}", c.logs()));
}

#[test]
fn restart_with_same_data_dir_keeps_identity_and_catches_up() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    let leader = c
        .wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let li = c.index_of(&leader).expect("leader");
    let vi = (0..3).find(|&i| i != li).expect("follower");
    let peer = c.nodes[vi].peer_id().expect("peer id");
    c.nodes[vi].kill();
    // Down long enough to be declared lost, while the others keep committing.
    wait_for(Duration::from_secs(10), || {
        let s = c.nodes[li].status()?;
        (s.member(&peer)?.status == MemberState::Lost).then_some(())
    })
    .unwrap_or_else(|| panic!("killed node not marked lost\n{}", c.logs()));
    let commit_before = c.nodes[li].status().expect("status").commit_index;

    c.nodes[vi].restart().expect("restarting the node");
    let s = wait_for(Duration::from_secs(15), || {
        let s = c.nodes[vi].status()?;
        let healthy = s.member(&peer)?.status.is_healthy();
        (healthy && s.applied_index >= commit_before).then_some(s)
    })
    .unwrap_or_else(|| panic!("restarted node did not catch up\n{}", c.logs()));
    assert_eq!(s.peer_id, peer, "same data dir, same peer id");
    assert_eq!(s.leader.as_deref(), Some(leader.as_str()));
}

/// The founder's wall clock 10 minutes ahead of the others'. node1 joins through it directly (the
/// connection brings node1's clock, and its `Join` is read on it); node2 joins through node1
/// only, so its relayed `Join` reaches the leader from a node whose clock it never heard, 10
/// minutes old on the leader's clock: refused, named on the leader's `/status`, and the leader
/// dials node2 back at the addresses it signed; its next `Join` is read on its own clock and
/// node2 becomes a member.
#[test]
fn a_join_refused_for_its_clock_is_named_and_its_node_dialled_back() {
    let _serial = serial();
    let _ = node_binary();
    let mut c = new_cluster_with_clock_skew(TEST_CONFIG, 600);
    c.start_nodes(2)
        .unwrap_or_else(|e| panic!("starting 2 nodes: {e}\n{}", c.logs()));
    c.wait_converged(&[0, 1], 2, secs(15))
        .unwrap_or_else(|| panic!("node1 did not join the skewed founder\n{}", c.logs()));
    let via = c.nodes[1].p2p.clone().expect("node1's p2p address");
    let joiner = c
        .spawn(&[via], None)
        .unwrap_or_else(|e| panic!("starting node2: {e}\n{}", c.logs()));
    c.wait_serving(&[joiner])
        .unwrap_or_else(|e| panic!("node2 does not serve: {e}\n{}", c.logs()));
    c.wait_converged(&[0, 1, joiner], 3, secs(30))
        .unwrap_or_else(|| panic!("node2 never joined\n{}", c.logs()));
    let id = c.nodes[joiner].peer_id().expect("node2's peer id");
    let s0 = c.nodes[0].status().expect("the founder's status");
    let refusal = s0
        .clock_refusals
        .iter()
        .find(|r| r.peer_id == id)
        .unwrap_or_else(|| panic!("no clock refusal of node2 on the founder: {s0:?}"));
    assert!(
        (590_000..=610_000).contains(&refusal.skew_ms),
        "{refusal:?}"
    );
}

/// Two of three nodes killed: the survivor is a minority of one, cannot commit and says why on
/// `/status` (what `/readyz` answers with its 503), naming how many voters it reaches.
#[test]
fn a_node_left_in_a_minority_says_why_it_is_not_ready() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, secs(15))
        .unwrap_or_else(|| panic!("no cluster of 3\n{}", c.logs()));
    wait_for(secs(10), || {
        (0..3)
            .all(|i| c.nodes[i].status().is_some_and(|s| s.not_ready.is_none()))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("not every member is ready\n{}", c.logs()));
    c.nodes[1].kill();
    c.nodes[2].kill();
    let why = wait_for(secs(15), || {
        c.nodes[0]
            .status()?
            .not_ready
            .filter(|w| w.contains("no leader known"))
    })
    .unwrap_or_else(|| panic!("the survivor never said why\n{}", c.logs()));
    assert_eq!(
        why,
        "no leader known: this node reaches 1 of 3 voters (a quorum is 2)"
    );
}
