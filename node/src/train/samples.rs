//! Where a step's samples come from: the training split and its sampler, the held-out split,
//! and how a global batch is cut into pipelines' shares and micro-batches.

use std::ops::Range;
use std::sync::Arc;

use parcae_model::{Dataset, Sampler};

/// Where samples come from.
pub struct DataSource {
    /// The dataset (its training split when the job holds samples out).
    pub dataset: Arc<dyn Dataset>,
    /// Global sample index -> example.
    pub sampler: Sampler,
    /// The held-out samples the validation loss is measured on, if the job has them.
    pub validation: Option<Validation>,
}

/// Held-out samples and when pipeline 0 evaluates them.
pub struct Validation {
    /// The validation split: examples no step trains.
    pub dataset: Arc<dyn Dataset>,
    /// Its order; evaluations take its first `samples`, the same ones every time.
    pub sampler: Sampler,
    /// Steps that are multiples of this evaluate, after their training micro-batches.
    pub every: u64,
    /// Samples evaluated each time.
    pub samples: u32,
}

impl Validation {
    /// The held-out micro-batches of step `step` (none when it does not evaluate).
    pub fn micro_batches(&self, step: u64, micro_batch: u32) -> Vec<Range<u64>> {
        if self.every == 0 || !step.is_multiple_of(self.every) {
            return Vec::new();
        }
        micro_batches(0..u64::from(self.samples), micro_batch)
    }
}

/// The samples of pipeline `d`: the global batch cut into `D` contiguous shares, of
/// `shares[i]` samples for pipeline `i` where the plan gives them, else near-equal. Empty when
/// the shares are not one per pipeline summing to the batch.
pub fn pipeline_share(
    start: u64,
    batch: u32,
    (d, pipelines): (u32, u32),
    shares: &[u32],
) -> Range<u64> {
    if !shares.is_empty() {
        let sum: u64 = shares.iter().map(|&s| u64::from(s)).sum();
        if shares.len() != pipelines as usize || sum != u64::from(batch) {
            return start..start;
        }
        let first = start
            + shares[..d as usize]
                .iter()
                .map(|&s| u64::from(s))
                .sum::<u64>();
        return first..first + u64::from(shares[d as usize]);
    }
    let (base, extra) = (u64::from(batch / pipelines), u64::from(batch % pipelines));
    let d = u64::from(d);
    let first = start + d * base + d.min(extra);
    first..first + base + u64::from(d < extra)
}

/// A share cut into micro-batches of at most `size` samples.
pub fn micro_batches(share: Range<u64>, size: u32) -> Vec<Range<u64>> {
    let size = u64::from(size.max(1));
    (share.start..share.end)
        .step_by(size as usize)
        .map(|s| s..(s + size).min(share.end))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_batch_exactly_once() {
        for d in 1..6u32 {
            let shares: Vec<_> = (0..d)
                .map(|i| pipeline_share(100, 16, (i, d), &[]))
                .collect();
            assert_eq!(shares[0].start, 100);
            assert_eq!(shares.last().unwrap().end, 116);
            assert!(shares.windows(2).all(|w| w[0].end == w[1].start));
        }
        let uneven: Vec<_> = (0..3)
            .map(|i| pipeline_share(100, 16, (i, 3), &[8, 5, 3]))
            .collect();
        assert_eq!(uneven, vec![100..108, 108..113, 113..116]);
        for wrong in [&[8, 5][..], &[8, 5, 4]] {
            assert!(pipeline_share(100, 16, (0, 3), wrong).is_empty());
        }
        assert_eq!(
            micro_batches(0..5, 2),
            vec![0..2, 2..4, 4..5],
            "the last micro-batch takes the rest"
        );
    }
}
