//! The scenarios of a migration event: which active nodes of each old stage an event's
//! preemptions hit, as per-stage loss vectors with their probabilities. Enumerated exactly with
//! their hypergeometric weights when there are few, sampled with a seeded generator otherwise.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;

use crate::config::ParallelConfig;

/// Loss vectors are enumerated exactly up to this many, sampled beyond.
const EXACT_SCENARIOS: u64 = 600;
/// Monte Carlo samples per event when scenarios are many.
const SAMPLES: usize = 400;

/// Per-stage active-node losses of one scenario, with its probability.
#[derive(Clone, Debug)]
pub(super) struct Scenario {
    pub(super) weight: f64,
    pub(super) lost: Vec<u32>,
    /// The most any stage lost: every stage keeps at least `d - most_lost` replicas.
    pub(super) most_lost: u32,
}

impl Scenario {
    fn new(weight: f64, lost: Vec<u32>) -> Self {
        let most_lost = lost.iter().copied().max().unwrap_or(0);
        Self {
            weight,
            lost,
            most_lost,
        }
    }
}

/// Binomial coefficient as a float (exact for the sizes used here).
pub(crate) fn choose(n: u32, k: u32) -> f64 {
    if k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, i| acc * f64::from(n - i) / f64::from(i + 1))
}

/// Number of loss vectors over `groups` groups of `size` plus `spares`, summing to `r`.
fn count_vectors(groups: u32, size: u32, spares: u32, r: u32) -> u64 {
    let mut ways = vec![0u64; r as usize + 1];
    for k in 0..=spares.min(r) {
        ways[k as usize] = 1;
    }
    for _ in 0..groups {
        let mut next = vec![0u64; r as usize + 1];
        for (t, &w) in ways.iter().enumerate() {
            if w == 0 {
                continue;
            }
            for k in 0..=size.min(r - t as u32) {
                let i = t + k as usize;
                next[i] = next[i].saturating_add(w);
            }
        }
        ways = next;
    }
    ways[r as usize]
}

/// The scenarios of `removed` preemptions among `nodes` alive running `from`.
pub(super) fn build_scenarios(
    nodes: u32,
    from: ParallelConfig,
    removed: u32,
    seed: u64,
) -> Vec<Scenario> {
    let (d, p) = (from.d, from.p);
    let r = removed.min(nodes);
    if p == 0 || r == 0 {
        return vec![Scenario::new(1.0, vec![0; p as usize])];
    }
    let spares = nodes.saturating_sub(d * p);
    if count_vectors(p, d, spares, r) <= EXACT_SCENARIOS {
        let total = choose(nodes, r);
        let mut out = Vec::new();
        let mut lost = vec![0u32; p as usize];
        enumerate(0, r, d, spares, 1.0 / total, &mut lost, &mut out);
        return out;
    }
    sample_scenarios(nodes, from, r, seed)
}

fn enumerate(
    stage: usize,
    left: u32,
    d: u32,
    spares: u32,
    w: f64,
    lost: &mut Vec<u32>,
    out: &mut Vec<Scenario>,
) {
    if stage == lost.len() {
        if left <= spares {
            out.push(Scenario::new(w * choose(spares, left), lost.clone()));
        }
        return;
    }
    for k in 0..=d.min(left) {
        lost[stage] = k;
        enumerate(stage + 1, left - k, d, spares, w * choose(d, k), lost, out);
    }
    lost[stage] = 0;
}

fn sample_scenarios(nodes: u32, from: ParallelConfig, r: u32, seed: u64) -> Vec<Scenario> {
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for v in [nodes, from.d, from.p, r] {
        h = (h ^ u64::from(v)).wrapping_mul(0x1000_0000_01B3);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(h);
    let (d, p) = (from.d, from.p);
    let active = d * p;
    let mut counts: FxHashMap<Vec<u32>, usize> = FxHashMap::default();
    let mut pool: Vec<u32> = (0..nodes).collect();
    let stage_of: Vec<usize> = (0..active).map(|node| (node % p) as usize).collect();
    let mut lost = vec![0u32; p as usize];
    for _ in 0..SAMPLES {
        lost.fill(0);
        for i in 0..r as usize {
            let j = rng.random_range(i..pool.len());
            pool.swap(i, j);
            if let Some(&stage) = stage_of.get(pool[i] as usize) {
                lost[stage] += 1;
            }
        }
        match counts.get_mut(lost.as_slice()) {
            Some(n) => *n += 1,
            None => {
                counts.insert(lost.clone(), 1);
            }
        }
    }
    let mut out: Vec<Scenario> = counts
        .into_iter()
        .map(|(lost, n)| Scenario::new(n as f64 / SAMPLES as f64, lost))
        .collect();
    out.sort_by(|a, b| a.lost.cmp(&b.lost));
    out
}
