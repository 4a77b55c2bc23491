//! `liveput-predict`: Parcae as published (the simulator's `liveput-predict`), the same
//! optimizer on Parcae's ARIMA predictor of the recorded availability, nothing valued past the
//! horizon, its choice shrunk to the nodes present as Parcae does. The predictor keeps its
//! penalties and random draws across decisions, as Parcae's does, and forecasts once an
//! interval; a new leader's starts afresh.

use parcae_strategies::ParallelConfig;
use parcae_strategies::liveput::{LiveputOptimizer, Terminal};
use parcae_strategies::predict::{RulePredictor, SeriesModel};
use parcae_strategies::sim::job_bounds;

use super::{Situation, Strategy, look_ahead};
use crate::planner::forecast::{Forecast, IntervalForecast};
use crate::planner::settle::departing_members;

/// The strategy and what it remembers.
pub struct LiveputPredict {
    /// Parcae's predictor, made with the first cost model (its bounds are the smallest
    /// feasible configuration and the job's cluster size).
    arima: Option<IntervalForecast<RulePredictor>>,
    optimizer: Option<LiveputOptimizer>,
    seed: u64,
    max_nodes: u32,
    lookahead: usize,
    interval_secs: f64,
}

impl LiveputPredict {
    /// Looks `lookahead` intervals of `interval_secs` ahead; the predictor draws from `seed`
    /// and forecasts at most `max_nodes`.
    pub fn new(seed: u64, max_nodes: u32, lookahead: usize, interval_secs: f64) -> Self {
        Self {
            arima: None,
            optimizer: None,
            seed,
            max_nodes,
            lookahead,
            interval_secs,
        }
    }
}

impl Strategy for LiveputPredict {
    fn acts_on_notices(&self) -> bool {
        true
    }

    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig> {
        let (seed, bounds) = (self.seed, job_bounds(at.cost, self.max_nodes));
        let arima = self.arima.get_or_insert_with(|| {
            IntervalForecast::new(RulePredictor::new(SeriesModel::Arima, bounds, seed))
        });
        // The optimizer plans from the nodes before the upcoming event, as the simulator's does:
        // at a notice, those still here and those leaving.
        let forecast = Forecast {
            before: at.workers + departing_members(at.state, |_| true),
            future: arima.forecast(at.state, at.workers, self.lookahead),
            terminal: Terminal::default(),
            tables: Vec::new(),
        };
        Some(look_ahead(
            &mut self.optimizer,
            at,
            forecast,
            self.interval_secs,
        ))
    }
}
