//! Training goes on through the cluster's churn: a notice drains a node before its deadline, a
//! kill and a cut cost only the steps in flight, and a joining node is put to work.

use std::time::Duration;

use parcae_api::{MigrationKind, RoleView, TrainingPhase};
use parcae_tests::training::*;
use parcae_tests::{serial, wait_for};

#[test]
fn a_noticed_node_is_drained_before_its_deadline() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    let epoch_before = c.nodes[0].status().unwrap().epoch;
    let noticed_at = std::time::Instant::now();
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGTERM);
    // A new plan without the node is in force, and trained under, before the 10 s deadline.
    let survivor = (0..c.nodes.len())
        .find(|i| *i != victim)
        .expect("a survivor");
    let trained_after = wait_for(Duration::from_secs(10), || {
        let epoch = c.nodes[survivor].status()?.epoch;
        let under_new = steps(&c, survivor).iter().any(|r| r.epoch == epoch);
        (epoch > epoch_before && under_new).then_some(noticed_at.elapsed())
    })
    .unwrap_or_else(|| panic!("no reconfiguration before the deadline\n{}", c.logs()));
    assert!(trained_after < Duration::from_secs(10));
    let status = c.nodes[victim].status();
    let exit = c.nodes[victim].wait_exit(Duration::from_secs(15));
    assert_eq!(
        exit.and_then(|e| e.code()),
        Some(0),
        "the noticed node exits cleanly"
    );
    assert!(
        status.is_none_or(|s| s
            .training
            .is_none_or(|t| t.phase != TrainingPhase::Training)),
        "drained"
    );
    let m = migrations(&c);
    assert!(
        m.iter().any(|x| x.epoch > epoch_before
            && matches!(
                x.kind,
                MigrationKind::Intra | MigrationKind::Inter | MigrationKind::Repartition
            )
            && x.secs.is_finite()),
        "migration kind and duration in /status: {m:?}"
    );
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 3, Duration::from_secs(30));
    committed_sequence(&c);
    assert!(c.logs().contains("reconfiguration done"));
}

#[test]
fn training_resumes_after_a_kill() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    let before = last_step(&c).unwrap();
    c.nodes[victim].kill();
    let resumed = trains_on(&c, before, 2, Duration::from_secs(30));
    eprintln!("training resumed {resumed:?} after the kill");
    assert!(
        resumed < Duration::from_secs(15),
        "resumed after {resumed:?}"
    );
    let seq = committed_sequence(&c);
    assert!(seq.len() as u64 > before);
}

#[test]
fn a_joining_node_is_put_to_work() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 2, 3);
    let founder = c.nodes[0].p2p_addr().unwrap();
    let new = c
        .spawn(std::slice::from_ref(&founder), None)
        .expect("spawn");
    let slot = wait_for(Duration::from_secs(60), || {
        let s = c.nodes[new].status()?;
        s.training.as_ref()?.slot?;
        s.config
    })
    .unwrap_or_else(|| panic!("the new node got no slot\n{}", c.logs()));
    let nodes = slot.0 * slot.1;
    assert_eq!(
        nodes, 3,
        "the larger configuration uses the new node: {slot:?}"
    );
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 2, Duration::from_secs(30));
    committed_sequence(&c);
}

#[test]
fn a_cut_off_node_stops_committing_and_rejoins_after_the_cut_heals() {
    let _serial = serial();
    let c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    freeze_then_wake(&c, victim, 3);
}

/// A frozen leader (a VM stalled by its host): the others elect another, replan without it and
/// go on; woken, it steps down, rejoins and follows the log, and no step it had prepared under
/// its old term is committed beside theirs. It stays frozen long enough for the others to
/// compact their log past it (a snapshot every 16 entries), so it rejoins through a snapshot:
/// its `/steps` must still be one unbroken run of steps.
#[test]
fn a_frozen_leader_is_replaced_and_rejoins_as_a_follower() {
    let _serial = serial();
    let config = train_config("", "checkpoint_every = 0").replacen(
        "[raft]\n",
        "[raft]\nsnapshot_interval = 16\n",
        1,
    );
    let c = training_cluster(&config, 4, 5);
    let leader = c
        .statuses()
        .into_iter()
        .find(|(_, s)| s.role == RoleView::Leader)
        .map(|(i, _)| i)
        .expect("a leader");
    let term = c.nodes[leader].status().unwrap().term;
    freeze_then_wake(&c, leader, 40);
    let now = c.nodes[leader].status().unwrap();
    assert_ne!(now.role, RoleView::Leader, "the woken leader stepped down");
    assert!(
        now.term > term,
        "it learnt the new term: {} -> {}",
        term,
        now.term
    );
    assert!(
        std::fs::read_to_string(&c.nodes[leader].log)
            .unwrap()
            .contains("installed snapshot"),
        "it caught up through a snapshot\n{}",
        c.logs()
    );
    let mine = steps(&c, leader);
    assert!(
        mine.windows(2).all(|w| w[1].step == w[0].step + 1),
        "its steps are one unbroken run: {:?}",
        mine.iter().map(|r| r.step).collect::<Vec<_>>()
    );
}

/// SIGSTOPs node `victim` until the others trained `more` steps without it, SIGCONTs it, waits
/// until it is a healthy member again that follows the log, and checks that every node's record
/// of every committed step agrees.
fn freeze_then_wake(c: &parcae_testnet::local_cluster::LocalCluster, victim: usize, more: u64) {
    let peer = c.nodes[victim].peer_id().unwrap();
    // SIGSTOP cuts the node off: its peers see no traffic from it, it sends nothing.
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGSTOP);
    let before = last_step(c).unwrap();
    let others: Vec<usize> = (0..c.nodes.len()).filter(|i| *i != victim).collect();
    wait_for(Duration::from_secs(60), || {
        others
            .iter()
            .filter_map(|i| c.nodes[*i].status())
            .map(|s| s.step)
            .max()
            .filter(|s| *s >= before + more)
    })
    .unwrap_or_else(|| panic!("the others did not go on without it\n{}", c.logs()));
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGCONT);
    // Healed: it is a healthy member again and follows the log.
    wait_for(Duration::from_secs(60), || {
        let s = c.nodes[others[0]].status()?;
        let healthy = s.member(&peer)?.status.is_healthy();
        let mine = c.nodes[victim].status()?;
        (healthy && mine.step + 2 >= s.step).then_some(())
    })
    .unwrap_or_else(|| panic!("the node did not rejoin\n{}", c.logs()));
    // No two configurations committed the same step: every node's record agrees.
    let reference = committed_sequence(c);
    for i in 0..c.nodes.len() {
        for r in steps(c, i) {
            let k = r.step as usize;
            if let Some(same) = reference.get(k) {
                assert_eq!(&r, same, "step {k} on node {i}");
            }
        }
    }
}
