//! Control frames (raft messages, forwarded proposals) over one long-lived libp2p stream per
//! peer and direction.
//!
//! Why not a request-response exchange per frame: each one opened a substream, negotiated its
//! protocol, sent the frame, waited for a one-byte acknowledgement and closed both halves, about
//! ten yamux frames and as many encrypted writes for one raft message. At 32 nodes that was half
//! of every node's network thread. Raft needs neither the acknowledgement nor a stream per
//! message (it tolerates lost messages and sends again), and one stream keeps a peer's frames in
//! order. A writer that cannot open its stream or finish a write within the timeout drops the
//! stream and the frames in hand, reports the peer unreachable (as a failed request did), and
//! opens a new stream for the next frame.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix::prelude::*;
use futures::channel::mpsc;
use futures::{AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream};
use libp2p_stream::{Control, IncomingStreams};
use tokio::task::JoinHandle;

use super::codec::{CONTROL_PROTOCOL, Inbound, read_frame, write_frame};
use super::messages::NetEvent;
use crate::metrics::Metrics;

/// Frames waiting for one peer's stream (raft keeps up to 256 appends in flight to a follower,
/// beside its heartbeats); a frame past this is dropped as not delivered (raft sends again).
const QUEUE: usize = 1024;
/// Bytes waiting for one peer's stream, so that a peer that stops reading holds at most this
/// much of our memory; a frame always fits in an empty queue.
const QUEUED_BYTES: usize = 32 << 20;

/// A frame over the size limit announced on a peer's control stream: the peer is to be
/// disconnected (its stream was dropped unread).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct OversizedFrame {
    /// The sender.
    pub from: PeerId,
    /// The length it announced.
    pub len: u32,
}

/// Whether a frame of `len` bytes may join `queued` bytes waiting for a peer.
fn admits(queued: usize, len: usize) -> bool {
    queued == 0 || queued + len <= QUEUED_BYTES
}

/// Bounds of the control streams.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Largest frame, bytes.
    pub max_frame: u32,
    /// Time allowed to open a stream, or to write and flush the frames in hand.
    pub timeout: Duration,
}

/// Where undelivered frames are reported.
#[derive(Clone)]
struct Failures {
    events: Recipient<NetEvent>,
    metrics: Arc<Metrics>,
}

impl Failures {
    fn report(&self, peer: PeerId, frames: usize, why: &dyn std::fmt::Display) {
        self.metrics
            .control_send_failures_total
            .inc_by(frames as u64);
        tracing::debug!(%peer, frames, "control frames not delivered: {why}");
        self.events.do_send(NetEvent::SendFailed(peer));
    }
}

/// The sending side: a queue and a writer task per connected peer.
pub struct Senders {
    control: Control,
    limits: StreamLimits,
    queues: HashMap<PeerId, Queue>,
    failures: Failures,
}

/// One peer's frames on their way to its writer, and their bytes.
struct Queue {
    frames: mpsc::Sender<Vec<u8>>,
    bytes: Arc<AtomicUsize>,
}

impl Senders {
    /// Senders that open their streams through `control`.
    pub fn new(
        control: Control,
        limits: StreamLimits,
        events: Recipient<NetEvent>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            control,
            limits,
            queues: HashMap::new(),
            failures: Failures { events, metrics },
        }
    }

    /// Queues `frame` for `to`, starting its writer on the current arbiter if it has none;
    /// a frame that cannot be queued (over the size limit, a full queue) is reported as not
    /// delivered at once.
    pub fn send(&mut self, to: PeerId, frame: Vec<u8>) {
        if frame.len() > self.limits.max_frame as usize {
            let why = format!("a frame of {} bytes is over the limit", frame.len());
            self.failures.report(to, 1, &why);
            return;
        }
        let queue = self.queues.entry(to).or_insert_with(|| {
            let (queue, frames) = mpsc::channel(QUEUE);
            let bytes = Arc::new(AtomicUsize::new(0));
            let writer = Writer {
                control: self.control.clone(),
                peer: to,
                limits: self.limits,
                failures: self.failures.clone(),
                queued: bytes.clone(),
            };
            actix::spawn(writer.run(frames));
            Queue {
                frames: queue,
                bytes,
            }
        });
        let (len, queued) = (frame.len(), queue.bytes.load(Ordering::Relaxed));
        if !admits(queued, len) {
            let why = format!("{queued} bytes already wait for the peer");
            self.failures.report(to, 1, &why);
            return;
        }
        queue.bytes.fetch_add(len, Ordering::Relaxed);
        if let Err(e) = queue.frames.try_send(frame) {
            queue.bytes.fetch_sub(len, Ordering::Relaxed);
            self.failures.report(to, 1, &e);
        }
    }

    /// Drops `peer`'s queue (its last connection closed); its writer ends.
    pub fn forget(&mut self, peer: &PeerId) {
        self.queues.remove(peer);
    }
}

/// One peer's writer.
struct Writer {
    control: Control,
    peer: PeerId,
    limits: StreamLimits,
    failures: Failures,
    /// Bytes in the queue, taken off as frames leave it.
    queued: Arc<AtomicUsize>,
}

impl Writer {
    /// Writes the queued frames until the queue is dropped, all that is waiting in one flush.
    async fn run(mut self, mut frames: mpsc::Receiver<Vec<u8>>) {
        let mut stream: Option<Stream> = None;
        while let Some(first) = frames.next().await {
            let mut batch = vec![first];
            while let Ok(frame) = frames.try_recv() {
                batch.push(frame);
            }
            let taken = batch.iter().map(Vec::len).sum();
            self.queued.fetch_sub(taken, Ordering::Relaxed);
            let written =
                tokio::time::timeout(self.limits.timeout, self.write(&mut stream, &batch)).await;
            let failure = match written {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("not written within {:?}", self.limits.timeout),
            };
            stream = None;
            self.failures.report(self.peer, batch.len(), &failure);
        }
    }

    async fn write(&mut self, stream: &mut Option<Stream>, batch: &[Vec<u8>]) -> io::Result<()> {
        let stream = match stream {
            Some(stream) => stream,
            None => stream.insert(
                self.control
                    .open_stream(self.peer, CONTROL_PROTOCOL)
                    .await
                    .map_err(io::Error::other)?,
            ),
        };
        for frame in batch {
            write_frame(stream, frame, self.limits.max_frame).await?;
        }
        stream.flush().await
    }
}

/// Where inbound frames go: frames to the node, oversized announcements to the network actor.
pub struct Readers {
    /// The node.
    pub events: Recipient<NetEvent>,
    /// The network actor, which disconnects a peer that announced an oversized frame.
    pub oversized: Recipient<OversizedFrame>,
    /// Counts the frames received.
    pub metrics: Arc<Metrics>,
    /// Largest frame, bytes.
    pub max_frame: u32,
}

impl Readers {
    /// Reads the peers' control streams for as long as the node runs: one reader per peer, a
    /// newer stream replacing an older one (a peer's writer opens a new stream only when it
    /// gave up its last), so a peer holds one reader however many streams it opens.
    pub async fn accept(self, mut incoming: IncomingStreams) {
        let this = Arc::new(self);
        let mut readers: HashMap<PeerId, JoinHandle<()>> = HashMap::new();
        while let Some((peer, stream)) = incoming.next().await {
            this.metrics.control_streams_in_total.inc();
            readers.retain(|_, reader| !reader.is_finished());
            let reader = actix::spawn(this.clone().read(peer, stream));
            if let Some(older) = readers.insert(peer, reader) {
                older.abort();
            }
        }
    }

    async fn read(self: Arc<Self>, peer: PeerId, mut stream: Stream) {
        loop {
            match read_frame(&mut stream, self.max_frame).await {
                Ok(Inbound::Frame(frame)) => {
                    self.metrics.control_frames_in_total.inc();
                    self.events.do_send(NetEvent::Control { from: peer, frame });
                }
                Ok(Inbound::Oversized { len }) => {
                    self.oversized.do_send(OversizedFrame { from: peer, len });
                    return;
                }
                Err(e) => {
                    tracing::debug!(%peer, "control stream ended: {e}");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
    use libp2p::identity::Keypair;

    use super::*;
    use crate::key::ClusterKey;
    use crate::net::actor::Network;
    use crate::net::messages::{KeepConnected, SendControl};
    use crate::net::seed_dialer::SeedSource;
    use crate::net::swarm::{NetLimits, build_swarm};

    /// Hands a network's events to the test.
    struct Inbox(UnboundedSender<NetEvent>);

    impl Actor for Inbox {
        type Context = Context<Self>;
    }

    impl Handler<NetEvent> for Inbox {
        type Result = ();

        fn handle(&mut self, event: NetEvent, _: &mut Context<Self>) {
            let _ = self.0.unbounded_send(event);
        }
    }

    /// A network actor on a fresh swarm listening on 127.0.0.1: its address, peer id, events
    /// and metrics.
    fn start(
        key: &ClusterKey,
    ) -> (
        Addr<Network>,
        PeerId,
        UnboundedReceiver<NetEvent>,
        Arc<Metrics>,
    ) {
        let limits = NetLimits::default();
        let keypair = Keypair::generate_ed25519();
        let peer = keypair.public().to_peer_id();
        let swarm = build_swarm(keypair, key.clone().into(), &limits).unwrap();
        let (events, inbox) = unbounded();
        let metrics = Arc::new(Metrics::default());
        let listen = vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()];
        let seeds = SeedSource {
            seeds: Vec::new(),
            file: None,
        };
        let events = Inbox(events).start().recipient();
        let net = Network::new(swarm, listen, seeds, events, metrics.clone(), &limits).start();
        (net, peer, inbox, metrics)
    }

    /// The first event `pick` takes, within 10 s (else a panic naming `what`).
    async fn next<T>(
        what: &str,
        events: &mut UnboundedReceiver<NetEvent>,
        mut pick: impl FnMut(NetEvent) -> Option<T>,
    ) -> T {
        let wait = async {
            loop {
                let event = events.next().await.expect("the network is running");
                if let Some(found) = pick(event) {
                    return found;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("{what}: not within 10 s"))
    }

    #[test]
    fn a_peer_s_queue_is_bounded_in_bytes_but_takes_any_frame_when_empty() {
        assert!(admits(0, 4 * QUEUED_BYTES));
        assert!(admits(QUEUED_BYTES - 10, 10));
        assert!(!admits(QUEUED_BYTES - 10, 11));
        assert!(!admits(1, QUEUED_BYTES));
    }

    #[test]
    fn a_peer_s_frames_arrive_in_order_on_one_stream() {
        System::new().block_on(async {
            let key = ClusterKey::generate();
            let (a, _, mut a_events, a_metrics) = start(&key);
            let (_b, b_peer, mut b_events, b_metrics) = start(&key);
            let b_addr = next("b listening", &mut b_events, |e| match e {
                NetEvent::Listening(addr) => Some(addr),
                _ => None,
            })
            .await;
            a.do_send(KeepConnected(vec![(b_peer, vec![b_addr])]));
            next("a connected to b", &mut a_events, |e| {
                matches!(e, NetEvent::Connected(p) if p == b_peer).then_some(())
            })
            .await;
            // A burst as large as the queue, sent before the writer runs.
            const FRAMES: u32 = QUEUE as u32;
            for i in 0..FRAMES {
                let frame = i.to_be_bytes().to_vec();
                a.do_send(SendControl { to: b_peer, frame });
            }
            for i in 0..FRAMES {
                let frame = next("a frame", &mut b_events, |e| match e {
                    NetEvent::Control { frame, .. } => Some(frame),
                    _ => None,
                })
                .await;
                assert_eq!(frame, i.to_be_bytes().to_vec(), "frame {i} out of order");
            }
            assert_eq!(b_metrics.control_frames_in_total.get(), u64::from(FRAMES));
            // A request-response exchange per frame opened a stream for each.
            assert_eq!(b_metrics.control_streams_in_total.get(), 1);
            assert_eq!(a_metrics.control_send_failures_total.get(), 0);
        });
    }
}
