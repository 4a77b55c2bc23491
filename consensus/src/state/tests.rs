//! Unit tests of the state machine rules.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn peer(i: u8) -> PeerInfo {
    PeerInfo {
        peer_id: vec![i, i, i],
        addrs: vec![format!("/ip4/10.0.0.{i}/tcp/4000")],
        data_addr: None,
        caps: Capabilities::default(),
        job: None,
        keys: vec![OLD_KEY],
    }
}

const OLD_KEY: KeyId = [1; 8];
const NEW_KEY: KeyId = [2; 8];

fn holding(i: u8, keys: &[KeyId]) -> Command {
    Command::Join {
        node: id(i),
        peer: PeerInfo {
            keys: keys.to_vec(),
            ..peer(i)
        },
    }
}

fn id(i: u8) -> NodeId {
    NodeId::from_peer_bytes(&peer(i).peer_id)
}

fn join(i: u8) -> Command {
    Command::Join {
        node: id(i),
        peer: peer(i),
    }
}

fn state_with(n: u8) -> ControlState {
    let mut s = ControlState::default();
    for i in 1..=n {
        s.apply(&join(i)).unwrap();
    }
    s
}

/// Plan of epoch `epoch`: D x P over nodes 1.., 4 layers per stage.
fn plan(epoch: u64, d: u32, p: u32, at_step: u64) -> Plan {
    let mut assignment = BTreeMap::new();
    let mut next = 1u8;
    for pipeline in 0..d {
        for stage in 0..p {
            assignment.insert(id(next), StageSlot { pipeline, stage });
            next += 1;
        }
    }
    Plan {
        epoch,
        data_parallel: d,
        pipeline_stages: p,
        partition: (0..=p).map(|s| s * 4).collect(),
        assignment,
        at_step,
        joins_before: 0,
        batch_shares: Vec::new(),
        all_reduce: Default::default(),
    }
}

fn step(step: u64, epoch: u64, sample_start: u64, p: usize) -> Command {
    Command::StepCommitted {
        step,
        epoch,
        sample_start,
        samples: 8,
        loss: 2.5,
        validation_loss: None,
        stage_digests: vec![[7; 32]; p],
        outer_digests: Vec::new(),
        optimizer: OptimizerScalars {
            step_count: step + 1,
            schedule_position: step + 1,
        },
    }
}

/// Applies `cmd` expecting a rejection, and checks that the state did not change.
fn rejected(state: &mut ControlState, cmd: &Command) -> Rejection {
    let before = state.clone();
    let err = state.apply(cmd).unwrap_err();
    assert_eq!(*state, before, "rejected {cmd:?} changed the state");
    err
}

#[test]
fn join_validates_identity_and_rejoins_after_loss() {
    let mut s = state_with(2);
    assert_eq!(s.members[&id(1)].join_seq, 0);
    assert_eq!(s.members[&id(2)].status, MemberStatus::Spare);
    let forged = Command::Join {
        node: id(9),
        peer: peer(1),
    };
    assert!(matches!(
        rejected(&mut s, &forged),
        Rejection::Invalid { field: "node", .. }
    ));
    let mut many = peer(3);
    many.addrs = vec!["a".into(); limits::MAX_ADDRS + 1];
    assert!(matches!(
        rejected(
            &mut s,
            &Command::Join {
                node: id(3),
                peer: many
            }
        ),
        Rejection::Invalid { field: "addrs", .. }
    ));
    s.apply(&Command::Lost { node: id(1) }).unwrap();
    assert_eq!(
        rejected(&mut s, &Command::Lost { node: id(1) }),
        Rejection::AlreadyLost(id(1))
    );
    assert_eq!(
        s.apply(&join(1)).unwrap(),
        vec![StateEvent::Joined {
            node: id(1),
            rejoined: true
        }]
    );
    let m = &s.members[&id(1)];
    assert_eq!((m.status, m.join_seq), (MemberStatus::Spare, 2));
}

#[test]
fn a_member_says_where_it_runs_and_on_what_within_bounds() {
    let mut s = state_with(1);
    let caps = Capabilities {
        zone: "us-east-1a".into(),
        instance_type: "p3.2xlarge".into(),
        device: "emulated:gpt-1.5b".into(),
        memory_mib: 16_000,
    };
    let placed = |caps: Capabilities| Command::Join {
        node: id(2),
        peer: PeerInfo { caps, ..peer(2) },
    };
    s.apply(&placed(caps.clone())).unwrap();
    assert_eq!(s.members[&id(2)].peer.caps, caps);
    let bad = [
        (
            Capabilities {
                zone: "z".repeat(65),
                ..caps.clone()
            },
            "caps.zone",
            "1 to 64 characters",
        ),
        (
            // A `/` joins a zone to its instance type: no zone may hold one.
            Capabilities {
                zone: "us-east-1a/p3".into(),
                ..caps.clone()
            },
            "caps.zone",
            "must be",
        ),
        (
            Capabilities {
                instance_type: "p3 2xlarge".into(),
                ..caps.clone()
            },
            "caps.instance_type",
            "\"p3 2xlarge\" must be",
        ),
        (
            Capabilities {
                device: "cuda\n".into(),
                ..caps.clone()
            },
            "caps.device",
            "'\\n'",
        ),
        (
            Capabilities {
                memory_mib: limits::MAX_DEVICE_MEMORY_MIB + 1,
                ..caps.clone()
            },
            "caps.memory_mib",
            "16777217 MiB",
        ),
    ];
    for (caps, name, why) in bad {
        match rejected(&mut s, &placed(caps)) {
            Rejection::Invalid { field, reason } => {
                assert_eq!(field, name);
                assert!(reason.contains(why), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_key_goes_into_force_once_every_member_holds_it_and_joiners_must_hold_it() {
    let mut s = state_with(3);
    s.apply(&Command::Lost { node: id(3) }).unwrap();
    s.apply(&holding(1, &[OLD_KEY, NEW_KEY])).unwrap();
    let rotate = Command::RotateKey { key: NEW_KEY };
    assert_eq!(rejected(&mut s, &rotate), Rejection::KeyNotHeld(id(2)));
    // The lost member is not waited for; every other member holds the new key now.
    s.apply(&holding(2, &[NEW_KEY])).unwrap();
    assert_eq!(
        s.apply(&rotate).unwrap(),
        vec![StateEvent::KeyRotated { key: NEW_KEY }]
    );
    assert_eq!(s.cluster_key, Some(NEW_KEY));
    assert_eq!(s.apply(&rotate).unwrap(), Vec::new());
    // Once the key is in force a joiner, or a lost member coming back, must hold it.
    assert_eq!(rejected(&mut s, &join(3)), Rejection::StaleKey(id(3)));
    assert_eq!(rejected(&mut s, &join(4)), Rejection::StaleKey(id(4)));
    s.apply(&holding(4, &[NEW_KEY])).unwrap();
    assert!(matches!(
        rejected(&mut s, &holding(5, &[NEW_KEY, NEW_KEY])),
        Rejection::Invalid { field: "keys", .. }
    ));
    assert!(matches!(
        rejected(&mut s, &holding(5, &[[3; 8], [4; 8], NEW_KEY])),
        Rejection::Invalid { field: "keys", .. }
    ));
    let restored = ControlState::decode_snapshot(&s.encode_snapshot().unwrap()).unwrap();
    assert_eq!(restored.cluster_key, Some(NEW_KEY));
}

#[test]
fn notice_keeps_earliest_deadline_and_leave_forgets() {
    let mut s = state_with(2);
    s.apply(&Command::Notice {
        node: id(1),
        deadline_ms: 500,
    })
    .unwrap();
    s.apply(&Command::Notice {
        node: id(1),
        deadline_ms: 900,
    })
    .unwrap();
    assert_eq!(
        s.members[&id(1)].status,
        MemberStatus::Leaving { deadline_ms: 500 }
    );
    s.apply(&Command::Leave { node: id(1) }).unwrap();
    assert!(!s.members.contains_key(&id(1)));
    assert_eq!(
        rejected(&mut s, &Command::Leave { node: id(1) }),
        Rejection::UnknownNode(id(1))
    );
}

#[test]
fn a_member_that_left_is_retired_and_cannot_join_again() {
    let mut s = state_with(3);
    s.apply(&Command::Leave { node: id(2) }).unwrap();
    assert!(s.is_retired(id(2)));
    assert_eq!(s.retired[0].peer_id, peer(2).peer_id);
    assert_eq!(rejected(&mut s, &join(2)), Rejection::Retired(id(2)));
    // A lost member is not retired: it may come back.
    s.apply(&Command::Lost { node: id(1) }).unwrap();
    assert!(!s.is_retired(id(1)));
    s.apply(&join(1)).unwrap();
    // The list survives a snapshot and stays bounded.
    let back = ControlState::decode_snapshot(&s.encode_snapshot().unwrap()).unwrap();
    assert!(back.is_retired(id(2)));
    while s.retired.len() < limits::MAX_RETIRED {
        s.retired.push_back(s.retired[0].clone());
    }
    s.apply(&join(4)).unwrap();
    s.apply(&Command::Leave { node: id(4) }).unwrap();
    assert_eq!(s.retired.len(), limits::MAX_RETIRED);
    assert_eq!(s.retired.back().map(|r| r.id), Some(id(4)));
}

#[test]
fn availability_is_strictly_increasing_and_bounded() {
    let mut s = ControlState::default();
    s.apply(&Command::AvailabilityTick {
        interval: 3,
        count: 4,
        pools: Vec::new(),
    })
    .unwrap();
    assert_eq!(
        rejected(
            &mut s,
            &Command::AvailabilityTick {
                interval: 3,
                count: 5,
                pools: Vec::new(),
            }
        ),
        Rejection::StaleInterval { last: 3, got: 3 }
    );
    for i in 4..4 + limits::MAX_AVAILABILITY as u64 {
        s.apply(&Command::AvailabilityTick {
            interval: i,
            count: 1,
            pools: Vec::new(),
        })
        .unwrap();
    }
    assert_eq!(s.availability.len(), limits::MAX_AVAILABILITY);
    assert_eq!(s.availability.front().unwrap().interval, 4);
}

#[test]
fn availability_by_pool_adds_up_to_the_count_over_named_pools_in_order() {
    let zone = |pool: &str, nodes: u32| PoolCount {
        pool: pool.into(),
        nodes,
    };
    let tick = |interval: u64, count: u32, pools: Vec<PoolCount>| Command::AvailabilityTick {
        interval,
        count,
        pools,
    };
    let mut s = ControlState::default();
    let by_zone = vec![zone("us-east-1a", 5), zone("us-east-1b", 3)];
    s.apply(&tick(0, 8, by_zone.clone())).unwrap();
    assert_eq!(s.availability.back().unwrap().pools, by_zone);
    let refused = |s: &mut ControlState, pools: Vec<PoolCount>, why: &str| {
        let r = rejected(s, &tick(1, 8, pools));
        assert!(
            matches!(&r, Rejection::Invalid { field: "pools", reason } if reason.contains(why)),
            "{r:?}"
        );
    };
    refused(
        &mut s,
        vec![zone("a", 5), zone("b", 2)],
        "7 nodes by pool for a count of 8",
    );
    refused(&mut s, vec![zone("b", 5), zone("a", 3)], "ascending order");
    refused(&mut s, vec![zone("a", 5), zone("a", 3)], "ascending order");
    refused(&mut s, vec![zone("", 8)], "without a name");
    refused(&mut s, vec![zone("a b", 8)], "must be 1 to 64 characters");
    refused(
        &mut s,
        vec![zone("a/p3/x", 8)],
        "must be 1 to 64 characters",
    );
    let many = (0..=limits::MAX_SAMPLE_POOLS)
        .map(|z| zone(&format!("z{z:02}"), u32::from(z == 0) * 8))
        .collect();
    refused(&mut s, many, "pools (at most 16)");
    // Nothing refused was recorded; a sample without pools still is.
    assert_eq!(s.availability.len(), 1);
    s.apply(&tick(1, 8, Vec::new())).unwrap();
    assert!(s.availability.back().unwrap().pools.is_empty());
}

#[test]
fn plans_activate_at_their_step_and_steps_advance_the_cursor() {
    let mut s = state_with(6);
    assert_eq!(rejected(&mut s, &step(0, 1, 0, 2)), Rejection::NoPlan);
    assert_eq!(
        rejected(
            &mut s,
            &Command::Reconfigure {
                plan: plan(2, 2, 2, 0)
            }
        ),
        Rejection::WrongEpoch {
            expected: 1,
            got: 2
        }
    );
    let events = s
        .apply(&Command::Reconfigure {
            plan: plan(1, 2, 2, 0),
        })
        .unwrap();
    assert_eq!(events[1], StateEvent::PlanActivated { epoch: 1 });
    assert_eq!(s.members[&id(1)].status, MemberStatus::Active);
    assert_eq!(s.members[&id(5)].status, MemberStatus::Spare);

    s.apply(&step(0, 1, 0, 2)).unwrap();
    assert_eq!(s.progress.audited_step, Some(0));
    assert_eq!(s.progress.stage_digests, vec![[7; 32]; 2]);
    assert_eq!(
        rejected(&mut s, &step(0, 1, 8, 2)),
        Rejection::AlreadyCommitted(0)
    );
    assert_eq!(
        rejected(&mut s, &step(2, 1, 8, 2)),
        Rejection::StepGap {
            expected: 1,
            got: 2
        }
    );
    assert_eq!(
        rejected(&mut s, &step(1, 1, 0, 2)),
        Rejection::CursorMismatch { cursor: 8, got: 0 }
    );
    assert!(matches!(
        rejected(&mut s, &step(1, 1, 8, 3)),
        Rejection::Invalid {
            field: "stage_digests",
            ..
        }
    ));
    // A step without digests commits and keeps the last audited ones.
    let mut unaudited = step(1, 1, 8, 0);
    let mut probe = s.clone();
    probe.apply(&unaudited).unwrap();
    assert_eq!(probe.progress.last_committed_step, Some(1));
    assert_eq!(probe.progress.audited_step, Some(0));
    assert_eq!(probe.progress.stage_digests, vec![[7; 32]; 2]);
    if let Command::StepCommitted { stage_digests, .. } = &mut unaudited {
        stage_digests.push([1; 32]);
    }
    assert!(matches!(
        rejected(&mut s, &unaudited),
        Rejection::Invalid {
            field: "stage_digests",
            ..
        }
    ));

    // A 3 x 2 plan from step 3: pending until step 2 is committed.
    s.apply(&Command::Reconfigure {
        plan: plan(2, 3, 2, 3),
    })
    .unwrap();
    assert_eq!(s.pending_plan.as_ref().map(|p| p.epoch), Some(2));
    s.apply(&step(1, 1, 8, 2)).unwrap();
    assert_eq!(s.plan.as_ref().unwrap().epoch, 1);
    let events = s.apply(&step(2, 1, 16, 2)).unwrap();
    assert_eq!(
        events,
        vec![
            StateEvent::StepCommitted { step: 2 },
            StateEvent::PlanActivated { epoch: 2 }
        ]
    );
    assert_eq!(s.members[&id(5)].status, MemberStatus::Active);
    assert_eq!(
        rejected(&mut s, &step(3, 1, 24, 2)),
        Rejection::StaleEpoch { current: 2, got: 1 }
    );
    let with_validation = |v: f64| {
        let mut c = step(3, 2, 24, 2);
        if let Command::StepCommitted {
            validation_loss, ..
        } = &mut c
        {
            *validation_loss = Some(v);
        }
        c
    };
    assert!(matches!(
        rejected(&mut s, &with_validation(f64::NAN)),
        Rejection::Invalid { .. }
    ));
    assert_eq!(s.progress.last_validation, None);
    s.apply(&with_validation(1.75)).unwrap();
    assert_eq!(s.progress.sample_cursor, 32);
    assert_eq!(s.progress.optimizer.step_count, 4);
    assert_eq!(s.progress.recent_losses.len(), 4);
    assert_eq!(
        s.progress.last_validation,
        Some(LossRecord {
            step: 3,
            loss: 1.75
        })
    );
    assert_eq!(
        rejected(
            &mut s,
            &Command::Reconfigure {
                plan: plan(3, 1, 1, 2)
            }
        ),
        Rejection::StepInPast {
            at_step: 2,
            next_step: 4
        }
    );
}

#[test]
fn invalid_plans_are_rejected() {
    let mut s = state_with(4);
    let mut p = plan(1, 2, 2, 0);
    p.partition = vec![0, 4, 4];
    assert!(matches!(
        rejected(&mut s, &Command::Reconfigure { plan: p }),
        Rejection::Invalid {
            field: "partition",
            ..
        }
    ));
    let mut p = plan(1, 2, 2, 0);
    p.assignment.insert(
        id(1),
        StageSlot {
            pipeline: 1,
            stage: 1,
        },
    );
    p.assignment.insert(
        id(4),
        StageSlot {
            pipeline: 1,
            stage: 1,
        },
    );
    assert!(matches!(
        rejected(&mut s, &Command::Reconfigure { plan: p }),
        Rejection::Invalid {
            field: "assignment",
            ..
        }
    ));
    s.apply(&Command::Lost { node: id(2) }).unwrap();
    assert!(matches!(
        rejected(
            &mut s,
            &Command::Reconfigure {
                plan: plan(1, 2, 2, 0)
            }
        ),
        Rejection::Invalid {
            field: "assignment",
            ..
        }
    ));
}

#[test]
fn a_plan_s_batch_shares_are_one_per_pipeline_and_none_empty() {
    let mut s = state_with(4);
    for shares in [vec![8], vec![8, 0], vec![4, 4, 4]] {
        let mut p = plan(1, 2, 2, 0);
        p.batch_shares = shares;
        assert!(matches!(
            rejected(&mut s, &Command::Reconfigure { plan: p }),
            Rejection::Invalid {
                field: "batch_shares",
                ..
            }
        ));
    }
    let mut p = plan(1, 2, 2, 0);
    p.batch_shares = vec![10, 6];
    s.apply(&Command::Reconfigure { plan: p }).unwrap();
    assert_eq!(s.plan.map(|p| p.batch_shares), Some(vec![10, 6]));
}

#[test]
fn a_plan_knows_at_most_the_members_that_joined() {
    let mut s = state_with(4);
    let mut p = plan(1, 2, 2, 0);
    p.joins_before = s.next_join_seq + 1;
    assert!(matches!(
        rejected(&mut s, &Command::Reconfigure { plan: p.clone() }),
        Rejection::Invalid {
            field: "joins_before",
            ..
        }
    ));
    p.joins_before = s.next_join_seq;
    s.apply(&Command::Reconfigure { plan: p }).unwrap();
    assert_eq!(s.plan.map(|p| p.joins_before), Some(4));
}

fn part(step: u64, stage: u32, holders: Vec<NodeId>) -> Command {
    Command::Checkpointed {
        step,
        epoch: 1,
        layers: LayerRange {
            start: stage * 4,
            end: stage * 4 + 4,
        },
        holders,
        digest: [step as u8 + stage as u8; 32],
        stored: false,
        group: None,
    }
}

/// Group `zone`'s part of stage `stage` after step `step`, stored, on nobody's disk.
fn group_part(step: u64, stage: u32, zone: &str) -> Command {
    let mut c = part(step, stage, Vec::new());
    if let Command::Checkpointed {
        stored,
        group,
        digest,
        ..
    } = &mut c
    {
        *stored = true;
        *group = Some(zone.into());
        digest[0] = 0xaa;
    }
    c
}

/// Nodes 1-4 under a 2 x 2 plan of epoch 1 with steps `0..steps` committed.
fn trained(steps: u64) -> ControlState {
    let mut s = state_with(4);
    s.apply(&Command::Reconfigure {
        plan: plan(1, 2, 2, 0),
    })
    .unwrap();
    for i in 0..steps {
        s.apply(&step(i, 1, i * 8, 2)).unwrap();
    }
    s
}

#[test]
fn a_cut_is_complete_once_every_stage_registered_and_the_newest_complete_ones_stay() {
    let mut s = trained(0);
    assert_eq!(
        rejected(&mut s, &part(0, 0, vec![id(1)])),
        Rejection::FutureStep(0)
    );
    let mut s = trained(10);
    s.apply(&part(1, 0, vec![id(1)])).unwrap();
    s.apply(&part(1, 0, vec![id(2)])).unwrap();
    assert!(!s.checkpoints[&1].is_complete());
    assert_eq!(s.checkpoints[&1].parts[0].holders.len(), 2, "holders merge");
    let events = s.apply(&part(1, 1, vec![id(2)])).unwrap();
    assert_eq!(
        events,
        vec![StateEvent::CheckpointRegistered {
            layers: LayerRange { start: 4, end: 8 },
            step: 1,
            complete: true
        }]
    );
    let cut = &s.checkpoints[&1];
    assert_eq!(cut.end.sample_cursor, 16, "the cursor after step 1");
    assert_eq!(cut.end.optimizer.step_count, 2);
    for k in [3, 5, 7] {
        s.apply(&part(k, 0, vec![id(1)])).unwrap();
    }
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![1, 3, 5, 7],
        "incomplete cuts after the newest complete one stay"
    );
    s.apply(&part(5, 1, vec![id(2)])).unwrap();
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![1, 5, 7],
        "an incomplete cut older than a complete one goes"
    );
    s.apply(&part(7, 1, vec![id(2)])).unwrap();
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![5, 7],
        "the two newest complete cuts"
    );
    assert_eq!(s.newest_complete_cut().map(|c| c.end.step), Some(7));
    for k in [8, 9] {
        s.apply(&part(k, 0, vec![id(1)])).unwrap();
    }
    assert!(matches!(
        rejected(&mut s, &part(3, 0, vec![id(1)])),
        Rejection::Invalid { field: "step", .. }
    ));
    let mut other = part(9, 0, vec![id(1)]);
    if let Command::Checkpointed { digest, .. } = &mut other {
        *digest = [0; 32];
    }
    assert!(matches!(
        rejected(&mut s, &other),
        Rejection::Invalid {
            field: "layers",
            ..
        }
    ));
    assert!(matches!(
        rejected(&mut s, &part(9, 0, vec![id(9)])),
        Rejection::UnknownNode(_)
    ));
    assert!(matches!(
        rejected(&mut s, &part(9, 2, vec![id(1)])),
        Rejection::Invalid {
            field: "layers",
            ..
        }
    ));
    let mut stale = part(9, 1, vec![id(2)]);
    if let Command::Checkpointed { epoch, .. } = &mut stale {
        *epoch = 2;
    }
    assert!(matches!(
        rejected(&mut s, &stale),
        Rejection::StaleEpoch { current: 1, got: 2 }
    ));
}

#[test]
fn another_groups_state_joins_the_cut_beside_its_parts_and_only_from_the_store() {
    let mut s = trained(10);
    s.apply(&part(3, 0, vec![id(1)])).unwrap();
    s.apply(&group_part(3, 0, "us-east-1b")).unwrap();
    s.apply(&group_part(3, 0, "us-east-1b")).unwrap();
    let cut = &s.checkpoints[&3];
    assert_eq!(
        cut.parts.len(),
        1,
        "the group's part is not one of the cut's own"
    );
    assert_eq!(cut.groups.len(), 1);
    assert_eq!(
        cut.groups[0].parts.len(),
        1,
        "the same part registered once"
    );
    assert!(cut.stored_group("us-east-1b").is_none(), "one stage of two");
    s.apply(&group_part(3, 1, "us-east-1b")).unwrap();
    assert!(!s.checkpoints[&3].is_complete(), "groups complete no cut");
    s.apply(&part(3, 1, vec![id(2)])).unwrap();
    let cut = &s.checkpoints[&3];
    assert!(cut.is_complete());
    assert_eq!(cut.stored_group("us-east-1b").map(<[_]>::len), Some(2));
    assert!(cut.stored_group("us-east-1c").is_none());

    // Held on a disk, not in the store, a zone no zone is named, a different state of the
    // same layers, and more groups than a cut holds: refused.
    let mut held = group_part(3, 0, "us-east-1c");
    if let Command::Checkpointed { holders, .. } = &mut held {
        holders.push(id(1));
    }
    let field = |r: Rejection| match r {
        Rejection::Invalid { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(rejected(&mut s, &held)), "holders");
    assert_eq!(field(rejected(&mut s, &group_part(3, 0, "a/b"))), "group");
    let mut other = group_part(3, 0, "us-east-1b");
    if let Command::Checkpointed { digest, .. } = &mut other {
        digest[1] = 1;
    }
    assert_eq!(field(rejected(&mut s, &other)), "layers");
    for g in 1..limits::MAX_GROUPS {
        s.apply(&group_part(3, 0, &format!("zone-{g}"))).unwrap();
    }
    assert_eq!(
        field(rejected(&mut s, &group_part(3, 0, "one-more"))),
        "group"
    );

    // A stored cut adopted by a new cluster resumes every group from its own parts.
    let mut stored = s.checkpoints[&3].clone();
    for p in &mut stored.parts {
        p.stored = true;
    }
    let mut fresh = state_with(2);
    fresh.apply(&Command::AdoptCut { cut: stored }).unwrap();
    assert!(fresh.checkpoints[&3].groups.is_empty());
}

#[test]
fn incomplete_cuts_are_bounded() {
    let mut s = trained(10);
    for k in 0..10 {
        s.apply(&part(k, 0, vec![id(1)])).unwrap();
    }
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
}

/// A cluster of `trained(6)` taken back from step 6 to the cut of step 2, as a rollback and a
/// restore both leave it: history 1, three steps rolled back, the plan under epoch 2 from step 3.
fn assert_back_from_step_6_at_step_3(s: &ControlState, events: Vec<StateEvent>) {
    assert_eq!(
        events,
        vec![
            StateEvent::RolledBack {
                from_step: 6,
                to_step: 3
            },
            StateEvent::PlanActivated { epoch: 2 }
        ]
    );
    let p = &s.progress;
    assert_eq!(p.last_committed_step, Some(2));
    assert_eq!(p.sample_cursor, 24);
    assert_eq!((p.history, p.rolled_back_steps), (1, 3));
    assert_eq!(s.plan.as_ref().map(|p| (p.epoch, p.at_step)), Some((2, 3)));
}

#[test]
fn a_rollback_rewinds_to_the_newest_complete_cut_under_a_new_epoch() {
    let mut s = trained(6);
    let roll = |node, epoch, at_step| Command::RollBack {
        node,
        epoch,
        at_step,
        to_step: 2,
    };
    assert_eq!(
        rejected(&mut s, &roll(id(1), 1, 6)),
        Rejection::NoCheckpoint
    );
    s.apply(&part(2, 0, vec![id(1)])).unwrap();
    s.apply(&part(2, 1, vec![id(2)])).unwrap();
    s.apply(&part(5, 0, vec![id(1)])).unwrap();
    assert!(matches!(
        rejected(&mut s, &roll(id(1), 0, 6)),
        Rejection::StaleEpoch { .. }
    ));
    assert!(matches!(
        rejected(&mut s, &roll(id(1), 1, 5)),
        Rejection::AlreadyCommitted(5)
    ));
    assert!(matches!(
        rejected(&mut s, &roll(id(9), 1, 6)),
        Rejection::Invalid { field: "node", .. }
    ));
    let events = s.apply(&roll(id(3), 1, 6)).unwrap();
    assert_back_from_step_6_at_step_3(&s, events);
    let p = &s.progress;
    assert_eq!(p.optimizer.step_count, 3);
    assert_eq!(p.recent_losses.back().map(|l| l.step), Some(2));
    assert_eq!(p.audited_step, None, "the audited step 5 was rolled back");
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![2],
        "the open cut of a rolled-back step is gone"
    );
    assert!(matches!(
        rejected(&mut s, &part(5, 1, vec![id(2)])),
        Rejection::FutureStep(5)
    ));
    s.apply(&step(3, 2, 24, 2)).unwrap();
    let mut again = |stage, holder| {
        let mut c = part(3, stage, vec![holder]);
        if let Command::Checkpointed { epoch, .. } = &mut c {
            *epoch = 2;
        }
        s.apply(&c).unwrap();
    };
    again(0, id(1));
    again(1, id(2));
    assert_eq!(s.checkpoints[&3].history, 1);
    let mut to_three = roll(id(1), 2, 4);
    if let Command::RollBack { to_step, .. } = &mut to_three {
        *to_step = 3;
    }
    assert!(matches!(
        rejected(&mut s, &to_three),
        Rejection::Invalid {
            field: "to_step",
            ..
        }
    ));
    s.apply(&roll(id(1), 2, 4)).unwrap();
    assert_eq!(
        s.checkpoints.keys().copied().collect::<Vec<_>>(),
        vec![2],
        "back to an older cut (the newer one was corrupt): the newer one goes"
    );
    assert_eq!(s.progress.rolled_back_steps, 4);
}

/// Under DiLoCo a round is committed with the step it opened: its step and each stage's outer
/// digest, one per stage or none, and a rollback to before it forgets it.
#[test]
fn a_round_is_committed_with_the_step_it_opened_and_forgotten_by_a_rollback_past_it() {
    let mut s = trained(4);
    s.apply(&part(2, 0, vec![id(1)])).unwrap();
    s.apply(&part(2, 1, vec![id(2)])).unwrap();
    let round = |digests: Vec<Digest32>| {
        let mut c = step(4, 1, 32, 2);
        if let Command::StepCommitted { outer_digests, .. } = &mut c {
            *outer_digests = digests;
        }
        c
    };
    assert!(matches!(
        rejected(&mut s, &round(vec![[3; 32]])),
        Rejection::Invalid {
            field: "outer_digests",
            ..
        }
    ));
    assert_eq!(s.progress.outer_round, None);
    s.apply(&round(vec![[3; 32], [4; 32]])).unwrap();
    let committed = OuterRound {
        step: 4,
        digests: vec![[3; 32], [4; 32]],
    };
    assert_eq!(s.progress.outer_round, Some(committed.clone()));
    s.apply(&step(5, 1, 40, 2)).unwrap();
    assert_eq!(
        s.progress.outer_round,
        Some(committed),
        "a step inside the round keeps it"
    );
    s.apply(&Command::RollBack {
        node: id(1),
        epoch: 1,
        at_step: 6,
        to_step: 2,
    })
    .unwrap();
    assert_eq!(s.progress.last_committed_step, Some(2));
    assert_eq!(
        s.progress.outer_round, None,
        "the round at step 4 was rolled back"
    );
}

#[test]
fn a_stopped_cluster_restores_a_stored_cut_it_does_not_hold_in_a_new_history() {
    let mut s = trained(6);
    let stored = |state: &mut ControlState, step| {
        for stage in 0..2 {
            let mut c = part(step, stage, vec![id(1)]);
            if let Command::Checkpointed { stored, .. } = &mut c {
                *stored = true;
            }
            state.apply(&c).unwrap();
        }
    };
    stored(&mut s, 2);
    let given = s.checkpoints[&2].clone();
    let restore = |cut: &Cut, at_step| Command::RestoreCut {
        node: id(1),
        epoch: 1,
        at_step,
        cut: cut.clone(),
    };
    assert!(
        matches!(
            rejected(&mut s, &restore(&given, 6)),
            Rejection::Invalid { field: "cut", .. }
        ),
        "the cluster rolls back to a cut it holds itself"
    );
    s.checkpoints.clear();
    assert!(matches!(
        rejected(&mut s, &restore(&given, 5)),
        Rejection::AlreadyCommitted(5)
    ));
    let mut ahead = given.clone();
    ahead.end.step = 9;
    assert!(matches!(
        rejected(&mut s, &restore(&ahead, 6)),
        Rejection::Invalid { field: "cut", .. }
    ));
    let mut partial = given.clone();
    partial.parts.pop();
    assert!(matches!(
        rejected(&mut s, &restore(&partial, 6)),
        Rejection::Invalid { field: "cut", .. }
    ));
    let events = s.apply(&restore(&given, 6)).unwrap();
    assert_back_from_step_6_at_step_3(&s, events);
    assert!(s.checkpoints[&2].parts.iter().all(|p| p.holders.is_empty()));
}

#[test]
fn a_new_cluster_adopts_a_stored_cut_before_its_first_step_only() {
    let mut old = trained(6);
    for stage in 0..2 {
        let mut c = part(4, stage, vec![id(1)]);
        if let Command::Checkpointed { stored, .. } = &mut c {
            *stored = true;
        }
        old.apply(&c).unwrap();
    }
    let cut = old.checkpoints[&4].clone();
    assert!(cut.is_stored());
    let mut fresh = state_with(2);
    let mut partial = cut.clone();
    partial.parts.pop();
    assert!(matches!(
        rejected(&mut fresh, &Command::AdoptCut { cut: partial }),
        Rejection::Invalid { field: "cut", .. }
    ));
    fresh
        .apply(&Command::AdoptCut { cut: cut.clone() })
        .unwrap();
    assert_eq!(fresh.progress.next_step(), 5);
    assert_eq!(fresh.progress.sample_cursor, 40);
    assert_eq!(fresh.progress.history, 1);
    assert!(
        fresh.checkpoints[&4]
            .parts
            .iter()
            .all(|p| p.holders.is_empty())
    );
    assert_eq!(
        rejected(&mut old, &Command::AdoptCut { cut }),
        Rejection::AlreadyCommitted(5)
    );
}

#[test]
fn cost_reports_replace_and_validate() {
    let mut s = state_with(2);
    let cost = LayerCost {
        forward_s: 0.1,
        backward_s: 0.2,
        optimizer_s: 0.01,
        params: 10,
        output_bytes: 64,
    };
    s.apply(&Command::CostReport {
        node: id(1),
        step: 5,
        layers: vec![(0, cost), (1, cost)],
        bandwidth: vec![(id(2), 1e9)],
        reconfiguration_s: None,
        allreduce_bytes_per_sec: Some(1.3e9),
        boundary_link: Some(LinkTime {
            bytes: 64,
            secs: 1e-4,
        }),
    })
    .unwrap();
    s.apply(&Command::CostReport {
        node: id(1),
        step: 6,
        layers: vec![(2, cost)],
        bandwidth: vec![],
        reconfiguration_s: Some(2.5),
        allreduce_bytes_per_sec: None,
        boundary_link: None,
    })
    .unwrap();
    let c = &s.costs[&id(1)];
    assert_eq!((c.step, c.layers.len(), c.bandwidth.len()), (6, 1, 0));
    assert_eq!(c.reconfiguration_s, Some(2.5));
    assert_eq!(
        (c.allreduce_bytes_per_sec, c.boundary_link),
        (None, None),
        "replaced by the later report"
    );
    let bad = LayerCost {
        forward_s: f64::NAN,
        ..cost
    };
    let link = |secs| Some(LinkTime { bytes: 64, secs });
    for (layers, reconfiguration_s, allreduce_bytes_per_sec, boundary_link, field) in [
        (vec![], Some(f64::INFINITY), None, None, "reconfiguration_s"),
        (vec![(0, bad)], None, None, None, "layers"),
        (vec![], None, Some(-1.0), None, "allreduce_bytes_per_sec"),
        (
            vec![],
            None,
            Some(f64::NAN),
            None,
            "allreduce_bytes_per_sec",
        ),
        (vec![], None, None, link(-1e-3), "boundary_link"),
        (vec![], None, None, link(f64::INFINITY), "boundary_link"),
    ] {
        let report = Command::CostReport {
            node: id(1),
            step: 7,
            layers,
            bandwidth: vec![],
            reconfiguration_s,
            allreduce_bytes_per_sec,
            boundary_link,
        };
        assert!(
            matches!(rejected(&mut s, &report), Rejection::Invalid { field: f, .. } if f == field),
            "{field}"
        );
    }
}

#[test]
fn snapshot_roundtrip_preserves_digest_and_roles_follow_raft() {
    let mut s = state_with(3);
    s.set_raft_roles(&[id(1).0, id(2).0], &[id(3).0]);
    assert_eq!(s.members[&id(1)].role, RaftRole::Voter);
    assert_eq!(s.members[&id(3)].role, RaftRole::Learner);
    s.apply(&Command::Reconfigure {
        plan: plan(1, 1, 2, 0),
    })
    .unwrap();
    let bytes = s.encode_snapshot().unwrap();
    let back = ControlState::decode_snapshot(&bytes).unwrap();
    assert_eq!(back, s);
    assert_eq!(back.digest(), s.digest());
    s.apply(&Command::AvailabilityTick {
        interval: 0,
        count: 3,
        pools: Vec::new(),
    })
    .unwrap();
    assert_ne!(back.digest(), s.digest());
}

#[test]
fn undecodable_entry_is_rejected_without_change() {
    let mut s = state_with(1);
    let before = s.clone();
    let (cmd, outcome) = s.apply_bytes(&[1, 0, 0xff, 0xff]);
    assert!(cmd.is_none());
    assert!(matches!(outcome, Err(Rejection::Undecodable(_))));
    assert_eq!(s, before);
    let mut next = join(2).encode().unwrap();
    next[..2].copy_from_slice(&(COMMAND_VERSION + 1).to_le_bytes());
    assert!(matches!(
        s.apply_bytes(&next).1,
        Err(Rejection::Undecodable(_))
    ));
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = Command::decode(&bytes);
        let _ = ControlState::decode_snapshot(&bytes);
        let mut s = state_with(2);
        let before = s.clone();
        if s.apply_bytes(&bytes).1.is_err() {
            prop_assert_eq!(s, before);
        }
    }

    #[test]
    fn commands_roundtrip(interval in any::<u64>(), count in any::<u32>(), deadline in any::<u64>(), i in 1u8..50) {
        for cmd in [
            Command::AvailabilityTick { interval, count, pools: Vec::new() },
            Command::Notice { node: id(i), deadline_ms: deadline },
            join(i),
        ] {
            prop_assert_eq!(Command::decode(&cmd.encode().unwrap()).unwrap(), cmd);
        }
    }

    /// Any sequence of commands leaves two replicas equal (determinism).
    #[test]
    fn apply_is_deterministic(ops in proptest::collection::vec((0u8..6, 1u8..6, any::<u64>()), 0..60)) {
        let cmds: Vec<Command> = ops.iter().map(|(kind, n, x)| match kind {
            0 => join(*n),
            1 => Command::Notice { node: id(*n), deadline_ms: *x },
            2 => Command::Lost { node: id(*n) },
            3 => Command::Leave { node: id(*n) },
            4 => Command::AvailabilityTick { interval: *x % 100, count: *n as u32, pools: Vec::new() },
            _ => Command::Reconfigure { plan: plan(*x % 3, 1, 1, 0) },
        }).collect();
        let mut a = ControlState::default();
        let mut b = ControlState::default();
        for c in &cmds {
            let ra = a.apply(c);
            let rb = b.apply(c);
            prop_assert_eq!(ra, rb);
        }
        prop_assert_eq!(a.digest(), b.digest());
    }
}

fn job(pairs: &[(&str, &str)]) -> Job {
    Job {
        settings: pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn the_first_job_stands_and_another_is_refused_naming_the_setting() {
    let mut s = ControlState::default();
    let mine = job(&[("batch.global", "16"), ("data.sha256", "ab")]);
    let define = |j: &Job| Command::DefineJob { job: j.clone() };
    assert_eq!(
        s.apply(&define(&mine)).unwrap(),
        vec![StateEvent::JobDefined]
    );
    assert_eq!(
        s.apply(&define(&mine)).unwrap(),
        Vec::new(),
        "the same again"
    );
    let other = job(&[("batch.global", "16"), ("data.sha256", "cd")]);
    assert_eq!(
        rejected(&mut s, &define(&other)),
        Rejection::JobConflict(
            "data.sha256: the cluster's job has \"ab\", this node's \"cd\"".into()
        )
    );
    let fewer = job(&[("batch.global", "16")]);
    assert_eq!(
        mine.difference(&fewer).unwrap(),
        "data.sha256: the cluster's job has \"ab\", this node's no value"
    );
    let both = job(&[("batch.global", "8"), ("data.sha256", "cd")]);
    assert_eq!(
        mine.difference(&both).unwrap(),
        "batch.global: the cluster's job has \"16\", this node's \"8\"; \
         data.sha256: the cluster's job has \"ab\", this node's \"cd\""
    );
    assert_eq!(s.job, Some(mine.clone()));
    assert!(matches!(
        rejected(&mut ControlState::default(), &define(&job(&[]))),
        Rejection::Invalid { field: "job", .. }
    ));
    let long = "x".repeat(limits::MAX_JOB_VALUE_BYTES + 1);
    assert!(matches!(
        rejected(&mut ControlState::default(), &define(&job(&[("a", &long)]))),
        Rejection::Invalid { field: "job", .. }
    ));
    // Members train the job when their digest is the job's.
    let training = PeerInfo {
        job: Some(mine.digest()),
        ..peer(1)
    };
    assert!(s.trains_the_job(&training));
    assert!(!s.trains_the_job(&PeerInfo {
        job: Some(other.digest()),
        ..peer(1)
    }));
    assert!(!s.trains_the_job(&peer(1)), "a node without a job");
    assert!(
        !ControlState::default().trains_the_job(&training),
        "no job yet"
    );
    assert_ne!(mine.digest(), other.digest());
}
