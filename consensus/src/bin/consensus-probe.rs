//! A single-node raft cluster on a data directory, for the crash-recovery test: it recovers
//! whatever the directory holds, prints what it found, then proposes `AvailabilityTick`s with
//! consecutive intervals and prints each one once it is applied (and therefore fsync'd).
//!
//! Usage: `consensus-probe DIR COUNT` (COUNT 0: only report the recovered state).
//! Output lines: `recovered applied=A samples=N last=L contiguous=true|false`, then `acked I`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use parcae_consensus::state::PeerInfo;
use parcae_consensus::{Command, NodeId, RaftConfig, RaftNode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(count)) = (args.get(1), args.get(2).and_then(|c| c.parse::<u64>().ok()))
    else {
        eprintln!("usage: consensus-probe DIR COUNT");
        return ExitCode::from(2);
    };
    match run(PathBuf::from(dir), count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("consensus-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: PathBuf, count: u64) -> Result<(), Box<dyn std::error::Error>> {
    let peer = PeerInfo {
        peer_id: b"consensus-probe".to_vec(),
        ..PeerInfo::default()
    };
    let config = RaftConfig::new(NodeId::from_peer_bytes(&peer.peer_id));
    let mut node = RaftNode::open_or_bootstrap(&dir, config, &[peer])?;
    node.campaign()?;
    while !node.is_leader() {
        node.tick();
        node.drive()?;
    }
    // Re-apply the committed log after the snapshot before reporting.
    while node.status().applied < node.status().commit {
        node.drive()?;
    }
    let state = node.state();
    let intervals: Vec<u64> = state.availability.iter().map(|a| a.interval).collect();
    let contiguous = intervals.iter().enumerate().all(|(i, v)| *v == i as u64);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "recovered applied={} samples={} last={} contiguous={contiguous}",
        node.status().applied,
        intervals.len(),
        intervals.last().map_or(-1, |v| *v as i64),
    )?;
    out.flush()?;
    let start = intervals.last().map_or(0, |v| v + 1);
    for interval in start..start + count {
        let mut handle = node.propose(&Command::AvailabilityTick {
            interval,
            count: 1,
            pools: Vec::new(),
        })?;
        let outcome = loop {
            node.drive()?;
            if let Some(outcome) = handle.try_outcome() {
                break outcome;
            }
        };
        outcome?;
        writeln!(out, "acked {interval}")?;
        out.flush()?;
    }
    Ok(())
}
