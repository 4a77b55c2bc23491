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

/// Weight of a node in a slot outside its zone: below any sum of real weights, so the matching
/// takes one only where no node of the slot's zone is left, which [`assign_in_zones`] refuses.
const WRONG_ZONE: i64 = -(1 << 50);

/// Assign `config` over `nodes` for a model whose layer `i` carries `layer_bytes[i]` of state,
/// with new stage boundaries `partition` (`p + 1` entries from 0 to the layer count).
pub fn assign<Id: Clone + Ord>(
    nodes: &[Holding<Id>],
    config: ParallelConfig,
    partition: &[usize],
    layer_bytes: &[f64],
) -> Result<Assignment<Id>, AssignError> {
    assign_where(nodes, config, partition, layer_bytes, &|_, _| true)
}

/// [`assign`] over zones: node `n` is in zone `node_zones[n]`, and slot `(i, s)` must go to a
/// node of zone `slot_zones[i][s]` (a placement of `cost::fleet`).
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
    let zone_of = |s: Slot| slot_zones[s.pipeline as usize][s.stage as usize];
    let a = assign_where(nodes, config, partition, layer_bytes, &|n, s| {
        node_zones[n] == zone_of(s)
    })?;
    for (n, holding) in nodes.iter().enumerate() {
        if let Some(slot) = a.slots.get(&holding.node)
            && node_zones[n] != zone_of(*slot)
        {
            return Err(AssignError::ZoneShort {
                config,
                zone: zone_of(*slot),
            });
        }
    }
    Ok(a)
}

/// [`assign`] where node `n` may take slot `s` only if `allowed(n, s)` (or no allowed node is
/// left for it).
fn assign_where<Id: Clone + Ord>(
    nodes: &[Holding<Id>],
    config: ParallelConfig,
    partition: &[usize],
    layer_bytes: &[f64],
    allowed: &dyn Fn(usize, Slot) -> bool,
) -> Result<Assignment<Id>, AssignError> {
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
    let slots: Vec<Slot> = (0..config.d)
        .flat_map(|pipeline| (0..config.p).map(move |stage| Slot { pipeline, stage }))
        .collect();
    let held = |n: &Holding<Id>, s: &Slot| -> i64 {
        let r = partition[s.stage as usize]..partition[s.stage as usize + 1];
        let lo = r.start.max(n.layers.start);
        let hi = r.end.min(n.layers.end);
        let bytes: f64 = (lo..hi).map(|l| layer_bytes[l]).sum();
        let keep = i64::from(n.slot == Some(*s));
        (bytes as i64).saturating_mul(WEIGHT_SCALE) + keep
    };
    // Kuhn-Munkres wants rows <= columns: slots are rows, nodes columns.
    let weights = Matrix::from_fn(slots.len(), nodes.len(), |(r, c)| {
        if allowed(c, slots[r]) {
            held(&nodes[c], &slots[r])
        } else {
            WRONG_ZONE
        }
    });
    let chosen: Vec<usize> = if slots.is_empty() {
        Vec::new()
    } else {
        kuhn_munkres(&weights).1
    };
    let mut out = Assignment {
        slots: BTreeMap::new(),
        transfers: BTreeMap::new(),
        lost_layers: Vec::new(),
        moved_bytes: 0.0,
    };
    let mut load: BTreeMap<Id, f64> = BTreeMap::new();
    for (r, &c) in chosen.iter().enumerate() {
        let slot = slots[r];
        let node = &nodes[c];
        out.slots.insert(node.node.clone(), slot);
        let wanted = partition[slot.stage as usize]..partition[slot.stage as usize + 1];
        let mut fetches: Vec<Transfer<Id>> = Vec::new();
        for layer in wanted.filter(|l| !node.layers.contains(l)) {
            let source = nodes
                .iter()
                .filter(|h| h.layers.contains(&layer))
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
    Ok(out)
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
}
