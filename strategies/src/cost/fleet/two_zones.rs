//! Pipelines over two zones: each holds `k_a` stages in zone `a` and `k_b` in zone `b`, its
//! layers split unevenly over the two kinds from split searches shared by every `k` of a depth
//! ([`mixed::heads`], [`mixed::tails`]), priced only while a bound can beat the best found.

use std::sync::Arc;

use super::schedules::transfer_over;
use super::{Arranged, Fleet, MAX_POOLS, PairShape, Pipeline, Placement, Shares};
use crate::cost::analytic;
use crate::cost::links::Link;
use crate::cost::mixed::{self, DeviceCosts};
use crate::cost::split::Splits;
use crate::cost::traffic::Pipelines;

impl Fleet {
    /// `d` pipelines that each hold `k[z]` stages in zone `z`, for every such `k` over two
    /// zones that the counts allow; the fastest (the first of `pair_shares` on a tie), unless
    /// it trains less than `floor`. Pipelines over three zones or more are not tried: each more
    /// zone is one more boundary crossing and one more zone's preemptions on every pipeline,
    /// and the block orders and the splits grow as a power of the zones.
    ///
    /// The candidates are simulated in the order of a bound on their rate that needs no
    /// schedule ([`Self::mixed_bound`]), and no further once the bound cannot beat the best
    /// found; a coarser bound in O(1) ([`PairShape::rate_above`]) drops first those that
    /// cannot reach `floor`. What the counts allow is each zone's nodes per pipeline, so a
    /// composition one node away mostly finds the answer kept.
    pub(super) fn mixed_pipelines(
        &mut self,
        counts: &[u32],
        d: u32,
        p: u32,
        floor: f64,
    ) -> Option<Arc<Placement>> {
        let caps = caps_of(counts, d);
        let key = (caps, d, p);
        // The fastest of those that reached a lower floor is the fastest at `floor`, if it
        // reaches it.
        if let Some((_, found)) = self
            .mixed_found
            .get(&key)
            .filter(|(seen, _)| floor >= *seen)
        {
            return found
                .as_ref()
                .filter(|placed| placed.samples_per_sec >= floor)
                .cloned();
        }
        let found = self.fastest_mixed(&caps, d, p, floor).map(Arc::new);
        self.mixed_found.insert(key, (floor, found.clone()));
        found
    }

    /// [`Self::mixed_pipelines`] unmemoised, for `caps[z]` nodes of zone `z` per pipeline.
    fn fastest_mixed(
        &mut self,
        caps: &[u32; MAX_POOLS],
        d: u32,
        p: u32,
        floor: f64,
    ) -> Option<Placement> {
        let m = analytic::micro_batches(&self.spec, d);
        // The coarse bound sums the same times as the bound in another order.
        let reach = floor / (1.0 + 1e-6);
        let shapes = self.pair_shapes(p);
        let candidates: Vec<(f64, usize, &PairShape)> = shapes
            .iter()
            .filter(|s| fits(&s.k, caps))
            .filter(|s| s.rate_above(&self.spec, d, m) >= reach)
            .map(|s| (self.mixed_bound(&s.arranged, d), s.rank, s))
            .collect();
        let (rate, shape) = fastest_by_bound(candidates, floor, |s| {
            let a = &s.arranged;
            let pipeline = Pipeline::Mixed(s.k);
            Some(self.scheduled_rate(pipeline, &a.stages, d, a.ring, a.boundary))
        })?;
        let pipelines = vec![Pipelines {
            pools: shape.arranged.order.clone(),
            count: d,
        }];
        let bounds = shape.arranged.bounds.clone();
        Some(self.placement(pipelines, bounds, (rate, d), None, true))
    }

    /// At least the rate of `d` pipelines arranged as `a`, with no schedule simulated.
    fn mixed_bound(&self, a: &Arranged, d: u32) -> f64 {
        mixed::samples_per_sec_bound(
            &self.spec,
            &a.stages,
            d,
            a.ring.mib_per_ms(),
            &transfer_over(a.boundary),
        )
    }

    /// Every share of `p` stages over two zones whose pipeline can be arranged, with its rank
    /// among [`pair_shares`] (memoised by depth).
    pub(super) fn pair_shapes(&mut self, p: u32) -> Arc<[PairShape]> {
        if let Some(shapes) = self.pair_shapes.get(&p) {
            return shapes.clone();
        }
        let mut shapes = Vec::new();
        for (rank, k) in pair_shares(p as usize, self.pools.len()).enumerate() {
            if let Some(arranged) = self.arranged(&k) {
                shapes.push(PairShape::new(k, rank, arranged));
            }
        }
        let shapes: Arc<[PairShape]> = shapes.into();
        self.pair_shapes.insert(p, shapes.clone());
        shapes
    }

    /// The pipeline holding `k[z]` stages in zone `z`, over two zones (memoised: the same `k`
    /// recurs for many `d` and compositions).
    pub(super) fn arranged(&mut self, k: &Shares) -> Option<Arc<Arranged>> {
        self.memoised(k, |fleet| &mut fleet.arranged, Self::arrange)
    }

    /// [`Self::arranged`], searched: the two zones' blocks joined in the better order
    /// ([`mixed::arrange_two`]) from split searches shared by every `k` of the same depth.
    fn arrange(&mut self, k: &Shares) -> Option<Arranged> {
        let kinds: Vec<(usize, usize)> = k
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(z, &n)| (z, n))
            .collect();
        let [(a, ka), (b, kb)] = kinds[..] else {
            return None;
        };
        let p = ka + kb;
        let (heads_a, heads_b) = (self.heads(a, p), self.heads(b, p));
        let (tails_a, tails_b) = (self.tails(a), self.tails(b));
        let part = |heads, tails, stages| mixed::Part {
            heads,
            tails,
            stages,
        };
        let (a_first, bounds) =
            mixed::arrange_two(part(&heads_a, &tails_a, ka), part(&heads_b, &tails_b, kb))?;
        let (first, second) = if a_first {
            ((a, ka), (b, kb))
        } else {
            ((b, kb), (a, ka))
        };
        let order: Vec<usize> = std::iter::repeat_n(first.0, first.1)
            .chain(std::iter::repeat_n(second.0, second.1))
            .collect();
        let devices: Vec<&DeviceCosts> = order.iter().map(|&z| &self.pools[z].device).collect();
        let stages = mixed::stages_of(&self.spec, &devices, &bounds)?;
        // Each stage all-reduces inside its zone; the activations take every link between
        // neighbouring stages, the slowest pacing them.
        let between = |x: usize, y: usize| self.link(x, y);
        let slowest = |links: &mut dyn Iterator<Item = Link>| {
            links.min_by(|x, y| x.gbit_per_s.total_cmp(&y.gbit_per_s))
        };
        let ring = slowest(&mut [a, b].into_iter().map(|z| between(z, z)))?;
        let boundary = slowest(&mut order.windows(2).map(|w| between(w[0], w[1]))).unwrap_or(ring);
        Some(Arranged {
            order,
            bounds,
            stages,
            ring,
            boundary,
        })
    }

    /// Zone `z`'s device as the first block of a `p`-stage pipeline (memoised).
    fn heads(&mut self, z: usize, p: usize) -> Arc<Splits> {
        let (spec, device) = (&self.spec, &self.pools[z].device);
        self.heads
            .entry((z, p))
            .or_insert_with(|| Arc::new(mixed::heads(spec, device, p)))
            .clone()
    }

    /// Zone `z`'s device as the last block of a pipeline of any depth (memoised).
    fn tails(&mut self, z: usize) -> Arc<Splits> {
        let (spec, device) = (&self.spec, &self.pools[z].device);
        let stages = spec.depths.iter().max().map_or(0, |&p| p as usize);
        self.tails
            .entry(z)
            .or_insert_with(|| Arc::new(mixed::tails(spec, device, stages)))
            .clone()
    }
}

/// The fastest of `candidates` (a bound on each one's rate, its rank, the candidate) that
/// trains at least `floor`, the lower rank on a tie: priced by `rate` in the order of their
/// bounds, and no further once a bound cannot reach the best found.
pub(super) fn fastest_by_bound<K>(
    mut candidates: Vec<(f64, usize, K)>,
    floor: f64,
    mut rate: impl FnMut(&K) -> Option<f64>,
) -> Option<(f64, K)> {
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut best: Option<(f64, usize, K)> = None;
    for (bound, rank, k) in candidates {
        // The bound and the schedule sum the same times in other orders.
        let reach = bound * (1.0 + 1e-9);
        if reach < floor || best.as_ref().is_some_and(|(rate, ..)| reach < *rate) {
            break;
        }
        let Some(rate) = rate(&k) else {
            continue;
        };
        let better = best
            .as_ref()
            .is_none_or(|(b, r, _)| rate > *b || (rate == *b && rank < *r));
        if better {
            best = Some((rate, rank, k));
        }
    }
    best.filter(|(rate, ..)| *rate >= floor)
        .map(|(rate, _, k)| (rate, k))
}

/// Each zone's nodes per pipeline when `d` pipelines share the zones' `counts` (zero past the
/// fleet's zones).
pub(super) fn caps_of(counts: &[u32], d: u32) -> [u32; MAX_POOLS] {
    let mut caps = [0; MAX_POOLS];
    for (cap, &n) in caps.iter_mut().zip(counts) {
        *cap = n / d.max(1);
    }
    caps
}

/// Whether pipelines holding `k[z]` stages in zone `z` fit `caps[z]` nodes of it each.
pub(super) fn fits(k: &Shares, caps: &[u32; MAX_POOLS]) -> bool {
    k.iter().zip(caps).all(|(&k, &cap)| k <= cap as usize)
}

/// Every way to give `p` stages to two of `zones` zones (at most [`MAX_POOLS`]), at least one
/// each, pair by pair.
pub(super) fn pair_shares(p: usize, zones: usize) -> impl Iterator<Item = Shares> {
    let zones = zones.min(MAX_POOLS);
    (0..zones).flat_map(move |a| {
        (a + 1..zones).flat_map(move |b| {
            (1..p).map(move |ka| {
                let mut k = [0; MAX_POOLS];
                k[a] = ka;
                k[b] = p - ka;
                k
            })
        })
    })
}
