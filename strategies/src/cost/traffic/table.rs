//! The links between a fleet's pools by index, so pricing a placement compares no names.

use parcae_pool::Pool;

use crate::cost::links::{Link, Links};

/// The links between every pair of a fleet's pools (zones, or `ZONE/TYPE`), by the pools'
/// indices.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkTable {
    pools: usize,
    /// `links[a * pools + b]`: the link between pools `a` and `b`.
    links: Vec<Link>,
    /// `crosses[a * pools + b]`: whether `a` and `b` lie in two zones (traffic between them is
    /// billed).
    crosses: Vec<bool>,
    /// Each pool's place in the pools' order (by zone, then instance type): a ring visits its
    /// members in it, so each zone's members are neighbours.
    rank: Vec<usize>,
}

impl LinkTable {
    /// The links of `links` between `pools`.
    pub fn new(links: &Links, pools: &[Pool]) -> Self {
        let n = pools.len();
        let mut table = Self {
            pools: n,
            links: Vec::with_capacity(n * n),
            crosses: Vec::with_capacity(n * n),
            rank: vec![0; n],
        };
        for a in pools {
            for b in pools {
                table.links.push(links.between(a.zone(), b.zone()));
                table.crosses.push(!a.shares_zone(b));
            }
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| &pools[i]);
        for (place, i) in order.into_iter().enumerate() {
            table.rank[i] = place;
        }
        table
    }

    /// Pool `p`'s place in the pools' order (a ring visits its members in it).
    pub fn rank(&self, p: usize) -> usize {
        self.rank[p]
    }

    /// How many pools the table joins.
    pub fn pools(&self) -> usize {
        self.pools
    }

    /// The link between pools `a` and `b`.
    pub fn link(&self, a: usize, b: usize) -> Link {
        self.links[a * self.pools + b]
    }

    /// Whether traffic between pools `a` and `b` leaves a zone.
    pub fn crosses(&self, a: usize, b: usize) -> bool {
        self.crosses[a * self.pools + b]
    }
}
