//! State-handoff throughput over the data plane (TCP + AES-256-GCM, authenticated by the
//! cluster key and libp2p identities) next to a raw TCP loopback copy, in the same run.
//!
//! `cargo bench -p parcae-node --bench handoff` prints a table; the goal is >= 1.25 GB/s, the
//! 10 Gb/s links of Parcae's evaluation. Three columns: raw TCP, one data-plane message, and a
//! real stage handoff (the trainer's endpoint serving held layers, fetched by `client::fetch`
//! exactly as a node entering a new slot does).

use std::time::Instant;

use libp2p::identity::Keypair;
use parcae_node::dataplane::{accept, connect};
use parcae_node::key::ClusterKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RUNS: usize = 5;

async fn raw(data: &[u8]) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let n = data.len();
    let rx = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await.expect("read");
        s.write_all(&[1]).await.expect("ack");
    });
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let t = Instant::now();
    s.write_all(data).await.expect("write");
    let mut ack = [0u8];
    s.read_exact(&mut ack).await.expect("ack");
    let secs = t.elapsed().as_secs_f64();
    rx.await.expect("receiver");
    n as f64 / secs / 1e9
}

async fn secure(data: &[u8], key: &ClusterKey) -> f64 {
    let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let b_id = b.public().to_peer_id();
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let k = key.clone();
    let rx = tokio::spawn(async move {
        let (s, _) = l.accept().await.expect("accept");
        let (_, mut st) = accept(s, &b, &[k], |_| async { true })
            .await
            .expect("handshake");
        let got = st.recv(u64::MAX).await.expect("recv").len();
        st.send(&[1]).await.expect("ack");
        got
    });
    let mut st = connect(addr, &a, b_id, std::slice::from_ref(key))
        .await
        .expect("connect");
    let t = Instant::now();
    st.send(data).await.expect("send");
    st.recv(1).await.expect("ack");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(rx.await.expect("receiver"), data.len());
    data.len() as f64 / secs / 1e9
}

/// Layers a handoff of the benchmark is cut into (one message per layer, as the trainer sends).
const LAYERS: usize = 8;

async fn handoff(data: &[u8], key: &ClusterKey) -> f64 {
    use std::sync::Arc;
    use std::time::Duration;

    use parcae_consensus::state::{PeerInfo, RaftRole};
    use parcae_consensus::{ControlState, NodeId};
    use parcae_node::checkpoint::CheckpointStore;
    use parcae_node::dataplane::client::{PeerAddr, fetch};
    use parcae_node::dataplane::server::{Endpoint, Held, serve};

    let (holder, fetcher) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let member = |k: &Keypair| {
        let info = PeerInfo {
            peer_id: k.public().to_peer_id().to_bytes(),
            ..PeerInfo::default()
        };
        (info, RaftRole::Voter)
    };
    let state = ControlState::bootstrap(&[member(&holder), member(&fetcher)]);
    let view = tokio::sync::watch::channel(Arc::new(state)).1;
    let dir = std::env::temp_dir().join("parcae-handoff-bench");
    let endpoint = |k: Keypair| {
        Arc::new(Endpoint::new(
            k,
            key.clone().into(),
            view.clone(),
            CheckpointStore::new(dir.clone()),
            u64::MAX,
            Duration::from_secs(60),
        ))
    };
    let server = endpoint(holder.clone());
    let per = data.len() / LAYERS;
    server.hold(Some(Held {
        history: 0,
        step: 1,
        start: 0,
        layers: data.chunks(per).map(<[u8]>::to_vec).collect(),
    }));
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let task = tokio::spawn(serve(l, server));
    let client = endpoint(fetcher);
    let peer = PeerAddr {
        node: NodeId::from_peer_bytes(&holder.public().to_peer_id().to_bytes()),
        peer: holder.public().to_peer_id(),
        addr,
    };
    let t = Instant::now();
    let got = fetch(&client, &peer, 0, 1, 0..LAYERS).await.expect("fetch");
    let secs = t.elapsed().as_secs_f64();
    task.abort();
    assert_eq!(got.iter().map(Vec::len).sum::<usize>(), data.len());
    data.len() as f64 / secs / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let key = ClusterKey::generate();
    println!(
        "| size | raw TCP GB/s (median of {RUNS}) | data plane GB/s | stage handoff GB/s | handoff / raw |"
    );
    println!("|---|---|---|---|---|");
    for mib in [64usize, 256] {
        let data = vec![0x5au8; mib << 20];
        let (mut r, mut s, mut h) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            r.push(raw(&data).await);
            s.push(secure(&data, &key).await);
            h.push(handoff(&data, &key).await);
        }
        let (r, s, h) = (median(r), median(s), median(h));
        println!("| {mib} MiB | {r:.2} | {s:.2} | {h:.2} | {:.2} |", h / r);
    }
}
