//! What a predictor is: what it is told at an interval boundary, what it answers, and the
//! node range that bounds its forecasts.

use crate::trace::Interval;

/// A preemption notice already received when a forecast is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticeAhead {
    /// Interval at whose start the noticed nodes disappear, counted from the upcoming one (0).
    pub offset: usize,
    /// How many nodes disappear then.
    pub nodes: u32,
}

/// What a predictor is told at an interval boundary.
#[derive(Clone, Copy, Debug)]
pub struct ForecastInput<'a> {
    /// Completed intervals, oldest first (the real past, also from before a simulation window).
    pub history: &'a [Interval],
    /// The index of `history[0]` among all intervals ever recorded: 0 for a whole history, more
    /// once a bounded record (the replicated state keeps the latest 4,096) dropped its oldest.
    /// Stateful predictors count intervals by it, so they go on consuming after the record is
    /// full and place the intervals on the clock the same way on every leader.
    pub first: usize,
    /// The node count of the upcoming interval when it is already known (the job's initial
    /// allocation at the very first interval). Parcae's rules use it during their warm-up.
    pub known_next: Option<u32>,
    /// Preemption notices received so far that fall in the forecast horizon.
    pub notices: &'a [NoticeAhead],
    /// Number of future intervals to forecast.
    pub horizon: usize,
}

/// Forecasts the next intervals' availability; implementations may keep state across calls.
pub trait Predictor {
    /// Forecast `input.horizon` intervals starting with the upcoming one; the result is
    /// consistent (`nodes[k] = nodes[k-1] + added[k] - removed[k]`, starting from the last
    /// history count).
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval>;
}

impl<P: Predictor + ?Sized> Predictor for Box<P> {
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
        (**self).forecast(input)
    }
}

impl<P: Predictor + ?Sized> Predictor for &mut P {
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
        (**self).forecast(input)
    }
}

/// The node range a job can use, which bounds forecasts: Parcae's 8 and 32 were the smallest
/// feasible and the requested cluster size of its GPT runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Fewest nodes the job is planned with.
    pub min_nodes: u32,
    /// Most nodes the job can have (its request).
    pub max_nodes: u32,
}

impl Bounds {
    /// Parcae's bounds (spec 1.2).
    pub const PARCAE: Bounds = Bounds {
        min_nodes: 8,
        max_nodes: 32,
    };

    /// `(min, max)` as signed counts, ordered even if the fields are swapped.
    pub(super) fn range(self) -> (i64, i64) {
        let (a, b) = (i64::from(self.min_nodes), i64::from(self.max_nodes));
        (a.min(b), a.max(b))
    }
}
