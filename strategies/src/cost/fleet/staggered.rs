//! Staggered pipelines over two zones. `d` pipelines that each hold `k_a` stages in zone `a`
//! and `k_b` in `b` need `d k_a` nodes of `a` and `d k_b` of `b`: 14 + 10 nodes hold no 3 x 8
//! so (4 + 4 needs 12 of `b`, 5 + 3 needs 15 of `a`), though 24 nodes are there. Staggered,
//! `m` pipelines hold the arranged `k_a + k_b` and the other `d - m` hold the same stage bounds
//! with the junction stage (the last of the first zone's block) moved into the second zone.
//! That stage's replicas then lie in both zones and its ring crosses the link between them;
//! every other stage's ring stays in one zone, where a zone-blind layout of the same nodes
//! crosses zones with every ring. Only the junction moves, so the bounds stay shared by every
//! pipeline, as a plan's are.

use std::sync::Arc;

use super::schedules::transfer_over;
use super::two_zones::fastest_by_bound;
use super::{Fleet, Pipeline, Placement, Shares, Staggered};
use crate::cost::analytic;
use crate::cost::mixed::{self, DeviceCosts};
use crate::cost::traffic::Pipelines;

impl Fleet {
    /// `d` staggered pipelines of `p` stages over two zones, for every share of the stages
    /// whose equal pipelines the counts do not hold but whose staggered ones they do; the
    /// fastest (the first share on a tie), unless it trains no more than `floor`. Priced in
    /// the order of a bound on their rate, as [`Self::mixed_pipelines`] does.
    pub(super) fn staggered_pipelines(
        &mut self,
        counts: &[u32],
        d: u32,
        p: u32,
        floor: f64,
    ) -> Option<Arc<Placement>> {
        if d < 2 {
            return None;
        }
        // Strictly faster than `floor`: on a tie the other layouts, whose rings all stay inside
        // a zone, are kept.
        let floor = floor.next_up();
        // The arranged shape's coarse bound is above the staggered pipelines' bound.
        let reach = floor / (1.0 + 1e-6);
        let micro = analytic::micro_batches(&self.spec, d);
        let mut candidates: Vec<(f64, usize, (Shares, u32))> = Vec::new();
        for shape in self.pair_shapes(p).iter() {
            let (k, rank, arranged) = (shape.k, shape.rank, &shape.arranged);
            let (first, second) = (arranged.order[0], arranged.order[p as usize - 1]);
            let Some(m) = arranged_pipelines(counts[first], counts[second], k[first], k[second], d)
            else {
                continue;
            };
            if shape.rate_above(&self.spec, d, micro) < reach {
                continue;
            }
            let Some(staggered) = self.staggered(&k) else {
                continue;
            };
            // Each shape's bound with every ring inside a zone is at least its own rate, and
            // the step waits for the slower shape with one ring across.
            let ring = arranged.ring.mib_per_ms();
            let transfer = transfer_over(arranged.boundary);
            let bound =
                |stages| mixed::samples_per_sec_bound(&self.spec, stages, d, ring, &transfer);
            let bound = bound(&arranged.stages).min(bound(&staggered.stages));
            candidates.push((bound, rank, (k, m)));
        }
        let (rate, (k, m)) =
            fastest_by_bound(candidates, floor, |(k, m)| self.staggered_rate(k, d, *m))?;
        let (arranged, staggered) = (self.arranged(&k)?, self.staggered(&k)?);
        let pipelines = vec![
            Pipelines {
                pools: arranged.order.clone(),
                count: m,
            },
            Pipelines {
                pools: staggered.order.clone(),
                count: d - m,
            },
        ];
        let bounds = arranged.bounds.clone();
        Some(Arc::new(self.placement(
            pipelines,
            bounds,
            (rate, d),
            None,
            true,
        )))
    }

    /// Samples per second of `d` pipelines of shares `k`, `m` of them arranged and the others
    /// staggered, each shape on its own schedule; the junction stage's `m` and `d - m` replicas
    /// all-reduce across the two zones (by zone where that is no slower).
    fn staggered_rate(&mut self, k: &Shares, d: u32, m: u32) -> Option<f64> {
        let (arranged, staggered) = (self.arranged(k)?, self.staggered(k)?);
        let first = self.schedule(Pipeline::Mixed(*k), &arranged.stages, arranged.boundary, d);
        let second = self.schedule(
            Pipeline::Staggered(*k),
            &staggered.stages,
            arranged.boundary,
            d,
        );
        let mut members = vec![0; self.pools.len()];
        members[arranged.order[0]] = m;
        members[staggered.order[staggered.junction]] = d - m;
        let across = self
            .table
            .reduction(&members, self.by_zone)
            .link
            .mib_per_ms();
        let within = arranged.ring.mib_per_ms();
        let ring = |s: usize| {
            if s == staggered.junction {
                across
            } else {
                within
            }
        };
        let shapes = [
            (arranged.stages.as_slice(), &first[..]),
            (staggered.stages.as_slice(), &second[..]),
        ];
        Some(mixed::rate_after_rings(&self.spec, &shapes, d, ring))
    }

    /// The staggered shape of shares `k` (memoised; `None` when the first zone holds a single
    /// stage or the junction stage does not fit the second zone's device).
    fn staggered(&mut self, k: &Shares) -> Option<Arc<Staggered>> {
        self.memoised(k, |fleet| &mut fleet.staggered, Self::stagger)
    }

    /// [`Self::staggered`], built.
    fn stagger(&mut self, k: &Shares) -> Option<Staggered> {
        let arranged = self.arranged(k)?;
        let (first, second) = (arranged.order[0], *arranged.order.last()?);
        let junction = k[first].checked_sub(1).filter(|&j| j > 0)?;
        let mut order = arranged.order.clone();
        order[junction] = second;
        let devices: Vec<&DeviceCosts> = order.iter().map(|&z| &self.pools[z].device).collect();
        let stages = mixed::stages_of(&self.spec, &devices, &arranged.bounds)?;
        Some(Staggered {
            order,
            stages,
            junction,
        })
    }
}

/// How many of `d` pipelines keep the arranged `k_first` stages in the first zone (the others
/// one fewer there and one more in the second) so that the first zone's `n_first` nodes and
/// the second's `n_second` hold them all: the most that fit, or `None` when equal pipelines
/// fit already, when the first zone has a single stage to give up, or when no count fits.
pub(super) fn arranged_pipelines(
    n_first: u32,
    n_second: u32,
    k_first: usize,
    k_second: usize,
    d: u32,
) -> Option<u32> {
    let (nf, ns, kf, ks, d) = (
        i64::from(n_first),
        i64::from(n_second),
        k_first as i64,
        k_second as i64,
        i64::from(d),
    );
    if kf < 2 || d < 2 || (d * kf <= nf && d * ks <= ns) {
        return None;
    }
    // m pipelines of kf + ks and d - m of (kf - 1) + (ks + 1).
    let most = (nf - d * (kf - 1)).min(d - 1);
    let least = (d * (ks + 1) - ns).max(1);
    (least <= most).then_some(most as u32)
}
