//! Hostile inputs: malformed, oversized, forged and non-member messages, oversized proposals.

use parcae_consensus::state::{LayerCost, MAX_COMMAND_BYTES};
use parcae_consensus::{Command, NodeId, ProposeError, StepError};
use proptest::prelude::*;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};

use crate::sim::{NetFaults, Sim, test_config};

fn message(kind: MessageType, from: NodeId, to: NodeId, term: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(kind);
    m.from = from.0;
    m.to = to.0;
    m.term = term;
    m.write_to_bytes().unwrap()
}

fn running_cluster() -> (Sim, NodeId, NodeId) {
    let mut sim = Sim::bootstrap(9, 3, test_config(false), NetFaults::NONE);
    sim.run_until(100, |s| s.leader().is_some()).unwrap();
    let leader = sim.leader().unwrap();
    sim.run_until(50, |s| {
        s.live()
            .iter()
            .all(|id| s.node(*id).leader() == Some(leader))
    })
    .expect("followers learn the leader");
    let follower = sim.live().into_iter().find(|id| *id != leader).unwrap();
    (sim, leader, follower)
}

#[test]
fn refused_messages_are_typed_and_counted() {
    let (mut sim, leader, follower) = running_cluster();
    let term = sim.node(leader).status().term;
    let stranger = NodeId::from_peer_bytes(b"stranger");
    let node = sim.node_mut(follower);

    assert!(matches!(
        node.step(leader, &[0xff, 0x01, 0x02]),
        Err(StepError::Malformed(_))
    ));
    let big = vec![0u8; test_config(false).max_message_bytes + 1];
    assert!(matches!(
        node.step(leader, &big),
        Err(StepError::TooLarge { .. })
    ));
    // A non-member cannot start or force an election, whatever term it claims.
    for kind in [
        MessageType::MsgRequestVote,
        MessageType::MsgRequestPreVote,
        MessageType::MsgTimeoutNow,
    ] {
        assert_eq!(
            node.step(stranger, &message(kind, stranger, follower, term + 5)),
            Err(StepError::NonMember(stranger))
        );
    }
    // A response from an unknown peer is refused by raft itself.
    assert!(matches!(
        node.step(
            stranger,
            &message(MessageType::MsgAppendResponse, stranger, follower, term)
        ),
        Err(StepError::Raft(_))
    ));
    assert!(matches!(
        node.step(
            stranger,
            &message(MessageType::MsgHeartbeat, leader, follower, term)
        ),
        Err(StepError::WrongSender { .. })
    ));
    assert!(matches!(
        node.step(
            leader,
            &message(MessageType::MsgHeartbeat, leader, stranger, term)
        ),
        Err(StepError::WrongRecipient(_))
    ));
    let mut hup = Message::default();
    hup.set_msg_type(MessageType::MsgHup);
    hup.from = leader.0;
    hup.to = follower.0;
    assert!(matches!(
        node.step(leader, &hup.write_to_bytes().unwrap()),
        Err(StepError::LocalMessage(MessageType::MsgHup))
    ));
    let m = node.metrics();
    assert_eq!(
        (
            m.malformed_messages,
            m.oversized_messages,
            m.refused_messages,
            m.raft_step_errors
        ),
        (1, 1, 6, 1)
    );
    // The stranger's higher term did not disturb the cluster.
    assert_eq!(node.status().term, term);
    sim.run(30);
    assert_eq!(sim.leader(), Some(leader));
}

#[test]
fn oversized_proposal_is_refused_and_counted() {
    let (mut sim, leader, follower) = running_cluster();
    let layers: Vec<(u32, LayerCost)> = (0..200_000)
        .map(|i| {
            (
                i,
                LayerCost {
                    forward_s: 1.0,
                    backward_s: 2.0,
                    optimizer_s: 0.5,
                    params: 1,
                    output_bytes: 1,
                },
            )
        })
        .collect();
    let cmd = Command::CostReport {
        node: leader,
        step: 0,
        layers,
        bandwidth: vec![],
        reconfiguration_s: None,
        allreduce_bytes_per_sec: None,
        boundary_link: None,
    };
    let err = sim.node_mut(leader).propose(&cmd).unwrap_err();
    assert!(matches!(err, ProposeError::TooLarge { max, .. } if max == MAX_COMMAND_BYTES));
    assert_eq!(sim.node(leader).metrics().oversized_proposals, 1);
    let err = sim
        .node_mut(follower)
        .propose(&Command::Lost { node: leader })
        .unwrap_err();
    assert_eq!(
        err,
        ProposeError::NotLeader {
            leader: Some(leader)
        }
    );
}

#[test]
fn rejected_command_resolves_with_typed_rejection() {
    let (mut sim, leader, _) = running_cluster();
    let stranger = NodeId::from_peer_bytes(b"stranger");
    let mut h = sim
        .node_mut(leader)
        .propose(&Command::Lost { node: stranger })
        .unwrap();
    sim.run_until(50, |_| false);
    assert_eq!(
        h.try_outcome(),
        Some(Err(ProposeError::Rejected(
            parcae_consensus::Rejection::UnknownNode(stranger)
        )))
    );
    assert!(sim.converged());
    assert!(
        sim.live()
            .iter()
            .all(|id| sim.node(*id).metrics().rejected_commands == 1)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_never_panic_the_node(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (mut sim, leader, follower) = running_cluster();
        let _ = sim.node_mut(follower).step(leader, &bytes);
        sim.run(5);
        prop_assert_eq!(sim.leader(), Some(leader));
    }
}
