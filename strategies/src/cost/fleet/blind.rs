//! The zone-blind planner's layout (Parcae's, run over every zone at once): the worst device's
//! split over the nodes in the order they joined, whatever their zone (a zone-ignorant system
//! ranks its workers by registration), and the ring over the zones those nodes are in; and the
//! zone-aware planner's packed layout, the same over the nodes taken zone by zone.

use std::collections::HashMap;
use std::sync::Arc;

use super::zone_pipelines::fill;
use super::{Fleet, MAX_COMPOSITIONS, Placement, Plans};
use crate::config::ParallelConfig;
use crate::cost::links::Link;
use crate::cost::mixed::{DeviceCosts, balanced_bounds};
use crate::cost::throughput::ThroughputTable;
use crate::cost::traffic::Pipelines;

impl Fleet {
    /// The zone-blind plans of the nodes whose zones (the fleet's indices) are `joined`, in the
    /// order they joined (memoised).
    pub fn blind_plans(&mut self, joined: &[u8]) -> Arc<Plans> {
        if let Some(plans) = self.blind_memo.get(joined) {
            return plans.clone();
        }
        if self.blind_memo.len() >= MAX_COMPOSITIONS {
            self.blind_memo.clear();
        }
        let zones = self.pools.len();
        let total = if joined.iter().all(|&z| usize::from(z) < zones) {
            joined.len() as u32
        } else {
            0
        };
        let mut splits: HashMap<u32, Option<Vec<usize>>> = HashMap::new();
        let plans = self.plans_of(total, |fleet, d, p| {
            let bounds = splits
                .entry(p)
                .or_insert_with(|| balanced_bounds(&fleet.spec, &vec![&fleet.worst; p as usize]))
                .clone()?;
            fleet.zone_blind(joined, bounds, (d, p), false)
        });
        self.blind_memo.insert(joined.into(), plans.clone());
        plans
    }

    /// `d` pipelines of `p` stages packed over the zones: the nodes of each zone in turn,
    /// fastest kind first, `p` at a time a pipeline, so that a pipeline spans two zones only
    /// where one zone's nodes run out; on the slowest used kind's split, priced as the
    /// zone-blind layout is, its rings by zone where that is no slower. What a zone-aware
    /// planner does where its zones' links are as good as one zone's and pipelines inside a
    /// zone would leave nodes idle.
    pub(super) fn packed_pipelines(
        &mut self,
        counts: &[u32],
        d: u32,
        p: u32,
    ) -> Option<Arc<Placement>> {
        let order = self.by_speed(counts);
        // Where whole pipelines fit inside the zones in this order, the zone pipelines are at
        // least as fast: the same nodes, their rings and activations on links no slower.
        if fill(counts, &order, d, p).is_some() {
            return None;
        }
        let packed: Vec<u8> = order
            .iter()
            .flat_map(|&z| std::iter::repeat_n(z as u8, counts[z] as usize))
            .take((d * p) as usize)
            .collect();
        let slowest = packed
            .iter()
            .map(|&z| usize::from(z))
            .max_by(|&a, &b| self.pace(a).total_cmp(&self.pace(b)))?;
        let bounds = self.zone_split(slowest, p)?;
        self.zone_blind(&packed, bounds, (d, p), true)
    }

    /// The zone-blind planner's `(d, p)` on the worst device's split `bounds`: the first `d p`
    /// nodes to join, `p` at a time a pipeline, paced by the slowest kind among them (its rings
    /// by zone where `by_zone` allows it and it is no slower).
    fn zone_blind(
        &mut self,
        joined: &[u8],
        bounds: Vec<usize>,
        (d, p): (u32, u32),
        by_zone: bool,
    ) -> Option<Arc<Placement>> {
        let slots: Vec<usize> = joined
            .get(..(d * p) as usize)?
            .iter()
            .map(|&z| usize::from(z))
            .collect();
        let mut present = slots.clone();
        present.sort_unstable();
        present.dedup();
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
        let link = match present.as_slice() {
            [_] => self.links.within,
            _ => self.slowest_ring_link(&present),
        };
        let mut rate = f64::INFINITY;
        for &z in &present {
            rate = rate.min(self.blind_rate(z, &bounds, d, link));
        }
        Some(Arc::new(self.placement(
            pipelines,
            bounds,
            (rate, d),
            None,
            by_zone,
        )))
    }

    /// Samples per second of `d` pipelines on zone `z`'s device split at `bounds`, their ring
    /// and activations over `link` (memoised by the zone, `d`, `p` and the link).
    fn blind_rate(&mut self, z: usize, bounds: &[usize], d: u32, link: Link) -> f64 {
        let p = (bounds.len() - 1) as u32;
        let key = (
            z,
            d,
            p,
            link.gbit_per_s.to_bits(),
            link.latency_ms.to_bits(),
        );
        if let Some(rate) = self.blind_rates.get(&key) {
            return *rate;
        }
        let devices = vec![&self.pools[z].device; p as usize];
        let rate = self.rate(&devices, bounds, d, link, link).unwrap_or(0.0);
        self.blind_rates.insert(key, rate);
        rate
    }

    /// The table of a cluster of `max_nodes` nodes of one `device` in one zone, split as the
    /// zone-aware planner splits a zone pipeline: what a planner of one zone (or one that
    /// believes its nodes alike) plans with.
    pub fn uniform_table(&self, device: &DeviceCosts, max_nodes: u32) -> ThroughputTable {
        let link = self.links.within;
        let mut rows = Vec::new();
        for &p in &self.spec.depths {
            let devices = vec![device; p as usize];
            let Some(bounds) = balanced_bounds(&self.spec, &devices) else {
                continue;
            };
            for d in 1..=max_nodes / p.max(1) {
                if !self.spec.admits(d, p) {
                    continue;
                }
                let rate = self.rate(&devices, &bounds, d, link, link);
                if let Some(rate) = rate {
                    rows.push((ParallelConfig::new(d, p), rate));
                }
            }
        }
        ThroughputTable::from_rows(rows)
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
