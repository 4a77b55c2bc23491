//! Commit latency and throughput of a 5-node cluster in one process, one thread per node,
//! every node on its own raft-engine directory with fsync on every write.
//!
//! `cargo bench -p parcae-consensus` prints a table: sequential commit latency (one proposal at a
//! time, p50/p99) and pipelined throughput (64 proposals in flight), with fsync (as in
//! production) and, for reference, without (which shows what the disk flushes cost). Set
//! `PARCAE_BENCH_DIR=/some/disk` to put the data directories on a particular disk (default: the
//! system temp dir).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parcae_consensus::state::PeerInfo;
use parcae_consensus::{Command, NodeId, ProposalHandle, RaftConfig, RaftNode, StorageOptions};

const NODES: u32 = 5;
const TICK: Duration = Duration::from_millis(10);
const LATENCY_SAMPLES: usize = 300;
const THROUGHPUT_WINDOW: usize = 64;
const THROUGHPUT_SECS: u64 = 3;

enum Input {
    Raft(NodeId, Vec<u8>),
    Propose(Box<Command>, Sender<bool>),
    Stop,
}

type Mailboxes = Arc<BTreeMap<NodeId, Sender<Input>>>;

fn peer(i: u32) -> PeerInfo {
    PeerInfo {
        peer_id: format!("bench-{i}").into_bytes(),
        ..PeerInfo::default()
    }
}

fn node_loop(
    mut node: RaftNode,
    inbox: Receiver<Input>,
    mailboxes: Mailboxes,
    leader: Arc<AtomicU64>,
) {
    let mut waiting: Vec<(ProposalHandle, Sender<bool>)> = Vec::new();
    let mut next_tick = Instant::now() + TICK;
    loop {
        let timeout = next_tick.saturating_duration_since(Instant::now());
        let mut inputs = Vec::new();
        match inbox.recv_timeout(timeout) {
            Ok(i) => inputs.push(i),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        inputs.extend(inbox.try_iter());
        if Instant::now() >= next_tick {
            node.tick();
            next_tick += TICK;
        }
        for input in inputs {
            match input {
                Input::Raft(from, bytes) => {
                    let _ = node.step(from, &bytes);
                }
                Input::Propose(cmd, reply) => match node.propose(&cmd) {
                    Ok(h) => waiting.push((h, reply)),
                    Err(_) => {
                        let _ = reply.send(false);
                    }
                },
                Input::Stop => return,
            }
        }
        node.drive().expect("drive");
        for m in node.take_messages() {
            if let Some(tx) = mailboxes.get(&m.to) {
                let _ = tx.send(Input::Raft(node.id(), m.bytes));
            }
        }
        node.take_events();
        if node.is_leader() {
            leader.store(node.id().0, Ordering::Relaxed);
        }
        waiting.retain_mut(|(h, reply)| match h.try_outcome() {
            Some(outcome) => {
                let _ = reply.send(outcome.is_ok());
                false
            }
            None => true,
        });
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Results of one configuration.
struct Row {
    p50: Duration,
    p99: Duration,
    sequential_rate: f64,
    pipelined_rate: f64,
}

fn measure(sync: bool) -> Row {
    let base = std::env::var_os("PARCAE_BENCH_DIR").map(std::path::PathBuf::from);
    let peers: Vec<PeerInfo> = (0..NODES).map(peer).collect();
    let dirs: Vec<tempfile::TempDir> = peers
        .iter()
        .map(|_| match &base {
            Some(b) => tempfile::tempdir_in(b).expect("bench dir"),
            None => tempfile::tempdir().expect("temp dir"),
        })
        .collect();
    let leader = Arc::new(AtomicU64::new(0));
    let mut senders = BTreeMap::new();
    let mut receivers = Vec::new();
    for p in &peers {
        let (tx, rx) = mpsc::channel();
        senders.insert(NodeId::from_peer_bytes(&p.peer_id), tx);
        receivers.push(rx);
    }
    let mailboxes: Mailboxes = Arc::new(senders);
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for ((p, dir), rx) in peers.iter().zip(&dirs).zip(receivers) {
        let mut config = RaftConfig::new(NodeId::from_peer_bytes(&p.peer_id));
        config.storage = StorageOptions { sync };
        let node = RaftNode::bootstrap(dir.path(), config, &peers).expect("bootstrap");
        let (mb, l) = (mailboxes.clone(), leader.clone());
        threads.push(std::thread::spawn(move || node_loop(node, rx, mb, l)));
    }
    let start = Instant::now();
    while leader.load(Ordering::Relaxed) == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "no leader");
        std::thread::sleep(Duration::from_millis(5));
    }
    let leader_box = mailboxes[&NodeId(leader.load(Ordering::Relaxed))].clone();
    let mut interval = 0u64;
    let mut next_cmd = || {
        interval += 1;
        Command::AvailabilityTick {
            interval,
            count: NODES,
            pools: Vec::new(),
        }
    };

    // Sequential latency.
    let mut lat = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        let (tx, rx) = mpsc::channel();
        let t = Instant::now();
        leader_box
            .send(Input::Propose(Box::new(next_cmd()), tx))
            .unwrap();
        assert!(rx.recv().unwrap(), "proposal failed");
        lat.push(t.elapsed());
    }
    lat.sort();

    // Pipelined throughput.
    let (tx, rx) = mpsc::channel();
    for _ in 0..THROUGHPUT_WINDOW {
        leader_box
            .send(Input::Propose(Box::new(next_cmd()), tx.clone()))
            .unwrap();
    }
    let t = Instant::now();
    let mut committed = 0u64;
    while t.elapsed() < Duration::from_secs(THROUGHPUT_SECS) {
        if rx.recv().unwrap() {
            committed += 1;
        }
        leader_box
            .send(Input::Propose(Box::new(next_cmd()), tx.clone()))
            .unwrap();
    }
    let pipelined_rate = committed as f64 / t.elapsed().as_secs_f64();

    for tx in mailboxes.values() {
        let _ = tx.send(Input::Stop);
    }
    for th in threads {
        th.join().unwrap();
    }
    Row {
        p50: percentile(&lat, 0.50),
        p99: percentile(&lat, 0.99),
        sequential_rate: LATENCY_SAMPLES as f64
            / lat.iter().map(Duration::as_secs_f64).sum::<f64>(),
        pipelined_rate,
    }
}

fn main() {
    // `cargo test --benches` runs bench targets with `--test`-style flags: nothing to do then.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let fsync = measure(true);
    let nosync = measure(false);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "parcae-consensus commit benchmark: {NODES} nodes in one process, one thread each, raft-engine storage"
    );
    println!("| metric | fsync (production) | no fsync (reference) |");
    println!("|---|---|---|");
    println!(
        "| commit latency p50, 1 in flight | {:.2} ms | {:.2} ms |",
        ms(fsync.p50),
        ms(nosync.p50)
    );
    println!(
        "| commit latency p99, 1 in flight | {:.2} ms | {:.2} ms |",
        ms(fsync.p99),
        ms(nosync.p99)
    );
    println!(
        "| commits/s, 1 in flight | {:.0} | {:.0} |",
        fsync.sequential_rate, nosync.sequential_rate
    );
    println!(
        "| commits/s, {THROUGHPUT_WINDOW} in flight ({THROUGHPUT_SECS} s) | {:.0} | {:.0} |",
        fsync.pipelined_rate, nosync.pipelined_rate
    );
}
