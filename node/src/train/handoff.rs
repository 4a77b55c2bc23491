//! Getting the state of a new slot: which layers come from which live holder (several in
//! parallel, spread over replicas), and which must be restored from the checkpoint cut of the
//! same step because every holder is gone. Layers are never mixed across steps: when no cut of
//! the step can be read, the acquisition says so and the cluster rolls back to an older
//! complete cut (or stops, when there is none).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use parcae_consensus::state::{Cut, CutPart, MemberStatus};
use parcae_consensus::{ControlState, NodeId};
use sha2::{Digest, Sha256};

use super::error::TrainError;
use crate::dataplane::DataplaneError;
use crate::dataplane::client::{self, PeerAddr};
use crate::dataplane::protocol::HeldInfo;
use crate::dataplane::server::{Endpoint, Piece};
use crate::store::{JobStore, StoreError};

/// Layers to take from one holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// The holder.
    pub from: NodeId,
    /// Contiguous layers.
    pub layers: Range<usize>,
}

/// Chooses a live holder of step `step` of `history` for every layer of `needed`, spreading layers over the
/// holders (`spread` shifts the choice so that replicas fetching the same stage use different
/// sources), a holder of `group` wherever one holds the layer (a DiLoCo group's own state);
/// returns the fetches and the layers nobody holds.
pub fn plan_fetches(
    needed: Range<usize>,
    (history, step): (u64, u64),
    holders: &[(NodeId, HeldInfo)],
    spread: usize,
    group: &BTreeSet<NodeId>,
) -> (Vec<Fetch>, Vec<usize>) {
    let mut fetches: Vec<Fetch> = Vec::new();
    let mut missing = Vec::new();
    for layer in needed {
        let mut candidates: Vec<NodeId> = holders
            .iter()
            .filter(|(_, h)| {
                (h.history, h.step) == (history, step)
                    && (h.start as usize..h.end as usize).contains(&layer)
            })
            .map(|(n, _)| *n)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.iter().any(|c| group.contains(c)) {
            candidates.retain(|c| group.contains(c));
        }
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

/// What [`acquire`] brought: every layer of the slot at the step.
pub struct Acquired {
    /// Layers from live holders (and this node's own state).
    pub live: Vec<Piece>,
    /// Layers nobody held, restored from the checkpoint cut of the step.
    pub restored: Vec<Piece>,
    /// Bytes received from other nodes.
    pub received_bytes: u64,
    /// What was fetched from other nodes, one entry a fetch.
    pub fetched: Vec<Fetch>,
    /// Seconds the parallel fetches took.
    pub fetch_secs: f64,
}

/// Why [`acquire`] could not bring every layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// Layers with no live holder and no readable checkpoint of the step.
    pub layers: Vec<usize>,
    /// The newest complete cut before the step to roll back to, if any.
    pub roll_back_to: Option<u64>,
}

/// What an acquisition came to.
pub enum Acquisition {
    /// Every layer is here.
    Acquired(Acquired),
    /// Some layers are lost with every holder and every checkpoint of the step.
    Missing(Missing),
}

/// What restoring layers from the checkpoint cut of the step came to.
enum Restoration {
    /// The layers' state, checked against the committed digests.
    Restored(Vec<Piece>),
    /// Some layers cannot be restored.
    Missing(Missing),
}

/// Where one acquisition looks: the slot's layers at a step of the current history, and who to
/// ask.
struct Search<'a> {
    ep: &'a Endpoint,
    me: NodeId,
    needed: Range<usize>,
    /// `(history, step)`.
    at: (u64, u64),
    spread: usize,
    /// The holders of this node's group ([`plan_fetches`]).
    group: BTreeSet<NodeId>,
    /// Every other member that is not lost, with its data-plane address.
    ask: Vec<PeerAddr>,
    /// What this node holds itself.
    own: Option<HeldInfo>,
}

impl Search<'_> {
    fn holds_at(&self, h: &HeldInfo) -> bool {
        (h.history, h.step) == self.at
    }

    /// Whether this node's own state at the step covers `layers`.
    fn own_covers(&self, layers: &Range<usize>) -> bool {
        self.own.is_some_and(|h| {
            self.holds_at(&h) && h.start as usize <= layers.start && layers.end <= h.end as usize
        })
    }

    fn plan(&self, holders: &[(NodeId, HeldInfo)]) -> (Vec<Fetch>, Vec<usize>) {
        plan_fetches(
            self.needed.clone(),
            self.at,
            holders,
            self.spread,
            &self.group,
        )
    }
}

/// Brings layers `needed` at step `step` to this node: its own held state first, then live
/// holders in parallel (of its `group` where they hold a layer), then the checkpoint cut of
/// the step; or says which layers are missing.
pub async fn acquire(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    (needed, step): (Range<usize>, u64),
    (spread, group): (usize, BTreeSet<NodeId>),
) -> Result<Acquisition, TrainError> {
    let search = Search {
        ep,
        me,
        at: (state.progress.history, step),
        spread,
        group,
        ask: members_to_ask(state, me),
        own: ep.held(),
        needed,
    };
    let can_restore = cuts_for(state, step).0.is_some();
    let holders = survey(&search, can_restore).await;
    let (mut fetches, missing) = search.plan(&holders);
    // This node's own layers cost nothing: take them wherever they cover a fetch.
    for f in &mut fetches {
        if search.own_covers(&f.layers) {
            f.from = me;
        }
    }
    let mut acquired = fetch_live(&search, &fetches).await?;
    match restore(ep, state, me, &missing, step).await? {
        Restoration::Restored(pieces) => acquired.restored = pieces,
        Restoration::Missing(missing) => return Ok(Acquisition::Missing(missing)),
    }
    Ok(Acquisition::Acquired(acquired))
}

fn members_to_ask(state: &ControlState, me: NodeId) -> Vec<PeerAddr> {
    state
        .members
        .iter()
        .filter(|(id, m)| **id != me && m.status != MemberStatus::Lost)
        .filter_map(|(id, _)| client::peer_addr(state, *id).ok())
        .collect()
}

/// Pause before a member whose answer failed is asked again.
const QUERY_RETRY: Duration = Duration::from_millis(250);

/// Who holds which layers at the step: this node alone when its own state covers the slot;
/// otherwise what every member holds now. Members that hold nothing at the step yet may be
/// about to publish it (they enter the plan a moment after this node): without a checkpoint of
/// the step to restore from, layers count as missing only once those members published the
/// step, their waits ran out, or the endpoint's timeout passed. Each of them answers the moment
/// it publishes ([`client::query`] awaiting the step), so nothing is polled.
async fn survey(search: &Search<'_>, can_restore: bool) -> Vec<(NodeId, HeldInfo)> {
    let (ep, me) = (search.ep, search.me);
    if search.own_covers(&search.needed) {
        return search.own.map(|h| (me, h)).into_iter().collect();
    }
    let settle_by = tokio::time::Instant::now() + ep.timeout;
    let mut holders: Vec<(NodeId, HeldInfo)> = search.own.map(|h| (me, h)).into_iter().collect();
    let answers = join_all(search.ask.iter().map(|p| client::query(ep, p, None))).await;
    let mut unsettled = Vec::new();
    for (peer, answer) in search.ask.iter().zip(answers) {
        match answer {
            Ok(Some(h)) => {
                if !search.holds_at(&h) {
                    unsettled.push(*peer);
                }
                holders.push((peer.node, h));
            }
            Ok(None) => unsettled.push(*peer),
            Err(e) => {
                unsettled.push(*peer);
                tracing::debug!(node = %peer.node, "state query failed: {e}");
            }
        }
    }
    if search.plan(&holders).1.is_empty() || unsettled.is_empty() || can_restore {
        return holders;
    }
    let awaiting = Some(search.at);
    let ask = |peer: PeerAddr, pause: Duration| async move {
        tokio::time::sleep(pause).await;
        (peer, client::query(ep, &peer, awaiting).await)
    };
    let mut waiting: FuturesUnordered<_> = unsettled
        .into_iter()
        .map(|peer| ask(peer, Duration::ZERO))
        .collect();
    while let Ok(Some((peer, answer))) = tokio::time::timeout_at(settle_by, waiting.next()).await {
        match answer {
            Ok(Some(h)) => {
                holders.retain(|(n, _)| *n != peer.node);
                holders.push((peer.node, h));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(node = %peer.node, "state query failed: {e}");
                waiting.push(ask(peer, QUERY_RETRY));
            }
        }
        if search.plan(&holders).1.is_empty() {
            break;
        }
    }
    holders
}

/// Fetches the layers `fetches` assigns to other nodes, in parallel, and takes those it
/// assigns to this node from its own held state.
async fn fetch_live(search: &Search<'_>, fetches: &[Fetch]) -> Result<Acquired, TrainError> {
    let (ep, me) = (search.ep, search.me);
    let (history, step) = search.at;
    let by_addr: BTreeMap<NodeId, PeerAddr> = search.ask.iter().map(|p| (p.node, *p)).collect();
    let fetched: Vec<Fetch> = fetches.iter().filter(|f| f.from != me).cloned().collect();
    let remote = fetched.iter().map(|f| async {
        let peer = by_addr
            .get(&f.from)
            .ok_or_else(|| DataplaneError::Peer(format!("{} has no address", f.from)))?;
        let bufs = client::fetch(ep, peer, history, step, f.layers.clone()).await?;
        Ok::<_, TrainError>((f.layers.clone(), bufs))
    });
    let started = std::time::Instant::now();
    let answers = join_all(remote).await;
    let fetch_secs = started.elapsed().as_secs_f64();
    let mut live = Vec::new();
    let mut received_bytes = 0u64;
    for got in answers {
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
    live.extend(local.flat_map(|f| ep.held_layers(history, step, f.layers.clone())));
    Ok(Acquired {
        live,
        restored: Vec::new(),
        received_bytes,
        fetched,
        fetch_secs,
    })
}

/// The complete cut that holds the state entering step `step` (the end of step `step - 1`),
/// and the newest complete cut before it (a rollback target).
pub fn cuts_for(state: &ControlState, step: u64) -> (Option<&Cut>, Option<&Cut>) {
    let mut complete = state.checkpoints.values().rev().filter(|c| c.is_complete());
    let exact = complete.clone().find(|c| c.steps_trained() == step);
    let older = complete.find(|c| c.steps_trained() < step);
    (exact, older)
}

/// How often a holder that does not answer is asked for its copy, and the pause between.
const CHECKPOINT_ATTEMPTS: usize = 2;
const CHECKPOINT_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// What asking for one checkpoint part yielded.
enum CheckpointCopy {
    /// Bytes whose SHA-256 is the digest committed in raft.
    Verified(Vec<u8>),
    /// Every holder answered, none with the committed bytes.
    Corrupt,
    /// Some holder did not answer (a node restarting, a partition): the checkpoint may well
    /// exist.
    Unreachable,
}

/// The bytes of `part` (of the cut of `steps` steps) from its holders, checked against its
/// committed digest; a holder that does not answer is asked again before the next one is.
/// Holders the membership counts as lost or gone are skipped: their copies went with them.
/// The job's durable store is asked last (peers' disks are the fast tier).
async fn fetch_verified(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    steps: u64,
    part: &CutPart,
) -> CheckpointCopy {
    let present = |holder: &NodeId| {
        *holder == me
            || state
                .members
                .get(holder)
                .is_some_and(|m| m.status != MemberStatus::Lost)
    };
    let mut unreachable = false;
    for holder in part.holders.iter().filter(|h| present(h)) {
        match from_holder(ep, state, me, *holder, steps, part).await {
            CheckpointCopy::Verified(bytes) => return CheckpointCopy::Verified(bytes),
            CheckpointCopy::Unreachable => unreachable = true,
            CheckpointCopy::Corrupt => {}
        }
    }
    if let (true, Some(store)) = (part.stored, &ep.store) {
        match from_store(ep, store, steps, part).await {
            CheckpointCopy::Verified(bytes) => return CheckpointCopy::Verified(bytes),
            CheckpointCopy::Unreachable => unreachable = true,
            CheckpointCopy::Corrupt => {}
        }
    }
    if unreachable {
        CheckpointCopy::Unreachable
    } else {
        CheckpointCopy::Corrupt
    }
}

/// `holder`'s copy of `part` (this node's own disk when it is the holder), asked again once
/// when the holder does not answer.
async fn from_holder(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    holder: NodeId,
    steps: u64,
    part: &CutPart,
) -> CheckpointCopy {
    let range = part.layers.start as usize..part.layers.end as usize;
    for attempt in 0..CHECKPOINT_ATTEMPTS {
        let got = if holder == me {
            ep.checkpoints
                .load(steps, &range)
                .map_err(DataplaneError::from)
        } else {
            match client::peer_addr(state, holder) {
                Ok(peer) => client::fetch_checkpoint(ep, &peer, steps, range.clone()).await,
                Err(e) => {
                    tracing::warn!(%holder, layers = ?range, steps, "checkpoint holder not reachable: {e}");
                    return CheckpointCopy::Unreachable;
                }
            }
        };
        match got {
            Ok(bytes) if Sha256::digest(&bytes).as_slice() == part.digest => {
                return CheckpointCopy::Verified(bytes);
            }
            Ok(_) => {
                tracing::error!(%holder, layers = ?range, steps, "a checkpoint copy does not match the digest committed in raft");
                return CheckpointCopy::Corrupt;
            }
            // The holder answered, or this node looked: the copy is not there (its disk was
            // wiped, or the file damaged beyond reading). Asking again changes nothing.
            Err(e @ (DataplaneError::Peer(_) | DataplaneError::Checkpoint(_))) => {
                tracing::error!(%holder, layers = ?range, steps, "the holder has no readable copy of the checkpoint: {e}");
                return CheckpointCopy::Corrupt;
            }
            Err(e) => {
                tracing::warn!(%holder, layers = ?range, steps, attempt, "checkpoint fetch failed: {e}");
                if attempt + 1 < CHECKPOINT_ATTEMPTS {
                    tokio::time::sleep(CHECKPOINT_RETRY).await;
                }
            }
        }
    }
    CheckpointCopy::Unreachable
}

/// The job's durable store's copy of `part`.
async fn from_store(ep: &Endpoint, store: &JobStore, steps: u64, part: &CutPart) -> CheckpointCopy {
    let range = part.layers.start..part.layers.end;
    match store.get_part(steps, part, ep.max_state_bytes).await {
        Ok(bytes) if Sha256::digest(&bytes).as_slice() == part.digest => {
            CheckpointCopy::Verified(bytes)
        }
        Ok(_) => {
            tracing::error!(layers = ?range, steps, "the stored checkpoint does not match the digest committed in raft");
            CheckpointCopy::Corrupt
        }
        Err(StoreError::Store {
            source: object_store::Error::NotFound { .. },
            ..
        }) => {
            tracing::error!(layers = ?range, steps, "the stored checkpoint is missing from the store");
            CheckpointCopy::Corrupt
        }
        Err(e) => {
            tracing::warn!(layers = ?range, steps, "checkpoint store read failed: {e}");
            CheckpointCopy::Unreachable
        }
    }
}

/// Restores `missing` layers from the complete cut holding the state entering `step`, every
/// part's bytes checked against the digest committed in raft. Without such a cut, or when every
/// copy of a part is corrupt, the layers are [`Missing`] (the cluster rolls back to the newest
/// older complete cut); when a part's holders did not answer, the acquisition fails and is
/// retried (an unreachable holder is not a lost checkpoint).
async fn restore(
    ep: &Endpoint,
    state: &ControlState,
    me: NodeId,
    missing: &[usize],
    step: u64,
) -> Result<Restoration, TrainError> {
    if missing.is_empty() {
        return Ok(Restoration::Restored(Vec::new()));
    }
    let (exact, older) = cuts_for(state, step);
    let not_restored = || Missing {
        layers: missing.to_vec(),
        roll_back_to: older.map(|c| c.end.step),
    };
    let Some(cut) = exact else {
        return Ok(Restoration::Missing(not_restored()));
    };
    let mut restored = Vec::new();
    for part in &cut.parts {
        let range = part.layers.start as usize..part.layers.end as usize;
        let wanted: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|l| range.contains(l))
            .collect();
        let (Some(first), Some(last)) = (wanted.iter().min(), wanted.iter().max()) else {
            continue;
        };
        match fetch_verified(ep, state, me, step, part).await {
            CheckpointCopy::Verified(bytes) => restored.push(Piece {
                bytes,
                layers: *first..last + 1,
            }),
            CheckpointCopy::Corrupt => return Ok(Restoration::Missing(not_restored())),
            CheckpointCopy::Unreachable => {
                return Err(DataplaneError::Peer(format!(
                    "the checkpoint of layers {range:?} after {step} steps is held by nodes that do not answer"
                ))
                .into());
            }
        }
    }
    Ok(Restoration::Restored(restored))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(step: u64, start: u32, end: u32) -> HeldInfo {
        HeldInfo {
            history: 0,
            step,
            start,
            end,
        }
    }

    #[test]
    fn the_cut_of_the_step_restores_and_an_older_complete_one_is_the_rollback_target() {
        use parcae_consensus::state::{LayerRange, OptimizerScalars, StepEnd};
        let cut = |step, parts: &[(u32, u32)]| Cut {
            end: StepEnd {
                step,
                epoch: 1,
                sample_cursor: 8 * (step + 1),
                optimizer: OptimizerScalars::default(),
            },
            history: 0,
            layers: 4,
            parts: parts
                .iter()
                .map(|&(start, end)| CutPart {
                    layers: LayerRange { start, end },
                    holders: vec![NodeId(1)],
                    digest: [0; 32],
                    stored: false,
                })
                .collect(),
            groups: Vec::new(),
        };
        let mut state = ControlState::default();
        for c in [
            cut(4, &[(0, 2), (2, 4)]),
            cut(9, &[(0, 2), (2, 4)]),
            cut(14, &[(0, 2)]),
        ] {
            state.checkpoints.insert(c.end.step, c);
        }
        let steps = |step| {
            let (exact, older) = cuts_for(&state, step);
            (exact.map(|c| c.end.step), older.map(|c| c.end.step))
        };
        assert_eq!(steps(10), (Some(9), Some(4)));
        assert_eq!(steps(12), (None, Some(9)));
        assert_eq!(
            steps(15),
            (None, Some(9)),
            "the incomplete cut is no target"
        );
        assert_eq!(steps(5), (Some(4), None));
        assert_eq!(steps(3), (None, None));
    }

    #[test]
    fn fetches_spread_over_holders_and_report_the_missing() {
        let holders = [
            (NodeId(1), held(5, 0, 2)),
            (NodeId(2), held(5, 0, 2)),
            (NodeId(3), held(5, 2, 4)),
            (NodeId(4), held(4, 4, 6)),
        ];
        let none = BTreeSet::new();
        let (f, missing) = plan_fetches(0..6, (0, 5), &holders, 0, &none);
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
        let (g, _) = plan_fetches(0..2, (0, 5), &holders, 1, &none);
        let (_, all) = plan_fetches(0..2, (1, 5), &holders, 0, &none);
        assert_eq!(all, vec![0, 1], "a state of another history does not count");
        assert_eq!(g[0].from, NodeId(2), "another replica starts elsewhere");
        // A DiLoCo group takes its own state where it holds it, another's where not.
        let group = BTreeSet::from([NodeId(2), NodeId(4)]);
        let (f, _) = plan_fetches(0..4, (0, 5), &holders, 0, &group);
        let from: Vec<(NodeId, Range<usize>)> = f.into_iter().map(|f| (f.from, f.layers)).collect();
        assert_eq!(from, vec![(NodeId(2), 0..2), (NodeId(3), 2..4)]);
    }
}
