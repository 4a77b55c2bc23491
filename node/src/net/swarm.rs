//! The libp2p behaviour and swarm: TCP + noise + cluster-key admission + yamux.
//!
//! QUIC is not enabled: its TLS handshake yields a multiplexed connection directly, so the
//! admission upgrade of [`super::admission`] could not run before the behaviours see the peer.

use std::error::Error;
use std::time::Duration;

use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    Swarm, SwarmBuilder, Transport, allow_block_list, connection_limits, gossipsub, identify,
    noise, ping, tcp,
};

use super::admission::AdmitThenMux;
use crate::keyring::KeyRing;

/// Gossipsub topic of preemption notices.
pub const NOTICE_TOPIC: &str = "parcae/notices/1";
/// Identify protocol version string; peers on another version are still allowed (they passed
/// admission) but operators see the mismatch in logs.
pub const IDENTIFY_PROTOCOL: &str = "/parcae/id/1.0.0";

/// Bounds on the network, from the node configuration.
#[derive(Debug, Clone)]
pub struct NetLimits {
    /// Largest control frame (raft message or forwarded proposal) in bytes.
    pub max_control_frame: u32,
    /// Largest gossip message in bytes.
    pub max_gossip_message: usize,
    /// Most established connections in total.
    pub max_connections: u32,
    /// Most established connections per peer.
    pub max_connections_per_peer: u32,
    /// Most connections being set up at once (inbound).
    pub max_pending_incoming: u32,
    /// Time allowed for TCP connect + noise + admission + yamux.
    pub handshake_timeout: Duration,
    /// Time allowed to open a control stream, or to write the frames waiting for it.
    pub request_timeout: Duration,
    /// Gossipsub heartbeat: drives mesh repair after peers vanish.
    pub gossip_heartbeat: Duration,
}

impl Default for NetLimits {
    fn default() -> Self {
        Self {
            max_control_frame: crate::wire::MAX_CONTROL_MESSAGE as u32,
            max_gossip_message: 4096,
            max_connections: 256,
            max_connections_per_peer: 2,
            max_pending_incoming: 64,
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            gossip_heartbeat: Duration::from_millis(100),
        }
    }
}

/// The node's combined behaviour. Connection limits come first so that an over-limit connection
/// is denied before the other behaviours allocate state for it.
#[derive(NetworkBehaviour)]
pub struct Behaviour {
    /// Caps on established and pending connections.
    pub limits: connection_limits::Behaviour,
    /// Members that left: their connections are denied (and closed when they are refused).
    pub refused: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    /// Exchanges listen addresses and versions.
    pub identify: identify::Behaviour,
    /// Liveness and round-trip times.
    pub ping: ping::Behaviour,
    /// Signed notices.
    pub gossipsub: gossipsub::Behaviour,
    /// Raft messages and forwarded proposals, on one stream per peer and direction
    /// ([`super::control_streams`]).
    pub control: libp2p_stream::Behaviour,
}

/// Why the swarm could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the libp2p swarm: {0}")]
pub struct SwarmError(String);

/// Builds the swarm for `keypair`, admitting only peers that hold one of the ring's keys (the
/// ring is read at each handshake, so a staged or rotated key counts at once).
pub fn build_swarm(
    keypair: Keypair,
    keys: KeyRing,
    limits: &NetLimits,
) -> Result<Swarm<Behaviour>, SwarmError> {
    let local = keypair.public().to_peer_id();
    let handshake_timeout = limits.handshake_timeout;
    let limits = limits.clone();
    let swarm = SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_other_transport(|id_key| -> Result<_, Box<dyn Error + Send + Sync>> {
            let noise = noise::Config::new(id_key)?;
            Ok(
                tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise)
                    .multiplex_ext(move |remote, _| AdmitThenMux::new(keys.clone(), local, *remote))
                    .timeout(handshake_timeout)
                    .boxed(),
            )
        })
        .map_err(|e| SwarmError(e.to_string()))?
        .with_behaviour(|key| -> Result<_, Box<dyn Error + Send + Sync>> {
            behaviour(key, &limits)
        })
        .map_err(|e| SwarmError(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build();
    Ok(swarm)
}

fn behaviour(key: &Keypair, limits: &NetLimits) -> Result<Behaviour, Box<dyn Error + Send + Sync>> {
    let gossip_config = gossipsub::ConfigBuilder::default()
        .heartbeat_interval(limits.gossip_heartbeat)
        .heartbeat_initial_delay(Duration::ZERO)
        .max_transmit_size(limits.max_gossip_message)
        .validation_mode(gossipsub::ValidationMode::Strict)
        .validate_messages()
        .build()?;
    let mut gossipsub = gossipsub::Behaviour::new(
        gossipsub::MessageAuthenticity::Signed(key.clone()),
        gossip_config,
    )?;
    gossipsub.subscribe(&gossipsub::IdentTopic::new(NOTICE_TOPIC))?;

    let conn_limits = connection_limits::ConnectionLimits::default()
        .with_max_established(Some(limits.max_connections))
        .with_max_established_per_peer(Some(limits.max_connections_per_peer))
        .with_max_pending_incoming(Some(limits.max_pending_incoming));
    Ok(Behaviour {
        limits: connection_limits::Behaviour::new(conn_limits),
        refused: allow_block_list::Behaviour::default(),
        identify: identify::Behaviour::new(
            identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), key.public())
                .with_agent_version(format!("parcae-node/{}", env!("CARGO_PKG_VERSION"))),
        ),
        ping: ping::Behaviour::new(ping::Config::new()),
        gossipsub,
        control: libp2p_stream::Behaviour::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ClusterKey;
    use futures::StreamExt;
    use libp2p::swarm::SwarmEvent;
    use libp2p::{Multiaddr, PeerId};

    fn node(key: &ClusterKey) -> Swarm<Behaviour> {
        holding(key.clone().into())
    }

    fn holding(keys: KeyRing) -> Swarm<Behaviour> {
        build_swarm(Keypair::generate_ed25519(), keys, &NetLimits::default()).unwrap()
    }

    async fn listen(swarm: &mut Swarm<Behaviour>) -> Multiaddr {
        swarm
            .listen_on("/ip4/127.0.0.1/tcp/0".parse().unwrap())
            .unwrap();
        loop {
            if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                return address;
            }
        }
    }

    /// Drives both swarms until the dialer's connection attempt to `listener` is decided;
    /// returns (dialer connected, listener saw the dialer connected).
    async fn dial_outcome(
        listener: &mut Swarm<Behaviour>,
        dialer: &mut Swarm<Behaviour>,
    ) -> (bool, bool) {
        let addr = listen(listener).await;
        let target = *listener.local_peer_id();
        let dialer_id = *dialer.local_peer_id();
        dialer
            .dial(addr.with(libp2p::multiaddr::Protocol::P2p(target)))
            .unwrap();
        let mut listener_saw = false;
        let deadline = tokio::time::sleep(Duration::from_secs(10));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                ev = dialer.select_next_some() => match ev {
                    SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == target => {
                        // give the listener a moment to report its side
                        let settle = tokio::time::sleep(Duration::from_millis(200));
                        tokio::pin!(settle);
                        loop {
                            tokio::select! {
                                ev = listener.select_next_some() => if let SwarmEvent::ConnectionEstablished { peer_id, .. } = ev {
                                    listener_saw |= peer_id == dialer_id;
                                },
                                _ = dialer.select_next_some() => {}
                                _ = &mut settle => return (true, listener_saw),
                            }
                        }
                    }
                    SwarmEvent::OutgoingConnectionError { .. } => return (false, listener_saw),
                    _ => {}
                },
                ev = listener.select_next_some() => if let SwarmEvent::ConnectionEstablished { peer_id, .. } = ev {
                    listener_saw |= peer_id == dialer_id;
                },
                _ = &mut deadline => panic!("dial outcome not decided within 10 s"),
            }
        }
    }

    #[tokio::test]
    async fn same_key_is_admitted() {
        let key = ClusterKey::generate();
        let (mut a, mut b) = (node(&key), node(&key));
        assert_eq!(dial_outcome(&mut a, &mut b).await, (true, true));
    }

    #[tokio::test]
    async fn other_key_is_refused_on_both_sides() {
        let mut a = node(&ClusterKey::generate());
        let mut b = node(&ClusterKey::generate());
        assert_eq!(dial_outcome(&mut a, &mut b).await, (false, false));
        assert!(!a.is_connected(&PeerId::random()));
    }

    #[tokio::test]
    async fn during_a_rotation_either_key_is_admitted_and_after_it_only_the_new_one() {
        let (old, new) = (ClusterKey::generate(), ClusterKey::generate());
        let both = KeyRing::from(old.clone());
        both.stage(new.clone());
        let mut rotating = holding(both.clone());
        assert_eq!(
            dial_outcome(&mut rotating, &mut node(&old)).await,
            (true, true)
        );
        let mut rotating = holding(both.clone());
        assert_eq!(
            dial_outcome(&mut node(&new), &mut rotating).await,
            (true, true)
        );
        assert_eq!(
            both.settle(new.id()).unwrap(),
            crate::keyring::Settled::Promoted
        );
        let mut rotated = holding(both);
        assert_eq!(
            dial_outcome(&mut rotated, &mut node(&old)).await,
            (false, false)
        );
    }
}
