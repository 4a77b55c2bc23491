//! How a configuration is chosen: one [`Strategy`] for each `[planner] strategy` (and a pinned
//! `[D, P]`), each owning what it remembers between decisions (the optimizer's memoised costs,
//! the predictor's state). A strategy sees only [`Situation`]: the replicated state and the
//! costs the nodes measured, so a new leader decides as the old one would have.

pub mod liveput;
pub mod pinned;
pub mod predict;
pub mod reactive;

use std::sync::Arc;

use parcae_consensus::ControlState;
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;
use parcae_strategies::liveput::{LiveputOptimizer, PlanState};

use super::forecast::{Forecast, ZonesAt};

/// What a strategy decides from.
pub struct Situation<'a> {
    /// The replicated state.
    pub state: &'a ControlState,
    /// The cost model the nodes measured.
    pub cost: &'a Arc<CostModel>,
    /// Workers present.
    pub workers: u32,
    /// The configuration in force (`ParallelConfig::IDLE` without a plan).
    pub running: ParallelConfig,
    /// Whether a plan is in force.
    pub planned: bool,
    /// Whether departures broke the plan in force.
    pub broken: bool,
    /// The workers' zones, when they are planned over zones.
    pub zones: Option<ZonesAt<'a>>,
}

/// A way of choosing the configuration.
pub trait Strategy {
    /// Whether a member of the plan that announces it leaves breaks the plan (re-planned
    /// before its deadline), or works on until it is gone.
    fn acts_on_notices(&self) -> bool;

    /// Whether a choice is run under a new plan even when it is the configuration running:
    /// the strategy chooses only when a restart is due (a checkpoint-restart system restarts
    /// on every change of its nodes). Otherwise choosing what runs keeps the plan in force.
    fn restarts_in_place(&self) -> bool {
        false
    }

    /// The configuration to run, or `None` to keep the plan in force.
    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig>;
}

/// Parcae's look-ahead optimizer on `forecast`, from the configuration running; its choice
/// shrunk to the workers present (a forecast may promise more: D shrinks first, spec 1.4, as in
/// the simulator).
pub fn look_ahead(
    kept: &mut Option<LiveputOptimizer>,
    at: &Situation<'_>,
    forecast: Forecast,
    interval_secs: f64,
) -> ParallelConfig {
    let optimizer = optimizer_for(kept, at.cost, interval_secs);
    let decision = optimizer.decide_with_tables(
        PlanState {
            nodes: forecast.before,
            config: at.running,
            leftover_ms: 0.0,
        },
        &forecast.future,
        forecast.terminal,
        &forecast.tables,
    );
    decision.config.clamp_to(at.workers)
}

/// The look-ahead optimizer for the cost model measured now: the one kept while the model is
/// the same (its memoised migration costs stay valid), a new one as soon as the nodes measured
/// anything new. The decision is then a function of the replicated state alone, so a new
/// leader decides as the old one would have; an optimizer kept from the first plan priced
/// every later move at the costs measured before any reconfiguration (the 2 s default restart).
pub fn optimizer_for<'a>(
    kept: &'a mut Option<LiveputOptimizer>,
    cost: &Arc<CostModel>,
    interval_secs: f64,
) -> &'a mut LiveputOptimizer {
    let current = kept
        .as_mut()
        .is_some_and(|o| o.costs().model().as_ref() == cost.as_ref());
    if !current {
        *kept = None;
    }
    kept.get_or_insert_with(|| LiveputOptimizer::new(cost.clone(), interval_secs, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_strategies::trace::Interval;

    #[test]
    fn the_optimizer_prices_moves_at_the_costs_measured_last() {
        let priced = |ms: f64| {
            let mut cost = CostModel::builtin("gpt-1.5b").unwrap();
            cost.spec.restart = parcae_strategies::cost::spec::RestartCost::Fixed { ms };
            Arc::new(cost)
        };
        let (cheap, dear) = (priced(1_000.0), priced(3_600_000.0));
        // Sixteen nodes run, thirty-two are here and stay: a move pays off unless it costs
        // more than the look-ahead.
        let now = PlanState {
            nodes: 32,
            config: ParallelConfig::new(2, 8),
            leftover_ms: 0.0,
        };
        let future = vec![
            Interval {
                nodes: 32,
                added: 0,
                removed: 0,
            };
            8
        ];
        let fresh = |cost: &Arc<CostModel>| {
            LiveputOptimizer::new(cost.clone(), 60.0, 1)
                .decide(now, &future)
                .config
        };
        assert_ne!(fresh(&cheap), fresh(&dear), "the price decides");
        let mut kept = None;
        let first = optimizer_for(&mut kept, &cheap, 60.0).decide(now, &future);
        assert_eq!(first.config, fresh(&cheap));
        let later = optimizer_for(&mut kept, &dear, 60.0).decide(now, &future);
        assert_eq!(later.config, fresh(&dear), "the costs measured since");
        let again = optimizer_for(&mut kept, &dear, 60.0).decide(now, &future);
        assert_eq!(again.config, later.config);
    }
}
