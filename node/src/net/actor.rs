//! The `Network` actor: the only owner of the libp2p swarm.
//!
//! It runs on its own arbiter (connection tasks are spawned on the runtime that polls the swarm,
//! so this keeps encryption and multiplexing off the thread of the control driver). The swarm stays a
//! field and is polled by a small [`ActorFuture`], so handlers can call `publish`, `dial` and
//! `send_request` directly. Everything the node needs to know is reported as a [`NetEvent`] to
//! one recipient (the control driver).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, Swarm, gossipsub, identify};

use super::admission::AdmissionError;
use super::codec::CONTROL_PROTOCOL;
use super::control_streams::{OversizedFrame, Readers, Senders, StreamLimits};
use super::log_limit::LogLimit;
use super::messages::{
    DialBack, DisconnectPeer, KeepConnected, NetEvent, PublishNotice, RefusePeers, SendControl,
};
use super::seed_dialer::{REDIAL_MAX, REDIAL_MIN, SeedDialer, SeedSource, ip_port};
use super::seeds::{MAX_RESOLVED, Seed, SeedHost};
use super::swarm::{Behaviour, BehaviourEvent, NOTICE_TOPIC, NetLimits};
use crate::metrics::Metrics;
use crate::notices::Notice;
use crate::retry::Retry;

/// How often the peers that should be connected but are not are checked for a redial.
const REDIAL_CHECK: Duration = Duration::from_millis(250);
/// Most swarm events handled per poll before yielding to the mailbox.
const EVENT_BATCH: usize = 256;
/// Lines logged per source of refused connections (and per peer address whose key differs).
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(60);

/// The actor.
pub struct Network {
    swarm: Swarm<Behaviour>,
    listen: Vec<Multiaddr>,
    events: Recipient<NetEvent>,
    metrics: Arc<Metrics>,
    notice_topic: gossipsub::TopicHash,
    /// Peers to keep connected, with their dial addresses.
    wanted: HashMap<PeerId, Vec<Multiaddr>>,
    /// Where to look for the cluster while no member is connected.
    seeds: SeedDialer,
    listening: Vec<Multiaddr>,
    connected: HashSet<PeerId>,
    /// Former members refused at admission.
    refused: HashSet<PeerId>,
    /// When each wanted but unconnected peer may be dialled again.
    dial_retry: HashMap<PeerId, Retry>,
    /// Refused inbound connections logged, per source IP.
    refused_log: LogLimit<IpAddr>,
    /// Dials refused for another cluster key logged, per address.
    wrong_key_log: LogLimit<Multiaddr>,
    /// The control streams' writers.
    senders: Senders,
    /// The largest control frame accepted.
    max_control_frame: u32,
}

/// Whether a transport error is the admission handshake's verdict that the keys differ.
fn is_wrong_key(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if matches!(
            e.downcast_ref::<AdmissionError>(),
            Some(AdmissionError::WrongKey(_))
        ) {
            return true;
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && is_wrong_key(inner)
        {
            return true;
        }
        current = e.source();
    }
    false
}

impl Network {
    /// Creates the actor; it starts listening on `listen` when started, and dials `seeds`
    /// whenever no member is connected.
    pub fn new(
        swarm: Swarm<Behaviour>,
        listen: Vec<Multiaddr>,
        seeds: SeedSource,
        events: Recipient<NetEvent>,
        metrics: Arc<Metrics>,
        limits: &NetLimits,
    ) -> Self {
        let streams = StreamLimits {
            max_frame: limits.max_control_frame,
            timeout: limits.request_timeout,
        };
        let control = swarm.behaviour().control.new_control();
        Self {
            senders: Senders::new(control, streams, events.clone(), metrics.clone()),
            max_control_frame: limits.max_control_frame,
            swarm,
            listen,
            events,
            metrics,
            notice_topic: gossipsub::IdentTopic::new(NOTICE_TOPIC).hash(),
            wanted: HashMap::new(),
            seeds: SeedDialer::new(seeds),
            listening: Vec::new(),
            connected: HashSet::new(),
            refused: HashSet::new(),
            dial_retry: HashMap::new(),
            refused_log: LogLimit::new(REFUSED_LOG_EVERY),
            wrong_key_log: LogLimit::new(REFUSED_LOG_EVERY),
        }
    }

    /// Whether no member is connected: then the seeds are the way back to the cluster.
    fn alone(&self) -> bool {
        !self.wanted.keys().any(|p| self.connected.contains(p))
    }

    /// Dials the wanted peers that are not connected and whose backoff has run out, and the
    /// seeds while the node is alone.
    fn redial(&mut self, ctx: &mut Context<Self>) {
        self.redial_members();
        if self.alone() {
            self.dial_seeds(ctx);
        }
    }

    /// Dials each seed that is not connected and whose backoff has run out; a name is resolved
    /// first, at every attempt.
    fn dial_seeds(&mut self, ctx: &mut Context<Self>) {
        let due = self.seeds.due(Instant::now(), &self.connected);
        for seed in due {
            match &seed.host {
                SeedHost::Ip(ip) => self.dial_seed(&seed, &[*ip]),
                SeedHost::Name { name, family } => {
                    let (name, family, port) = (name.clone(), *family, seed.port);
                    let lookup = async move {
                        tokio::net::lookup_host((name.as_str(), port))
                            .await
                            .map(|addrs| {
                                addrs
                                    .map(|a| a.ip())
                                    .filter(|ip| family.admits(ip))
                                    .take(MAX_RESOLVED)
                                    .collect::<Vec<_>>()
                            })
                            .map_err(|e| format!("resolving {name}: {e}"))
                    };
                    ctx.spawn(lookup.into_actor(self).map(move |ips, act, _| match ips {
                        Ok(ips) => {
                            act.dial_seed(&seed, &ips);
                            act.seeds.resolved(seed, ips);
                        }
                        Err(e) => tracing::debug!("seed not dialled: {e}"),
                    }));
                }
            }
        }
    }

    /// Dials `seed` at each of `ips`: by peer id when the seed names one, else as an unknown
    /// peer (noise learns its id, admission checks its key).
    fn dial_seed(&mut self, seed: &Seed, ips: &[IpAddr]) {
        for ip in ips {
            let addr = seed.dial_addr(*ip);
            let opts = match seed.peer {
                Some(peer) => DialOpts::peer_id(peer)
                    .addresses(vec![addr])
                    .condition(PeerCondition::DisconnectedAndNotDialing)
                    .build(),
                None => DialOpts::unknown_peer_id().address(addr).build(),
            };
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!(?seed, "seed dial not started: {e}");
            }
        }
    }

    /// Dials the wanted peers that are not connected and whose backoff has run out.
    fn redial_members(&mut self) {
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
                if endpoint.is_dialer() {
                    self.seeds.learn(endpoint.get_remote_address(), peer_id);
                }
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
                    self.senders.forget(&peer_id);
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
                let source = ip_port(&send_back_addr).map(|(ip, _)| ip);
                if let Some(held) =
                    source.and_then(|ip| self.refused_log.allow(&ip, Instant::now()))
                {
                    tracing::info!(from = %send_back_addr, held_back = held, "incoming connection refused: {error}");
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                self.metrics.connections_failed_total.inc();
                self.on_dial_error(peer_id, &error);
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    /// A dial failed: refusals for another cluster key are the operator's business (warn, once
    /// a minute per address); anything else is a peer that is down (debug).
    fn on_dial_error(&mut self, peer: Option<PeerId>, error: &libp2p::swarm::DialError) {
        let libp2p::swarm::DialError::Transport(attempts) = error else {
            tracing::debug!(?peer, "outgoing connection failed: {error}");
            return;
        };
        for (addr, e) in attempts {
            if !is_wrong_key(e) {
                tracing::debug!(?peer, %addr, "outgoing connection failed: {e}");
            } else if let Some(held) = self.wrong_key_log.allow(addr, Instant::now()) {
                tracing::warn!(%addr, held_back = held, "the peer at {addr} refused us: it holds another cluster key than ours");
            }
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
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
                tracing::error!(%addr, "cannot listen: {e:?}");
                System::current().stop_with_code(2);
            }
        }
        ctx.spawn(SwarmDriver);
        match self
            .swarm
            .behaviour()
            .control
            .new_control()
            .accept(CONTROL_PROTOCOL)
        {
            Ok(incoming) => {
                let readers = Readers {
                    events: self.events.clone(),
                    oversized: ctx.address().recipient(),
                    metrics: self.metrics.clone(),
                    max_frame: self.max_control_frame,
                };
                actix::spawn(readers.accept(incoming));
            }
            Err(e) => {
                tracing::error!("cannot accept control streams: {e}");
                System::current().stop_with_code(2);
            }
        }
        self.redial(ctx);
        ctx.run_interval(REDIAL_CHECK, |act, ctx| act.redial(ctx));
    }
}

impl Handler<SendControl> for Network {
    type Result = ();

    fn handle(&mut self, msg: SendControl, _: &mut Context<Self>) {
        self.metrics.control_frames_out_total.inc();
        if self.connected.contains(&msg.to) {
            self.senders.send(msg.to, msg.frame);
        } else {
            // The redial of wanted peers brings the connection back; raft sends again.
            self.metrics.control_send_failures_total.inc();
            self.events.do_send(NetEvent::SendFailed(msg.to));
        }
    }
}

impl Handler<OversizedFrame> for Network {
    type Result = ();

    fn handle(&mut self, msg: OversizedFrame, _: &mut Context<Self>) {
        self.disconnect(
            msg.from,
            &format!("oversized control frame of {} bytes", msg.len),
        );
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

    fn handle(&mut self, msg: KeepConnected, ctx: &mut Context<Self>) {
        let mut wanted: HashMap<PeerId, Vec<Multiaddr>> = HashMap::new();
        for (peer, addrs) in msg.0 {
            let entry = wanted.entry(peer).or_default();
            for addr in addrs {
                if !entry.contains(&addr) {
                    entry.push(addr);
                }
            }
        }
        self.wanted = wanted;
        self.redial(ctx);
    }
}

impl Handler<DialBack> for Network {
    type Result = ();

    fn handle(&mut self, msg: DialBack, _: &mut Context<Self>) {
        let opts = DialOpts::peer_id(msg.peer)
            .addresses(msg.addrs)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            tracing::debug!(peer = %msg.peer, "dial back not started: {e}");
        }
    }
}

impl Handler<RefusePeers> for Network {
    type Result = ();

    fn handle(&mut self, msg: RefusePeers, _: &mut Context<Self>) {
        let refused = &mut self.swarm.behaviour_mut().refused;
        let now: HashSet<PeerId> = msg.0.into_iter().collect();
        for peer in self.refused.difference(&now) {
            refused.unblock_peer(*peer);
        }
        for peer in now.difference(&self.refused) {
            tracing::info!(%peer, "refusing a former member");
            refused.block_peer(*peer);
        }
        self.refused = now;
    }
}

impl Handler<DisconnectPeer> for Network {
    type Result = ();

    fn handle(&mut self, msg: DisconnectPeer, _: &mut Context<Self>) {
        self.disconnect(msg.peer, &msg.reason);
    }
}
