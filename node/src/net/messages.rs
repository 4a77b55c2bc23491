//! What the `Network` actor and the node say to each other: the events it reports, and the
//! commands it takes.

use actix::prelude::*;
use libp2p::{Multiaddr, PeerId};

use crate::notices::Notice;

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

/// Replaces the set of peers the node keeps connections to (the members), with the addresses to
/// dial them at.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct KeepConnected(pub Vec<(PeerId, Vec<Multiaddr>)>);

/// Dial `peer` at these addresses once, unless connected: the leader reaching a joining node
/// whose clock it has not heard (its `Join` came through a relay).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DialBack {
    /// The node.
    pub peer: PeerId,
    /// Where its `Join` says it listens.
    pub addrs: Vec<Multiaddr>,
}

/// The peers to refuse at admission: members that left the cluster (replaces the last list).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RefusePeers(pub Vec<PeerId>);

/// Closes every connection to a misbehaving peer.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DisconnectPeer {
    /// The peer.
    pub peer: PeerId,
    /// Why, for the log.
    pub reason: String,
}
