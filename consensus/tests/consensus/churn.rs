//! Spot churn: the cluster grows from 3 to 15 nodes and shrinks to 4, with crashes in between.
//! Voters never exceed `max_voters`, and commands keep committing while a majority of voters
//! is alive.

use parcae_consensus::state::{MemberStatus, RaftRole};
use parcae_consensus::{Command, NodeId};

use crate::sim::{NetFaults, Sim, id_of, test_config};

const MAX_VOTERS: usize = 5;

/// Ticks, checking the voter bound on every live node after each tick.
fn run_checked(sim: &mut Sim, ticks: u64) {
    for _ in 0..ticks {
        sim.tick();
        for id in sim.live() {
            let st = sim.node(id).status();
            assert!(
                st.voters.len() <= MAX_VOTERS,
                "{id} sees {} voters",
                st.voters.len()
            );
            let roles = sim
                .node(id)
                .state()
                .members
                .values()
                .filter(|m| m.role == RaftRole::Voter)
                .count();
            assert!(roles <= MAX_VOTERS);
        }
    }
}

/// Commits `cmd` through the leader, retrying across leader changes.
fn commit(sim: &mut Sim, cmd: Command) {
    for _ in 0..20 {
        while sim.leader().is_none() {
            run_checked(sim, 1);
        }
        if sim.propose(cmd.clone()).is_ok() {
            for _ in 0..100 {
                if sim.pending() == 0 {
                    break;
                }
                run_checked(sim, 1);
            }
            if sim.acked.values().any(|c| *c == cmd) {
                return;
            }
        }
        run_checked(sim, 5);
    }
    panic!("could not commit {cmd:?}");
}

fn voters(sim: &Sim, at: NodeId) -> Vec<NodeId> {
    sim.node(at).status().voters
}

fn settle(sim: &mut Sim) {
    for _ in 0..60 {
        run_checked(sim, 10);
        if sim.converged() && sim.leader().is_some() {
            let l = sim.leader().unwrap();
            let st = sim.node(l).status();
            let members = sim
                .node(l)
                .state()
                .members
                .values()
                .filter(|m| m.status != MemberStatus::Lost)
                .count();
            let healthy = sim
                .node(l)
                .state()
                .members
                .values()
                .filter(|m| m.status.is_healthy())
                .count();
            let want = MAX_VOTERS.min(healthy);
            let want = want - (1 - want % 2);
            if st.voters.len() == want && st.voters.len() + st.learners.len() == members {
                return;
            }
        }
    }
    let l = sim.leader();
    for id in sim.live() {
        let n = sim.node(id);
        eprintln!(
            "{id}: {:?} members={:?}",
            n.status(),
            n.state()
                .members
                .values()
                .map(|m| (m.id, m.status, m.role))
                .collect::<Vec<_>>()
        );
    }
    panic!("membership did not settle (leader {l:?})");
}

#[test]
fn grow_to_fifteen_and_shrink_to_four_with_crashes() {
    let mut sim = Sim::bootstrap(21, 3, test_config(false), NetFaults::NONE);
    let mut interval = 0u64;
    let mut tick = |sim: &mut Sim| {
        commit(
            sim,
            Command::AvailabilityTick {
                interval,
                count: sim.live().len() as u32,
                pools: Vec::new(),
            },
        );
        interval += 1;
    };
    while sim.leader().is_none() {
        run_checked(&mut sim, 1);
    }
    // Grow to 15, crashing a voter after the 8th and a learner after the 12th node.
    while sim.nodes.len() < 15 {
        let p = sim.add_empty_node();
        commit(
            &mut sim,
            Command::Join {
                node: id_of(&p),
                peer: p.clone(),
            },
        );
        run_checked(&mut sim, 10);
        if sim.nodes.len() == 8 || sim.nodes.len() == 12 {
            settle(&mut sim);
            let leader = sim.leader().unwrap();
            let vs = voters(&sim, leader);
            let victim = if sim.nodes.len() == 8 {
                *vs.iter().find(|v| **v != leader).unwrap()
            } else {
                *sim.node(leader).status().learners.first().unwrap()
            };
            sim.crash(victim);
            commit(&mut sim, Command::Lost { node: victim });
            tick(&mut sim);
        }
    }
    settle(&mut sim);
    let leader = sim.leader().unwrap();
    assert_eq!(voters(&sim, leader).len(), MAX_VOTERS);
    assert_eq!(sim.live().len(), 13);
    tick(&mut sim);

    // Shrink to 4: alternately a graceful leave (notice, demotion, leave) and a crash.
    let mut graceful = true;
    while sim.live().len() > 4 {
        let leader = sim.leader().unwrap();
        let vs = voters(&sim, leader);
        let victim = *vs.iter().find(|v| **v != leader).unwrap();
        if graceful {
            commit(
                &mut sim,
                Command::Notice {
                    node: victim,
                    deadline_ms: 1_000,
                },
            );
            for _ in 0..100 {
                if !voters(&sim, sim.leader().unwrap()).contains(&victim) {
                    break;
                }
                run_checked(&mut sim, 2);
            }
            let l = sim.leader().unwrap();
            assert!(
                !voters(&sim, l).contains(&victim),
                "leaving voter demoted before it goes"
            );
            assert!(matches!(
                sim.node(l).state().members[&victim].status,
                MemberStatus::Leaving { .. }
            ));
            commit(&mut sim, Command::Leave { node: victim });
            sim.crash(victim);
        } else {
            sim.crash(victim);
            commit(&mut sim, Command::Lost { node: victim });
        }
        graceful = !graceful;
        settle(&mut sim);
        tick(&mut sim);
    }
    settle(&mut sim);
    let leader = sim.leader().unwrap();
    let st = sim.node(leader).status();
    assert_eq!(st.voters.len(), 3);
    assert_eq!(st.learners.len(), 1);
    // Crash one voter of three: a majority is alive and commands still commit.
    let victim = *st.voters.iter().find(|v| **v != leader).unwrap();
    sim.crash(victim);
    tick(&mut sim);
    sim.restart(victim);
    sim.run_until(500, |s| s.converged())
        .expect("converges after churn");
}
