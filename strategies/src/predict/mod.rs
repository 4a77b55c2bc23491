//! Forecasts of future availability.
//!
//! At every interval boundary the optimizer needs the next `H` intervals. [`Predictor`] is that
//! contract; the implementations are:
//! * [`RulePredictor`] with [`SeriesModel::Arima`]: Parcae's predictor, ARIMA(1,1,0) with drift
//!   inside Parcae's rules (spec 1.3: history window by horizon, warm-up, outlier removal,
//!   turn-point flattening, sticky damping, clamps to the job's [`Bounds`], seeded Poisson
//!   injection), [`RuleConfig`] switching its quirks off when wanted;
//! * the same rules with [`SeriesModel::Holt`], Parcae's exponential-smoothing alternative;
//! * [`NoticeAware`], wrapping either and folding known preemption notices into the forecast;
//! * [`ZoneModel`], the zone's change rates learned online (quiet or churning, by hour of the
//!   day), forecasting persistence plus the time-of-day drift and the expected stay beyond
//!   the optimizer's horizon.
//!
//! [`by_name`] selects one by name for the CLI and the simulator; [`mean_l1_per_step`] measures
//! accuracy on a trace.
//!
//! Accuracy on Parcae's p3 trace (`tests/predict_p3.rs`, seed 0, bounds 8 and 32, mean |error|
//! of the predicted count in nodes; forecasting at every interval):
//!
//! | predictor | H | step 1 | step H | mean over steps |
//! |---|---|---|---|---|
//! | `arima` | 8 | 0.61 | 3.44 | 2.13 |
//! | `es` | 8 | 0.72 | 3.43 | 2.17 |
//! | `arima` | 12 | 0.60 | 4.28 | 2.77 |
//! | `es` | 12 | 0.71 | 4.45 | 2.86 |
//! | `last+nopoisson` | 12 | 0.48 | 3.70 | 2.35 |
//! | `arima+notices` | 12 | 0.38 | 4.23 | 2.65 |
//! | `last+nopoisson+notices` | 12 | 0.24 | 3.62 | 2.19 |
//!
//! (`+notices`: the true preemptions of the upcoming interval are known, as with 25 s notices.)
//! Persistence is the most accurate in L1 on this trace; Parcae's models (and their Poisson
//! injection) trade accuracy for anticipating churn, which is what the optimizer plans for.

mod arima;
mod eval;
mod holt;
mod notice;
mod predictor;
mod rules;
mod zone;
mod zones;

use std::fmt;
use std::str::FromStr;

pub use arima::Arima110;
pub use eval::{StepErrors, mean_l1_per_step};
pub use holt::HoltDamped;
pub use notice::{NoticeAware, fold_notices, observed};
pub use predictor::{Bounds, ForecastInput, NoticeAhead, Predictor};
pub use rules::{
    RuleConfig, RulePredictor, SeriesModel, flatten_turn_point, history_window, remove_outliers,
};
pub use zone::{Regime, ZoneModel};
pub use zones::{ZoneForecasts, ZoneNow};

/// A predictor choice, as named on the command line: a model (`arima`, `es` or `last`)
/// followed by any of the modifiers `+notices` (fold in preemption notices), `+nopoisson` (no
/// Poisson injection), `+fresh` (penalties reset every call), `+reclamp` (bounds enforced after
/// the penalties). `arima` alone is exactly Parcae's predictor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PredictorSpec {
    /// The series model inside Parcae's rules.
    pub model: SeriesModel,
    /// Which of Parcae's rules apply.
    pub config: RuleConfig,
    /// Whether preemption notices are folded in.
    pub notices: bool,
}

/// A predictor name that [`PredictorSpec`] does not understand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown predictor {0:?} (expected arima, es or last, then any of +notices, +nopoisson, +fresh, +reclamp)"
)]
pub struct UnknownPredictor(pub String);

impl PredictorSpec {
    /// The names worth listing in help texts (any modifier combination also parses).
    pub const NAMES: [&'static str; 6] = [
        "arima",
        "es",
        "last",
        "arima+notices",
        "es+notices",
        "last+notices",
    ];

    /// Parcae's rules around `model`, without notices.
    pub fn new(model: SeriesModel) -> Self {
        Self {
            model,
            config: RuleConfig::PARCAE,
            notices: false,
        }
    }

    /// Builds the predictor with the job's `bounds`, seeded with `seed`.
    pub fn build(self, bounds: Bounds, seed: u64) -> Box<dyn Predictor + Send> {
        let rules = RulePredictor::with_config(self.model, bounds, seed, self.config);
        if self.notices {
            Box::new(NoticeAware::new(rules))
        } else {
            Box::new(rules)
        }
    }
}

impl FromStr for PredictorSpec {
    type Err = UnknownPredictor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || UnknownPredictor(s.to_owned());
        let mut parts = s.split('+');
        let model = parts.next().unwrap_or_default();
        let model = SeriesModel::ALL
            .into_iter()
            .find(|m| m.name() == model)
            .ok_or_else(unknown)?;
        let mut spec = Self::new(model);
        for modifier in parts {
            match modifier {
                "notices" => spec.notices = true,
                "nopoisson" => spec.config.poisson = false,
                "fresh" => spec.config.sticky_penalties = false,
                "reclamp" => spec.config.clamp_after_penalties = true,
                _ => return Err(unknown()),
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for PredictorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model.name())?;
        let c = &self.config;
        for (on, modifier) in [
            (self.notices, "+notices"),
            (!c.poisson, "+nopoisson"),
            (!c.sticky_penalties, "+fresh"),
            (c.clamp_after_penalties, "+reclamp"),
        ] {
            if on {
                f.write_str(modifier)?;
            }
        }
        Ok(())
    }
}

/// The predictor called `name` (see [`PredictorSpec`]) for a job with `bounds`, seeded.
pub fn by_name(
    name: &str,
    bounds: Bounds,
    seed: u64,
) -> Result<Box<dyn Predictor + Send>, UnknownPredictor> {
    name.parse::<PredictorSpec>().map(|s| s.build(bounds, seed))
}
