//! Zone pipelines: every pipeline inside one zone, the zones filled in an order (the fastest
//! kind first, the fullest zone first, or where pools are priced the cheapest work first or one
//! pool alone), each pipeline on the slowest used kind's split, with uneven shares of the batch
//! where those train more.

use std::sync::Arc;

use super::{Fleet, MAX_POOLS, Pipeline, Placement, Stages, ZoneGroup, ZoneKey};
use crate::cost::links::Link;
use crate::cost::mixed;
use crate::cost::traffic::Pipelines;

/// Zone pipelines laid out but not yet priced for their egress.
struct Laid {
    rate: f64,
    pipelines: Vec<Pipelines>,
    bounds: Vec<usize>,
    /// Micro-batches per pipeline where uneven.
    micro: Option<Vec<u32>>,
}

impl Fleet {
    /// `d` pipelines of `p` stages, each inside one zone: filled from the fastest kind first,
    /// from the fullest zone first, or, where the pools are priced, from the cheapest work
    /// first (a node-hour's price times the model's pace) or in one pool alone, whichever the
    /// objective prefers.
    pub(super) fn zone_pipelines(
        &mut self,
        counts: &[u32],
        d: u32,
        p: u32,
    ) -> Option<Arc<Placement>> {
        let by_speed = self.by_speed(counts);
        let mut by_count: Vec<usize> = (0..counts.len()).collect();
        by_count.sort_by(|&a, &b| counts[b].cmp(&counts[a]));
        let mut orders = vec![by_speed, by_count];
        if let Some(usd) = &self.prices {
            let work = |z: usize| usd[z] * self.pace(z);
            let mut by_cost: Vec<usize> = (0..counts.len()).collect();
            by_cost.sort_by(|&a, &b| work(a).total_cmp(&work(b)).then(counts[b].cmp(&counts[a])));
            orders.push(by_cost);
            // Each pool alone: a pool is billed whole, so a configuration a small pool holds
            // may buy more per dollar there than in a larger one of the same price.
            orders.extend((0..counts.len()).map(|z| vec![z]));
        }
        let mut placed: Vec<Arc<Placement>> = Vec::new();
        for order in orders {
            let Some(per_zone) = fill(counts, &order, d, p) else {
                continue;
            };
            placed.extend(self.zone_placement(&order, &per_zone, p));
        }
        if self.prices.is_none() {
            // The fastest, the first on a tie.
            let fastest = placed.into_iter().reduce(|f, l| {
                if l.samples_per_sec > f.samples_per_sec {
                    l
                } else {
                    f
                }
            });
            return fastest;
        }
        self.best_of(placed.into_iter(), counts)
    }

    /// The zones fastest kind first, the fullest first among equals.
    pub(super) fn by_speed(&self, counts: &[u32]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..counts.len()).collect();
        order.sort_by(|&a, &b| {
            self.pace(a)
                .total_cmp(&self.pace(b))
                .then(counts[b].cmp(&counts[a]))
        });
        order
    }

    /// [`Self::filled`] with its egress priced (memoised: it depends on the zones in `order`
    /// that hold pipelines and on how many each holds, not on the rest of the composition).
    fn zone_placement(
        &mut self,
        order: &[usize],
        per_zone: &[u32],
        p: u32,
    ) -> Option<Arc<Placement>> {
        let mut key: ZoneKey = ([u8::MAX; MAX_POOLS], [0; MAX_POOLS], p);
        let used = order.iter().filter(|&&z| per_zone[z] > 0);
        for (slot, (&z, held)) in used.zip(&mut key.1).enumerate() {
            key.0[slot] = z as u8;
            *held = per_zone[z];
        }
        if let Some(placed) = self.zone_placed.get(&key) {
            return placed.clone();
        }
        let d = per_zone.iter().sum();
        let placed = self
            .filled(order, per_zone, d, p)
            .map(|l| Arc::new(self.placement(l.pipelines, l.bounds, (l.rate, d), l.micro, true)));
        self.zone_placed.insert(key, placed.clone());
        placed
    }

    /// `d` pipelines of `p` stages, `per_zone[z]` of them inside zone `z`, the zones taken in
    /// `order`: each on the slowest used kind's split, with uneven shares of the batch where
    /// those train more.
    fn filled(&mut self, order: &[usize], per_zone: &[u32], d: u32, p: u32) -> Option<Laid> {
        let used: Vec<usize> = order.iter().copied().filter(|&z| per_zone[z] > 0).collect();
        let slowest = *used
            .iter()
            .max_by(|&&a, &&b| self.pace(a).total_cmp(&self.pace(b)))?;
        let bounds = self.zone_split(slowest, p)?;
        // Each stage has per_zone[z] replicas in zone z: priced as the planner will run it (a
        // job whose steps stay in a zone on the slowest of the used zones' own links).
        let ring = match self.steps_in_zone {
            true => used
                .iter()
                .map(|&z| self.link(z, z))
                .min_by(|a, b| a.gbit_per_s.total_cmp(&b.gbit_per_s))?,
            false => self.table.reduction(per_zone, self.by_zone).link,
        };
        let mut rate = f64::INFINITY;
        for &z in &used {
            rate = rate.min(self.local_rate(z, slowest, &bounds, d, ring));
        }
        let groups: Vec<ZoneGroup> = used
            .iter()
            .map(|&z| ZoneGroup {
                z,
                pipelines: per_zone[z],
            })
            .collect();
        let mut micro = None;
        if let Some((shared, counts)) = self
            .shared_rate(&groups, slowest, &bounds, ring)
            .filter(|(shared, _)| *shared > rate)
        {
            (rate, micro) = (shared, Some(counts));
        }
        let pipelines = used
            .iter()
            .map(|&z| Pipelines {
                pools: vec![z; p as usize],
                count: per_zone[z],
            })
            .collect();
        Some(Laid {
            rate,
            pipelines,
            bounds,
            micro,
        })
    }

    /// Samples per second of `d` pipelines on zone `z`'s device split at `bounds` (zone
    /// `slowest`'s split), all-reducing over `ring` (memoised: a composition one node away
    /// lays out mostly the same pipelines).
    fn local_rate(
        &mut self,
        z: usize,
        slowest: usize,
        bounds: &[usize],
        d: u32,
        ring: Link,
    ) -> f64 {
        let p = (bounds.len() - 1) as u32;
        let key = (
            z,
            slowest,
            p,
            d,
            ring.gbit_per_s.to_bits(),
            ring.latency_ms.to_bits(),
        );
        if let Some(rate) = self.local_rates.get(&key) {
            return *rate;
        }
        let within = self.link(z, z);
        let rate = self.local_stages(z, slowest, bounds).map_or(0.0, |stages| {
            let pipeline = Pipeline::Local { z, slowest, p };
            self.scheduled_rate(pipeline, &stages, d, ring, within)
        });
        self.local_rates.insert(key, rate);
        rate
    }

    /// The stages of a zone pipeline on zone `z`'s device split at `bounds`, zone `slowest`'s
    /// split (memoised by the three: `None` where a stage does not fit).
    pub(super) fn local_stages(
        &mut self,
        z: usize,
        slowest: usize,
        bounds: &[usize],
    ) -> Option<Stages> {
        let p = (bounds.len() - 1) as u32;
        if let Some(stages) = self.local_stages.get(&(z, slowest, p)) {
            return stages.clone();
        }
        let devices = vec![&self.pools[z].device; p as usize];
        let stages: Option<Stages> = mixed::stages_of(&self.spec, &devices, bounds).map(Into::into);
        self.local_stages.insert((z, slowest, p), stages.clone());
        stages
    }
}

/// Pipelines per zone when `d` pipelines of `p` stages are filled in `order`, or `None` when
/// the zones do not hold them.
pub(super) fn fill(counts: &[u32], order: &[usize], d: u32, p: u32) -> Option<Vec<u32>> {
    let mut per_zone = vec![0; counts.len()];
    let mut left = d;
    for &z in order {
        let take = (counts[z] / p).min(left);
        per_zone[z] = take;
        left -= take;
    }
    (left == 0).then_some(per_zone)
}
