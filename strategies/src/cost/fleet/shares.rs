//! Uneven shares of the batch over zone pipelines of unequal kinds. Zone pipelines that run
//! the same micro-batches wait, every step, for the slowest kind's pipelines: with a 0.8x zone
//! beside a 1.5x one, the fast pipelines idle a third of the step. Giving each pipeline
//! micro-batches in proportion to its pace ends every pipeline's schedule at about the same
//! time; the stage bounds stay shared by every pipeline (so each stage's ring still all-reduces
//! one layer range), and since every sample's loss is weighted by its share of the global batch
//! the step's gradient is the same mean over the same samples (what the node trains with a
//! plan's `batch_shares`).

use super::{Fleet, Pipeline, SharedKey, ZoneGroup};
use crate::cost::analytic;
use crate::cost::links::Link;
use crate::cost::mixed;

impl Fleet {
    /// Samples per second of zone pipelines holding `groups` (every one split at `bounds`,
    /// zone `slowest`'s split), all-reducing over `ring`, when each pipeline runs its own
    /// number of micro-batches, and those numbers (one per pipeline, in the order of
    /// `groups`); `None` when the pipelines are of one pace or the batch has too few
    /// micro-batches to give each at least one.
    pub(super) fn shared_rate(
        &mut self,
        groups: &[ZoneGroup],
        slowest: usize,
        bounds: &[usize],
        ring: Link,
    ) -> Option<(f64, Vec<u32>)> {
        let d: u32 = groups.iter().map(|g| g.pipelines).sum();
        let total = (self.spec.global_batch / self.spec.micro_batch.max(1)).max(1);
        let one_pace = groups
            .iter()
            .all(|g| self.pace(g.z) == self.pace(groups[0].z));
        if one_pace || total < d {
            return None;
        }
        let p = (bounds.len() - 1) as u32;
        let key: SharedKey = (
            groups.iter().map(|g| (g.z, g.pipelines)).collect(),
            slowest,
            p,
        );
        if let Some(shared) = self.shared.get(&key) {
            return shared.clone();
        }
        let shared = self.balanced_rate(groups, slowest, bounds, ring, d, total);
        self.shared.insert(key, shared.clone());
        shared
    }

    /// [`Self::shared_rate`] unmemoised, for `total` micro-batches over `d` pipelines.
    fn balanced_rate(
        &mut self,
        groups: &[ZoneGroup],
        slowest: usize,
        bounds: &[usize],
        ring: Link,
        d: u32,
        total: u32,
    ) -> Option<(f64, Vec<u32>)> {
        let even = analytic::micro_batches(&self.spec, d);
        // Each zone's iteration grows about linearly in its micro-batches once past the
        // warm-up: its line through the even count (the schedule its even rate already ran)
        // and one more.
        let lines: Vec<(f64, f64)> = groups
            .iter()
            .map(|g| {
                let at = self.iteration_ms(g.z, slowest, bounds, d, ring, even)?;
                let next = self.iteration_ms(g.z, slowest, bounds, d, ring, even + 1)?;
                let slope = (next - at).max(f64::MIN_POSITIVE);
                Some((at - f64::from(even) * slope, slope))
            })
            .collect::<Option<_>>()?;
        let counts = balance(groups, &lines, total);
        // A zone's pipelines with fewer micro-batches end no later than its most loaded one.
        let mut worst = 0.0f64;
        for (g, m) in groups.iter().zip(&counts) {
            let top = m.iter().copied().max().unwrap_or(1);
            worst = worst.max(self.iteration_ms(g.z, slowest, bounds, d, ring, top)?);
        }
        let samples = f64::from(total * self.spec.micro_batch.max(1));
        Some((samples / (worst / 1000.0), counts.concat()))
    }

    /// One iteration of `d` zone pipelines on zone `z`'s device split at `bounds`, of which
    /// this one runs `m` micro-batches, ms (its schedule memoised by `m`).
    fn iteration_ms(
        &mut self,
        z: usize,
        slowest: usize,
        bounds: &[usize],
        d: u32,
        ring: Link,
        m: u32,
    ) -> Option<f64> {
        let p = (bounds.len() - 1) as u32;
        let stages = self.local_stages(z, slowest, bounds)?;
        let within = self.link(z, z);
        let ends = self.schedule_of(Pipeline::Local { z, slowest, p }, &stages, within, m);
        Some(mixed::iteration_after(
            &self.spec,
            &stages,
            &ends,
            d,
            ring.mib_per_ms(),
        ))
    }
}

/// Micro-batches per pipeline of each group, `total` in all, at least one each, so that the
/// latest end on each group's line `(intercept, slope)` is as early as whole micro-batches
/// allow: the continuous balance rounded down, then the rest one at a time to the pipeline that
/// would end soonest with it. A group's pipelines are alike, so each group is kept as `m`
/// micro-batches for some of them and `m + 1` for the `extra` others: O(groups) a move.
fn balance(groups: &[ZoneGroup], lines: &[(f64, f64)], total: u32) -> Vec<Vec<u32>> {
    let inverse: f64 = groups
        .iter()
        .zip(lines)
        .map(|(g, (_, slope))| f64::from(g.pipelines) / slope)
        .sum();
    let offset: f64 = groups
        .iter()
        .zip(lines)
        .map(|(g, (at, slope))| f64::from(g.pipelines) * at / slope)
        .sum();
    let end = (f64::from(total) + offset) / inverse;
    // (m, extra) per group.
    let mut state: Vec<(u32, u32)> = lines
        .iter()
        .map(|(at, slope)| (((end - at) / slope).floor().max(1.0) as u32, 0))
        .collect();
    let ends = |g: usize, m: u32| lines[g].0 + f64::from(m) * lines[g].1;
    let count = |state: &[(u32, u32)]| -> u64 {
        groups
            .iter()
            .zip(state)
            .map(|(g, (m, extra))| u64::from(g.pipelines) * u64::from(*m) + u64::from(*extra))
            .sum()
    };
    let mut sum = count(&state);
    while sum < u64::from(total) {
        // One more micro-batch for a pipeline at `m`: it ends at `m + 1`.
        let Some(g) = (0..groups.len())
            .min_by(|&a, &b| ends(a, state[a].0 + 1).total_cmp(&ends(b, state[b].0 + 1)))
        else {
            break;
        };
        let (m, extra) = &mut state[g];
        *extra += 1;
        if *extra == groups[g].pipelines {
            (*m, *extra) = (*m + 1, 0);
        }
        sum += 1;
    }
    while sum > u64::from(total) {
        // One fewer for the latest-ending pipeline that has more than one.
        let top = |(m, extra): (u32, u32)| if extra > 0 { m + 1 } else { m };
        let Some(g) = (0..groups.len())
            .filter(|&g| top(state[g]) > 1)
            .max_by(|&a, &b| ends(a, top(state[a])).total_cmp(&ends(b, top(state[b]))))
        else {
            break;
        };
        let (m, extra) = &mut state[g];
        if *extra > 0 {
            *extra -= 1;
        } else {
            (*m, *extra) = (*m - 1, groups[g].pipelines - 1);
        }
        sum -= 1;
    }
    groups
        .iter()
        .zip(state)
        .map(|(g, (m, extra))| {
            (0..g.pipelines)
                .map(|i| if i < extra { m + 1 } else { m })
                .collect()
        })
        .collect()
}

/// Samples of a global batch of `batch` for each pipeline, in proportion to the micro-batches
/// a placement gives it (the largest remainders rounded up), summing to `batch`: what a plan's
/// pipelines train. Empty (an even cut) when the batch has fewer samples than pipelines.
pub fn batch_shares(micro_batches: &[u32], batch: u32) -> Vec<u32> {
    let total: u64 = micro_batches.iter().map(|&m| u64::from(m)).sum();
    if total == 0 || (batch as usize) < micro_batches.len() {
        return Vec::new();
    }
    let exact: Vec<u64> = micro_batches
        .iter()
        .map(|&m| u64::from(batch) * u64::from(m))
        .collect();
    let mut shares: Vec<u32> = exact.iter().map(|e| (e / total) as u32).collect();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(exact[i] % total), i));
    let short = batch - shares.iter().sum::<u32>();
    for &i in order.iter().take(short as usize) {
        shares[i] += 1;
    }
    // Every pipeline trains a sample: one taken from the largest share for any left at none.
    while let Some(empty) = shares.iter().position(|&s| s == 0) {
        let largest = (0..shares.len())
            .max_by_key(|&i| shares[i])
            .unwrap_or(empty);
        shares[largest] -= 1;
        shares[empty] += 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_shared_in_proportion_to_micro_batches() {
        assert_eq!(batch_shares(&[16, 16, 8], 40), vec![16, 16, 8]);
        assert_eq!(batch_shares(&[2, 1], 128), vec![85, 43]);
        assert_eq!(batch_shares(&[3, 3, 3], 10), vec![4, 3, 3]);
        assert_eq!(batch_shares(&[100, 1], 4), vec![3, 1]);
        assert!(batch_shares(&[1, 1, 1], 2).is_empty());
    }

    #[test]
    fn a_twice_as_fast_zone_takes_twice_the_micro_batches() {
        let groups = [
            ZoneGroup { z: 0, pipelines: 2 },
            ZoneGroup { z: 1, pipelines: 1 },
        ];
        // Zone 0 takes 1 ms a micro-batch, zone 1 2 ms, both after a 3 ms warm-up.
        let counts = balance(&groups, &[(3.0, 1.0), (3.0, 2.0)], 40);
        assert_eq!(counts, vec![vec![16, 16], vec![8]]);
        let counts = balance(&groups, &[(3.0, 1.0), (3.0, 2.0)], 41);
        assert_eq!(counts.iter().flatten().sum::<u32>(), 41);
        assert_eq!(
            counts[1],
            vec![8],
            "the extra one goes where it ends soonest"
        );
    }

    #[test]
    fn every_pipeline_keeps_a_micro_batch() {
        let groups = [
            ZoneGroup { z: 0, pipelines: 1 },
            ZoneGroup { z: 1, pipelines: 3 },
        ];
        let counts = balance(&groups, &[(0.0, 1.0), (0.0, 100.0)], 6);
        assert_eq!(counts, vec![vec![3], vec![1, 1, 1]]);
    }
}
