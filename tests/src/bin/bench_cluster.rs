//! Cluster benchmark: notice propagation and raft commit latency over libp2p, with real
//! `parcae-node` processes on 127.0.0.1. Prints a table.
//!
//! `parcae-bench-cluster [NODES] [ROUNDS]` (defaults 10 and 6). Commit latency is measured by
//! the leader from proposal to local apply of its planner's `AvailabilityTick`s (one every
//! 50 ms), over libp2p with fsync'd raft storage. Notice propagation is `received - issued` on
//! every other node for a SIGTERM notice; each round terminates a non-leader and restarts it
//! from its data directory.

use std::time::Duration;

use parcae_tests::{start_cluster, wait_for};

const CONFIG: &str = "grace_secs = 1.0\n[raft]\ntick_ms = 100\nelection_ticks = 10\nheartbeat_ticks = 2\nlost_timeout_ms = 3000\n[planner]\ninterval_secs = 0.05\n[train]\nenabled = false\n";

fn quantile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(6);
    let mut c = start_cluster(CONFIG, nodes);
    let all: Vec<usize> = (0..nodes).collect();
    let mut leader = c
        .wait_converged(&all, nodes, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("cluster did not converge\n{}", c.logs()));

    let mut notice_ms: Vec<u64> = Vec::new();
    for round in 0..rounds {
        let li = c.index_of(&leader).expect("leader");
        let vi = (round % nodes + 1..nodes + round % nodes + 1)
            .map(|i| i % nodes)
            .find(|&i| i != li)
            .expect("a follower");
        let victim = c.nodes[vi].peer_id().expect("victim id");
        c.nodes[vi].signal(nix::sys::signal::Signal::SIGTERM);
        let samples = wait_for(Duration::from_secs(10), || {
            all.iter()
                .filter(|&&i| i != vi)
                .map(|&i| {
                    let s = c.nodes[i].status()?;
                    let n = s.notices.iter().rev().find(|n| n.peer_id == victim)?;
                    Some(n.received_unix_ms - n.issued_unix_ms)
                })
                .collect::<Option<Vec<u64>>>()
        })
        .unwrap_or_else(|| {
            panic!(
                "round {round}: notice not delivered everywhere\n{}",
                c.logs()
            )
        });
        notice_ms.extend(samples);
        c.nodes[vi]
            .wait_exit(Duration::from_secs(10))
            .expect("victim exits");
        // Let the leader forget it, then bring it back from its data directory.
        wait_for(Duration::from_secs(10), || {
            let s = c.nodes[li].status()?;
            s.member(&victim).is_none().then_some(())
        });
        c.nodes[vi].restart().expect("restarting the node");
        leader = c
            .wait_converged(&all, nodes, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("round {round}: no reconvergence\n{}", c.logs()));
    }

    let li = c.index_of(&leader).expect("leader");
    let lat = wait_for(Duration::from_secs(60), || {
        let s = c.nodes[li].status()?;
        let l = s.commit_latency_us;
        (l.count >= 200).then_some(l)
    })
    .expect("200 commits measured");

    notice_ms.sort_unstable();
    println!("| metric ({nodes} nodes, 127.0.0.1, 2 cores) | samples | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    println!(
        "| notice propagation (SIGTERM -> gossip receipt) | {} | {} ms | {} ms | {} ms |",
        notice_ms.len(),
        quantile(&notice_ms, 0.5),
        quantile(&notice_ms, 0.99),
        notice_ms.last().copied().unwrap_or(0)
    );
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "| raft commit (leader propose -> apply, fsync) | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
        lat.count,
        ms(lat.p50),
        ms(lat.p99),
        ms(lat.max)
    );
}
