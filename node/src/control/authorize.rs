//! Which proposals a peer may make: a member is trusted only with changes about itself.
//!
//! Peers that are not the leader send their proposals to it (directly, or relayed by a member
//! when they do not know the leader yet). The leader proposes only commands about the node
//! that originated them; everything else (plans, availability ticks, other members' fate) is
//! the leader's own decision and never accepted from the wire.

use parcae_consensus::{Command, ControlState, NodeId};

/// A proposal its origin may not make; the sender is disconnected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} proposal not about its sender")]
pub struct Unauthorized {
    /// The command's kind.
    pub kind: &'static str,
}

/// Whether the node whose libp2p peer id bytes are `origin` may propose `command`.
pub fn authorize(
    state: &ControlState,
    origin: &[u8],
    command: &Command,
) -> Result<(), Unauthorized> {
    let origin_id = NodeId::from_peer_bytes(origin);
    let allowed = match command {
        Command::Join { node, peer } => *node == origin_id && peer.peer_id == origin,
        Command::Notice { node, .. }
        | Command::Leave { node }
        | Command::CostReport { node, .. } => *node == origin_id,
        // Training reports come from nodes of the plan they ran under.
        Command::StepCommitted { epoch, .. } => state
            .plan
            .as_ref()
            .is_some_and(|p| p.epoch == *epoch && p.assignment.contains_key(&origin_id)),
        // A part held on disks names its writer among them; another DiLoCo group's part is in
        // the store alone, on no disk.
        Command::Checkpointed { holders, group, .. } => {
            (holders.contains(&origin_id) || (group.is_some() && holders.is_empty()))
                && state.members.contains_key(&origin_id)
        }
        // A rollback, or a restore of a stopped cluster, comes from a node of the plan it found
        // layers missing under; a stored cut is adopted by a member of a cluster that has not
        // trained yet.
        Command::RollBack { node, epoch, .. } | Command::RestoreCut { node, epoch, .. } => {
            *node == origin_id
                && state
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.epoch == *epoch && p.assignment.contains_key(&origin_id))
        }
        Command::AdoptCut { .. } => {
            state.progress.last_committed_step.is_none() && state.members.contains_key(&origin_id)
        }
        // The job is defined once, by a member (the founder, in practice: it is the only
        // member when its trainer starts); after that nobody may propose one.
        Command::DefineJob { .. } => state.job.is_none() && state.members.contains_key(&origin_id),
        Command::Lost { .. }
        | Command::AvailabilityTick { .. }
        | Command::Reconfigure { .. }
        | Command::RotateKey { .. } => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(Unauthorized {
            kind: command.kind(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::state::{PeerInfo, Plan, StageSlot};

    fn id(n: u8) -> NodeId {
        NodeId::from_peer_bytes(&[n])
    }

    fn planned_state(epoch: u64, planned: &[u8]) -> ControlState {
        let mut state = ControlState::default();
        for n in planned {
            state
                .apply(&Command::Join {
                    node: id(*n),
                    peer: PeerInfo {
                        peer_id: vec![*n],
                        ..PeerInfo::default()
                    },
                })
                .unwrap();
        }
        state.plan = Some(Plan {
            epoch,
            data_parallel: planned.len() as u32,
            pipeline_stages: 1,
            partition: vec![0, 1],
            assignment: planned
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    (
                        id(*n),
                        StageSlot {
                            pipeline: i as u32,
                            stage: 0,
                        },
                    )
                })
                .collect(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        state
    }

    #[test]
    fn a_node_may_join_and_announce_only_itself() {
        let state = ControlState::default();
        let join = |n: u8, bytes: Vec<u8>| Command::Join {
            node: id(n),
            peer: PeerInfo {
                peer_id: bytes,
                ..PeerInfo::default()
            },
        };
        assert_eq!(authorize(&state, &[1], &join(1, vec![1])), Ok(()));
        assert!(authorize(&state, &[1], &join(2, vec![2])).is_err());
        assert!(
            authorize(&state, &[1], &join(1, vec![2])).is_err(),
            "a join must carry the sender's own peer id"
        );
        let notice = |n| Command::Notice {
            node: id(n),
            deadline_ms: 9,
        };
        assert_eq!(authorize(&state, &[3], &notice(3)), Ok(()));
        assert_eq!(
            authorize(&state, &[3], &notice(4)),
            Err(Unauthorized { kind: "notice" })
        );
        assert!(authorize(&state, &[3], &Command::Leave { node: id(4) }).is_err());
    }

    #[test]
    fn the_leaders_decisions_are_never_taken_from_the_wire() {
        let state = planned_state(1, &[1, 2]);
        for command in [
            Command::Lost { node: id(1) },
            Command::AvailabilityTick {
                interval: 0,
                count: 2,
                pools: Vec::new(),
            },
            Command::Reconfigure {
                plan: state.plan.clone().unwrap(),
            },
            Command::RotateKey { key: [9; 8] },
        ] {
            assert!(authorize(&state, &[1], &command).is_err(), "{command:?}");
        }
    }

    #[test]
    fn a_step_is_reported_only_by_a_node_of_its_plan() {
        let state = planned_state(4, &[1, 2]);
        let step = |epoch| Command::StepCommitted {
            step: 0,
            epoch,
            sample_start: 0,
            samples: 8,
            loss: 1.0,
            validation_loss: None,
            stage_digests: Vec::new(),
            outer_digests: Vec::new(),
            optimizer: Default::default(),
        };
        assert_eq!(authorize(&state, &[2], &step(4)), Ok(()));
        assert!(authorize(&state, &[3], &step(4)).is_err(), "not planned");
        assert!(authorize(&state, &[2], &step(3)).is_err(), "old epoch");
    }
}
