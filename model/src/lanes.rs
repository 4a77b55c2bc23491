//! Lanes: slices of one micro-batch trained at the same time, each on its own CPU thread.
//!
//! Burn's CPU kernels use a second core poorly (measured on the `small` GPT: forward + backward of
//! a batch of 8 took 1.49 s on two threads and 1.70 s on one), while two slices of 4, each on a
//! single-threaded pool of its own, took 0.85 s together. So a stage cuts every micro-batch along
//! its first dimension into one slice per core, runs every slice through its own autodiff graph,
//! and sums the slices' parameter gradients. The loss of a slice is a mean over its examples
//! ([`crate::PipelineModel::loss`]), so slice `k` is weighted by its share of the examples.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{ModelError, Result};

/// Single-threaded pools, one per lane, shared by every stage of the process.
static POOLS: Mutex<Vec<Arc<ThreadPool>>> = Mutex::new(Vec::new());

/// The lane count a stage uses by default: one per thread of the current rayon pool (set it
/// with `RAYON_NUM_THREADS`; processes that share cores run one lane).
pub fn default_lanes() -> usize {
    rayon::current_num_threads().max(1)
}

/// How many examples each lane takes of a micro-batch of `batch` examples: as even as possible,
/// never an empty lane.
pub(crate) fn split_sizes(batch: usize, lanes: usize) -> Vec<usize> {
    let lanes = lanes.clamp(1, batch.max(1));
    (0..lanes)
        .map(|k| batch / lanes + usize::from(k < batch % lanes))
        .collect()
}

fn pools(n: usize) -> Result<Vec<Arc<ThreadPool>>> {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    while pools.len() < n {
        let k = pools.len();
        let pool = ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(move |_| format!("parcae-lane-{k}"))
            .build()
            .map_err(|e| ModelError::InvalidConfig(format!("cannot start lane thread: {e}")))?;
        pools.push(Arc::new(pool));
    }
    Ok(pools[..n].to_vec())
}

/// Runs job `k` on lane `k`'s single-threaded pool, all at once, and returns their results in
/// order. A single job runs on the calling thread, with the caller's pool.
pub(crate) fn run<T: Send>(jobs: Vec<impl FnOnce() -> T + Send>) -> Result<Vec<T>> {
    if jobs.len() <= 1 {
        return Ok(jobs.into_iter().map(|job| job()).collect());
    }
    let pools = pools(jobs.len())?;
    Ok(std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .into_iter()
            .zip(&pools)
            .map(|(job, pool)| scope.spawn(move || pool.install(job)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_batch_evenly() {
        assert_eq!(split_sizes(8, 2), [4, 4]);
        assert_eq!(split_sizes(7, 3), [3, 2, 2]);
        assert_eq!(split_sizes(2, 4), [1, 1]);
        assert_eq!(split_sizes(5, 1), [5]);
        assert_eq!(split_sizes(3, 0), [3]);
    }

    #[test]
    fn jobs_run_on_their_own_single_threaded_pools_in_order() {
        let jobs: Vec<_> = (0..3)
            .map(|k| move || (k, rayon::current_num_threads()))
            .collect();
        assert_eq!(run(jobs).unwrap(), [(0, 1), (1, 1), (2, 1)]);
    }
}
