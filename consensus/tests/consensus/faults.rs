//! Safety under randomized faults: partitions, crashes, restarts, loss, duplication and
//! reordering, with nodes joining mid-run (learner, snapshot, promotion through joint
//! consensus). Each seed runs a random schedule, then heals everything and checks that all nodes
//! converge to equal states containing every acknowledged command.
//!
//! `cargo test` runs 200 seeds; set `PARCAE_CONSENSUS_SEEDS=N` for more (or fewer) and
//! `PARCAE_CONSENSUS_FIRST_SEED=S` to start elsewhere (to replay a failing seed). The storage
//! runs without fsync here to keep the sweep fast (an in-process crash loses no written data);
//! the durability tests use fsync.

use std::collections::BTreeSet;

use parcae_consensus::{Command, NodeId};
use rand::Rng;

use crate::sim::{NetFaults, Sim, id_of, test_config};

const DEFAULT_SEEDS: u64 = 200;

fn run_seed(seed: u64) {
    let mut rng_setup = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    let n = if rng_setup.random_bool(0.5) { 3 } else { 5 };
    let faults = NetFaults {
        drop: rng_setup.random_range(0.0..0.2),
        duplicate: rng_setup.random_range(0.0..0.1),
        max_delay: rng_setup.random_range(1..4),
    };
    let mut sim = Sim::bootstrap(seed, n, test_config(false), faults);
    let mut next_interval = 0u64;
    for _ in 0..250 {
        let ids: Vec<NodeId> = sim.nodes.keys().copied().collect();
        let roll: f64 = sim.rng.random();
        if roll < 0.02 {
            let live = sim.live();
            // Keep a majority alive so that progress is possible most of the time.
            if live.len() > n as usize / 2 + 1 {
                let victim = live[sim.rng.random_range(0..live.len())];
                sim.crash(victim);
            }
        } else if roll < 0.05 {
            let dead: Vec<NodeId> = ids
                .iter()
                .copied()
                .filter(|id| sim.nodes[id].node.is_none())
                .collect();
            if !dead.is_empty() {
                let back = dead[sim.rng.random_range(0..dead.len())];
                sim.restart(back);
            }
        } else if roll < 0.07 {
            let size = sim.rng.random_range(1..=n as usize / 2);
            let group: BTreeSet<NodeId> = ids
                .iter()
                .copied()
                .filter(|_| sim.rng.random_bool(size as f64 / n as f64))
                .collect();
            sim.partition(group);
        } else if roll < 0.10 {
            sim.heal();
        } else if roll < 0.11 && ids.len() < n as usize + 2 {
            // A node joins mid-run: learner, snapshot, maybe promotion, all under faults.
            let p = sim.add_empty_node();
            let _ = sim.propose(Command::Join {
                node: id_of(&p),
                peer: p,
            });
        } else if roll < 0.45 {
            let cmd = Command::AvailabilityTick {
                interval: next_interval,
                count: 1,
                pools: Vec::new(),
            };
            if sim.propose(cmd).is_ok() {
                next_interval += 1;
            }
        }
        sim.tick();
    }
    // Heal: everyone back, no more faults, every started node joined.
    sim.heal();
    sim.faults = NetFaults::NONE;
    let ids: Vec<NodeId> = sim.nodes.keys().copied().collect();
    for id in &ids {
        if sim.nodes[id].node.is_none() {
            sim.restart(*id);
        }
    }
    for _ in 0..20 {
        let Some(leader) = sim.leader() else {
            sim.run(10);
            continue;
        };
        let missing: Vec<NodeId> = ids
            .iter()
            .copied()
            .filter(|id| !sim.node(leader).state().members.contains_key(id))
            .collect();
        if missing.is_empty() {
            break;
        }
        for id in missing {
            let p = sim.peer_info(id);
            let _ = sim.propose(Command::Join { node: id, peer: p });
        }
        sim.run(30);
    }
    sim.run_until(600, |s| {
        s.leader().is_some() && s.pending() == 0 && s.converged()
    })
    .unwrap_or_else(|| {
        for id in sim.live() {
            let n = sim.node(id);
            eprintln!(
                "{id}: {:?} last={:?} metrics={:?}",
                n.status(),
                n.state().availability.back(),
                n.metrics()
            );
        }
        panic!("seed {seed}: no convergence (pending {})", sim.pending())
    });
    // Every acknowledged command is in the final state, in log order.
    let state = sim.node(ids[0]).state().clone();
    let intervals: BTreeSet<u64> = state.availability.iter().map(|a| a.interval).collect();
    for cmd in sim.acked.values() {
        if let Command::AvailabilityTick { interval, .. } = cmd {
            assert!(
                intervals.contains(interval),
                "seed {seed}: acked interval {interval} lost"
            );
        }
    }
    let history: Vec<u64> = state.availability.iter().map(|a| a.interval).collect();
    assert!(
        history.windows(2).all(|w| w[0] < w[1]),
        "seed {seed}: history out of order"
    );
    for id in &ids {
        assert_eq!(
            sim.node(*id).state().digest(),
            state.digest(),
            "seed {seed}: digest of {id}"
        );
    }
}

fn seed_range(half: u64) -> std::ops::Range<u64> {
    let seeds = std::env::var("PARCAE_CONSENSUS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    let first: u64 = std::env::var("PARCAE_CONSENSUS_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Two halves so that the test harness runs them on two threads.
    let mid = first + seeds / 2;
    if half == 0 {
        first..mid
    } else {
        mid..first + seeds
    }
}

#[test]
fn randomized_faults_preserve_safety_first_half() {
    for seed in seed_range(0) {
        run_seed(seed);
    }
}

#[test]
fn randomized_faults_preserve_safety_second_half() {
    for seed in seed_range(1) {
        run_seed(seed);
    }
}
