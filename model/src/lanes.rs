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

/// The lane pools of one stage.
#[derive(Clone)]
pub(crate) struct Lanes {
    pools: Vec<Arc<ThreadPool>>,
}

impl Lanes {
    /// `n` lanes; with one, every job runs on the caller's thread and pool.
    pub(crate) fn new(n: usize) -> Result<Self> {
        if n <= 1 {
            return Ok(Self { pools: Vec::new() });
        }
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        while pools.len() < n {
            let k = pools.len();
            let pool = ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("parcae-lane-{k}"))
                .build()
                .map_err(|e| {
                    ModelError::InvalidConfig(format!("cannot start lane thread {k}: {e}"))
                })?;
            pools.push(Arc::new(pool));
        }
        Ok(Self {
            pools: pools[..n].to_vec(),
        })
    }

    /// How many slices a micro-batch is cut into.
    pub(crate) fn count(&self) -> usize {
        self.pools.len().max(1)
    }

    /// Runs job `k` on lane `k`, all at once, and returns their results in order; there must be
    /// no more jobs than lanes. A single job runs on the calling thread, with the caller's pool.
    pub(crate) fn run<T: Send>(&self, jobs: Vec<impl FnOnce() -> T + Send>) -> Vec<T> {
        if jobs.len() <= 1 || self.pools.is_empty() {
            return jobs.into_iter().map(|job| job()).collect();
        }
        debug_assert!(jobs.len() <= self.pools.len());
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .zip(&self.pools)
                .map(|(job, pool)| scope.spawn(move || pool.install(job)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    }

    /// Applies `f` to every item, the items dealt to the lanes in turn, and returns the results
    /// in the items' order.
    pub(crate) fn map<T: Send, U: Send>(&self, items: Vec<T>, f: impl Fn(T) -> U + Sync) -> Vec<U> {
        let lanes = self.count().min(items.len()).max(1);
        let mut dealt: Vec<Vec<(usize, T)>> = (0..lanes).map(|_| Vec::new()).collect();
        for (i, item) in items.into_iter().enumerate() {
            dealt[i % lanes].push((i, item));
        }
        let f = &f;
        let jobs: Vec<_> = dealt
            .into_iter()
            .map(|mine| move || mine.into_iter().map(|(i, t)| (i, f(t))).collect::<Vec<_>>())
            .collect();
        let mut out: Vec<(usize, U)> = self.run(jobs).into_iter().flatten().collect();
        out.sort_by_key(|(i, _)| *i);
        out.into_iter().map(|(_, u)| u).collect()
    }
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
        let lanes = Lanes::new(3).unwrap();
        assert_eq!(lanes.count(), 3);
        let jobs: Vec<_> = (0..3)
            .map(|k| move || (k, rayon::current_num_threads(), std::thread::current().id()))
            .collect();
        let out = lanes.run(jobs);
        assert_eq!(
            out.iter().map(|(k, n, _)| (*k, *n)).collect::<Vec<_>>(),
            [(0, 1), (1, 1), (2, 1)]
        );
        assert_ne!(out[0].2, out[1].2);
        assert_ne!(out[1].2, out[2].2);
    }

    #[test]
    fn map_keeps_the_order_of_items() {
        for n in [1, 2, 3] {
            let lanes = Lanes::new(n).unwrap();
            assert_eq!(
                lanes.map((0..7).collect(), |i: u32| i * 10),
                [0, 10, 20, 30, 40, 50, 60]
            );
            assert_eq!(lanes.map(Vec::<u32>::new(), |i| i), Vec::<u32>::new());
        }
    }
}
