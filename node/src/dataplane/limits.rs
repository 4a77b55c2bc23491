//! Bounds of the data-plane server against peers that hold the key and misbehave, or just
//! never finish: connections in total and per peer, and links parked for epochs nobody takes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::PeerId;

/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one peer may hold at once (a plan's links plus fetches and checkpoint copies).
pub const MAX_PER_PEER: usize = 64;
/// Links parked at most, waiting for the trainer to take them.
pub const MAX_PARKED: usize = 512;
/// How long a parked link waits to be taken before it is closed.
pub const PARK_TTL: Duration = Duration::from_secs(120);
/// How many epochs ahead of the plan in force a link may be for (a peer may apply the next
/// plan before this node does; nobody is further ahead).
pub const MAX_EPOCHS_AHEAD: u64 = 2;

/// Connections per peer; a [`PeerSlot`] counts one until it is dropped.
#[derive(Clone, Default)]
pub struct PeerSlots {
    held: Arc<Mutex<HashMap<PeerId, usize>>>,
}

/// One connection of a peer, counted while it lives.
pub struct PeerSlot {
    slots: PeerSlots,
    peer: PeerId,
}

impl PeerSlots {
    /// A slot for one more connection of `peer`, unless it holds [`MAX_PER_PEER`] already.
    pub fn acquire(&self, peer: PeerId) -> Option<PeerSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(peer).or_default();
        if *n >= MAX_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            slots: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// Drops the parked links of epochs (`epoch_of` their key) before `current` and those parked
/// longer than [`PARK_TTL`] at `now`; values are `(parked at, ..)`.
pub fn expire_parked<K: Ord, V>(
    parked: &mut BTreeMap<K, (Instant, V)>,
    epoch_of: impl Fn(&K) -> u64,
    current: u64,
    now: Instant,
) {
    parked.retain(|k, (at, _)| {
        epoch_of(k) >= current && now.saturating_duration_since(*at) < PARK_TTL
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_share_and_dropped_slots_come_back() {
        let slots = PeerSlots::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        let held: Vec<PeerSlot> = (0..MAX_PER_PEER)
            .map(|_| slots.acquire(a).unwrap())
            .collect();
        assert!(slots.acquire(a).is_none(), "over its share");
        assert!(slots.acquire(b).is_some(), "another peer is not affected");
        drop(held);
        let again: Vec<PeerSlot> = (0..MAX_PER_PEER)
            .map(|_| slots.acquire(a).unwrap())
            .collect();
        assert_eq!(again.len(), MAX_PER_PEER, "every slot came back");
        assert!(slots.held.lock().unwrap().len() <= 2);
    }

    #[test]
    fn stale_and_old_parked_links_are_dropped() {
        let t0 = Instant::now();
        let mut parked: BTreeMap<(u64, u8), (Instant, &str)> = BTreeMap::new();
        parked.insert((3, 0), (t0, "old epoch"));
        parked.insert((4, 0), (t0, "current, fresh"));
        parked.insert((5, 0), (t0 - PARK_TTL, "next epoch, parked too long"));
        parked.insert((5, 1), (t0, "next epoch, fresh"));
        expire_parked(&mut parked, |k| k.0, 4, t0);
        let kept: Vec<&str> = parked.values().map(|(_, v)| *v).collect();
        assert_eq!(kept, ["current, fresh", "next epoch, fresh"]);
    }
}
