//! Lanes: slices of one micro-batch trained at the same time, each on its own CPU thread.
//!
//! Burn's CPU kernels use a second core poorly (measured on the `small` GPT: forward + backward of
//! a batch of 8 took 1.49 s on two threads and 1.70 s on one), while two slices of 4, each on a
//! single-threaded pool of its own, took 0.85 s together. So a stage cuts every micro-batch along
//! its first dimension into one slice per core, runs every slice through its own autodiff graph,
//! and sums the slices' parameter gradients. The loss of a slice is a mean over its examples
//! ([`crate::PipelineModel::loss`]), so slice `k` is weighted by its share of the examples.
//!
//! Work that is not cut (a micro-batch too small to pay for lanes, one lane) runs whole on a
//! pool of as many threads as the caller's rayon pool, or on the caller's thread when that is
//! one. Every thread of these pools flushes denormal floats to zero
//! (FTZ/DAZ): as a model trains, attention probabilities and gradients drift into the
//! subnormal range, where x86 arithmetic takes microcode assists, and a `small` GPT node's
//! step grew from 1.8 s to 3.9 s within 30 steps, nearly all of it in GEMM; with the flags set
//! it stays at 2.1-2.5 s. The caller's thread has the flags only while it runs such work; the global
//! rayon pool is left as it is.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{ModelError, Result};

/// Pools shared by every stage of the process: single-threaded ones, one per lane, and
/// multi-threaded ones by thread count.
static POOLS: Mutex<Pools> = Mutex::new(Pools {
    narrow: Vec::new(),
    wide: Vec::new(),
});

struct Pools {
    narrow: Vec<Arc<ThreadPool>>,
    wide: Vec<(usize, Arc<ThreadPool>)>,
}

/// A pool of `threads` threads that flush denormals to zero for as long as they live.
fn flushing_pool(threads: usize, name: String) -> Result<Arc<ThreadPool>> {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |k| format!("{name}-{k}"))
        .spawn_handler(|thread| {
            let mut b = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                b = b.name(name.to_owned());
            }
            if let Some(size) = thread.stack_size() {
                b = b.stack_size(size);
            }
            // SAFETY: the flags are this worker thread's own and stay set for its whole life;
            // only Burn's kernels run here.
            b.spawn(move || unsafe { no_denormals::no_denormals(|| thread.run()) })?;
            Ok(())
        })
        .build()
        .map(Arc::new)
        .map_err(|e| ModelError::InvalidConfig(format!("cannot start lane threads: {e}")))
}

/// The most lanes (and stage threads) a stage starts, whatever it is configured with.
pub const MAX_LANES: usize = 256;

/// The lane count a stage uses by default: one per thread of the current rayon pool (set it
/// with `RAYON_NUM_THREADS`; processes that share cores run one lane).
pub fn default_lanes() -> usize {
    rayon::current_num_threads().max(1)
}

/// The smallest estimated forward work of a slice, in FLOPs, worth a lane of its own. Handing
/// a slice to a lane costs tens of microseconds (measured on the `tiny` GPT, whose micro-batches
/// are ~1 MFLOP: 5.6 ms per step whole, 8 ms cut into two lanes), so slices must be well above
/// that: 5e7 FLOPs take about a millisecond on one core.
pub const DEFAULT_LANE_MIN_FLOPS: f64 = 5e7;

/// The forward work of `examples` examples of `positions` positions each through a stage of
/// `params` parameters, estimated as a dense layer's `2 x params` per position.
fn forward_flops(params: usize, positions: usize, examples: usize) -> f64 {
    2.0 * params as f64 * positions as f64 * examples as f64
}

/// How many examples each lane takes of a micro-batch of `batch` examples of `positions`
/// positions each: at most `lanes` slices, each worth at least `min_flops` of forward work
/// through a stage of `params` parameters; as even as possible, never an empty slice.
pub(crate) fn split_sizes(
    batch: usize,
    lanes: usize,
    params: usize,
    positions: usize,
    min_flops: f64,
) -> Vec<usize> {
    let total = forward_flops(params, positions, batch);
    let worth = if min_flops > 0.0 {
        (total / min_flops).floor().min(usize::MAX as f64) as usize
    } else {
        usize::MAX
    };
    let lanes = lanes.min(worth).clamp(1, batch.max(1));
    (0..lanes)
        .map(|k| batch / lanes + usize::from(k < batch % lanes))
        .collect()
}

/// The lane pools of one stage.
#[derive(Clone)]
pub(crate) struct Lanes {
    /// One single-threaded pool per lane (empty with one lane).
    narrow: Vec<Arc<ThreadPool>>,
    /// A multi-threaded pool for work that is not cut.
    wide: Arc<ThreadPool>,
}

impl Lanes {
    /// `n` lanes, and a wide pool of `threads` threads (each at most [`MAX_LANES`]).
    pub(crate) fn new(n: usize, threads: usize) -> Result<Self> {
        let (n, threads) = (n.clamp(1, MAX_LANES), threads.clamp(1, MAX_LANES));
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        let wide = match pools.wide.iter().find(|(t, _)| *t == threads) {
            Some((_, pool)) => pool.clone(),
            None => {
                let pool = flushing_pool(threads, format!("parcae-stage{threads}"))?;
                pools.wide.push((threads, pool.clone()));
                pool
            }
        };
        while n > 1 && pools.narrow.len() < n {
            let k = pools.narrow.len();
            pools
                .narrow
                .push(flushing_pool(1, format!("parcae-lane{k}"))?);
        }
        let narrow = if n > 1 {
            pools.narrow[..n].to_vec()
        } else {
            Vec::new()
        };
        Ok(Self { narrow, wide })
    }

    /// How many slices a micro-batch may be cut into.
    pub(crate) fn count(&self) -> usize {
        self.narrow.len().max(1)
    }

    /// The first `n` of these lanes (work too small to spread runs on fewer); the wide pool
    /// stays.
    pub(crate) fn at_most(&self, n: usize) -> Lanes {
        let n = if n <= 1 { 0 } else { n.min(self.narrow.len()) };
        Self {
            narrow: self.narrow[..n].to_vec(),
            wide: self.wide.clone(),
        }
    }

    /// Runs job `k` on lane `k`, all at once, and returns their results in order; there must be
    /// no more jobs than lanes. A single job runs on the wide pool. The lanes' threads live as
    /// long as the process: a call hands them work, it starts none.
    pub(crate) fn run<T: Send>(&self, jobs: Vec<impl FnOnce() -> T + Send>) -> Vec<T> {
        if jobs.len() <= 1 || self.narrow.is_empty() {
            return jobs.into_iter().map(|job| self.run_whole(job)).collect();
        }
        debug_assert!(jobs.len() <= self.narrow.len());
        let slots: Vec<Mutex<Option<T>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        spread(&self.narrow, jobs.into_iter().zip(&slots).collect());
        slots
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every lane ran its job")
            })
            .collect()
    }

    /// Runs `job` whole: on the calling thread when the wide pool has one thread and so has the
    /// caller's rayon pool, else on the wide pool. Handing one thread's work to another thread
    /// only adds two wake-ups, and where many processes share the cores each waits in the run
    /// queue: 32 emulated nodes on two cores spent milliseconds per operation there, more than
    /// the emulated GPU's time for it at a time scale of 4. Denormals are flushed as on the
    /// pools' threads, so the numbers are the same either way.
    fn run_whole<T: Send>(&self, job: impl FnOnce() -> T + Send) -> T {
        if self.wide.current_num_threads() == 1 && rayon::current_num_threads() == 1 {
            // SAFETY: the flags are set on this thread for the job only and restored when it
            // returns or unwinds; only Burn's kernels run in it. The job is an opaque indirect
            // call: inlined, its arithmetic could be scheduled before the flags are set (the
            // compiler does not order floating-point work against them).
            let job: Box<dyn FnOnce() -> T + Send + '_> = Box::new(job);
            unsafe { no_denormals::no_denormals(|| std::hint::black_box(job)()) }
        } else {
            self.wide.install(job)
        }
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

/// Queues the last job on its lane's pool, recurses for the others, and runs the first on lane
/// 0's pool; returns when every job has run (a job's panic is raised here).
fn spread<T: Send, J: FnOnce() -> T + Send>(
    pools: &[Arc<ThreadPool>],
    mut jobs: Vec<(J, &Mutex<Option<T>>)>,
) {
    let Some((job, slot)) = jobs.pop() else {
        return;
    };
    let pool = &pools[jobs.len()];
    let store = move |value| *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
    if jobs.is_empty() {
        store(pool.install(job));
        return;
    }
    pool.in_place_scope(|scope| {
        scope.spawn(move |_| store(job()));
        spread(pools, jobs);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_batch_evenly() {
        let any = |batch, lanes| split_sizes(batch, lanes, 1, 1, 0.0);
        assert_eq!(any(8, 2), [4, 4]);
        assert_eq!(any(7, 3), [3, 2, 2]);
        assert_eq!(any(2, 4), [1, 1]);
        assert_eq!(any(5, 1), [5]);
        assert_eq!(any(3, 0), [3]);
    }

    #[test]
    fn small_slices_stay_whole() {
        // The tiny GPT's stage (15k parameters, 16 positions): 4 examples are 2 MFLOP.
        assert_eq!(split_sizes(4, 2, 15_000, 16, DEFAULT_LANE_MIN_FLOPS), [4]);
        // The small GPT (23M parameters, 128 positions): one example is 6 GFLOP.
        assert_eq!(
            split_sizes(8, 2, 23_000_000, 128, DEFAULT_LANE_MIN_FLOPS),
            [4, 4]
        );
        // Enough work for two slices of the three lanes.
        assert_eq!(split_sizes(4, 3, 1_000, 10_000, 3e7), [2, 2]);
    }

    #[test]
    fn jobs_run_on_their_own_single_threaded_pools_in_order() {
        let lanes = Lanes::new(3, 2).unwrap();
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
    fn lane_threads_flush_denormals_and_the_caller_does_not() {
        let half_of_smallest =
            || std::hint::black_box(f32::MIN_POSITIVE) * std::hint::black_box(0.5f32);
        assert!(half_of_smallest() > 0.0, "the test thread keeps denormals");
        for n in [1, 2] {
            let lanes = Lanes::new(n, 2).unwrap();
            let out = lanes.run((0..n).map(|_| half_of_smallest).collect());
            assert!(out.iter().all(|v| *v == 0.0), "{n} lane(s): {out:?}");
            let wide = lanes.run(vec![|| rayon::broadcast(|_| half_of_smallest())]);
            assert!(wide[0].iter().all(|v| *v == 0.0), "wide pool: {wide:?}");
        }
        assert!(half_of_smallest() > 0.0);
    }

    #[test]
    fn one_thread_s_work_runs_on_the_caller_with_denormals_flushed() {
        let half_of_smallest =
            || std::hint::black_box(f32::MIN_POSITIVE) * std::hint::black_box(0.5f32);
        let caller = ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let lanes = Lanes::new(1, 1).unwrap();
        let (here, ran_on, flushed, kept_after) = caller.install(|| {
            let here = std::thread::current().id();
            let out = lanes.run(vec![|| (std::thread::current().id(), half_of_smallest())]);
            (here, out[0].0, out[0].1, half_of_smallest())
        });
        assert_eq!(ran_on, here, "no hand-off to another thread");
        assert_eq!(flushed, 0.0);
        assert!(kept_after > 0.0, "the caller's own flags are restored");
        // A caller with more threads hands the work to the wide pool.
        let wide = ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (here, ran_on) = wide.install(|| {
            let out = lanes.run(vec![|| std::thread::current().id()]);
            (std::thread::current().id(), out[0])
        });
        assert_ne!(ran_on, here);
    }

    #[test]
    fn map_keeps_the_order_of_items() {
        for n in [1, 2, 3] {
            let lanes = Lanes::new(n, 1).unwrap();
            assert_eq!(
                lanes.map((0..7).collect(), |i: u32| i * 10),
                [0, 10, 20, 30, 40, 50, 60]
            );
            assert_eq!(lanes.map(Vec::<u32>::new(), |i| i), Vec::<u32>::new());
        }
    }
}
