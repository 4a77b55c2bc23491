//! Holt's linear trend with additive damping (Parcae's "ES" method, spec 1.2).
//!
//! Level `ℓ` and trend `b` are smoothed with weights `α` and `β`, and the trend is damped by `φ`
//! per step, so long forecasts flatten instead of running away:
//! `ℓ_t = α h_t + (1-α)(ℓ_{t-1} + φ b_{t-1})`, `b_t = β (ℓ_t - ℓ_{t-1}) + (1-β) φ b_{t-1}`,
//! forecast `ℓ_T + (φ + … + φ^k) b_T`. Parcae used statsmodels'
//! `ExponentialSmoothing(trend='add', damped_trend=True)`; here the states start at the first
//! value and first difference, and `(α, β, φ)` minimise the one-step squared error over a small
//! grid, which is robust on the 7-17 point windows the predictor sees.

/// Smoothing weights tried for the level and the trend.
const WEIGHTS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
/// Damping factors tried.
const DAMPINGS: [f64; 5] = [0.8, 0.85, 0.9, 0.95, 0.98];

/// A fitted damped-trend model with its final state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HoltDamped {
    /// Level smoothing weight.
    pub alpha: f64,
    /// Trend smoothing weight.
    pub beta: f64,
    /// Trend damping per step.
    pub phi: f64,
    /// Level after the last observation.
    pub level: f64,
    /// Trend after the last observation.
    pub trend: f64,
}

impl HoltDamped {
    /// Fits the model to `h` by grid search on the one-step sum of squared errors (ties keep the
    /// smallest weights). Fewer than two values give a flat model.
    pub fn fit(h: &[f64]) -> Self {
        let mut best = (f64::INFINITY, Self::run(h, 1.0, 0.0, 0.0).1);
        for alpha in WEIGHTS {
            for beta in WEIGHTS {
                for phi in DAMPINGS {
                    let (sse, model) = Self::run(h, alpha, beta, phi);
                    if sse < best.0 {
                        best = (sse, model);
                    }
                }
            }
        }
        best.1
    }

    /// Smooths `h` with the given weights: (one-step SSE, model with the final state).
    fn run(h: &[f64], alpha: f64, beta: f64, phi: f64) -> (f64, Self) {
        let mut model = Self {
            alpha,
            beta,
            phi,
            level: h.first().copied().unwrap_or(0.0),
            trend: 0.0,
        };
        if let [a, b, ..] = h {
            model.trend = b - a;
        }
        let mut sse = 0.0;
        for &x in h.iter().skip(1) {
            let predicted = model.level + phi * model.trend;
            sse += (x - predicted).powi(2);
            let level = alpha * x + (1.0 - alpha) * predicted;
            model.trend = beta * (level - model.level) + (1.0 - beta) * phi * model.trend;
            model.level = level;
        }
        (sse, model)
    }

    /// Forecasts `steps` future levels.
    pub fn forecast(&self, steps: usize) -> Vec<f64> {
        let mut damp = 0.0;
        let mut power = 1.0;
        (0..steps)
            .map(|_| {
                power *= self.phi;
                damp += power;
                self.level + damp * self.trend
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_series_stays_flat() {
        let m = HoltDamped::fit(&[12.0; 8]);
        assert_eq!(m.forecast(3), vec![12.0; 3]);
    }

    #[test]
    fn trend_is_followed_and_damped() {
        let h: Vec<f64> = (0..10).map(|i| 10.0 + 2.0 * f64::from(i)).collect();
        let m = HoltDamped::fit(&h);
        let f = m.forecast(30);
        assert!(f[0] > 28.0 && f[0] <= 30.0 + 1e-9, "{f:?}");
        let steps: Vec<f64> = f.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            steps.windows(2).all(|s| s[1] <= s[0] + 1e-12),
            "damped: {steps:?}"
        );
        assert!(
            f[29] < 28.0 + 2.0 * 30.0,
            "flattens below the linear extrapolation"
        );
    }
}
