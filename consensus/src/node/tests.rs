use super::*;

fn assert_send<T: Send>() {}

#[test]
fn driver_and_handles_can_move_between_threads() {
    assert_send::<RaftNode>();
    assert_send::<ProposalHandle>();
    assert_send::<ReadHandle>();
}

#[test]
fn invalid_configurations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RaftConfig::new(NodeId(7));
    config.max_voters = 4;
    assert!(matches!(
        RaftNode::open(dir.path(), config),
        Err(RaftError::Config(_))
    ));
    assert!(matches!(
        RaftNode::open(dir.path(), RaftConfig::new(NodeId(0))),
        Err(RaftError::Config(_))
    ));
    let other = PeerInfo {
        peer_id: b"other".to_vec(),
        ..PeerInfo::default()
    };
    assert!(matches!(
        RaftNode::bootstrap(dir.path(), RaftConfig::new(NodeId(7)), &[other]),
        Err(RaftError::Config(_))
    ));
}

#[test]
fn founding_follows_the_storage_not_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let me = PeerInfo {
        peer_id: b"founder".to_vec(),
        ..PeerInfo::default()
    };
    let config = RaftConfig::new(NodeId::from_peer_bytes(&me.peer_id));
    // A founder killed after its storage was created and before its first state.
    drop(RaftNode::open(dir.path(), config.clone()).unwrap());
    assert!(dir.path().read_dir().unwrap().next().is_some());
    let members = std::slice::from_ref(&me);
    let (_, founded) = RaftNode::open_or_found(dir.path(), config.clone(), Some(members)).unwrap();
    assert!(founded, "uninitialised storage founds again");
    let (_, founded) = RaftNode::open_or_found(dir.path(), config.clone(), Some(members)).unwrap();
    assert!(
        !founded,
        "an initialised cluster is opened, never founded twice"
    );
    let empty = tempfile::tempdir().unwrap();
    let (node, founded) = RaftNode::open_or_found(empty.path(), config, None).unwrap();
    assert!(
        !founded && node.state().members.is_empty(),
        "a joiner waits"
    );
}

#[test]
fn single_node_bootstraps_commits_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let me = PeerInfo {
        peer_id: b"solo".to_vec(),
        ..PeerInfo::default()
    };
    let config = RaftConfig::new(NodeId::from_peer_bytes(&me.peer_id));
    {
        let mut node =
            RaftNode::open_or_bootstrap(dir.path(), config.clone(), std::slice::from_ref(&me))
                .unwrap();
        node.campaign().unwrap();
        node.drive().unwrap();
        assert!(node.is_leader());
        let mut h = node
            .propose(&Command::AvailabilityTick {
                interval: 1,
                count: 1,
                pools: Vec::new(),
            })
            .unwrap();
        node.drive().unwrap();
        assert_eq!(
            h.try_outcome(),
            Some(Ok(vec![StateEvent::AvailabilityRecorded { interval: 1 }]))
        );
        let events = node.take_events();
        assert!(events.iter().any(|e| matches!(
            e,
            NodeEvent::RoleChanged {
                role: Role::Leader,
                ..
            }
        )));
    }
    let mut node = RaftNode::open_or_bootstrap(dir.path(), config, &[me]).unwrap();
    node.campaign().unwrap();
    node.drive().unwrap();
    assert_eq!(node.state().availability.len(), 1);
    assert_eq!(node.state().members.len(), 1);
}
