//! Which connections the status server keeps: a pure ledger of open connections by source
//! address. A source may hold at most `per_source` connections and the server at most `total`;
//! when the server is full, a newcomer from a source holding fewer connections than the
//! largest holder takes that holder's oldest connection. So one address (or a few) opening
//! thousands of idle sockets can never starve a monitoring client that opens one, and nothing
//! grows with what the attacker sends.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

/// A connection the ledger admitted, named by arrival order.
pub type ConnectionId = u64;

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Serve it as `id`.
    Admit(ConnectionId),
    /// Serve it as `id` after closing `evict`, the oldest connection of the largest holder.
    AdmitEvicting {
        id: ConnectionId,
        evict: ConnectionId,
    },
    /// Close it at once: its source holds its share already.
    Refuse,
}

/// The open connections by source.
#[derive(Debug)]
pub struct Admission {
    total: usize,
    per_source: usize,
    open: HashMap<IpAddr, VecDeque<ConnectionId>>,
    count: usize,
    next: ConnectionId,
}

impl Admission {
    /// At most `total` connections, at most `per_source` from one address (both at least 1).
    pub fn new(total: usize, per_source: usize) -> Self {
        Self {
            total: total.max(1),
            per_source: per_source.clamp(1, total.max(1)),
            open: HashMap::new(),
            count: 0,
            next: 0,
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.count
    }

    /// Decides on a connection from `source` and records it when admitted (an evicted one is
    /// forgotten here; the caller closes it).
    pub fn arrive(&mut self, source: IpAddr) -> Decision {
        let held = self.open.get(&source).map_or(0, VecDeque::len);
        if held >= self.per_source {
            return Decision::Refuse;
        }
        let evict = if self.count >= self.total {
            let Some(victim) = self.largest_holder().filter(|(_, n)| *n > held + 1) else {
                return Decision::Refuse;
            };
            let evicted = self.remove_oldest(victim.0);
            Some(evicted)
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.open.entry(source).or_default().push_back(id);
        self.count += 1;
        match evict {
            Some(evict) => Decision::AdmitEvicting { id, evict },
            None => Decision::Admit(id),
        }
    }

    /// Forgets connection `id` of `source` when it ends (no-op if it was evicted already).
    pub fn leave(&mut self, source: IpAddr, id: ConnectionId) {
        let Some(ids) = self.open.get_mut(&source) else {
            return;
        };
        if let Some(at) = ids.iter().position(|&open| open == id) {
            ids.remove(at);
            self.count -= 1;
        }
        if ids.is_empty() {
            self.open.remove(&source);
        }
    }

    fn largest_holder(&self) -> Option<(IpAddr, usize)> {
        self.open
            .iter()
            .map(|(ip, ids)| (*ip, ids.len()))
            .max_by_key(|&(ip, n)| (n, std::cmp::Reverse(ip)))
    }

    fn remove_oldest(&mut self, source: IpAddr) -> ConnectionId {
        let ids = self
            .open
            .get_mut(&source)
            .expect("the largest holder holds connections");
        let oldest = ids
            .pop_front()
            .expect("the largest holder holds connections");
        self.count -= 1;
        if ids.is_empty() {
            self.open.remove(&source);
        }
        oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_source_gets_its_share_and_no_more() {
        let mut a = Admission::new(100, 3);
        for want in 0..3 {
            assert_eq!(a.arrive(ip(2)), Decision::Admit(want));
        }
        assert_eq!(a.arrive(ip(2)), Decision::Refuse);
        assert_eq!(a.arrive(ip(1)), Decision::Admit(3));
        a.leave(ip(2), 1);
        assert_eq!(a.open(), 3);
        assert_eq!(a.arrive(ip(2)), Decision::Admit(4));
    }

    #[test]
    fn when_full_a_small_holder_takes_the_largest_holders_oldest_connection() {
        let mut a = Admission::new(4, 4);
        for _ in 0..4 {
            a.arrive(ip(2));
        }
        assert_eq!(a.arrive(ip(1)), Decision::AdmitEvicting { id: 4, evict: 0 });
        assert_eq!(a.open(), 4);
        // The evicted connection's own end is a no-op.
        a.leave(ip(2), 0);
        assert_eq!(a.open(), 4);
        // 127.0.0.1 holds 1, 127.0.0.2 holds 3: a second one still evicts (3 > 2).
        assert_eq!(a.arrive(ip(1)), Decision::AdmitEvicting { id: 5, evict: 1 });
        // Now 2 and 2: a third would make it 3 against 1, so it is refused.
        assert_eq!(a.arrive(ip(1)), Decision::Refuse);
        // The largest holder cannot evict itself either.
        assert_eq!(a.arrive(ip(2)), Decision::Refuse);
    }

    #[test]
    fn thousands_of_arrivals_keep_the_ledger_bounded() {
        let mut a = Admission::new(16, 8);
        for n in 0..10_000u32 {
            a.arrive(ip((n % 4) as u8 + 2));
        }
        assert_eq!(a.open(), 16);
        assert!(a.open.values().all(|ids| ids.len() == 4));
        assert!(matches!(a.arrive(ip(1)), Decision::AdmitEvicting { .. }));
        // With as many sources as places, everyone holds one: a newcomer waits for a place.
        let mut a = Admission::new(16, 8);
        for n in 0..10_000u32 {
            a.arrive(ip((n % 200) as u8 + 2));
        }
        assert_eq!(a.open(), 16);
        assert_eq!(a.arrive(ip(1)), Decision::Refuse);
    }
}
