//! The `Network` actor: the only owner of the libp2p swarm.
//!
//! It runs on its own arbiter (connection tasks are spawned on the runtime that polls the swarm,
//! so this keeps encryption and multiplexing off the thread of the control driver). The swarm stays a
//! field and is polled by a small [`ActorFuture`], so handlers can call `publish`, `dial` and
//! `send_request` directly. Everything the node needs to know is reported as a [`NetEvent`] to
//! one recipient (the control driver).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, Swarm, gossipsub, identify, request_response};

use super::codec::{ControlAck, ControlRequest};
use super::swarm::{Behaviour, BehaviourEvent, NOTICE_TOPIC};
use crate::metrics::Metrics;
use crate::notice::Notice;
use crate::retry::Retry;

/// How often the peers that should be connected but are not are checked for a redial.
const REDIAL_CHECK: Duration = Duration::from_millis(250);
/// First delay before an unreachable peer is dialled again.
const REDIAL_MIN: Duration = Duration::from_millis(500);
/// Longest delay between dials of one unreachable peer.
const REDIAL_MAX: Duration = Duration::from_secs(2);
/// Most swarm events handled per poll before yielding to the mailbox.
const EVENT_BATCH: usize = 256;

/// What the network reports to the node.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum NetEvent {
    /// A listen address became active (with `/p2p/<local id>` appended).
    Listening(Multiaddr),
    /// The first connection to `peer` passed admission.
    Connected(PeerId),
    /// The last connection to `peer` closed.
    Disconnected(PeerId),
    /// A control frame (within the size limit) arrived from an admitted peer.
    Control {
        /// Sender.
        from: PeerId,
        /// The frame, not yet decoded.
        frame: Vec<u8>,
    },
    /// A valid notice, signed by the node it names.
    Notice {
        /// The leaving node.
        from: PeerId,
        /// The notice.
        notice: Notice,
    },
    /// A control frame to `peer` could not be delivered.
    SendFailed(PeerId),
}

/// Sends a control frame (fire and forget; failures come back as [`NetEvent::SendFailed`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SendControl {
    /// Recipient.
    pub to: PeerId,
    /// Encoded frame.
    pub frame: Vec<u8>,
}

/// Gossips an encoded notice on the notice topic.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), String>")]
pub struct PublishNotice(pub Vec<u8>);

/// Replaces the set of peers the node keeps connections to (bootstrap peers and members), with
/// the addresses to dial them at.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct KeepConnected(pub Vec<(PeerId, Vec<Multiaddr>)>);

/// Closes every connection to a misbehaving peer.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DisconnectPeer {
    /// The peer.
    pub peer: PeerId,
    /// Why, for the log.
    pub reason: String,
}

/// The actor.
pub struct Network {
    swarm: Swarm<Behaviour>,
    listen: Vec<Multiaddr>,
    events: Recipient<NetEvent>,
    metrics: Arc<Metrics>,
    notice_topic: gossipsub::TopicHash,
    /// Peers to keep connected, with their dial addresses.
    wanted: HashMap<PeerId, Vec<Multiaddr>>,
    /// Bootstrap peers stay wanted whatever the membership says.
    bootstrap: HashMap<PeerId, Vec<Multiaddr>>,
    listening: Vec<Multiaddr>,
    connected: HashSet<PeerId>,
    /// When each wanted but unconnected peer may be dialled again.
    dial_retry: HashMap<PeerId, Retry>,
}

impl Network {
    /// Creates the actor; it starts listening on `listen` and dialling `bootstrap` when started.
    /// Bootstrap addresses must end in `/p2p/<peer id>` (checked by [`split_peer_addr`]).
    pub fn new(
        swarm: Swarm<Behaviour>,
        listen: Vec<Multiaddr>,
        bootstrap: Vec<(PeerId, Multiaddr)>,
        events: Recipient<NetEvent>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut boot: HashMap<PeerId, Vec<Multiaddr>> = HashMap::new();
        for (peer, addr) in bootstrap {
            boot.entry(peer).or_default().push(addr);
        }
        Self {
            swarm,
            listen,
            events,
            metrics,
            notice_topic: gossipsub::IdentTopic::new(NOTICE_TOPIC).hash(),
            wanted: boot.clone(),
            bootstrap: boot,
            listening: Vec::new(),
            connected: HashSet::new(),
            dial_retry: HashMap::new(),
        }
    }

    /// Dials the wanted peers that are not connected and whose backoff has run out.
    fn redial(&mut self) {
        let local = *self.swarm.local_peer_id();
        let now = Instant::now();
        let (wanted, connected) = (&self.wanted, &self.connected);
        self.dial_retry
            .retain(|p, _| wanted.contains_key(p) && !connected.contains(p));
        let mut missing = Vec::new();
        for (peer, addrs) in &self.wanted {
            if *peer == local || addrs.is_empty() || self.connected.contains(peer) {
                continue;
            }
            let retry = self
                .dial_retry
                .entry(*peer)
                .or_insert_with(|| Retry::new(REDIAL_MIN, REDIAL_MAX));
            if retry.due(now) {
                retry.attempted(now);
                missing.push((*peer, addrs.clone()));
            }
        }
        for (peer, addrs) in missing {
            let opts = DialOpts::peer_id(peer)
                .addresses(addrs)
                .condition(PeerCondition::DisconnectedAndNotDialing)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!(%peer, "dial not started: {e}");
            }
        }
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                let full = address.with(Protocol::P2p(*self.swarm.local_peer_id()));
                tracing::info!(%full, "listening");
                self.listening.push(full.clone());
                self.events.do_send(NetEvent::Listening(full));
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                num_established,
                ..
            } => {
                self.metrics.connections_established_total.inc();
                tracing::debug!(peer = %peer_id, addr = %endpoint.get_remote_address(), "connection admitted");
                if num_established.get() == 1 {
                    self.connected.insert(peer_id);
                    self.metrics
                        .peers_connected
                        .set(self.connected.len() as u64);
                    self.events.do_send(NetEvent::Connected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established,
                cause,
                ..
            } => {
                tracing::debug!(peer = %peer_id, ?cause, "connection closed");
                if num_established == 0 {
                    self.connected.remove(&peer_id);
                    self.metrics
                        .peers_connected
                        .set(self.connected.len() as u64);
                    self.events.do_send(NetEvent::Disconnected(peer_id));
                }
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error,
                ..
            } => {
                self.metrics.connections_failed_total.inc();
                tracing::info!(from = %send_back_addr, "incoming connection refused: {error} ({error:?})");
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                self.metrics.connections_failed_total.inc();
                tracing::debug!(?peer_id, "outgoing connection failed: {error} ({error:?})");
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Control(request_response::Event::Message { peer, message, .. }) => {
                match message {
                    request_response::Message::Request {
                        request, channel, ..
                    } => self.on_control_request(peer, request, channel),
                    request_response::Message::Response { .. } => {}
                }
            }
            BehaviourEvent::Control(request_response::Event::OutboundFailure {
                peer,
                error,
                ..
            }) => {
                self.metrics.control_send_failures_total.inc();
                tracing::debug!(%peer, "control frame not delivered: {error}");
                self.events.do_send(NetEvent::SendFailed(peer));
            }
            BehaviourEvent::Control(request_response::Event::InboundFailure {
                peer,
                error,
                ..
            }) => {
                tracing::debug!(%peer, "inbound control stream failed: {error}");
            }
            BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            }) => self.on_gossip(propagation_source, message_id, message),
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })
                if info.protocol_version != super::swarm::IDENTIFY_PROTOCOL =>
            {
                tracing::warn!(peer = %peer_id, version = %info.protocol_version, "peer runs another protocol version");
            }
            _ => {}
        }
    }

    fn on_control_request(
        &mut self,
        peer: PeerId,
        request: ControlRequest,
        channel: request_response::ResponseChannel<ControlAck>,
    ) {
        match request {
            ControlRequest::Frame(frame) => {
                self.metrics.control_frames_in_total.inc();
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .control
                    .send_response(channel, ControlAck::Accepted);
                self.events.do_send(NetEvent::Control { from: peer, frame });
            }
            ControlRequest::Oversized { len } => {
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .control
                    .send_response(channel, ControlAck::Rejected);
                self.disconnect(peer, &format!("oversized control frame of {len} bytes"));
            }
        }
    }

    fn on_gossip(
        &mut self,
        propagation_source: PeerId,
        message_id: gossipsub::MessageId,
        message: gossipsub::Message,
    ) {
        let verdict = match message.source {
            Some(signer) if message.topic == self.notice_topic => {
                match Notice::decode_from(&message.data, signer) {
                    Ok(notice) => {
                        self.metrics.notices_received_total.inc();
                        self.events.do_send(NetEvent::Notice {
                            from: signer,
                            notice,
                        });
                        gossipsub::MessageAcceptance::Accept
                    }
                    Err(e) => {
                        tracing::warn!(peer = %propagation_source, "invalid notice: {e}");
                        gossipsub::MessageAcceptance::Reject
                    }
                }
            }
            _ => gossipsub::MessageAcceptance::Reject,
        };
        if matches!(verdict, gossipsub::MessageAcceptance::Reject) {
            self.metrics.notices_rejected_total.inc();
        }
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&message_id, &propagation_source, verdict);
    }

    fn disconnect(&mut self, peer: PeerId, reason: &str) {
        self.metrics.bad_input_disconnects_total.inc();
        tracing::warn!(%peer, "disconnecting peer: {reason}");
        let _ = self.swarm.disconnect_peer_id(peer);
    }
}

/// Polls the swarm on behalf of the actor in bounded batches.
struct SwarmDriver;

impl ActorFuture<Network> for SwarmDriver {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut Network,
        _: &mut Context<Network>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<()> {
        for _ in 0..EVENT_BATCH {
            match act.swarm.poll_next_unpin(cx) {
                Poll::Ready(Some(event)) => act.on_swarm_event(event),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Actor for Network {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for addr in self.listen.clone() {
            if let Err(e) = self.swarm.listen_on(addr.clone()) {
                tracing::error!(%addr, "cannot listen: {e}");
                System::current().stop_with_code(2);
            }
        }
        ctx.spawn(SwarmDriver);
        self.redial();
        ctx.run_interval(REDIAL_CHECK, |act, _| act.redial());
    }
}

impl Handler<SendControl> for Network {
    type Result = ();

    fn handle(&mut self, msg: SendControl, _: &mut Context<Self>) {
        self.metrics.control_frames_out_total.inc();
        let addrs = self.wanted.get(&msg.to).cloned().unwrap_or_default();
        self.swarm
            .behaviour_mut()
            .control
            .send_request_with_addresses(&msg.to, ControlRequest::Frame(msg.frame), addrs);
    }
}

impl Handler<PublishNotice> for Network {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: PublishNotice, _: &mut Context<Self>) -> Self::Result {
        self.swarm
            .behaviour_mut()
            .gossipsub
            .publish(self.notice_topic.clone(), msg.0)
            .map(|_| {
                self.metrics.notices_published_total.inc();
            })
            .map_err(|e| e.to_string())
    }
}

impl Handler<KeepConnected> for Network {
    type Result = ();

    fn handle(&mut self, msg: KeepConnected, _: &mut Context<Self>) {
        let mut wanted = self.bootstrap.clone();
        for (peer, addrs) in msg.0 {
            let entry = wanted.entry(peer).or_default();
            for addr in addrs {
                if !entry.contains(&addr) {
                    entry.push(addr);
                }
            }
        }
        self.wanted = wanted;
        self.redial();
    }
}

impl Handler<DisconnectPeer> for Network {
    type Result = ();

    fn handle(&mut self, msg: DisconnectPeer, _: &mut Context<Self>) {
        self.disconnect(msg.peer, &msg.reason);
    }
}

/// Why a bootstrap address was refused.
#[derive(Debug, thiserror::Error)]
#[error("bootstrap address {0} must end in /p2p/<peer id>")]
pub struct MissingPeerId(pub Multiaddr);

/// Splits `/ip4/.../tcp/N/p2p/ID` into the peer id and the address without the `/p2p` suffix.
pub fn split_peer_addr(addr: &Multiaddr) -> Result<(PeerId, Multiaddr), MissingPeerId> {
    let mut base = addr.clone();
    match base.pop() {
        Some(Protocol::P2p(peer)) => Ok((peer, base)),
        _ => Err(MissingPeerId(addr.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_addresses_need_a_peer_id() {
        let peer = PeerId::random();
        let addr: Multiaddr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{peer}")
            .parse()
            .unwrap();
        let (p, base) = split_peer_addr(&addr).unwrap();
        assert_eq!(p, peer);
        assert_eq!(base.to_string(), "/ip4/127.0.0.1/tcp/4001");
        let bare: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().unwrap();
        assert!(split_peer_addr(&bare).is_err());
    }
}
