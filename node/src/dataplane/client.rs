//! Client side of the data plane: reaching another member's endpoint and asking it for links,
//! state and checkpoint storage.

use std::net::SocketAddr;
use std::ops::Range;

use libp2p::PeerId;
use parcae_consensus::state::{Digest32, StageSlot};
use parcae_consensus::{ControlState, NodeId};

use super::DataplaneError;
use super::protocol::{self, HeldInfo, LinkKind, MAX_CONTROL, Reply, Request};
use super::server::Endpoint;
use crate::dataplane::{self, SecureStream};

/// Where a member's data plane listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr {
    /// Its raft id.
    pub node: NodeId,
    /// Its libp2p identity (checked in the handshake).
    pub peer: PeerId,
    /// Its data-plane address.
    pub addr: SocketAddr,
}

/// The data-plane address of `node` as recorded in the replicated membership.
pub fn peer_addr(state: &ControlState, node: NodeId) -> Result<PeerAddr, DataplaneError> {
    let member = state
        .members
        .get(&node)
        .ok_or_else(|| DataplaneError::Peer(format!("{node} is not a member")))?;
    let peer = PeerId::from_bytes(&member.peer.peer_id)
        .map_err(|_| DataplaneError::Peer(format!("{node} has an invalid peer id")))?;
    let addr = member
        .peer
        .data_addr
        .as_deref()
        .ok_or_else(|| DataplaneError::Peer(format!("{node} has no data-plane address yet")))?
        .parse()
        .map_err(|_| DataplaneError::Peer(format!("{node} has an invalid data-plane address")))?;
    Ok(PeerAddr { node, peer, addr })
}

async fn open(
    ep: &Endpoint,
    to: &PeerAddr,
    request: &Request,
) -> Result<SecureStream, DataplaneError> {
    let mut stream = tokio::time::timeout(
        ep.timeout,
        dataplane::connect(to.addr, &ep.keypair, to.peer, &ep.keys.keys()),
    )
    .await
    .map_err(|_| DataplaneError::Timeout(format!("connecting to {}", to.addr)))??;
    stream.send(&protocol::encode(request)?).await?;
    Ok(stream)
}

async fn reply(stream: &mut SecureStream, ep: &Endpoint) -> Result<Reply, DataplaneError> {
    let bytes = tokio::time::timeout(ep.timeout, stream.recv(MAX_CONTROL as u64))
        .await
        .map_err(|_| DataplaneError::Timeout("data plane reply".into()))??;
    protocol::decode(&bytes)
}

/// Opens this node's side of a link of `epoch`.
pub async fn open_link(
    ep: &Endpoint,
    to: &PeerAddr,
    epoch: u64,
    kind: LinkKind,
    from: StageSlot,
) -> Result<SecureStream, DataplaneError> {
    open(ep, to, &Request::Link { epoch, kind, from }).await
}

/// What `to` holds; with `awaiting`, once it holds state of that `(history, step)` or a later
/// one, or its wait ran out.
pub async fn query(
    ep: &Endpoint,
    to: &PeerAddr,
    awaiting: Option<(u64, u64)>,
) -> Result<Option<HeldInfo>, DataplaneError> {
    let mut s = open(ep, to, &Request::Query { awaiting }).await?;
    match reply(&mut s, ep).await? {
        Reply::Held(h) => Ok(h),
        other => Err(DataplaneError::Protocol(format!(
            "unexpected reply {other:?}"
        ))),
    }
}

async fn receive_layers(
    ep: &Endpoint,
    mut s: SecureStream,
    want: u32,
) -> Result<Vec<Vec<u8>>, DataplaneError> {
    match reply(&mut s, ep).await? {
        Reply::Sending { layers } if layers == want => {}
        Reply::Refused(why) => return Err(DataplaneError::Peer(why)),
        other => {
            return Err(DataplaneError::Protocol(format!(
                "unexpected reply {other:?}"
            )));
        }
    }
    let mut out = Vec::with_capacity(want as usize);
    for _ in 0..want {
        out.push(s.recv(ep.max_state_bytes).await?);
    }
    Ok(out)
}

/// Fetches layers `layers` after `step` steps of `history` from `from`, one buffer per layer.
pub async fn fetch(
    ep: &Endpoint,
    from: &PeerAddr,
    history: u64,
    step: u64,
    layers: Range<usize>,
) -> Result<Vec<Vec<u8>>, DataplaneError> {
    let n = layers.len() as u32;
    let (start, end) = (layers.start as u32, layers.end as u32);
    let request = Request::Fetch {
        history,
        step,
        start,
        end,
    };
    let s = open(ep, from, &request).await?;
    receive_layers(ep, s, n).await
}

/// Fetches a stored checkpoint.
pub async fn fetch_checkpoint(
    ep: &Endpoint,
    from: &PeerAddr,
    steps: u64,
    layers: Range<usize>,
) -> Result<Vec<u8>, DataplaneError> {
    let (start, end) = (layers.start as u32, layers.end as u32);
    let s = open(ep, from, &Request::FetchCheckpoint { steps, start, end }).await?;
    let mut got = receive_layers(ep, s, 1).await?;
    got.pop()
        .ok_or_else(|| DataplaneError::Protocol("empty checkpoint reply".into()))
}

/// Asks `to` to store a checkpoint.
pub async fn put_checkpoint(
    ep: &Endpoint,
    to: &PeerAddr,
    steps: u64,
    layers: Range<usize>,
    bytes: &[u8],
    digest: Digest32,
) -> Result<(), DataplaneError> {
    let request = Request::PutCheckpoint {
        steps,
        start: layers.start as u32,
        end: layers.end as u32,
        digest,
    };
    let mut s = open(ep, to, &request).await?;
    s.send(bytes).await?;
    match reply(&mut s, ep).await? {
        Reply::Stored => Ok(()),
        Reply::Refused(why) => Err(DataplaneError::Peer(why)),
        other => Err(DataplaneError::Protocol(format!(
            "unexpected reply {other:?}"
        ))),
    }
}
