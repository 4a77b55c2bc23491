//! Getting the state of a new slot: which layers come from which live holder (several in
//! parallel, spread over replicas), and which must be restored from a checkpoint because every
//! holder is gone.

use std::collections::BTreeMap;
use std::ops::Range;

use futures::future::join_all;
use parcae_consensus::state::{CheckpointRecord, MemberStatus};
use parcae_consensus::{ControlState, NodeId};
use sha2::{Digest, Sha256};

use super::TrainError;
use crate::dataplane::DataplaneError;
use crate::dataplane::client::{self, PeerAddr};
use crate::dataplane::protocol::HeldInfo;
use crate::dataplane::server::{Endpoint, Piece};

/// Layers to take from one holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// The holder.
    pub from: NodeId,
    /// Contiguous layers.
    pub layers: Range<usize>,
}

/// Chooses a live holder of step `step` for every layer of `needed`, spreading layers over the
/// holders (`spread` shifts the choice so that replicas fetching the same stage use different
/// sources); returns the fetches and the layers nobody holds.
pub fn plan_fetches(
    needed: Range<usize>,
    step: u64,
    holders: &[(NodeId, HeldInfo)],
    spread: usize,
) -> (Vec<Fetch>, Vec<usize>) {
    let mut fetches: Vec<Fetch> = Vec::new();
    let mut missing = Vec::new();
    for layer in needed {
        let mut candidates: Vec<NodeId> = holders
            .iter()
            .filter(|(_, h)| h.step == step && (h.start as usize..h.end as usize).contains(&layer))
            .map(|(n, _)| *n)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.is_empty() {
            missing.push(layer);
            continue;
        }
        let from = candidates[(layer + spread) % candidates.len()];
        match fetches.last_mut() {
            Some(f) if f.from == from && f.layers.end == layer => f.layers.end += 1,
            _ => fetches.push(Fetch {
                from,
                layers: layer..layer + 1,
            }),
        }
    }
    (fetches, missing)
}

/// What [`acquire`] brought.
pub struct Acquired {
    /// Layers from live holders (and this node's own state), at the job's step.
    pub live: Vec<Piece>,
    /// Layers restored from checkpoints, with the steps the checkpoint had taken.
    pub restored: Vec<(u64, Piece)>,
    /// Layers nobody held and no checkpoint covered (initialised afresh).
    pub lost: Vec<usize>,
    /// Bytes received from other nodes.
    pub received_bytes: u64,
    /// The nodes they came from.
    pub sources: Vec<NodeId>,
    /// What was fetched from each of them.
    pub fetched: Vec<Fetch>,
    /// Seconds the parallel fetches took.
    pub fetch_secs: f64,
}

fn members_to_ask(state: &ControlState, me: NodeId) -> Vec<PeerAddr> {
    state
        .members
        .iter()
        .filter(|(id, m)| **id != me && m.status != MemberStatus::Lost)
        .filter_map(|(id, _)| client::peer_addr(state, *id).ok())
        .collect()
}

/// Brings layers `needed` at step `step` to this node: its own held state first, then live
/// holders in parallel, then checkpoints.
pub async fn acquire(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    needed: Range<usize>,
    step: u64,
    spread: usize,
) -> Result<Acquired, TrainError> {
    let ask = members_to_ask(state, me);
    let answers = join_all(ask.iter().map(|p| client::query(ep, p))).await;
    let mut holders: Vec<(NodeId, HeldInfo)> = Vec::new();
    let own = ep.held();
    let covers_own = own.filter(|h| {
        h.step == step && h.start as usize <= needed.start && needed.end <= h.end as usize
    });
    if let Some(h) = covers_own {
        holders.push((me, h));
    } else {
        if let Some(h) = own {
            holders.push((me, h));
        }
        for (peer, answer) in ask.iter().zip(answers) {
            match answer {
                Ok(Some(h)) => holders.push((peer.node, h)),
                Ok(None) => {}
                Err(e) => tracing::debug!(node = %peer.node, "state query failed: {e}"),
            }
        }
    }
    let (mut fetches, missing) = plan_fetches(needed.clone(), step, &holders, spread);
    // This node's own layers cost nothing: take them wherever they cover a fetch.
    for f in &mut fetches {
        if own.is_some_and(|h| {
            h.step == step && h.start as usize <= f.layers.start && f.layers.end <= h.end as usize
        }) {
            f.from = me;
        }
    }
    let by_addr: BTreeMap<NodeId, PeerAddr> = ask.iter().map(|p| (p.node, *p)).collect();
    let remote = fetches.iter().filter(|f| f.from != me).map(|f| async {
        let peer = by_addr
            .get(&f.from)
            .ok_or_else(|| DataplaneError::Peer(format!("{} has no address", f.from)))?;
        let bufs = client::fetch(ep, peer, step, f.layers.clone()).await?;
        Ok::<_, TrainError>((f.layers.clone(), bufs))
    });
    let mut live = Vec::new();
    let mut received_bytes = 0u64;
    let mut sources: Vec<NodeId> = fetches
        .iter()
        .map(|f| f.from)
        .filter(|n| *n != me)
        .collect();
    sources.sort_unstable();
    sources.dedup();
    let fetched_from_peers: Vec<Fetch> = fetches.iter().filter(|f| f.from != me).cloned().collect();
    let started = std::time::Instant::now();
    let fetched = join_all(remote).await;
    let fetch_secs = started.elapsed().as_secs_f64();
    for got in fetched {
        let (layers, bufs) = got?;
        for (layer, bytes) in layers.zip(bufs) {
            received_bytes += bytes.len() as u64;
            live.push(Piece {
                bytes,
                layers: layer..layer + 1,
            });
        }
    }
    let local = fetches.iter().filter(|f| f.from == me);
    live.extend(local.flat_map(|f| ep.held_layers(step, f.layers.clone())));
    let (restored, lost) = restore(ep, state, me, &missing).await?;
    Ok(Acquired {
        live,
        restored,
        lost,
        received_bytes,
        sources,
        fetched: fetched_from_peers,
        fetch_secs,
    })
}

/// The checkpoints that cover `layer`, newest first.
fn candidates(state: &ControlState, layer: usize) -> Vec<&CheckpointRecord> {
    let mut recs: Vec<&CheckpointRecord> = state
        .checkpoints
        .iter()
        .filter(|(r, _)| (r.start as usize..r.end as usize).contains(&layer))
        .flat_map(|(_, recs)| recs.iter())
        .collect();
    recs.sort_by_key(|r| std::cmp::Reverse(r.step));
    recs
}

/// How often a holder that does not answer is asked for its copy, and the pause between.
const CHECKPOINT_ATTEMPTS: usize = 2;
const CHECKPOINT_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// What one checkpoint yielded.
enum Copy {
    /// Bytes whose SHA-256 is the digest committed in raft.
    Verified(Vec<u8>),
    /// Every holder answered, none with the committed bytes.
    Corrupt,
    /// Some holder did not answer (a node restarting, a partition): the checkpoint may well
    /// exist.
    Unreachable,
}

/// The bytes of `record` from its holders, checked against its committed digest; a holder
/// that does not answer is asked again before the next one is.
async fn fetch_verified(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    record: &CheckpointRecord,
) -> Copy {
    let range = record.layers.start as usize..record.layers.end as usize;
    let steps = record.step + 1;
    let mut unreachable = false;
    for holder in &record.holders {
        for attempt in 0..CHECKPOINT_ATTEMPTS {
            let got = if *holder == me {
                ep.checkpoints
                    .load(steps, &range)
                    .map_err(DataplaneError::from)
            } else {
                match client::peer_addr(state, *holder) {
                    Ok(peer) => client::fetch_checkpoint(ep, &peer, steps, range.clone()).await,
                    Err(e) => Err(e),
                }
            };
            match got {
                Ok(bytes) if Sha256::digest(&bytes).as_slice() == record.digest => {
                    return Copy::Verified(bytes);
                }
                Ok(_) => {
                    tracing::error!(%holder, layers = ?range, steps, "a checkpoint copy does not match the digest committed in raft");
                    break;
                }
                Err(e) => {
                    tracing::warn!(%holder, layers = ?range, steps, attempt, "checkpoint fetch failed: {e}");
                    if attempt + 1 == CHECKPOINT_ATTEMPTS {
                        unreachable = true;
                    } else {
                        tokio::time::sleep(CHECKPOINT_RETRY).await;
                    }
                }
            }
        }
    }
    if unreachable {
        Copy::Unreachable
    } else {
        Copy::Corrupt
    }
}

/// Restores `missing` layers from the newest checkpoint covering each whose bytes match the
/// digest committed in raft, falling back to older checkpoints. Layers no checkpoint covers,
/// or whose every copy is corrupt, are lost; when a checkpoint's holders did not answer and
/// no other checkpoint could be read, the acquisition fails and is retried (an unreachable
/// holder is not a lost checkpoint).
async fn restore(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    missing: &[usize],
) -> Result<(Vec<(u64, Piece)>, Vec<usize>), TrainError> {
    let mut restored = Vec::new();
    let mut lost = Vec::new();
    let mut done: Vec<usize> = Vec::new();
    for &layer in missing {
        if done.contains(&layer) {
            continue;
        }
        let mut unreachable = false;
        let mut found = None;
        for record in candidates(state, layer) {
            match fetch_verified(ep, state, me, record).await {
                Copy::Verified(bytes) => {
                    found = Some((record, bytes));
                    break;
                }
                Copy::Unreachable => unreachable = true,
                Copy::Corrupt => {}
            }
        }
        let Some((record, bytes)) = found else {
            if unreachable {
                return Err(DataplaneError::Peer(format!(
                    "the checkpoints of layer {layer} are held by nodes that do not answer"
                ))
                .into());
            }
            lost.push(layer);
            continue;
        };
        let range = record.layers.start as usize..record.layers.end as usize;
        let wanted: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|l| range.contains(l))
            .collect();
        done.extend(&wanted);
        // Missing layers are contiguous within a stage; import them in one piece.
        let first = wanted.iter().min().copied().unwrap_or(layer);
        let last = wanted.iter().max().copied().unwrap_or(layer);
        restored.push((
            record.step + 1,
            Piece {
                bytes,
                layers: first..last + 1,
            },
        ));
    }
    Ok((restored, lost))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(step: u64, start: u32, end: u32) -> HeldInfo {
        HeldInfo { step, start, end }
    }

    #[test]
    fn checkpoints_are_tried_newest_first() {
        use parcae_consensus::state::LayerRange;
        let record = |step, start, end| CheckpointRecord {
            step,
            epoch: 1,
            layers: LayerRange { start, end },
            holders: vec![NodeId(1)],
            digest: [0; 32],
        };
        let mut state = ControlState::default();
        state.checkpoints.insert(
            LayerRange { start: 0, end: 2 },
            vec![record(19, 0, 2), record(9, 0, 2)],
        );
        state
            .checkpoints
            .insert(LayerRange { start: 1, end: 3 }, vec![record(29, 1, 3)]);
        let steps =
            |layer| -> Vec<u64> { candidates(&state, layer).iter().map(|r| r.step).collect() };
        assert_eq!(steps(0), vec![19, 9]);
        assert_eq!(steps(1), vec![29, 19, 9]);
        assert_eq!(steps(3), Vec::<u64>::new());
    }

    #[test]
    fn fetches_spread_over_holders_and_report_the_missing() {
        let holders = [
            (NodeId(1), held(5, 0, 2)),
            (NodeId(2), held(5, 0, 2)),
            (NodeId(3), held(5, 2, 4)),
            (NodeId(4), held(4, 4, 6)),
        ];
        let (f, missing) = plan_fetches(0..6, 5, &holders, 0);
        assert_eq!(
            f,
            vec![
                Fetch {
                    from: NodeId(1),
                    layers: 0..1
                },
                Fetch {
                    from: NodeId(2),
                    layers: 1..2
                },
                Fetch {
                    from: NodeId(3),
                    layers: 2..4
                },
            ]
        );
        assert_eq!(
            missing,
            vec![4, 5],
            "a holder of another step does not count"
        );
        let (g, _) = plan_fetches(0..2, 5, &holders, 1);
        assert_eq!(g[0].from, NodeId(2), "another replica starts elsewhere");
    }
}
