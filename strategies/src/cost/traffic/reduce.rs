//! How one stage's replicas all-reduce, priced: a flat ring over them all (at the pace of its
//! slowest link, each crossing of a zone carrying `2 (w - 1) / w` of the buffer), or by zone
//! (a ring inside each zone, then each zone's shards exchanged in a ring over the zones:
//! each zone sends `2 (Z - 1) / Z` of the buffer to the next, spread over its replicas). By
//! zone is chosen where its time is no longer than the flat ring's; it never sends more
//! across zones.
//!
//! Both are priced by their bytes at their links' rates; each step's latency is added to the
//! time of a reduction, not to the choice between them.

use parcae_pool::AllReduce;

use super::table::LinkTable;
use crate::cost::links::Link;

/// The zones of a stage's replicas, in the ring's order: a pool of each (where they cross
/// zones), the replicas in it, and the slowest link inside it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ZoneGroup {
    pool: usize,
    replicas: u32,
    within: Link,
}

/// How a stage's replicas all-reduce.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduction {
    /// Which all-reduce.
    pub kind: AllReduce,
    /// The link whose flat ring takes as long: the slowest of the flat ring's, or for a
    /// reduction by zone the rate moving `2 (w - 1) / w` of the buffer in its time (latency and
    /// price the slowest crossing's).
    pub link: Link,
    /// Replicas.
    replicas: u32,
    /// The pools in the flat ring's order with their replicas.
    order: Vec<(usize, u32)>,
    /// The zones in the ring's order.
    zones: Vec<ZoneGroup>,
    /// The slowest link between neighbouring zones of the ring over zones.
    across: Link,
}

impl LinkTable {
    /// How replicas `members[p]` in each pool `p` all-reduce: by zone where `by_zone` allows it
    /// and it is no slower, else in one ring.
    pub fn reduction(&self, members: &[u32], by_zone: bool) -> Reduction {
        let mut order: Vec<(usize, u32)> = (0..members.len())
            .filter(|&p| members[p] > 0)
            .map(|p| (p, members[p]))
            .collect();
        order.sort_by_key(|&(p, _)| self.rank(p));
        let replicas = order.iter().map(|o| o.1).sum();
        let mut zones: Vec<ZoneGroup> = Vec::new();
        for &(p, n) in &order {
            match zones.last_mut() {
                Some(z) if !self.crosses(z.pool, p) => {
                    z.replicas += n;
                    z.within = slower(z.within, self.link(z.pool, p));
                }
                _ => zones.push(ZoneGroup {
                    pool: p,
                    replicas: n,
                    within: self.link(p, p),
                }),
            }
        }
        let across = (0..zones.len())
            .map(|i| self.link(zones[i].pool, zones[(i + 1) % zones.len()].pool))
            .reduce(slower)
            .unwrap_or(self.link(0, 0));
        let mut reduction = Reduction {
            kind: AllReduce::Ring,
            link: self.flat_ring_link(&order),
            replicas,
            order,
            zones,
            across,
        };
        if by_zone && reduction.zones.len() > 1 {
            let flat = reduction.flat_share() / reduction.link.gbit_per_s;
            let zoned = reduction.by_zone_secs_per_gbit();
            if zoned <= flat {
                reduction.kind = AllReduce::ByZone;
                reduction.link = Link {
                    gbit_per_s: reduction.flat_share() / zoned,
                    ..reduction.across
                };
            }
        }
        reduction
    }

    /// The slowest link of a flat ring over pools `order` (with their replicas).
    fn flat_ring_link(&self, order: &[(usize, u32)]) -> Link {
        let mut slowest: Option<Link> = None;
        for (i, &(p, n)) in order.iter().enumerate() {
            if n > 1 || order.len() == 1 {
                slowest = Some(slowest.map_or(self.link(p, p), |s| slower(s, self.link(p, p))));
            }
            if order.len() > 1 {
                let next = self.link(p, order[(i + 1) % order.len()].0);
                slowest = Some(slowest.map_or(next, |s| slower(s, next)));
            }
        }
        slowest.unwrap_or(self.link(0, 0))
    }
}

impl Reduction {
    /// The share of the buffer each replica of a flat ring sends, `2 (w - 1) / w`.
    fn flat_share(&self) -> f64 {
        share(self.replicas)
    }

    /// The time by zone per buffer byte, in units where a flat ring's is its share over its
    /// link's Gb/s: each zone's ring inside it, then every replica's part of the shards over
    /// the slowest crossing (the zone of fewest replicas holds the largest parts).
    fn by_zone_secs_per_gbit(&self) -> f64 {
        let inside = self
            .zones
            .iter()
            .map(|z| share(z.replicas) / z.within.gbit_per_s)
            .fold(0.0, f64::max);
        let fewest = self.zones.iter().map(|z| z.replicas).min().unwrap_or(1);
        by_zone_time(
            inside,
            self.zones.len() as u32,
            fewest,
            self.across.gbit_per_s,
        )
    }

    /// Time of an all-reduce of `bytes`, ms, each step's latency added.
    pub fn ms(&self, bytes: f64) -> f64 {
        let steps = |n: u32| f64::from(2 * n.saturating_sub(1));
        match self.kind {
            AllReduce::Ring if self.replicas > 1 => {
                self.link.transfer_ms(bytes * self.flat_share())
                    + self.link.latency_ms * (steps(self.replicas) - 1.0)
            }
            AllReduce::Ring => 0.0,
            AllReduce::ByZone => {
                let inside = self
                    .zones
                    .iter()
                    .map(|z| z.within.latency_ms * steps(z.replicas))
                    .fold(0.0, f64::max);
                let across = self.across.latency_ms * steps(self.zones.len() as u32);
                let rate = Link {
                    latency_ms: 0.0,
                    ..self.link
                };
                rate.transfer_ms(bytes * self.flat_share()) + inside + across
            }
        }
    }

    /// Bytes of an all-reduce of `bytes` sent from pool to pool where it leaves a zone:
    /// `(from, to, bytes)`.
    pub fn crossings(&self, bytes: f64) -> Vec<(usize, usize, f64)> {
        let mut out = Vec::new();
        match self.kind {
            AllReduce::Ring if self.order.len() > 1 => {
                let sent = bytes * self.flat_share();
                for (i, &(p, _)) in self.order.iter().enumerate() {
                    out.push((p, self.order[(i + 1) % self.order.len()].0, sent));
                }
            }
            AllReduce::Ring => {}
            AllReduce::ByZone => {
                let sent = bytes * share(self.zones.len() as u32);
                for (i, z) in self.zones.iter().enumerate() {
                    out.push((z.pool, self.zones[(i + 1) % self.zones.len()].pool, sent));
                }
            }
        }
        out
    }
}

/// The time of the all-reduce by zone per buffer byte, in units where a flat ring's is its
/// share over its rate: `inside` for the slowest zone's ring (its share over its rate), then
/// across `zones` zones at `across`, the zone of `fewest` replicas holding the largest parts.
pub fn by_zone_time(inside: f64, zones: u32, fewest: u32, across: f64) -> f64 {
    inside + share(zones) / f64::from(fewest.max(1)) / across
}

/// What each member of a ring of `n` sends of the buffer, `2 (n - 1) / n`.
pub fn share(n: u32) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    2.0 * f64::from(n - 1) / f64::from(n)
}

/// The slower of two links.
fn slower(a: Link, b: Link) -> Link {
    if b.gbit_per_s < a.gbit_per_s { b } else { a }
}
