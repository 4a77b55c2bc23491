//! The zone-blind planner's layout (Parcae's, run over every zone at once): the worst device's
//! split, nodes taken from every zone present in turn, and the ring over the zones it spans.

use super::{Fleet, Placement};
use crate::cost::links::Link;
use crate::cost::mixed::balanced_bounds;
use crate::cost::traffic::Pipelines;

impl Fleet {
    /// The zone-blind planner's `(d, p)`: the worst device's split, nodes taken from every zone
    /// present in turn, paced by the slowest kind present.
    pub(super) fn zone_blind(&mut self, counts: &[u32], d: u32, p: u32) -> Option<Placement> {
        let present: Vec<usize> = (0..counts.len()).filter(|&z| counts[z] > 0).collect();
        if present.is_empty() || counts.iter().sum::<u32>() < d * p {
            return None;
        }
        let bounds = balanced_bounds(&self.spec, &vec![&self.worst; p as usize])?;
        let mut left = counts.to_vec();
        let mut slots = Vec::with_capacity((d * p) as usize);
        let mut turn = 0;
        while slots.len() < (d * p) as usize {
            let z = present[turn % present.len()];
            turn += 1;
            if left[z] > 0 {
                left[z] -= 1;
                slots.push(z);
            }
        }
        // Consecutive pipelines of one shape as one entry.
        let mut pipelines: Vec<Pipelines> = Vec::new();
        for pools in slots.chunks(p as usize) {
            match pipelines.last_mut() {
                Some(last) if last.pools == pools => last.count += 1,
                _ => pipelines.push(Pipelines {
                    pools: pools.to_vec(),
                    count: 1,
                }),
            }
        }
        let spans = present.len() > 1 && d * p > 1;
        let link = match present.as_slice() {
            [z] => self.link(*z, *z),
            _ => self.slowest_ring_link(&present),
        };
        let (ring, boundary) = if spans {
            (link, link)
        } else {
            (self.links.within, self.links.within)
        };
        let mut rate = f64::INFINITY;
        for &z in &present {
            let devices = vec![&self.zones[z].device; p as usize];
            rate = rate.min(
                self.rate(&devices, &bounds, d, ring, boundary)
                    .unwrap_or(0.0),
            );
        }
        Some(self.placement(pipelines, bounds, rate, d, None))
    }

    /// The slowest link of a ring over `zones` (each zone's own link when it is alone).
    pub(super) fn slowest_ring_link(&self, zones: &[usize]) -> Link {
        let mut links: Vec<Link> = (0..zones.len())
            .map(|i| self.link(zones[i], zones[(i + 1) % zones.len()]))
            .collect();
        links.sort_by(|a, b| a.gbit_per_s.total_cmp(&b.gbit_per_s));
        links.first().copied().unwrap_or(self.links.within)
    }
}
