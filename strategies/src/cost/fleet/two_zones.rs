//! Pipelines over two zones: each holds `k_a` stages in zone `a` and `k_b` in zone `b`, its
//! layers split unevenly over the two kinds from split searches shared by every `k` of a depth
//! ([`mixed::heads`], [`mixed::tails`]), priced only while a bound can beat the best found.

use std::sync::Arc;

use super::{Arranged, Fleet, MAX_ZONES, Pipeline, Placement, Shares, transfer_over};
use crate::cost::links::Link;
use crate::cost::mixed::{self, DeviceCosts};
use crate::cost::split::Splits;
use crate::cost::traffic::Pipelines;

impl Fleet {
    /// `d` pipelines that each hold `k[z]` stages in zone `z`, for every such `k` over two
    /// zones that the counts allow; the fastest (the first of `pair_splits` on a tie), unless
    /// it trains less than `floor`. Pipelines over three zones or more are not tried: each more
    /// zone is one more boundary crossing and one more zone's preemptions on every pipeline,
    /// and the block orders and the splits grow as a power of the zones.
    ///
    /// The candidates are simulated in the order of a bound on their rate that needs no
    /// schedule ([`Self::mixed_bound`]), and no further once the bound cannot beat the best
    /// found.
    pub(super) fn mixed_pipelines(
        &mut self,
        counts: &[u32],
        d: u32,
        p: u32,
        floor: f64,
    ) -> Option<Placement> {
        let candidates: Vec<(f64, usize, Shares)> = pair_splits(p as usize, counts, d)
            .into_iter()
            .enumerate()
            .filter_map(|(rank, k)| Some((self.mixed_bound(&k, d)?, rank, k)))
            .collect();
        let (rate, k) = fastest_by_bound(candidates, floor, |k| self.mixed_rate(k, d))?;
        let arranged = self.arranged(&k)?;
        let pipelines = vec![Pipelines {
            pools: arranged.order.clone(),
            count: d,
        }];
        Some(self.placement(pipelines, arranged.bounds.clone(), rate, d, None))
    }

    /// At least the rate of `d` pipelines holding `k[z]` stages in zone `z`, with no schedule
    /// simulated.
    fn mixed_bound(&mut self, k: &Shares, d: u32) -> Option<f64> {
        let a = self.arranged(k)?;
        let bound = mixed::samples_per_sec_bound(
            &self.spec,
            &a.stages,
            d,
            a.ring.mib_per_ms(),
            &transfer_over(a.boundary),
        );
        Some(bound)
    }

    /// Samples per second of `d` pipelines holding `k[z]` stages in zone `z` (its arrangement
    /// and schedule memoised: it depends on `k` and `d` alone, not on the rest of the
    /// composition).
    fn mixed_rate(&mut self, k: &Shares, d: u32) -> Option<f64> {
        let a = self.arranged(k)?;
        Some(self.scheduled_rate(Pipeline::Mixed(*k), &a.stages, d, a.ring, a.boundary))
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
        let devices: Vec<&DeviceCosts> = order.iter().map(|&z| &self.zones[z].device).collect();
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
        let (spec, device) = (&self.spec, &self.zones[z].device);
        self.heads
            .entry((z, p))
            .or_insert_with(|| Arc::new(mixed::heads(spec, device, p)))
            .clone()
    }

    /// Zone `z`'s device as the last block of a pipeline of any depth (memoised).
    fn tails(&mut self, z: usize) -> Arc<Splits> {
        let (spec, device) = (&self.spec, &self.zones[z].device);
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

/// Every way to give `p` stages to two zones, at least one each, such that `d` pipelines fit
/// the zones' `counts`: one stage count per zone, zero outside the pair.
pub(super) fn pair_splits(p: usize, counts: &[u32], d: u32) -> Vec<Shares> {
    let caps: Vec<usize> = counts.iter().map(|&n| (n / d.max(1)) as usize).collect();
    pair_shares(p, counts.len())
        .filter(|k| k.iter().zip(&caps).all(|(k, cap)| k <= cap))
        .collect()
}

/// Every way to give `p` stages to two of `zones` zones (at most [`MAX_ZONES`]), at least one
/// each, pair by pair.
pub(super) fn pair_shares(p: usize, zones: usize) -> impl Iterator<Item = Shares> {
    let zones = zones.min(MAX_ZONES);
    (0..zones).flat_map(move |a| {
        (a + 1..zones).flat_map(move |b| {
            (1..p).map(move |ka| {
                let mut k = [0; MAX_ZONES];
                k[a] = ka;
                k[b] = p - ka;
                k
            })
        })
    })
}
