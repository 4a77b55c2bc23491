//! What the wall clocks of directly connected peers read against this node's.
//!
//! A signed proposal's freshness is its age, and a notice's deadline a moment in time; both are
//! written on the sender's wall clock. Clocks of spot VMs are close, not equal, and a VM that
//! wakes from a long freeze may be minutes off, so reading another node's time on our own clock
//! would refuse its fresh proposals (or accept stale ones) and move its departure. Each side of a
//! new connection sends its clock (`ControlMessage::Clock`) over the connection itself, which
//! Noise authenticates: a peer speaks for its own clock only, and a relay for nobody's. Where a
//! signer's clock was never heard (a joining node reached only through a relay), our own clock
//! stands in for it.

use std::collections::HashMap;

use libp2p::PeerId;

/// Offsets of connected peers' clocks from ours, in milliseconds (theirs minus ours).
#[derive(Debug, Default)]
pub struct PeerClocks {
    offsets: HashMap<PeerId, i64>,
}

impl PeerClocks {
    /// `peer` said its clock read `their_ms` when ours read `my_ms` (the transit time, on a
    /// link that carries raft's heartbeats in milliseconds, is left in the offset).
    pub fn heard(&mut self, peer: PeerId, their_ms: u64, my_ms: u64) {
        let offset = i128::from(their_ms) - i128::from(my_ms);
        let offset = offset.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        self.offsets.insert(peer, offset);
    }

    /// The connection to `peer` closed: a new one brings a new reading.
    pub fn forget(&mut self, peer: &PeerId) {
        self.offsets.remove(peer);
    }

    /// The offset heard from `peer`, if any.
    pub fn offset(&self, peer: &PeerId) -> Option<i64> {
        self.offsets.get(peer).copied()
    }

    /// Our time `my_ms` read on `peer`'s clock (ours where it was never heard).
    pub fn their_now(&self, peer: &PeerId, my_ms: u64) -> u64 {
        let offset = self.offset(peer).unwrap_or(0);
        my_ms.saturating_add_signed(offset)
    }
}

/// Below this, a message's time of writing and of arrival are taken to agree: the transit of a
/// notice and NTP's error, not a skewed clock.
const CLOCKS_AGREE_MS: u64 = 1_000;

/// A deadline written on a sender's clock, moved onto ours. Where the time it was written and
/// the time it arrived agree (within [`CLOCKS_AGREE_MS`]) the deadline stands as written: it is
/// the cloud's own, and the clocks are the same. Otherwise it is the sender's own grace (its
/// deadline less the time it wrote the message, both on its clock) from the arrival; a deadline
/// before the message was written means "now".
pub fn local_deadline(deadline_ms: u64, written_ms: u64, received_ms: u64) -> u64 {
    if written_ms.abs_diff(received_ms) <= CLOCKS_AGREE_MS {
        return deadline_ms;
    }
    received_ms.saturating_add(deadline_ms.saturating_sub(written_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heard_clock_reads_our_time_on_theirs_until_forgotten() {
        let mut clocks = PeerClocks::default();
        let ahead = PeerId::random();
        let behind = PeerId::random();
        clocks.heard(ahead, 1_600_000, 1_000_000);
        clocks.heard(behind, 400_000, 1_000_000);
        assert_eq!(clocks.their_now(&ahead, 2_000_000), 2_600_000);
        assert_eq!(clocks.their_now(&behind, 2_000_000), 1_400_000);
        assert_eq!(clocks.their_now(&PeerId::random(), 2_000_000), 2_000_000);
        clocks.forget(&ahead);
        assert_eq!(clocks.their_now(&ahead, 2_000_000), 2_000_000);
        // A clock far behind ours cannot read before the epoch.
        clocks.heard(behind, 0, u64::MAX);
        assert_eq!(clocks.their_now(&behind, 5), 0);
    }

    #[test]
    fn a_deadline_keeps_the_senders_grace_whatever_its_clock() {
        // Written 10 minutes ahead of us with 90 s of grace: 90 s from receipt.
        assert_eq!(local_deadline(1_690_000, 1_600_000, 1_000_000), 1_090_000);
        // Written 10 minutes behind.
        assert_eq!(local_deadline(490_000, 400_000, 1_000_000), 1_090_000);
        // Already past when written.
        assert_eq!(local_deadline(100, 200, 1_000_000), 1_000_000);
        // Clocks that agree keep the deadline to the millisecond (20 ms in flight).
        assert_eq!(local_deadline(1_090_000, 1_000_000, 1_000_020), 1_090_000);
        assert_eq!(local_deadline(1_090_000, 1_001_000, 1_000_000), 1_090_000);
        assert_eq!(local_deadline(1_090_000, 1_001_001, 1_000_000), 1_088_999);
    }
}
