//! Admission and hostile input against real `parcae-node` processes.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use libp2p::identity::Keypair;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, Swarm};
use parcae_api::RoleView;
use parcae_consensus::Command;
use parcae_consensus::state::PeerInfo;
use parcae_node::control::proof;
use parcae_node::data_dir::DataDir;
use parcae_node::http::{MAX_PER_SOURCE, REQUEST_TIMEOUT};
use parcae_node::key::ClusterKey;
use parcae_node::keyring::KeyRing;
use parcae_node::net::codec::{CONTROL_PROTOCOL, write_frame};
use parcae_node::net::swarm::{Behaviour, NetLimits, build_swarm};
use parcae_node::wire::ControlMessage;
use parcae_tests::training::*;
use parcae_tests::{
    LocalCluster, TEST_CONFIG, TRAIN_BASE_CONFIG, http_get, new_cluster, rss_kib, secs, serial,
    start_cluster, wait_for,
};

fn metric(addr: std::net::SocketAddr, name: &str) -> u64 {
    http_get(addr, "/metrics")
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn member_count(c: &LocalCluster, i: usize) -> usize {
    c.nodes[i].status().map(|s| s.members.len()).unwrap_or(0)
}

#[test]
fn node_with_another_key_cannot_connect_or_join() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let admitted_before = metric(
        c.nodes[0].status_addr,
        "parcae_connections_established_total",
    );

    let other_key = c.dir().join("other.key");
    ClusterKey::generate().store(&other_key).expect("key");
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let intruder = c.spawn(&[founder], Some(&other_key)).expect("spawn");
    wait_for(Duration::from_secs(5), || c.nodes[intruder].status()).expect("intruder runs");
    // It keeps trying (redials with backoff, at most ~4 s apart); give it several attempts.
    wait_for(Duration::from_secs(10), || {
        (metric(c.nodes[0].status_addr, "parcae_connections_failed_total") >= 3).then_some(())
    })
    .unwrap_or_else(|| panic!("no refused connections seen\n{}", c.logs()));

    let s = c.nodes[intruder].status().expect("intruder status");
    assert_eq!(s.connected_peers.len(), 0);
    // The intruder is told why, at warn level, naming the address; the founder logs the
    // refusals from one source at most once a minute.
    let told = c.nodes[intruder].log_tail(400);
    assert!(
        told.lines().any(|l| l.contains("WARN")
            && l.contains("another cluster key")
            && l.contains(&c.nodes[0].listen)),
        "{told}"
    );
    let refusals = c.nodes[0]
        .log_tail(4000)
        .matches("incoming connection refused")
        .count();
    assert_eq!(refusals, 1, "{}", c.nodes[0].log_tail(4000));
    assert_eq!(s.members.len(), 0);
    for i in 0..3 {
        assert_eq!(member_count(&c, i), 3, "membership changed on node {i}");
    }
    assert_eq!(
        metric(
            c.nodes[0].status_addr,
            "parcae_connections_established_total"
        ),
        admitted_before,
        "the intruder's connection was admitted"
    );
}

/// An authenticated attacker: holds the cluster key, speaks the control protocol.
fn attacker(key: &ClusterKey) -> Swarm<Behaviour> {
    let limits = NetLimits {
        max_control_frame: 64 << 20,
        ..NetLimits::default()
    };
    build_swarm(Keypair::generate_ed25519(), key.clone().into(), &limits).expect("swarm")
}

/// Sends `frame` to `target` on a control stream of its own, from a task: the stream opens
/// only while the swarm is polled.
fn send_frame(swarm: &Swarm<Behaviour>, target: PeerId, frame: Vec<u8>) {
    let mut control = swarm.behaviour().control.new_control();
    tokio::spawn(async move {
        let mut stream = control
            .open_stream(target, CONTROL_PROTOCOL)
            .await
            .expect("the node accepts control streams");
        // The node may cut the connection mid-frame: that is what some of these tests wait for.
        if write_frame(&mut stream, &frame, u32::MAX).await.is_ok() {
            let _ = stream.close().await;
        }
    });
}

/// Connects, sends `frame`, and waits until the node closes the connection.
async fn send_and_expect_disconnect(
    swarm: &mut Swarm<Behaviour>,
    target: PeerId,
    addr: &Multiaddr,
    frame: Vec<u8>,
) {
    swarm.dial(addr.clone()).expect("dial");
    let deadline = tokio::time::sleep(secs(10));
    tokio::pin!(deadline);
    let mut sent = false;
    loop {
        tokio::select! {
            ev = swarm.select_next_some() => match ev {
                SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == target && !sent => {
                    send_frame(swarm, target, frame.clone());
                    sent = true;
                }
                SwarmEvent::ConnectionClosed { peer_id, num_established: 0, .. } if peer_id == target && sent => return,
                SwarmEvent::OutgoingConnectionError { error, .. } => panic!("attacker could not connect: {error}"),
                _ => {}
            },
            _ = &mut deadline => panic!("node did not disconnect the peer within 10 s"),
        }
    }
}

#[test]
fn hostile_input_is_dropped_and_the_node_keeps_serving() {
    let _serial = serial();
    let mut c = new_cluster(&format!("{TEST_CONFIG}[net]\nmax_control_frame = 65536\n"));
    c.spawn(&[], None).expect("spawn");
    let node = &c.nodes[0];
    let target: PeerId = wait_for(Duration::from_secs(10), || node.peer_id())
        .expect("node up")
        .parse()
        .expect("peer id");
    let addr: Multiaddr = node.listen.parse().expect("listen addr");

    // 1. Random bytes to the TCP port, several connections.
    let port: u16 = node
        .listen
        .rsplit('/')
        .next()
        .expect("port")
        .parse()
        .expect("port");
    // The node serves its peer id before its swarm listens: on a loaded machine the first
    // connection can come before the port is bound.
    for i in 0..5u8 {
        let mut s = wait_for(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("tcp connect within 10 s");
        let junk: Vec<u8> = (0..4096u32)
            .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i))
            .collect();
        let _ = s.write_all(&junk);
    }
    wait_for(Duration::from_secs(5), || {
        (metric(node.status_addr, "parcae_connections_failed_total") >= 5).then_some(())
    })
    .expect("garbage connections refused");
    assert!(
        node.status().is_some(),
        "node stopped serving after garbage"
    );

    // 2. An authenticated peer sending malformed and oversized messages.
    let key = ClusterKey::load(c.key()).expect("key");
    let frames = vec![
        vec![0xff; 64], // not a control message
        ControlMessage::Raft(vec![0xde, 0xad, 0xbe, 0xef])
            .encode()
            .expect("encode"), // not raft protobuf
        ControlMessage::Propose(
            proof::sign(&Keypair::generate_ed25519(), vec![1, 2, 3], now_ms()).expect("sign"),
        )
        .encode()
        .expect("encode"), // signed, but by another peer than the sender, and not a command
        vec![0u8; 200_000], // over the 64 KiB frame limit
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for frame in frames {
            let mut swarm = attacker(&key);
            send_and_expect_disconnect(&mut swarm, target, &addr, frame).await;
        }
    });
    assert!(metric(node.status_addr, "parcae_bad_input_disconnects_total") >= 4);
    let s = c.nodes[0].status().expect("node still serves /status");
    assert_eq!(s.role, RoleView::Leader, "the node still leads its cluster");
    assert_eq!(s.members.len(), 1);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A signed control frame carrying `command`, as `signer` proposes it.
fn proposal(signer: &Keypair, command: &Command, relayed: bool) -> Vec<u8> {
    let signed = proof::sign(signer, command.encode().expect("encode"), now_ms()).expect("sign");
    let message = if relayed {
        ControlMessage::Forwarded(signed)
    } else {
        ControlMessage::Propose(signed)
    };
    message.encode().expect("encode")
}

#[test]
fn a_member_cannot_propose_for_another_member() {
    let _serial = serial();
    let c = start_cluster(TEST_CONFIG, 3);
    let leader = c
        .wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let li = c.index_of(&leader).expect("leader index");
    let victim = c.nodes[(li + 1) % 3].peer_id().expect("victim");
    let victim_peer: PeerId = victim.parse().expect("peer id");
    let target: PeerId = leader.parse().expect("leader id");
    let addr: Multiaddr = c.nodes[li].listen.parse().expect("addr");
    let key = ClusterKey::load(c.key()).expect("key");

    let mallory = Keypair::generate_ed25519();
    let me = mallory.public().to_peer_id();
    let join = Command::Join {
        node: parcae_consensus::NodeId::from_peer_bytes(&me.to_bytes()),
        peer: PeerInfo {
            peer_id: me.to_bytes(),
            ..PeerInfo::default()
        },
    };
    let victim_node = parcae_consensus::NodeId::from_peer_bytes(&victim_peer.to_bytes());
    let forgeries = [
        // Its own signature on a command about the victim, relayed as a member.
        proposal(&mallory, &Command::Leave { node: victim_node }, true),
        // The same, sent directly.
        proposal(
            &mallory,
            &Command::Notice {
                node: victim_node,
                deadline_ms: now_ms() + 1000,
            },
            false,
        ),
        // A command the victim never signed, under mallory's name as the relay of another key.
        proposal(
            &Keypair::generate_ed25519(),
            &Command::Leave { node: victim_node },
            false,
        ),
    ];
    let limits = NetLimits::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let members_here = || c.nodes[li].status().map(|s| s.members.len()).unwrap_or(0);
    rt.block_on(async {
        let mut swarm = build_swarm(mallory.clone(), key.clone().into(), &limits).expect("swarm");
        // Mallory joins the cluster properly: a member holding the key.
        swarm.dial(addr.clone()).expect("dial");
        let deadline = tokio::time::sleep(secs(15));
        tokio::pin!(deadline);
        let mut poll = tokio::time::interval(Duration::from_millis(200));
        let mut joined = false;
        while !joined {
            tokio::select! {
                ev = swarm.select_next_some() => {
                    if let SwarmEvent::ConnectionEstablished { peer_id, .. } = ev
                        && peer_id == target
                    {
                        send_frame(&swarm, target, proposal(&mallory, &join, false));
                    }
                }
                _ = poll.tick() => joined = members_here() == 4,
                _ = &mut deadline => panic!("mallory's own join was not applied"),
            }
        }
    });
    for frame in forgeries {
        rt.block_on(async {
            let mut swarm =
                build_swarm(mallory.clone(), key.clone().into(), &limits).expect("swarm");
            send_and_expect_disconnect(&mut swarm, target, &addr, frame).await;
        });
    }
    // A forged notice would reach every node within a second: watch for one that long.
    let took = wait_for(Duration::from_secs(1), || {
        (0..3).find(|&i| {
            let s = c.nodes[i].status().expect("status");
            let v = s.member(&victim).expect("the victim is still a member");
            !v.status.is_healthy() || s.notices.iter().any(|n| n.peer_id == victim)
        })
    });
    assert_eq!(took, None, "a node took a forged notice\n{}", c.logs());
    assert!(
        metric(
            c.nodes[li].status_addr,
            "parcae_bad_input_disconnects_total"
        ) >= 3
    );
}

/// A TCP connection to `to` from the loopback address `from`, as another host would open one.
fn connect_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::from((from, 0)).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(1))?;
    Ok(socket.into())
}

#[test]
fn the_status_port_serves_a_client_through_ten_thousand_idle_connections_and_a_pipeline() {
    let _serial = serial();
    let c = start_cluster(TEST_CONFIG, 1);
    let status = c.nodes[0].status_addr;
    let pid = c.nodes[0].pid().expect("node runs");
    wait_for(Duration::from_secs(10), || c.nodes[0].status())
        .unwrap_or_else(|| panic!("no status\n{}", c.logs()));
    let rss_before = rss_kib(pid);

    // 10,000 connections from ten other addresses that never send a byte, all held open.
    let mut idle = Vec::with_capacity(10_000);
    let opening = std::time::Instant::now();
    for n in 0..10_000u32 {
        let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + (n % 10) as u8);
        if let Ok(stream) = connect_from(from, status) {
            idle.push(stream);
        }
    }
    // Each source holds its share until the server drops an idle one for not sending its
    // request in time; then the next of that source is admitted: so many in all.
    let rounds = 1 + opening.elapsed().as_secs() / REQUEST_TIMEOUT.as_secs();
    let admissible = 10 * MAX_PER_SOURCE as u64 * rounds;
    let rss_idle = rss_kib(pid);
    // One more host pipelines 200,000 requests and never reads an answer.
    let pipeline = std::thread::spawn(move || {
        let mut stream = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 12), status)?;
        stream.set_write_timeout(Some(Duration::from_secs(3)))?;
        let request = b"GET /status HTTP/1.1\r\nHost: node\r\n\r\n";
        let batch: Vec<u8> = request.repeat(1000);
        let mut sent = 0u64;
        for _ in 0..200 {
            if stream.write_all(&batch).is_err() {
                break;
            }
            sent += 1000;
        }
        Ok::<_, std::io::Error>((stream, sent))
    });

    // Meanwhile a monitoring client on 127.0.0.1 gets /status within 1 s, every time.
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let asked = std::time::Instant::now();
        let body = http_get(status, "/status");
        slowest = slowest.max(asked.elapsed());
        assert!(
            body.is_some_and(|b| b.contains("\"role\"")),
            "/status not served within 1 s under load\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_pipelined, sent) = pipeline.join().expect("pipeline thread").expect("pipeline");
    let grown_mib = rss_kib(pid).saturating_sub(rss_before) / 1024;
    eprintln!(
        "slowest /status under load: {slowest:?}; pipeline sent {sent} requests; RSS grew {grown_mib} MiB ({} MiB with the idle connections alone)",
        rss_idle.saturating_sub(rss_before) / 1024
    );
    assert!(
        sent >= 1000,
        "the pipeline could not even start ({sent} requests)"
    );
    let refused = metric(status, "parcae_http_refused_total");
    let opened = idle.len() as u64;
    assert!(
        opened >= 9_000 && refused + admissible >= opened,
        "idle connections beyond each source's share must be closed at once: {refused} of \
         {opened} connections refused, at most {admissible} admissible"
    );
    assert!(metric(status, "parcae_http_connections") <= 256);
    assert!(grown_mib < 100, "RSS grew by {grown_mib} MiB");
    drop(idle);
    assert!(http_get(status, "/status").is_some());
}

#[test]
fn a_damaged_raft_log_stops_the_node_with_a_clear_error_and_resync_brings_it_back() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let old_id = c.nodes[2].peer_id().expect("peer id");
    // Let raft write a while (membership, plans) so the damage lands mid-log.
    let raft_dir = DataDir::new(&c.nodes[2].data_dir).raft();
    let log_bytes = || -> u64 {
        std::fs::read_dir(&raft_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "raftlog"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .max()
            .unwrap_or(0)
    };
    wait_for(Duration::from_secs(10), || {
        (log_bytes() > 4096).then_some(())
    })
    .unwrap_or_else(|| panic!("raft wrote too little log\n{}", c.logs()));
    c.nodes[2].kill();
    let mut logs: Vec<_> = std::fs::read_dir(&raft_dir)
        .expect("raft dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    logs.sort();
    let log = logs.pop().expect("a raft log file");
    let mut bytes = std::fs::read(&log).expect("log");
    assert!(
        bytes.len() > 1024,
        "too little log to damage: {}",
        bytes.len()
    );
    let middle = bytes.len() / 2;
    bytes[middle..middle + 64]
        .iter_mut()
        .for_each(|b| *b ^= 0x5A);
    std::fs::write(&log, &bytes).expect("write");

    // It refuses to start, says why, names the file and the way back; no zombie.
    c.nodes[2].restart().expect("restart");
    let exit = c.nodes[2]
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a node on a damaged log kept running\n{}", c.logs()));
    assert!(!exit.success(), "{exit:?}");
    let said = std::fs::read_to_string(&c.nodes[2].log).expect("node log");
    assert!(said.contains("is damaged at byte"), "{said}");
    assert!(said.contains(&log.display().to_string()), "{said}");
    assert!(said.contains("--resync"), "{said}");
    assert_eq!(
        std::fs::read(&log).expect("log"),
        bytes,
        "the evidence stays"
    );

    // --resync sets it aside and the node is back as a new member.
    c.nodes[2]
        .restart_with_args(|args| args.push("--resync".into()))
        .expect("resync");
    let new_id = wait_for(Duration::from_secs(30), || {
        let s = c.nodes[2].status()?;
        let healthy = s.members.iter().any(|m| m.peer_id == s.peer_id);
        (s.peer_id != old_id && healthy && s.leader.is_some()).then_some(s.peer_id)
    })
    .unwrap_or_else(|| panic!("the resynced node did not rejoin\n{}", c.logs()));
    let leader_sees = wait_for(Duration::from_secs(10), || {
        let s = c.nodes[0].status()?;
        s.members.iter().any(|m| m.peer_id == new_id).then_some(())
    });
    assert!(leader_sees.is_some(), "{}", c.logs());
    let aside: Vec<_> = std::fs::read_dir(&c.nodes[2].data_dir)
        .expect("data dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("set-aside-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let kept = c.nodes[2].data_dir.join(&aside[0]).join("raft");
    assert!(kept.join(log.file_name().expect("name")).exists());
}

#[test]
fn a_member_that_left_is_refused_and_comes_back_only_as_a_new_member() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let old_id = c.nodes[2].peer_id().expect("peer id");
    c.nodes[2].signal(nix::sys::signal::Signal::SIGTERM);
    let exit = c.nodes[2]
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the node did not leave\n{}", c.logs()));
    assert!(exit.success(), "{exit:?}");
    let marker = DataDir::new(&c.nodes[2].data_dir).left_marker();
    assert!(marker.exists(), "a graceful exit leaves its mark");
    wait_for(Duration::from_secs(20), || {
        let s = c.nodes[0].status()?;
        (s.members.len() == 2 && s.members.iter().all(|m| m.peer_id != old_id)).then_some(())
    })
    .unwrap_or_else(|| panic!("the leave was not applied\n{}", c.logs()));

    // The old identity (its key and the cluster key in hand, no mark) is refused everywhere.
    std::fs::remove_file(&marker).expect("remove mark");
    c.nodes[2].restart().expect("restart");
    let deadline = std::time::Instant::now() + secs(8);
    while std::time::Instant::now() < deadline {
        if let Some(s) = c.nodes[2].status() {
            assert_eq!(s.peer_id, old_id);
        }
        // The members deny its connections once its handshake names it; the former member's
        // own swarm may count such a connection for the moment before the denial closes it, so
        // the members' side is the one that tells whether it got in.
        for member in [0, 1] {
            let connected = c.nodes[member]
                .status()
                .map(|s| s.connected_peers)
                .unwrap_or_default();
            assert!(
                !connected.contains(&old_id),
                "a former member got connected to node {member}\n{}",
                c.logs()
            );
        }
        let members = c.nodes[0].status().map(|s| s.members).unwrap_or_default();
        assert!(
            members.iter().all(|m| m.peer_id != old_id),
            "it joined again"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(metric(c.nodes[0].status_addr, "parcae_connections_failed_total") >= 1);

    // With its mark, the machine comes back by itself under a new identity.
    c.nodes[2].kill();
    std::fs::write(&marker, b"left the cluster\n").expect("mark");
    c.nodes[2].restart().expect("restart");
    let new_id = wait_for(Duration::from_secs(30), || {
        let s = c.nodes[2].status()?;
        let member = s.members.iter().any(|m| m.peer_id == s.peer_id);
        (s.peer_id != old_id && member && s.leader.is_some()).then_some(s.peer_id)
    })
    .unwrap_or_else(|| panic!("the machine did not come back\n{}", c.logs()));
    assert_ne!(new_id, old_id);
    assert!(
        !marker.exists(),
        "the mark is set aside with the old identity"
    );
}

/// The newest committed step any node shows, once the cluster trains.
fn trained_step(c: &LocalCluster) -> Option<u64> {
    c.statuses()
        .into_iter()
        .filter(|(_, s)| s.loss.is_some())
        .map(|(_, s)| s.step)
        .max()
}

#[test]
fn the_cluster_key_is_rotated_through_raft_while_training_goes_on() {
    let _serial = serial();
    let config = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\n[train]\nseed = 3\nglobal_batch = 16\n\
         micro_batch = 2\npeer_timeout_secs = 5.0\ncheckpoint_every = 0\n"
    );
    let mut c = new_cluster(&config);
    // Every node has a key file of its own, as on separate VMs.
    let old = ClusterKey::load(c.key()).expect("key");
    let dir = c.dir().to_path_buf();
    let key_file = |i: usize| dir.join(format!("node{i}.key"));
    for i in 0..5 {
        old.store(&key_file(i)).expect("key copy");
    }
    let founder = c.spawn(&[], Some(&key_file(0))).expect("founder");
    let seed = wait_for(Duration::from_secs(20), || c.nodes[founder].p2p_addr())
        .unwrap_or_else(|| panic!("no founder\n{}", c.logs()));
    for i in 1..3 {
        c.spawn(std::slice::from_ref(&seed), Some(&key_file(i)))
            .expect("spawn");
    }
    wait_for(Duration::from_secs(120), || {
        trained_step(&c).filter(|s| *s >= 3)
    })
    .unwrap_or_else(|| panic!("no training\n{}", c.logs()));

    // Staged on two of the three members: both keys admitted there, nothing rotated yet.
    let new = ClusterKey::generate();
    let (old_id, new_id) = (old.fingerprint(), new.fingerprint());
    for i in 0..2 {
        new.store(&KeyRing::staged_path(&key_file(i)))
            .expect("stage");
    }
    wait_for(Duration::from_secs(15), || {
        (0..2)
            .all(|i| {
                c.nodes[i]
                    .status()
                    .is_some_and(|s| s.keys_held == [old_id.clone(), new_id.clone()])
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the staged key is not held\n{}", c.logs()));
    // The leader checks the keys every 2 s: watch for an early rotation over several checks.
    let early = wait_for(Duration::from_secs(5), || {
        c.statuses()
            .into_iter()
            .find_map(|(i, s)| s.key_in_force.map(|_| i))
    });
    assert_eq!(early, None, "rotated before node 2 held the key");

    // Staged on the last member too: the leader rotates, every node keeps only the new key.
    new.store(&KeyRing::staged_path(&key_file(2)))
        .expect("stage");
    let rotated_at = wait_for(Duration::from_secs(30), || {
        let statuses = c.statuses();
        let done = statuses.len() == 3
            && statuses.iter().all(|(_, s)| {
                s.key_in_force.as_deref() == Some(new_id.as_str())
                    && s.keys_held == [new_id.clone()]
            });
        done.then(|| trained_step(&c)).flatten()
    })
    .unwrap_or_else(|| panic!("the key was not rotated\n{}", c.logs()));
    for i in 0..3 {
        assert_eq!(
            ClusterKey::load(&key_file(i)).expect("key"),
            new,
            "node {i}'s key file"
        );
        assert!(!KeyRing::staged_path(&key_file(i)).exists());
    }
    // Training went on through the rotation, without a rollback or a restart.
    wait_for(Duration::from_secs(60), || {
        trained_step(&c).filter(|s| *s >= rotated_at + 3)
    })
    .unwrap_or_else(|| panic!("training stopped after the rotation\n{}", c.logs()));
    for (i, s) in c.statuses() {
        assert_eq!((s.history, s.rolled_back_steps), (0, 0), "node {i}");
        assert_eq!(s.members.len(), 3, "node {i}");
    }

    // The old key admits nobody now; the new one does.
    let stale = c
        .spawn(std::slice::from_ref(&seed), Some(&key_file(3)))
        .expect("spawn");
    let fresh_file = key_file(4);
    std::fs::remove_file(&fresh_file).expect("remove");
    new.store(&fresh_file).expect("new key");
    let fresh = c
        .spawn(std::slice::from_ref(&seed), Some(&fresh_file))
        .expect("spawn");
    wait_for(Duration::from_secs(30), || {
        let s = c.nodes[fresh].status()?;
        (s.members.len() == 4 && s.members.iter().any(|m| m.peer_id == s.peer_id)).then_some(())
    })
    .unwrap_or_else(|| panic!("a node with the new key did not join\n{}", c.logs()));
    // The fresh node may join before the stale one, started first, serves `/status` on a
    // loaded machine.
    let s = wait_for(Duration::from_secs(30), || c.nodes[stale].status()).unwrap_or_else(|| {
        panic!(
            "the node with the old key does not serve /status\n{}",
            c.logs()
        )
    });
    assert!(s.connected_peers.is_empty(), "{s:?}");
    assert!(s.members.is_empty());
    assert_eq!(c.nodes[0].status().expect("status").members.len(), 4);
}

#[test]
fn hostile_data_plane_input_is_refused_and_training_goes_on() {
    use parcae_node::dataplane::protocol::{self, LinkKind, Reply, Request};
    let _serial = serial();
    let mut c = training_cluster(&train_config("pin = [1, 2]", "checkpoint_every = 0"), 3, 3);
    // Borrow the identity of the spare (a member, but assigned nothing) after stopping it.
    let spare = (0..3)
        .find(|i| {
            c.nodes[*i]
                .status()
                .is_some_and(|s| s.training.is_none_or(|t| t.slot.is_none()))
        })
        .expect("a spare");
    let (target, slot) = *workers(&c)
        .iter()
        .find(|(i, _)| *i != spare)
        .expect("a training non-leader");
    let status = c.nodes[target].status().unwrap();
    let addr: std::net::SocketAddr = status.data_addr.as_deref().unwrap().parse().unwrap();
    let target_peer: libp2p::PeerId = status.peer_id.parse().unwrap();
    let epoch = status.epoch;
    c.nodes[spare].kill();
    let keypair = parcae_node::identity::load_or_create(&parcae_node::data_dir::DataDir::new(
        &c.nodes[spare].data_dir,
    ))
    .unwrap();
    let key = parcae_node::key::ClusterKey::load(c.key()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connect = || {
            let (keypair, key) = (keypair.clone(), key.clone());
            async move {
                parcae_node::dataplane::connect(addr, &keypair, target_peer, &[key])
                    .await
                    .unwrap()
            }
        };
        let ask = |req: Request| async move {
            let mut s = connect().await;
            s.send(&protocol::encode(&req).unwrap()).await.unwrap();
            s.recv(1 << 16)
                .await
                .ok()
                .map(|b| protocol::decode::<Reply>(&b).unwrap())
        };
        // A link claiming another node's slot, and one of a stale epoch: closed without reply.
        let other = [slot[0] as u32, 1 - slot[1] as u32];
        let claim = parcae_node::dataplane::protocol::Request::Link {
            epoch,
            kind: LinkKind::Pipeline,
            from: parcae_node::dataplane::links::slot_at(other[0], other[1]),
        };
        assert_eq!(ask(claim).await, None);
        let stale = Request::Link {
            epoch: epoch.saturating_sub(1),
            kind: LinkKind::Ring,
            from: parcae_node::dataplane::links::slot_at(0, 0),
        };
        assert_eq!(ask(stale).await, None);
        // State it does not hold, an empty range.
        for (step, start, end) in [(1_000_000, 0, 1), (0, 3, 1)] {
            let r = ask(Request::Fetch {
                history: 0,
                step,
                start,
                end,
            })
            .await;
            assert!(matches!(r, Some(Reply::Refused(_))), "{r:?}");
        }
        // A checkpoint from a member the plan does not make a stage's first replica (its bytes
        // do not match their digest either): refused before its bytes are read.
        let mut s = connect().await;
        let put = Request::PutCheckpoint {
            steps: 4,
            start: 0,
            end: 1,
            digest: [7; 32],
        };
        s.send(&protocol::encode(&put).unwrap()).await.unwrap();
        s.send(b"not a state").await.unwrap();
        let r = protocol::decode::<Reply>(&s.recv(1 << 16).await.unwrap()).unwrap();
        assert!(matches!(r, Reply::Refused(_)), "{r:?}");
        // Random bytes instead of a handshake.
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        raw.write_all(&[0xAB; 4096]).await.unwrap();
    });
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 3, Duration::from_secs(60));
    let logs = c.logs();
    assert!(logs.contains("link refused"), "{logs}");
    assert!(
        logs.contains("checkpoint refused: the sender has no slot in the plan"),
        "{logs}"
    );
    committed_sequence(&c);
}
