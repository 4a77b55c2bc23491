//! What comes in from outside the driver: network events (raft frames, proposals relayed by
//! peers, gossiped notices, connections) and this node's own leave request. Inbound bytes are
//! untrusted: an undecodable frame, or a raft message that is oversized, malformed or forged,
//! disconnects the sender.

use std::collections::VecDeque;
use std::time::Instant;

use actix::prelude::*;
use libp2p::PeerId;
use parcae_consensus::{Command, StepError};
use parcae_pool::{check_instance_type, check_zone};

use super::{
    ControlDriver, MAX_CLOCK_REFUSALS_SHOWN, MAX_DIAL_BACK_ADDRS, MAX_NOTICES_SHOWN, node_id,
};
use crate::clock;
use crate::control::authorize::authorize;
use crate::control::peer_clocks::local_deadline;
use crate::control::proof::{self, ProofError};
use crate::net::messages::{DialBack, DisconnectPeer, NetEvent, PublishNotice};
use crate::notices::cloud::CloudPlacement;
use crate::notices::{LeaveRequested, Notice};
use crate::status::ClockRefusalView;
use crate::status::NoticeView;
use crate::wire::ControlMessage;
use crate::wire::SignedProposal;

impl ControlDriver {
    fn on_control(&mut self, from: PeerId, frame: Vec<u8>, ctx: &mut Context<Self>) {
        self.liveness.heard(node_id(&from), Instant::now());
        let message = match ControlMessage::decode(&frame) {
            Ok(m) => m,
            Err(e) => return self.punish(from, format!("undecodable control frame: {e}")),
        };
        match message {
            ControlMessage::Raft(bytes) => match self.node.step(node_id(&from), &bytes) {
                Ok(()) => self.schedule_ready(ctx),
                Err(
                    e @ (StepError::TooLarge { .. }
                    | StepError::Malformed(_)
                    | StepError::WrongSender { .. }),
                ) => self.punish(from, format!("bad raft message: {e}")),
                Err(e) => tracing::debug!(peer = %from, "raft message refused: {e}"),
            },
            ControlMessage::Propose(proposal) => self.on_proposal(from, proposal, true, ctx),
            ControlMessage::Clock(their_ms) => {
                self.peer_clocks.heard(from, their_ms, clock::now_ms());
            }
            ControlMessage::Forwarded(proposal) => {
                if self.node.state().members.contains_key(&node_id(&from)) {
                    self.on_proposal(from, proposal, false, ctx);
                } else {
                    self.punish(from, "relayed a proposal without being a member".into());
                }
            }
        }
    }

    /// A node asks for a change about itself: check whose it is (the signer, who must be the
    /// sender unless a member relayed it) and whether that node may ask for it, then propose it
    /// or relay it unchanged.
    fn on_proposal(
        &mut self,
        from: PeerId,
        proposal: SignedProposal,
        direct: bool,
        ctx: &mut Context<Self>,
    ) {
        let now = clock::now_ms();
        let origin = match proof::verify(&proposal, |o| self.peer_clocks.their_now(o, now)) {
            Ok(origin) => origin,
            // An honest node with a clock off by more than the window (or a relay passing its
            // proposal on) is refused, not disconnected: its raft traffic must keep flowing.
            Err(ProofError::Stale { origin, skew_ms }) => {
                return self.refuse_for_clock(origin, &proposal, skew_ms, now);
            }
            Err(e) => return self.punish(from, e.to_string()),
        };
        if direct && origin != from {
            return self.punish(from, format!("sent a proposal signed by {origin}"));
        }
        let command = match Command::decode(&proposal.command) {
            Ok(Command::Notice { node, deadline_ms }) => Command::Notice {
                node,
                deadline_ms: local_deadline(deadline_ms, proposal.signed_unix_ms, now),
            },
            Ok(c) => c,
            Err(e) => return self.punish(from, format!("undecodable proposal: {e}")),
        };
        if let Err(e) = authorize(self.node.state(), &origin.to_bytes(), &command) {
            return self.punish(from, e.to_string());
        }
        if self.node.is_leader() {
            self.propose_logged(command, ctx);
        } else if let Some(leader) = self.node.leader().and_then(|l| self.peer_of(l))
            && leader != self.me
            && leader != from
        {
            self.send_control(leader, ControlMessage::Forwarded(proposal));
        }
    }

    /// A proposal signed too far from now: named in the log and `/status`. A `Join` whose
    /// signer's clock was never heard (it came through a relay) makes this node dial the joiner
    /// at the addresses it signed: the connection brings its clock, and its next `Join` is read
    /// on it.
    fn refuse_for_clock(
        &mut self,
        origin: PeerId,
        proposal: &SignedProposal,
        skew_ms: u64,
        now: u64,
    ) {
        let heard = self.peer_clocks.offset(&origin).is_some();
        tracing::warn!(
            peer = %origin,
            skew_ms,
            clock_heard = heard,
            "proposal refused: signed too far from now on its signer's clock (clocks more than \
             5 minutes apart, or a replay)"
        );
        let refusal = ClockRefusalView {
            peer_id: origin.to_string(),
            skew_ms,
            refused_unix_ms: now,
        };
        push_newest(&mut self.clock_refusals, refusal, MAX_CLOCK_REFUSALS_SHOWN);
        if let (false, Ok(Command::Join { peer, .. })) = (heard, Command::decode(&proposal.command))
            && peer.peer_id == origin.to_bytes()
        {
            let addrs = peer.addrs.iter().filter_map(|a| a.parse().ok());
            self.net.do_send(DialBack {
                peer: origin,
                addrs: addrs.take(MAX_DIAL_BACK_ADDRS).collect(),
            });
        }
    }

    fn punish(&mut self, peer: PeerId, reason: String) {
        self.net.do_send(DisconnectPeer { peer, reason });
    }

    fn record_notice(&mut self, notice: &Notice, received: u64) {
        let Some(peer) = notice.peer() else { return };
        let view = NoticeView {
            peer_id: peer.to_string(),
            deadline_unix_ms: notice.deadline_unix_ms,
            issued_unix_ms: notice.issued_unix_ms,
            received_unix_ms: received,
        };
        push_newest(&mut self.notices, view, MAX_NOTICES_SHOWN);
    }
}

/// Appends `item` to a list shown on `/status`, dropping the oldest beyond `max`.
fn push_newest<T>(list: &mut VecDeque<T>, item: T, max: usize) {
    if list.len() == max {
        list.pop_front();
    }
    list.push_back(item);
}

impl Handler<NetEvent> for ControlDriver {
    type Result = ();

    fn handle(&mut self, event: NetEvent, ctx: &mut Context<Self>) {
        match event {
            NetEvent::Listening(addr) => {
                let mut base = addr.clone();
                base.pop();
                if !self.listen_addrs.contains(&base) {
                    self.listen_addrs.push(base);
                    self.join_retry.reset();
                    self.maintain_membership(ctx);
                }
            }
            NetEvent::Connected(peer) => {
                self.connected.insert(peer);
                self.send_control(peer, ControlMessage::Clock(clock::now_ms()));
                self.liveness.connected(node_id(&peer));
                if !self.node.state().members.contains_key(&self.my_id) {
                    // A new way to reach the cluster: worth trying at once.
                    self.join_retry.reset();
                    self.maintain_membership(ctx);
                }
            }
            NetEvent::Disconnected(peer) => {
                self.connected.remove(&peer);
                self.peer_clocks.forget(&peer);
                self.liveness.disconnected(node_id(&peer), Instant::now());
            }
            NetEvent::Control { from, frame } => self.on_control(from, frame, ctx),
            NetEvent::Notice { from, notice } => {
                let now = clock::now_ms();
                self.record_notice(&notice, now);
                let deadline_ms =
                    local_deadline(notice.deadline_unix_ms, notice.issued_unix_ms, now);
                tracing::info!(peer = %from, deadline_ms, "preemption notice received");
                if self.node.is_leader() {
                    let notice = Command::Notice {
                        node: node_id(&from),
                        deadline_ms,
                    };
                    self.propose_logged(notice, ctx);
                }
                self.schedule_ready(ctx);
            }
            NetEvent::SendFailed(peer) => self.node.report_unreachable(node_id(&peer)),
        }
    }
}

impl Handler<CloudPlacement> for ControlDriver {
    type Result = ();

    /// The cloud's word on where this machine runs fills what the configuration left empty
    /// (`[placement]`, `--zone`, `--instance-type` win); the next membership check joins again
    /// with the new record. A name the pool rule refuses is left out (the cluster would refuse
    /// the record), with a warning.
    fn handle(&mut self, found: CloudPlacement, _: &mut Context<Self>) {
        let placement = &mut self.config.placement;
        if placement.zone.is_empty() {
            match check_zone(&found.zone) {
                Ok(()) => placement.zone = found.zone,
                Err(e) => tracing::warn!("the cloud's zone is not used: {e}"),
            }
        }
        if placement.instance_type.is_empty() {
            match check_instance_type(&found.instance_type) {
                Ok(()) => placement.instance_type = found.instance_type,
                Err(e) => tracing::warn!("the cloud's instance type is not used: {e}"),
            }
        }
        tracing::info!(
            zone = placement.zone,
            instance_type = placement.instance_type,
            "placement"
        );
    }
}

impl Handler<LeaveRequested> for ControlDriver {
    type Result = ();

    fn handle(&mut self, msg: LeaveRequested, ctx: &mut Context<Self>) {
        if self.leaving.is_some() {
            return;
        }
        self.leaving = Some(msg.deadline);
        let grace = msg
            .deadline
            .duration_since(clock::now())
            .unwrap_or_default();
        let notice = Notice::with_deadline(self.me, msg.deadline, msg.source);
        self.record_notice(&notice, notice.issued_unix_ms);
        match notice.encode() {
            Ok(bytes) => {
                let net = self.net.clone();
                actix::spawn(async move {
                    match net.send(PublishNotice(bytes)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("notice not gossiped: {e}"),
                        Err(e) => tracing::warn!("network actor gone: {e}"),
                    }
                });
            }
            Err(e) => tracing::error!("cannot encode notice: {e}"),
        }
        tracing::warn!(source = ?msg.source, ?grace, "leaving the cluster");
        let own = Command::Notice {
            node: self.my_id,
            deadline_ms: notice.deadline_unix_ms,
        };
        self.propose_logged(own, ctx);
        self.schedule_ready(ctx);
        ctx.run_later(grace, |driver, _| {
            tracing::info!("grace period over: exiting");
            if let Err(e) = crate::resync::mark_left(&driver.data_dir) {
                tracing::warn!("cannot record the leave (the next start will be refused): {e}");
            }
            System::current().stop_with_code(0);
        });
    }
}
