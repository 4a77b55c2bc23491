//! The node's data-plane endpoint: accepts authenticated connections from cluster members and
//! either hands them to the trainer (pipeline and ring links of a plan) or serves them here
//! (state queries, layer fetches, checkpoint storage), concurrently with training.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use libp2p::identity::Keypair;
use parcae_consensus::ControlState;
use parcae_consensus::NodeId;
use parcae_consensus::state::{Digest32, StageSlot};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};

use super::DataplaneError;
use super::limits::{
    MAX_CONNECTIONS, MAX_EPOCHS_AHEAD, MAX_PARKED, MAX_PER_PEER, PeerSlots, expire_parked,
};
use super::protocol::{self, HeldInfo, LinkKind, MAX_CONTROL, Reply, Request};
use crate::checkpoint::CheckpointStore;
use crate::dataplane::{self, SecureStream};
use crate::keyring::KeyRing;
use crate::store::JobStore;

/// How long an inbound connection from a peer this node does not know as a member waits for
/// its `Join` to be applied here before it is refused.
const ADMIT_WAIT: Duration = Duration::from_secs(2);

/// Stage state this node can hand to others: layer `start + i` is `layers[i]`, each a
/// self-contained state buffer after `step` optimizer steps.
#[derive(Debug)]
pub struct Held {
    /// The training history the state belongs to: after a rollback, a step number names
    /// another state than before it.
    pub history: u64,
    /// Optimizer steps taken.
    pub step: u64,
    /// First layer.
    pub start: usize,
    /// One buffer per layer.
    pub layers: Vec<Vec<u8>>,
}

impl Held {
    fn info(&self) -> HeldInfo {
        HeldInfo {
            history: self.history,
            step: self.step,
            start: self.start as u32,
            end: (self.start + self.layers.len()) as u32,
        }
    }
}

/// A state buffer and the layers to import from it.
pub struct Piece {
    /// The buffer (a `parcae-model` state with per-layer CRCs).
    pub bytes: Vec<u8>,
    /// Layers to take from it.
    pub layers: Range<usize>,
}

/// A link waiting for the trainer, keyed by epoch, kind and the opener's slot.
type LinkKey = (u64, LinkKind, StageSlot);
/// A link a peer opened, waiting for the trainer: who opened it, and the channel.
type Parked = (PeerId, SecureStream);

/// What the server and the trainer share.
pub struct Endpoint {
    /// This node's identity (signs the handshake).
    pub keypair: Keypair,
    /// The cluster keys (admission), read at each handshake.
    pub keys: KeyRing,
    /// The replicated state as last applied here.
    pub view: watch::Receiver<Arc<ControlState>>,
    /// Checkpoints on this node's disk.
    pub checkpoints: CheckpointStore,
    /// The job's durable checkpoint store, if any.
    pub store: Option<JobStore>,
    /// Largest state message accepted (one layer or one checkpoint), bytes.
    pub max_state_bytes: u64,
    /// How long a request may wait for state that is about to be exported.
    pub timeout: Duration,
    held: watch::Sender<Option<Arc<Held>>>,
    /// Links opened by peers, waiting for the trainer: when each was parked, by whom.
    inbox: Mutex<BTreeMap<LinkKey, (Instant, Parked)>>,
    arrived: Notify,
    /// Connections per peer.
    slots: PeerSlots,
}

impl Endpoint {
    /// An endpoint with nothing held and no links waiting.
    pub fn new(
        keypair: Keypair,
        keys: KeyRing,
        view: watch::Receiver<Arc<ControlState>>,
        checkpoints: CheckpointStore,
        max_state_bytes: u64,
        timeout: Duration,
    ) -> Self {
        Self {
            keypair,
            keys,
            view,
            checkpoints,
            store: None,
            max_state_bytes,
            timeout,
            held: watch::channel(None).0,
            inbox: Mutex::new(BTreeMap::new()),
            arrived: Notify::new(),
            slots: PeerSlots::default(),
        }
    }

    /// The endpoint with the job's durable checkpoint store.
    pub fn with_store(mut self, store: JobStore) -> Self {
        self.store = Some(store);
        self
    }

    /// Publishes the state other nodes may fetch (replacing the previous one).
    pub fn hold(&self, held: Option<Held>) {
        self.held.send_replace(held.map(Arc::new));
    }

    /// What is held now.
    pub fn held(&self) -> Option<HeldInfo> {
        self.held.borrow().as_ref().map(|h| h.info())
    }

    /// Copies of held layers `layers` if the held state is at `step` of `history` and covers
    /// them.
    pub fn held_layers(&self, history: u64, step: u64, layers: Range<usize>) -> Vec<Piece> {
        let held = self.held.borrow();
        let Some(h) = held
            .as_ref()
            .filter(|h| (h.history, h.step) == (history, step))
        else {
            return Vec::new();
        };
        layers
            .filter_map(|l| {
                let bytes = h.layers.get(l.checked_sub(h.start)?)?.clone();
                Some(Piece {
                    bytes,
                    layers: l..l + 1,
                })
            })
            .collect()
    }

    /// Refuses links of epochs older than the plan in force, and links whose opener is not the
    /// node the plan (when this node knows it already) puts at `from`.
    fn check_link(&self, epoch: u64, from: StageSlot, peer: &PeerId) -> Result<(), String> {
        let view = self.view.borrow();
        let current = view.plan.as_ref().map_or(0, |p| p.epoch);
        if epoch < current {
            return Err(format!("stale epoch {epoch} (current {current})"));
        }
        if epoch > current + MAX_EPOCHS_AHEAD {
            return Err(format!(
                "epoch {epoch} is too far ahead (current {current})"
            ));
        }
        let plan = [view.plan.as_ref(), view.pending_plan.as_ref()]
            .into_iter()
            .flatten()
            .find(|p| p.epoch == epoch);
        if let Some(plan) = plan {
            let id = NodeId::from_peer_bytes(&peer.to_bytes());
            if plan.assignment.get(&id) != Some(&from) {
                return Err(format!(
                    "the plan of epoch {epoch} does not put it at {from:?}"
                ));
            }
        }
        Ok(())
    }

    /// Whether `peer` is a member, waiting up to [`ADMIT_WAIT`] for its `Join` to be applied
    /// here: a peer that applied a plan before this node did may dial before this node knows
    /// it. 32 nodes starting together did, and each refusal abandoned a step on both sides.
    async fn admits(&self, peer: &PeerId) -> bool {
        let id = NodeId::from_peer_bytes(&peer.to_bytes());
        let mut view = self.view.clone();
        let member = view.wait_for(|s| s.members.contains_key(&id));
        matches!(tokio::time::timeout(ADMIT_WAIT, member).await, Ok(Ok(_)))
    }

    /// Waits for the link `key` opened by `expected`; links of older epochs are dropped.
    pub async fn take_link(
        &self,
        key: LinkKey,
        expected: PeerId,
    ) -> Result<SecureStream, DataplaneError> {
        let wait = async {
            loop {
                let notified = self.arrived.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
                    expire_parked(&mut inbox, |k| k.0, key.0, Instant::now());
                    if let Some((_, (peer, stream))) = inbox.remove(&key) {
                        if peer == expected {
                            return Ok(stream);
                        }
                        tracing::error!(%peer, ?key, "link opened by a node not assigned that slot");
                    }
                }
                notified.await;
            }
        };
        tokio::time::timeout(self.timeout, wait)
            .await
            .map_err(|_| DataplaneError::Timeout(format!("{:?} link from {:?}", key.1, key.2)))?
    }

    /// The held state once it is at `step` of `history` or later, waiting at most the
    /// endpoint's timeout; `None` when it is not there by then.
    async fn held_from(&self, history: u64, step: u64) -> Option<Arc<Held>> {
        let mut rx = self.held.subscribe();
        let wait = rx.wait_for(|h| {
            h.as_ref()
                .is_some_and(|h| (h.history, h.step) >= (history, step))
        });
        let got = tokio::time::timeout(self.timeout, wait).await.ok()?.ok()?;
        got.clone()
    }

    /// The held state at exactly `step` of `history`, waiting for it as [`Self::held_from`].
    async fn held_at(&self, history: u64, step: u64) -> Option<Arc<Held>> {
        self.held_from(history, step)
            .await
            .filter(|h| (h.history, h.step) == (history, step))
    }
}

/// Accepts connections until the listener fails: at most [`MAX_CONNECTIONS`] at once (more are
/// closed at accept).
pub async fn serve(listener: TcpListener, endpoint: Arc<Endpoint>) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (socket, addr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("data plane accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(%addr, "data plane connection refused: {MAX_CONNECTIONS} open");
            continue;
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(socket, &endpoint).await {
                tracing::warn!(%addr, "data plane connection: {e}");
            }
            drop(permit);
        });
    }
}

async fn handle(socket: tokio::net::TcpStream, ep: &Endpoint) -> Result<(), DataplaneError> {
    let (peer, mut stream) = tokio::time::timeout(
        ep.timeout,
        dataplane::accept(socket, &ep.keypair, &ep.keys.keys(), |p| async move {
            ep.admits(&p).await
        }),
    )
    .await
    .map_err(|_| DataplaneError::Timeout("data plane handshake".into()))??;
    let Some(_slot) = ep.slots.acquire(peer) else {
        return Err(DataplaneError::Peer(format!(
            "{peer} holds {MAX_PER_PEER} connections already"
        )));
    };
    let first = tokio::time::timeout(ep.timeout, stream.recv(MAX_CONTROL as u64))
        .await
        .map_err(|_| DataplaneError::Timeout("the first request after the handshake".into()))??;
    match protocol::decode(&first)? {
        Request::Link { epoch, kind, from } => park_link(ep, peer, stream, (epoch, kind, from)),
        Request::Query { awaiting } => {
            if let Some((history, step)) = awaiting {
                ep.held_from(history, step).await;
            }
            reply(&mut stream, &Reply::Held(ep.held())).await
        }
        Request::Fetch {
            history,
            step,
            start,
            end,
        } => send_held(ep, &mut stream, (history, step), start..end).await,
        Request::FetchCheckpoint { steps, start, end } => {
            let store = ep.checkpoints.clone();
            let layers = start as usize..end as usize;
            match on_blocking_pool(move || Ok(store.load(steps, &layers)?)).await {
                Ok(bytes) => {
                    reply(&mut stream, &Reply::Sending { layers: 1 }).await?;
                    stream.send(&bytes).await?;
                    Ok(())
                }
                Err(e) => reply(&mut stream, &Reply::Refused(e.to_string())).await,
            }
        }
        Request::PutCheckpoint {
            steps,
            start,
            end,
            digest,
        } => store_checkpoint(ep, peer, &mut stream, (steps, start..end), digest).await,
    }
}

/// Parks a link `key` opened by `peer` for the trainer, if the plan lets `peer` open it.
fn park_link(
    ep: &Endpoint,
    peer: PeerId,
    stream: SecureStream,
    key: LinkKey,
) -> Result<(), DataplaneError> {
    let (epoch, _, from) = key;
    if let Err(why) = ep.check_link(epoch, from, &peer) {
        tracing::error!(%peer, epoch, ?from, "link refused: {why}");
        return Err(DataplaneError::Peer(why));
    }
    let current = ep.view.borrow().plan.as_ref().map_or(0, |p| p.epoch);
    let mut inbox = ep.inbox.lock().unwrap_or_else(|p| p.into_inner());
    expire_parked(&mut inbox, |k| k.0, current, Instant::now());
    if inbox.len() >= MAX_PARKED {
        return Err(DataplaneError::Peer(format!(
            "{MAX_PARKED} links parked already"
        )));
    }
    inbox.insert(key, (Instant::now(), (peer, stream)));
    drop(inbox);
    ep.arrived.notify_waiters();
    Ok(())
}

/// Sends the held state of `layers` at `(history, step)`, one layer per message, waiting for
/// it as [`Endpoint::held_at`] does; refuses what is not held.
async fn send_held(
    ep: &Endpoint,
    stream: &mut SecureStream,
    (history, step): (u64, u64),
    layers: Range<u32>,
) -> Result<(), DataplaneError> {
    let (start, end) = (layers.start, layers.end);
    let Some(held) = ep.held_at(history, step).await else {
        let why = format!("no state of step {step} in history {history}");
        return reply(stream, &Reply::Refused(why)).await;
    };
    let info = held.info();
    if start >= end || start < info.start || end > info.end {
        let why = format!(
            "layers {start}..{end} not held (holding {}..{})",
            info.start, info.end
        );
        return reply(stream, &Reply::Refused(why)).await;
    }
    reply(
        stream,
        &Reply::Sending {
            layers: end - start,
        },
    )
    .await?;
    let from = (start - info.start) as usize;
    for layer in &held.layers[from..from + (end - start) as usize] {
        stream.send(layer).await?;
    }
    Ok(())
}

/// Stores the checkpoint `peer` sends of `layers` after `steps` steps, if the plan makes it
/// that stage's first replica and the bytes are what `digest` says.
async fn store_checkpoint(
    ep: &Endpoint,
    peer: PeerId,
    stream: &mut SecureStream,
    (steps, layers): (u64, Range<u32>),
    digest: Digest32,
) -> Result<(), DataplaneError> {
    let sender = NodeId::from_peer_bytes(&peer.to_bytes());
    let (start, end) = (layers.start, layers.end);
    let layers = start as usize..end as usize;
    let admissible = crate::checkpoint::may_store(&ep.view.borrow(), sender, steps, &layers);
    if let Err(why) = admissible {
        tracing::warn!(%peer, steps, "checkpoint refused: {why}");
        return reply(stream, &Reply::Refused(why)).await;
    }
    let registered = crate::checkpoint::registered_steps(&ep.view.borrow(), &layers);
    let bytes = stream.recv(ep.max_state_bytes).await?;
    let store = ep.checkpoints.clone();
    let stored = on_blocking_pool(move || {
        let got: [u8; 32] = Sha256::digest(&bytes).into();
        if got != digest || start >= end {
            return Ok(false);
        }
        store.save(steps, &layers, &bytes, &registered)?;
        Ok(true)
    })
    .await?;
    if !stored {
        tracing::error!(%peer, steps, "checkpoint with a bad digest or range refused");
        return reply(stream, &Reply::Refused("bad digest or range".into())).await;
    }
    reply(stream, &Reply::Stored).await
}

/// Runs disk work and whole-state hashing off the data plane's one worker thread, so that a
/// checkpoint copy never stalls the links and fetches of training.
async fn on_blocking_pool<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, DataplaneError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| DataplaneError::Task(format!("checkpoint task: {e}")))?
}

async fn reply(stream: &mut SecureStream, r: &Reply) -> Result<(), DataplaneError> {
    stream.send(&protocol::encode(r)?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ClusterKey;
    use parcae_consensus::Command;
    use parcae_consensus::state::PeerInfo;

    #[tokio::test]
    async fn a_peer_is_admitted_once_its_join_is_applied_here_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(Arc::new(ControlState::default()));
        let ep = Endpoint::new(
            Keypair::generate_ed25519(),
            ClusterKey::generate().into(),
            rx,
            CheckpointStore::new(dir.path().to_path_buf()),
            1 << 20,
            Duration::from_secs(5),
        );
        let late = Keypair::generate_ed25519().public().to_peer_id();
        let stranger = Keypair::generate_ed25519().public().to_peer_id();
        let join = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut state = ControlState::default();
            let command = Command::Join {
                node: NodeId::from_peer_bytes(&late.to_bytes()),
                peer: PeerInfo {
                    peer_id: late.to_bytes(),
                    ..PeerInfo::default()
                },
            };
            state.apply(&command).unwrap();
            tx.send(Arc::new(state)).unwrap();
            tx
        });
        let started = std::time::Instant::now();
        assert!(ep.admits(&late).await, "admitted when its join arrives");
        assert!(started.elapsed() >= Duration::from_millis(250));
        let _tx = join.await.unwrap();
        let started = std::time::Instant::now();
        assert!(!ep.admits(&stranger).await, "never a member");
        assert!(started.elapsed() >= ADMIT_WAIT);
    }
}
