//! What every holder sends when the cluster enters a plan: each slot's fetches as its node
//! plans them ([`handoff::plan_fetches`]), reconstructed from the replicated plans. A node
//! knows only its own fetches; the others' tell it how many pieces each of its sources sends at
//! the same time, which an emulated link shares between them (a holder sends no faster than its
//! own link, however many nodes fetch from it).

use std::collections::BTreeMap;
use std::ops::Range;

use parcae_consensus::state::{MemberStatus, Plan};
use parcae_consensus::{ControlState, NodeId};
use parcae_outer::SyncMode;

use super::{handoff, zones};
use crate::dataplane::protocol::HeldInfo;

/// The layers each holder sends to the nodes of `plan` other than `me` when they enter it at
/// step `step` after `previous`: every node of `previous` that is not lost holds its old
/// stage's layers at the step; a node that keeps its layers fetches nothing, and one that
/// holds a piece it needs takes it from itself. A node that did not train under `previous`
/// holds nothing.
pub fn sends(
    state: &ControlState,
    (previous, plan): (&Plan, &Plan),
    step: u64,
    me: NodeId,
    sync: SyncMode,
) -> BTreeMap<NodeId, Vec<Range<usize>>> {
    let at = (state.progress.history, step);
    let held = |p: &Plan, node: &NodeId| {
        let slot = p.assignment.get(node)?;
        let r = p.stage_layers(slot.stage)?;
        Some(r.start as usize..r.end as usize)
    };
    let holders: Vec<(NodeId, HeldInfo)> = previous
        .assignment
        .keys()
        .filter(|n| {
            state
                .members
                .get(n)
                .is_some_and(|m| m.status != MemberStatus::Lost)
        })
        .filter_map(|n| {
            let r = held(previous, n)?;
            let info = HeldInfo {
                history: at.0,
                step: at.1,
                start: r.start as u32,
                end: r.end as u32,
            };
            Some((*n, info))
        })
        .collect();
    let mut sends: BTreeMap<NodeId, Vec<Range<usize>>> = BTreeMap::new();
    for (node, slot) in plan.assignment.iter().filter(|(n, _)| **n != me) {
        let Some(needed) = held(plan, node) else {
            continue;
        };
        let own = held(previous, node);
        let covers = |r: &Range<usize>| {
            own.as_ref()
                .is_some_and(|o| o.start <= r.start && r.end <= o.end)
        };
        if covers(&needed) {
            continue;
        }
        let group = zones::group(state, node, sync);
        let spread = slot.pipeline as usize;
        let (fetches, _) = handoff::plan_fetches(needed, at, &holders, spread, &group);
        for f in fetches.into_iter().filter(|f| !covers(&f.layers)) {
            sends.entry(f.from).or_default().push(f.layers);
        }
    }
    sends
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::Command;
    use parcae_consensus::state::{PeerInfo, StageSlot};

    fn node(k: u8) -> NodeId {
        NodeId::from_peer_bytes(&[k])
    }

    /// `d` pipelines of the stages `bounds` over nodes `first..`, pipeline-major.
    fn plan(epoch: u64, d: u32, bounds: &[u32], first: u8) -> Plan {
        let p = bounds.len() as u32 - 1;
        let mut assignment = BTreeMap::new();
        let mut k = first;
        for pipeline in 0..d {
            for stage in 0..p {
                assignment.insert(node(k), StageSlot { pipeline, stage });
                k += 1;
            }
        }
        Plan {
            epoch,
            data_parallel: d,
            pipeline_stages: p,
            partition: bounds.to_vec(),
            assignment,
            at_step: 5,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        }
    }

    fn state(members: u8) -> ControlState {
        let mut s = ControlState::default();
        for k in 1..=members {
            let peer = PeerInfo {
                peer_id: vec![k],
                ..PeerInfo::default()
            };
            s.apply(&Command::Join {
                node: node(k),
                peer,
            })
            .unwrap();
        }
        s
    }

    #[test]
    fn each_holder_sends_what_the_other_slots_lack_and_keepers_fetch_nothing() {
        // Two pipelines of two stages (layers 0..2, 2..4) on nodes 1-4 become one pipeline
        // of four single layers on nodes 1-4 (node 1: 0..1, 2: 1..2, 3: 2..3, 4: 3..4).
        let s = state(4);
        let before = plan(1, 2, &[0, 2, 4], 1);
        let after = plan(2, 1, &[0, 1, 2, 3, 4], 1);
        let sends = sends(&s, (&before, &after), 5, node(9), SyncMode::Step);
        // Node 1 held 0..2 and node 2 held 2..4: both now need a layer they do not hold; node 3
        // (0..2 in pipeline 1) lacks 2..3, node 4 (2..4) holds 3..4. Every needed layer has two
        // holders; pipeline 0 of the new plan takes the first by layer order.
        let pieces: usize = sends.values().map(Vec::len).sum();
        assert_eq!(pieces, 2, "{sends:?}");
        let sent: Vec<Range<usize>> = sends.values().flatten().cloned().collect();
        assert!(
            sent.contains(&(1..2)) && sent.contains(&(2..3)),
            "{sends:?}"
        );
        // Without `me`'s slot: node 2's fetch of 1..2 is not counted.
        let without_2 = super::sends(&s, (&before, &after), 5, node(2), SyncMode::Step);
        let sent: Vec<Range<usize>> = without_2.values().flatten().cloned().collect();
        assert_eq!(sent, vec![Range { start: 2, end: 3 }]);
    }

    #[test]
    fn lost_members_hold_nothing() {
        let mut s = state(5);
        let before = plan(1, 2, &[0, 2, 4], 1);
        // Node 1 (0..2 of pipeline 0) is lost; nodes 2-5 take the four layers.
        s.apply(&Command::Lost { node: node(1) }).unwrap();
        let after = plan(2, 1, &[0, 1, 2, 3, 4], 2);
        let sends = sends(&s, (&before, &after), 5, node(9), SyncMode::Step);
        assert!(!sends.contains_key(&node(1)), "{sends:?}");
        // Node 2 (2..4 before) needs layer 0, which node 3 alone holds now; nodes 3 and 4 hold
        // theirs; node 5 is new and takes layer 3 from node 2 or node 4.
        assert_eq!(sends.get(&node(3)), Some(&vec![Range { start: 0, end: 1 }]));
        let pieces: usize = sends.values().map(Vec::len).sum();
        assert_eq!(pieces, 2, "{sends:?}");
    }
}
