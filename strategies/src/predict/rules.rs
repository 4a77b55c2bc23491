//! Parcae's forecasting rules (spec 1.3) around a series model.
//!
//! Parcae does not trust its time-series model much: it cleans the history first (outliers,
//! turn points), bounds what the model may say (±3 nodes around the first step, the job's
//! `[min, max]`), damps large predicted moves once it has seen steep ramps, and when the model
//! predicts a flat line over a noisy history it injects Poisson preemptions so the optimizer
//! still plans for some churn. Every rule is a small function here; [`RulePredictor`] runs them
//! in the spec's order with either model.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};

use super::arima::Arima110;
use super::holt::HoltDamped;
use super::predictor::{Bounds, ForecastInput, Predictor};
use crate::trace::Interval;

/// The time-series model inside the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesModel {
    /// ARIMA(1,1,0) with drift (Parcae's default).
    Arima,
    /// Holt's damped additive trend (Parcae's "ES").
    Holt,
    /// The last count, unchanged (persistence; more accurate than either model on the p3
    /// trace, see `tests/predict_p3.rs`).
    Last,
}

impl SeriesModel {
    /// Every model.
    pub const ALL: [SeriesModel; 3] = [SeriesModel::Arima, SeriesModel::Holt, SeriesModel::Last];

    /// The model's name in predictor names (`arima`, `es`, `last`).
    pub fn name(self) -> &'static str {
        match self {
            SeriesModel::Arima => "arima",
            SeriesModel::Holt => "es",
            SeriesModel::Last => "last",
        }
    }

    /// Fits the model to `h` and forecasts `steps` levels.
    fn forecast(self, h: &[f64], steps: usize) -> Vec<f64> {
        match self {
            SeriesModel::Arima => Arima110::fit(h).forecast(h, steps),
            SeriesModel::Holt => HoltDamped::fit(h).forecast(steps),
            SeriesModel::Last => vec![h.last().copied().unwrap_or(0.0); steps],
        }
    }
}

/// Switches between Parcae's behaviour and corrections of its quirks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleConfig {
    /// Steps 2.. of the forecast stay within this many nodes of step 1 (Parcae: 3).
    pub grow_bound: u32,
    /// Keep damping penalties across calls once set (Parcae's quirk: true); false resets them
    /// to 1 before each forecast.
    pub sticky_penalties: bool,
    /// Clamp the counts to the job's bounds again after the penalties (Parcae: false).
    pub clamp_after_penalties: bool,
    /// Inject Poisson preemptions into flat forecasts of a noisy history (Parcae: true).
    pub poisson: bool,
}

impl RuleConfig {
    /// Exactly Parcae's rules.
    pub const PARCAE: RuleConfig = RuleConfig {
        grow_bound: 3,
        sticky_penalties: true,
        clamp_after_penalties: false,
        poisson: true,
    };
}

impl Default for RuleConfig {
    fn default() -> Self {
        Self::PARCAE
    }
}

/// History window W (intervals, the current one included) for horizon H: Parcae's table
/// (spec 1.2), and at least 7 for the horizons its code rejects.
pub fn history_window(horizon: usize) -> usize {
    let w = match horizon {
        14 => 17,
        7 => 8,
        5 => 10,
        h => h,
    };
    w.max(7)
}

/// Spikes and dips of up to 3 intervals that return to the same level are overwritten with
/// that level (widths 3, 2, 1 in turn, left to right, in place).
pub fn remove_outliers(h: &mut [i64]) {
    for width in (1..=3).rev() {
        for i in 0..h.len().saturating_sub(width + 1) {
            let level = h[i];
            if h[i + width + 1] == level && h[i + 1..=i + width].iter().all(|&v| v != level) {
                h[i + 1..=i + width].fill(level);
            }
        }
    }
}

/// If the series has an interior minimum below both ends (else maximum above both), every
/// value before its last occurrence becomes that extreme: only the trend after it remains.
pub fn flatten_turn_point(h: &mut [i64]) {
    let (Some(&l), Some(&r)) = (h.first(), h.last()) else {
        return;
    };
    let (min, max) = (
        h.iter().copied().min().unwrap_or(l),
        h.iter().copied().max().unwrap_or(l),
    );
    let extreme = if min < l.min(r) {
        min
    } else if max > l.max(r) {
        max
    } else {
        return;
    };
    if let Some(last) = h.iter().rposition(|&v| v == extreme) {
        h[..last].fill(extreme);
    }
}

/// The penalty a monotone ramp of `delta` nodes sets: 0.75 for 5-9 nodes, 0.5 for 10 or more.
fn ramp_penalty(delta: i64) -> Option<f64> {
    match delta {
        10.. => Some(0.5),
        5..=9 => Some(0.75),
        _ => None,
    }
}

/// Population standard deviation, variance and mean of `v`.
fn moments(v: &[f64]) -> (f64, f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (var.sqrt(), var, mean)
}

fn all_equal(v: &[i64]) -> bool {
    v.windows(2).all(|w| w[0] == w[1])
}

/// Parcae's predictor (spec 1.3) with a choice of series model; seeded, and stateful like
/// Parcae's (the damping penalties persist across calls).
#[derive(Clone, Debug)]
pub struct RulePredictor {
    model: SeriesModel,
    bounds: Bounds,
    config: RuleConfig,
    rng: ChaCha8Rng,
    in_penalty: f64,
    out_penalty: f64,
}

impl RulePredictor {
    /// Parcae's rules around `model`, clamping to the job's `bounds`, Poisson draws from `seed`.
    pub fn new(model: SeriesModel, bounds: Bounds, seed: u64) -> Self {
        Self::with_config(model, bounds, seed, RuleConfig::PARCAE)
    }

    /// [`RulePredictor::new`] with some of Parcae's quirks switched off.
    pub fn with_config(model: SeriesModel, bounds: Bounds, seed: u64, config: RuleConfig) -> Self {
        Self {
            model,
            bounds,
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            in_penalty: 1.0,
            out_penalty: 1.0,
        }
    }

    /// Current damping factors of predicted arrivals and preemptions.
    pub fn penalties(&self) -> (f64, f64) {
        (self.in_penalty, self.out_penalty)
    }

    /// Step 4: steep monotone ramps damp later forecasts in their direction.
    fn update_penalties(&mut self, h: &[i64]) {
        if !self.config.sticky_penalties {
            (self.in_penalty, self.out_penalty) = (1.0, 1.0);
        }
        let (Some(&last), Some(&min), Some(&max)) = (h.last(), h.iter().min(), h.iter().max())
        else {
            return;
        };
        if h.windows(2).all(|w| w[0] <= w[1])
            && let Some(p) = ramp_penalty(last - min)
        {
            self.in_penalty = p;
        }
        if h.windows(2).all(|w| w[0] >= w[1])
            && let Some(p) = ramp_penalty(max - last)
        {
            self.out_penalty = p;
        }
    }

    /// Step 6: steps 2.. within `grow_bound` of step 1, then all within the job's bounds.
    fn clamp(&self, y: &mut [i64]) {
        let (lo, hi) = self.bounds.range();
        let grow = i64::from(self.config.grow_bound);
        if let Some(&first) = y.first() {
            for v in y.iter_mut().skip(1) {
                *v = (*v)
                    .max(first.saturating_sub(grow))
                    .min(first.saturating_add(grow));
            }
        }
        for v in y.iter_mut() {
            *v = (*v).max(lo).min(hi);
        }
    }
}

impl Predictor for RulePredictor {
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
        let horizon = input.horizon;
        let history = input.history;
        let last = history.last().map_or(0, |i| i.nodes);
        let w = history_window(horizon);
        // Step 1: warm-up while the history is not longer than the window.
        if history.len() <= w {
            return warm_up(last, input.known_next, horizon);
        }
        let window = &history[history.len() - w..];
        let mut h: Vec<i64> = window.iter().map(|i| i64::from(i.nodes)).collect();
        remove_outliers(&mut h);
        flatten_turn_point(&mut h);
        self.update_penalties(&h);
        let last = i64::from(last);
        // Step 5: the model, unless the cleaned history is flat.
        let mut y: Vec<i64> = if all_equal(&h) {
            vec![last; horizon]
        } else {
            let hf: Vec<f64> = h.iter().map(|&v| v as f64).collect();
            self.model
                .forecast(&hf, horizon)
                .into_iter()
                .map(|v| v.round_ties_even() as i64)
                .collect()
        };
        self.clamp(&mut y);
        let mut added = vec![0i64; horizon];
        let mut removed = vec![0i64; horizon];
        // Step 7: a flat forecast of a noisy history still expects preemptions.
        if self.config.poisson && all_equal(&y) && !all_equal(&h) {
            let outs: Vec<f64> = window.iter().map(|i| f64::from(i.removed)).collect();
            let (std, var, mean) = moments(&outs);
            if let Ok(poisson) = Poisson::new(std.min(var).min(mean)) {
                for r in removed.iter_mut() {
                    *r += poisson.sample(&mut self.rng) as i64;
                }
            }
        }
        // Step 8: split the level forecast into arrivals and preemptions.
        let mut current = last;
        for ((&level, a), r) in y.iter().zip(added.iter_mut()).zip(removed.iter_mut()) {
            *a += (level - current).max(0);
            *r += (current - level).max(0);
            current = level;
        }
        // Step 9: damped moves, accumulated; step 10: re-derived events.
        let (lo, hi) = self.bounds.range();
        let mut current = last;
        let counts = added.iter().zip(&removed).map(|(&a, &r)| {
            let moved = current as f64 + a as f64 * self.in_penalty - r as f64 * self.out_penalty;
            let mut next = (moved.round_ties_even() as i64).max(0);
            if self.config.clamp_after_penalties {
                next = next.max(lo).min(hi);
            }
            current = next;
            next
        });
        intervals_from_counts(last, counts)
    }
}

/// Step 1: before enough history, the upcoming count if known (then flat), else the last one.
fn warm_up(last: u32, known_next: Option<u32>, horizon: usize) -> Vec<Interval> {
    let first = known_next.unwrap_or(last);
    intervals_from_counts(
        i64::from(last),
        std::iter::repeat_n(i64::from(first), horizon),
    )
}

/// Consistent intervals for successive counts after `start`: each step a pure arrival or a
/// pure preemption of the difference.
pub(crate) fn intervals_from_counts(
    start: i64,
    counts: impl IntoIterator<Item = i64>,
) -> Vec<Interval> {
    let clip = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    let mut prev = start;
    counts
        .into_iter()
        .map(|n| {
            let iv = Interval {
                nodes: clip(n),
                added: clip(n - prev),
                removed: clip(prev - n),
            };
            prev = n;
            iv
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outliers_of_up_to_three_intervals_are_removed() {
        let mut h = vec![10, 10, 14, 15, 13, 10, 10, 9, 10, 12, 12, 11, 12];
        remove_outliers(&mut h);
        assert_eq!(h, vec![10, 10, 10, 10, 10, 10, 10, 10, 10, 12, 12, 12, 12]);
        // A four-interval excursion is a real change, not an outlier.
        let mut h = vec![10, 14, 14, 14, 14, 10];
        remove_outliers(&mut h);
        assert_eq!(h, vec![10, 14, 14, 14, 14, 10]);
        // A step that does not return is kept.
        let mut h = vec![10, 12, 12, 12];
        remove_outliers(&mut h);
        assert_eq!(h, vec![10, 12, 12, 12]);
    }

    #[test]
    fn turn_points_keep_only_the_trend_after_them() {
        let mut h = vec![20, 18, 15, 16, 15, 17, 19];
        flatten_turn_point(&mut h);
        assert_eq!(h, vec![15, 15, 15, 15, 15, 17, 19]);
        let mut h = vec![20, 25, 24, 22, 21];
        flatten_turn_point(&mut h);
        assert_eq!(h, vec![25, 25, 24, 22, 21]);
        let mut h = vec![10, 12, 11, 14];
        flatten_turn_point(&mut h);
        assert_eq!(h, vec![10, 12, 11, 14], "no interior extreme");
    }

    #[test]
    fn window_follows_parcae_table() {
        let table = [
            (14, 17),
            (12, 12),
            (10, 10),
            (9, 9),
            (8, 8),
            (7, 8),
            (5, 10),
            (6, 7),
            (1, 7),
            (20, 20),
        ];
        for (h, w) in table {
            assert_eq!(history_window(h), w, "H = {h}");
        }
    }

    #[test]
    fn penalties_are_sticky_unless_configured() {
        let bounds = Bounds {
            min_nodes: 8,
            max_nodes: 32,
        };
        let mut p = RulePredictor::new(SeriesModel::Arima, bounds, 0);
        p.update_penalties(&[10, 11, 13, 16, 16, 17, 18, 21]);
        assert_eq!(p.penalties(), (0.5, 1.0));
        p.update_penalties(&[20, 20, 19, 18, 14]);
        assert_eq!(p.penalties(), (0.5, 0.75));
        p.update_penalties(&[20, 21, 20, 21]);
        assert_eq!(p.penalties(), (0.5, 0.75), "sticky");
        p.update_penalties(&[20, 20, 21, 27]);
        assert_eq!(
            p.penalties(),
            (0.75, 0.75),
            "a later 5-9 ramp sets 0.75 again"
        );
        let config = RuleConfig {
            sticky_penalties: false,
            ..RuleConfig::PARCAE
        };
        let mut p = RulePredictor::with_config(SeriesModel::Arima, bounds, 0, config);
        p.update_penalties(&[10, 20]);
        p.update_penalties(&[20, 21, 20]);
        assert_eq!(p.penalties(), (1.0, 1.0));
    }

    #[test]
    fn clamps_around_first_step_then_to_bounds() {
        let p = RulePredictor::new(
            SeriesModel::Arima,
            Bounds {
                min_nodes: 8,
                max_nodes: 32,
            },
            0,
        );
        let mut y = vec![20, 25, 14, 21];
        p.clamp(&mut y);
        assert_eq!(y, vec![20, 23, 17, 21]);
        let mut y = vec![31, 35, 36, 2];
        p.clamp(&mut y);
        assert_eq!(y, vec![31, 32, 32, 28]);
        let mut y = vec![3, 4, 5];
        p.clamp(&mut y);
        assert_eq!(y, vec![8, 8, 8]);
    }

    #[test]
    fn counts_become_consistent_intervals() {
        let iv = intervals_from_counts(10, [12, 12, 9]);
        assert_eq!(
            iv,
            vec![
                Interval {
                    nodes: 12,
                    added: 2,
                    removed: 0
                },
                Interval {
                    nodes: 12,
                    added: 0,
                    removed: 0
                },
                Interval {
                    nodes: 9,
                    added: 0,
                    removed: 3
                },
            ]
        );
    }
}
