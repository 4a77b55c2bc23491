//! The least-pace split of a pipeline's layers over its stages, as a table: for every count of
//! stages `s` and of leading layers `j`, the slowest stage of the best split of those layers
//! over those stages. [`super::mixed::balanced_bounds`] reads one entry of it; a pipeline over
//! two device kinds joins a table of the first kind's leading stages to one of the second
//! kind's trailing stages ([`join`]), so that every way to share `p` stages between two kinds
//! costs two searches instead of one each.

use super::analytic::StageSums;
use super::spec::{LayerCost, ModelSpec};

/// One stage of a search: the device it runs on, and the micro-batches 1F1B keeps in flight
/// on it (the stages left to the pipeline's end, itself included).
#[derive(Clone, Copy)]
pub(crate) struct StageDevice<'a> {
    /// The job's layers timed on the stage's device, in the model's order.
    pub layers: &'a [LayerCost],
    /// The device's memory, MiB.
    pub memory_mb: f64,
    /// Micro-batches in flight on the stage.
    pub in_flight: usize,
}

/// The table of one split search. A search from the pipeline's end (`reversed`) counts its
/// stages and layers from the last.
pub(crate) struct Splits {
    /// Layers of the model, plus one: the length of a row.
    row: usize,
    reversed: bool,
    /// `slowest[s * row + j]`: the least pace of `s` stages holding the first `j` layers.
    slowest: Vec<f64>,
    /// `from[s * row + j]`: where stage `s - 1` starts in that split.
    from: Vec<usize>,
}

impl Splits {
    /// Searches the splits of the first `j` layers (the last `j` with `reversed`) over `s`
    /// stages, for `s` up to `stages` and `j` from `s` to `last(s)`; stage `i` (counted from the
    /// end with `reversed`) runs on `device(i)`. A dynamic program over the split points, each
    /// stage's sums grown one layer at a time.
    pub(crate) fn search<'a>(
        spec: &ModelSpec,
        stages: usize,
        reversed: bool,
        last: impl Fn(usize) -> usize,
        device: impl Fn(usize) -> StageDevice<'a>,
    ) -> Self {
        let layers = spec.layers.len();
        let row = layers + 1;
        let mut slowest = vec![f64::INFINITY; (stages + 1) * row];
        let mut from = vec![0usize; (stages + 1) * row];
        slowest[0] = 0.0;
        for s in 1..=stages {
            let on = device(s - 1);
            let layer = |pos: usize| {
                let at = if reversed { layers - 1 - pos } else { pos };
                on.layers.get(at)
            };
            for j in s..=last(s).min(layers) {
                // Stage s - 1 grows as its start `i` moves back, and a larger stage is never
                // faster nor smaller: once it does not fit, or is alone slower than the best
                // split found, no earlier start can do better. Ties go to the earliest start.
                let mut stage = StageSums::default();
                for i in (s - 1..j).rev() {
                    let Some(l) = layer(i) else {
                        break;
                    };
                    stage.add(l);
                    let Some(c) = stage.cost(spec, on.memory_mb, on.in_flight) else {
                        break;
                    };
                    let own = c.pace_ms();
                    let best = slowest[s * row + j];
                    if own > best {
                        break;
                    }
                    let pace = slowest[(s - 1) * row + i].max(own);
                    if pace <= best && pace.is_finite() {
                        slowest[s * row + j] = pace;
                        from[s * row + j] = i;
                    }
                }
            }
        }
        Self {
            row,
            reversed,
            slowest,
            from,
        }
    }

    /// The least pace of `s` stages holding the first (or last) `j` layers; infinite where no
    /// split fits or none was searched.
    pub(crate) fn pace(&self, s: usize, j: usize) -> f64 {
        if j >= self.row {
            return f64::INFINITY;
        }
        self.slowest
            .get(s * self.row + j)
            .copied()
            .unwrap_or(f64::INFINITY)
    }

    /// The stage bounds of that split, as layer indices of the model, ascending.
    pub(crate) fn bounds(&self, s: usize, j: usize) -> Vec<usize> {
        let mut positions = vec![j];
        let mut at = j;
        for stage in (1..=s).rev() {
            at = self.from[stage * self.row + at];
            positions.push(at);
        }
        if self.reversed {
            let layers = self.row - 1;
            positions.iter().map(|&pos| layers - pos).collect()
        } else {
            positions.reverse();
            positions
        }
    }
}

/// The best pipeline of `k_head` stages searched by `heads` (from the pipeline's start)
/// followed by `k_tail` stages searched by `tails` (from its end): its slowest stage's pace and
/// its bounds, the fewest layers in the head on a tie; `None` when no split fits.
pub(crate) fn join(
    heads: &Splits,
    k_head: usize,
    tails: &Splits,
    k_tail: usize,
) -> Option<(f64, Vec<usize>)> {
    let layers = heads.row - 1;
    if k_head == 0 || k_tail == 0 || k_head + k_tail > layers || tails.row != heads.row {
        return None;
    }
    let mut best: Option<(f64, usize)> = None;
    for j in k_head..=layers - k_tail {
        let pace = heads.pace(k_head, j).max(tails.pace(k_tail, layers - j));
        if pace.is_finite() && best.is_none_or(|(b, _)| pace < b) {
            best = Some((pace, j));
        }
    }
    let (pace, j) = best?;
    let mut bounds = heads.bounds(k_head, j);
    bounds.extend(tails.bounds(k_tail, layers - j).into_iter().skip(1));
    Some((pace, bounds))
}
