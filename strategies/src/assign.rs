//! From a decision `(D, P)` to concrete work: which node runs which `(pipeline, stage)`, and
//! which layers each node must fetch from which holders.
//!
//! Nodes are matched to stage slots by maximum-weight bipartite matching (Kuhn-Munkres), the
//! weight being the bytes of the new stage a node already holds, as SpotServe matches its
//! migrations; layers a node lacks are then spread over every holder so that transfers run
//! from several sources in parallel.

use std::collections::BTreeMap;
use std::ops::Range;

use pathfinding::prelude::{Matrix, kuhn_munkres};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::ParallelConfig;

/// A position in the grid of pipelines and stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Slot {
    /// Pipeline (data-parallel replica) index.
    pub pipeline: u32,
    /// Stage index.
    pub stage: u32,
}

/// What a surviving node holds before the change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding<Id> {
    /// The node.
    pub node: Id,
    /// Its slot in the old configuration (`None` for spares and newcomers).
    pub slot: Option<Slot>,
    /// Layers whose state it holds (empty for spares and newcomers).
    pub layers: Range<usize>,
}

/// Layers to fetch from one holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer<Id> {
    /// Source node.
    pub from: Id,
    /// Contiguous layers to fetch from it.
    pub layers: Range<usize>,
}

/// The concrete plan for a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment<Id> {
    /// Every working node's slot.
    pub slots: BTreeMap<Id, Slot>,
    /// Per node, the fetches it must do before training (absent when it has everything).
    pub transfers: BTreeMap<Id, Vec<Transfer<Id>>>,
    /// Layers no survivor holds: to be restored from a checkpoint.
    pub lost_layers: Vec<usize>,
    /// Bytes moved by all transfers.
    pub moved_bytes: f64,
}

/// Why no assignment exists.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AssignError {
    /// Fewer nodes than slots.
    #[error("configuration {config} needs {need} nodes, only {have} are available")]
    NotEnoughNodes {
        /// The configuration asked for.
        config: ParallelConfig,
        /// Nodes it needs.
        need: u32,
        /// Nodes available.
        have: usize,
    },
    /// A placement over zones that is not `d` pipelines of `p` stages, or not one zone per
    /// node.
    #[error("the zones given do not place {config}")]
    BadPlacement {
        /// The configuration asked for.
        config: ParallelConfig,
    },
    /// Fewer nodes in a zone than the placement puts there.
    #[error("configuration {config} places more slots in zone {zone} than it has nodes")]
    ZoneShort {
        /// The configuration asked for.
        config: ParallelConfig,
        /// The zone short of nodes.
        zone: usize,
    },
    /// The partition does not describe `p` stages over the layers.
    #[error("partition {partition:?} does not split {layers} layers into {stages} stages")]
    BadPartition {
        /// The partition given.
        partition: Vec<usize>,
        /// Layers of the model.
        layers: usize,
        /// Stages asked for.
        stages: u32,
    },
}

/// Scale of byte weights, leaving the units digit for the keep-your-slot tie-break.
const WEIGHT_SCALE: i64 = 4;

/// Assign `config` over `nodes` for a model whose layer `i` carries `layer_bytes[i]` of state,
/// with new stage boundaries `partition` (`p + 1` entries from 0 to the layer count).
pub fn assign<Id: Clone + Ord>(
    nodes: &[Holding<Id>],
    config: ParallelConfig,
    partition: &[usize],
    layer_bytes: &[f64],
) -> Result<Assignment<Id>, AssignError> {
    let slots = checked_slots(nodes, config, partition, layer_bytes)?;
    let all_slots: Vec<usize> = (0..slots.len()).collect();
    let all_nodes: Vec<usize> = (0..nodes.len()).collect();
    let chosen = matched(
        nodes,
        &slots,
        &all_slots,
        &all_nodes,
        partition,
        layer_bytes,
    );
    Ok(assignment_of(
        nodes,
        &slots,
        &chosen,
        partition,
        layer_bytes,
    ))
}

/// [`assign`] over zones: node `n` is in zone `node_zones[n]`, and slot `(i, s)` must go to a
/// node of zone `slot_zones[i][s]` (a placement of `cost::fleet`). No slot may go outside its
/// zone, so each zone's slots are matched to its own nodes alone: the same optimum as one
/// matching over all of them, in a zone's share of its time (Kuhn-Munkres is cubic: 4 zones of
/// 128 nodes match ~16x faster than 512 at once).
pub fn assign_in_zones<Id: Clone + Ord>(
    nodes: &[Holding<Id>],
    config: ParallelConfig,
    partition: &[usize],
    layer_bytes: &[f64],
    node_zones: &[usize],
    slot_zones: &[Vec<usize>],
) -> Result<Assignment<Id>, AssignError> {
    let fits = slot_zones.len() == config.d as usize
        && slot_zones.iter().all(|p| p.len() == config.p as usize)
        && node_zones.len() == nodes.len();
    if !fits {
        return Err(AssignError::BadPlacement { config });
    }
    let slots = checked_slots(nodes, config, partition, layer_bytes)?;
    let zone_of = |s: &Slot| slot_zones[s.pipeline as usize][s.stage as usize];
    let mut zones: Vec<usize> = slots.iter().map(zone_of).collect();
    zones.sort_unstable();
    zones.dedup();
    let mut chosen = vec![0; slots.len()];
    for zone in zones {
        let rows: Vec<usize> = (0..slots.len())
            .filter(|&r| zone_of(&slots[r]) == zone)
            .collect();
        let cols: Vec<usize> = (0..nodes.len())
            .filter(|&c| node_zones[c] == zone)
            .collect();
        if cols.len() < rows.len() {
            return Err(AssignError::ZoneShort { config, zone });
        }
        let matched = matched(nodes, &slots, &rows, &cols, partition, layer_bytes);
        for (&r, c) in rows.iter().zip(matched) {
            chosen[r] = c;
        }
    }
    Ok(assignment_of(
        nodes,
        &slots,
        &chosen,
        partition,
        layer_bytes,
    ))
}

/// The slots of `config`, pipeline by pipeline, once `partition` is known to split the layers
/// into its stages and `nodes` are enough for it.
fn checked_slots<Id>(
    nodes: &[Holding<Id>],
    config: ParallelConfig,
    partition: &[usize],
    layer_bytes: &[f64],
) -> Result<Vec<Slot>, AssignError> {
    let need = config.nodes();
    let valid = partition.len() == config.p as usize + 1
        && partition.first() == Some(&0)
        && partition.last() == Some(&layer_bytes.len())
        && partition.windows(2).all(|w| w[0] < w[1]);
    if !valid {
        return Err(AssignError::BadPartition {
            partition: partition.to_vec(),
            layers: layer_bytes.len(),
            stages: config.p,
        });
    }
    if (nodes.len() as u64) < u64::from(need) {
        return Err(AssignError::NotEnoughNodes {
            config,
            need,
            have: nodes.len(),
        });
    }
    Ok((0..config.d)
        .flat_map(|pipeline| (0..config.p).map(move |stage| Slot { pipeline, stage }))
        .collect())
}

/// For each of the slots `rows` (indices into `slots`, no more than `cols`), the node of `cols`
/// (indices into `nodes`) a maximum-weight matching gives it: the weight is the bytes of the
/// slot's stage the node holds, and one more where the node keeps its own slot.
fn matched<Id: PartialEq>(
    nodes: &[Holding<Id>],
    slots: &[Slot],
    rows: &[usize],
    cols: &[usize],
    partition: &[usize],
    layer_bytes: &[f64],
) -> Vec<usize> {
    if rows.is_empty() {
        return Vec::new();
    }
    // Nodes that hold nothing and had no slot (a cluster's first plan) weigh nothing anywhere:
    // every matching is as good, so the first of them take the slots in order.
    if cols
        .iter()
        .all(|&c| nodes[c].layers.is_empty() && nodes[c].slot.is_none())
    {
        return cols[..rows.len()].to_vec();
    }
    let held = |n: &Holding<Id>, s: &Slot| -> i64 {
        let r = partition[s.stage as usize]..partition[s.stage as usize + 1];
        let lo = r.start.max(n.layers.start);
        let hi = r.end.min(n.layers.end);
        let bytes: f64 = (lo..hi).map(|l| layer_bytes[l]).sum();
        let keep = i64::from(n.slot == Some(*s));
        (bytes as i64).saturating_mul(WEIGHT_SCALE) + keep
    };
    // Kuhn-Munkres wants rows <= columns: slots are rows, nodes columns.
    let weights = Matrix::from_fn(rows.len(), cols.len(), |(r, c)| {
        held(&nodes[cols[c]], &slots[rows[r]])
    });
    kuhn_munkres(&weights)
        .1
        .into_iter()
        .map(|c| cols[c])
        .collect()
}

/// The assignment that gives slot `slots[r]` to node `chosen[r]`, with the fetches each node
/// makes for the layers of its stage it lacks (spread over every holder).
fn assignment_of<Id: Clone + Ord>(
    nodes: &[Holding<Id>],
    slots: &[Slot],
    chosen: &[usize],
    partition: &[usize],
    layer_bytes: &[f64],
) -> Assignment<Id> {
    let mut out = Assignment {
        slots: BTreeMap::new(),
        transfers: BTreeMap::new(),
        lost_layers: Vec::new(),
        moved_bytes: 0.0,
    };
    // Who holds each layer, in the nodes' order: a large cluster asks for every layer of
    // every node, and scanning all nodes for each was quadratic in them.
    let layers = layer_bytes.len();
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for (i, node) in nodes.iter().enumerate() {
        let end = node.layers.end.min(layers);
        let held = node.layers.start.min(end)..end;
        for holding in &mut holders[held] {
            holding.push(i);
        }
    }
    let mut load: BTreeMap<Id, f64> = BTreeMap::new();
    for (r, &c) in chosen.iter().enumerate() {
        let slot = slots[r];
        let node = &nodes[c];
        out.slots.insert(node.node.clone(), slot);
        let wanted = partition[slot.stage as usize]..partition[slot.stage as usize + 1];
        let mut fetches: Vec<Transfer<Id>> = Vec::new();
        for layer in wanted.filter(|l| !node.layers.contains(l)) {
            let source = holders
                .get(layer)
                .into_iter()
                .flatten()
                .map(|&i| &nodes[i])
                .min_by(|a, b| {
                    let la = load.get(&a.node).copied().unwrap_or(0.0);
                    let lb = load.get(&b.node).copied().unwrap_or(0.0);
                    la.total_cmp(&lb).then_with(|| a.node.cmp(&b.node))
                });
            let Some(source) = source else {
                if !out.lost_layers.contains(&layer) {
                    out.lost_layers.push(layer);
                }
                continue;
            };
            *load.entry(source.node.clone()).or_default() += layer_bytes[layer];
            out.moved_bytes += layer_bytes[layer];
            match fetches.last_mut() {
                Some(t) if t.from == source.node && t.layers.end == layer => t.layers.end += 1,
                _ => fetches.push(Transfer {
                    from: source.node.clone(),
                    layers: layer..layer + 1,
                }),
            }
        }
        if !fetches.is_empty() {
            out.transfers.insert(node.node.clone(), fetches);
        }
    }
    out.lost_layers.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(node: u32, slot: Option<(u32, u32)>, layers: Range<usize>) -> Holding<u32> {
        Holding {
            node,
            slot: slot.map(|(pipeline, stage)| Slot { pipeline, stage }),
            layers,
        }
    }

    #[test]
    fn unchanged_config_keeps_every_slot_and_moves_nothing() {
        let nodes: Vec<_> = (0..4)
            .map(|i| {
                holding(
                    i,
                    Some((i / 2, i % 2)),
                    if i % 2 == 0 { 0..2 } else { 2..4 },
                )
            })
            .collect();
        let a = assign(&nodes, ParallelConfig::new(2, 2), &[0, 2, 4], &[1.0; 4]).unwrap();
        assert_eq!(a.moved_bytes, 0.0);
        for n in &nodes {
            assert_eq!(a.slots[&n.node], n.slot.unwrap());
        }
    }

    #[test]
    fn repartition_fetches_only_missing_layers_from_holders() {
        // Old: 2 stages [0,3) [3,6) with one replica each plus a spare; new: 3 stages.
        let nodes = vec![
            holding(10, Some((0, 0)), 0..3),
            holding(11, Some((0, 1)), 3..6),
            holding(12, None, 0..0),
        ];
        let a = assign(&nodes, ParallelConfig::new(1, 3), &[0, 2, 4, 6], &[1.0; 6]).unwrap();
        assert_eq!(a.slots[&10].stage, 0);
        assert_eq!(a.slots[&11].stage, 2);
        assert_eq!(a.slots[&12].stage, 1);
        let t = &a.transfers[&12];
        let fetched: usize = t.iter().map(|t| t.layers.len()).sum();
        assert_eq!(fetched, 2);
        assert_eq!(a.moved_bytes, 2.0, "{a:?}");
        assert_eq!(t.iter().map(|t| t.from).collect::<Vec<_>>(), vec![10, 11]);
        assert!(a.lost_layers.is_empty());
    }

    #[test]
    fn slots_go_to_nodes_of_their_zone_even_against_what_they_hold() {
        // Node 1 (zone 0) holds stage 1's layers, node 2 (zone 1) stage 0's; the placement
        // wants stage 0 in zone 0 and stage 1 in zone 1, so both move.
        let nodes = vec![
            holding(1, Some((0, 1)), 2..4),
            holding(2, Some((0, 0)), 0..2),
        ];
        let config = ParallelConfig::new(1, 2);
        let a = assign_in_zones(
            &nodes,
            config,
            &[0, 2, 4],
            &[1.0; 4],
            &[0, 1],
            &[vec![0, 1]],
        )
        .unwrap();
        assert_eq!(a.slots[&1].stage, 0);
        assert_eq!(a.slots[&2].stage, 1);
        assert_eq!(a.moved_bytes, 4.0);
        let free = assign(&nodes, config, &[0, 2, 4], &[1.0; 4]).unwrap();
        assert_eq!(free.moved_bytes, 0.0, "without zones both keep theirs");
        assert_eq!(
            assign_in_zones(
                &nodes,
                config,
                &[0, 2, 4],
                &[1.0; 4],
                &[0, 0],
                &[vec![0, 1]]
            ),
            Err(AssignError::ZoneShort { config, zone: 1 })
        );
        assert_eq!(
            assign_in_zones(&nodes, config, &[0, 2, 4], &[1.0; 4], &[0, 1], &[vec![0]]),
            Err(AssignError::BadPlacement { config })
        );
    }

    #[test]
    fn lost_layers_and_errors_are_reported() {
        let nodes = vec![holding(1, Some((0, 0)), 0..2), holding(2, None, 0..0)];
        let a = assign(&nodes, ParallelConfig::new(1, 2), &[0, 2, 4], &[1.0; 4]).unwrap();
        assert_eq!(a.lost_layers, vec![2, 3]);
        assert!(matches!(
            assign(&nodes, ParallelConfig::new(2, 2), &[0, 2, 4], &[1.0; 4]),
            Err(AssignError::NotEnoughNodes { .. })
        ));
        assert!(matches!(
            assign(&nodes, ParallelConfig::new(1, 2), &[0, 4], &[1.0; 4]),
            Err(AssignError::BadPartition { .. })
        ));
    }

    #[test]
    fn zones_are_matched_apart_and_fresh_nodes_in_order_as_one_matching_would() {
        // Four zones of three nodes, 2 x 4 slots placed two per zone; in zone 2 one node holds
        // stage 1's layers and keeps its slot, in zone 3 one holds stage 0's.
        let mut nodes: Vec<Holding<u32>> = (0..12).map(|n| holding(n, None, 0..0)).collect();
        nodes[7] = holding(7, Some((1, 1)), 2..4);
        nodes[10] = holding(10, Some((0, 0)), 0..2);
        let node_zones: Vec<usize> = (0..12).map(|n| n / 3).collect();
        let slot_zones = vec![vec![0, 1], vec![2, 2], vec![3, 3], vec![0, 1]];
        let config = ParallelConfig::new(4, 2);
        let a = assign_in_zones(
            &nodes,
            config,
            &[0, 2, 4],
            &[1.0; 4],
            &node_zones,
            &slot_zones,
        )
        .unwrap();
        for (node, slot) in &a.slots {
            let zone = slot_zones[slot.pipeline as usize][slot.stage as usize];
            assert_eq!(node_zones[*node as usize], zone, "{node} in {slot:?}");
        }
        assert_eq!(
            a.slots[&7],
            Slot {
                pipeline: 1,
                stage: 1
            },
            "keeps its slot"
        );
        assert_eq!(a.slots[&10].stage, 0, "keeps its layers");
        // Both holders keep their layers: the six fresh nodes in the other slots fetch two
        // layers each.
        assert_eq!(a.moved_bytes, 12.0, "{a:?}");
        // Fresh nodes alone take the slots in order, the first nodes of each zone.
        let fresh: Vec<Holding<u32>> = (0..4).map(|n| holding(n, None, 0..0)).collect();
        let a = assign_in_zones(
            &fresh,
            ParallelConfig::new(2, 1),
            &[0, 4],
            &[1.0; 4],
            &[0, 1, 0, 1],
            &[vec![1], vec![0]],
        )
        .unwrap();
        let slot = |pipeline| Slot { pipeline, stage: 0 };
        assert_eq!((a.slots[&1], a.slots[&0]), (slot(0), slot(1)));
        assert_eq!(a.lost_layers, vec![0, 1, 2, 3]);
    }
}
