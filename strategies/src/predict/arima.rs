//! ARIMA(1,1,0) with drift, fitted by exact maximum likelihood.
//!
//! The differences `y_t = h_t - h_{t-1}` follow a stationary AR(1) around a mean `μ` (the
//! drift): `y_t - μ = φ (y_{t-1} - μ) + ε_t`. This is the model Parcae fits with statsmodels'
//! old `ARIMA(order=(1,1,0), trend='c').fit(method='css-mle')`, whose optimum is the exact
//! Gaussian likelihood used here. With `σ²` and `μ` concentrated out (both have closed forms
//! for a given `φ`), the likelihood is a function of `φ ∈ (-1, 1)` alone, maximised by a grid
//! search refined by golden-section search. Forecasts of `y` decay geometrically to `μ` and are
//! summed back onto the last level.

/// Largest |φ| considered (keeps the process stationary, as statsmodels' transform does).
const PHI_LIMIT: f64 = 0.999;
/// Points of the coarse grid over φ.
const GRID: usize = 200;
/// Golden-section iterations after the grid (the bracket shrinks by 0.618 each time).
const REFINE: usize = 40;

/// A fitted AR(1)-with-mean on first differences.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arima110 {
    /// AR coefficient of the differences.
    pub phi: f64,
    /// Mean of the differences (the drift per step).
    pub drift: f64,
}

impl Arima110 {
    /// Fits the model to the level series `h` (at least two values for a drift; a single value
    /// or none gives a flat model).
    pub fn fit(h: &[f64]) -> Self {
        let y: Vec<f64> = h.windows(2).map(|w| w[1] - w[0]).collect();
        let Some(&first) = y.first() else {
            return Self {
                phi: 0.0,
                drift: 0.0,
            };
        };
        if y.len() < 3 || y.iter().all(|&v| v == first) {
            let drift = y.iter().sum::<f64>() / y.len() as f64;
            return Self { phi: 0.0, drift };
        }
        let loglik = |phi: f64| concentrated(&y, phi).1;
        let step = 2.0 * PHI_LIMIT / (GRID - 1) as f64;
        let best = (0..GRID)
            .map(|i| {
                let phi = -PHI_LIMIT + step * i as f64;
                (phi, loglik(phi))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(0.0, |(phi, _)| phi);
        let phi = golden_max(
            loglik,
            (best - step).max(-PHI_LIMIT),
            (best + step).min(PHI_LIMIT),
        );
        Self {
            phi,
            drift: concentrated(&y, phi).0,
        }
    }

    /// Forecasts `steps` future levels after `h` (which must be the series the model was fitted
    /// on, or one continuing it).
    pub fn forecast(&self, h: &[f64], steps: usize) -> Vec<f64> {
        let mut level = h.last().copied().unwrap_or(0.0);
        let mut dev = match h {
            [.., a, b] => b - a - self.drift,
            _ => 0.0,
        };
        (0..steps)
            .map(|_| {
                dev *= self.phi;
                level += self.drift + dev;
                level
            })
            .collect()
    }
}

/// For a given φ: the maximum-likelihood mean of `y` and the log-likelihood with σ² and the
/// mean concentrated out (constants dropped).
fn concentrated(y: &[f64], phi: f64) -> (f64, f64) {
    let n = y.len() as f64;
    let w = 1.0 - phi * phi;
    // The first value has the stationary variance σ²/(1-φ²); the others are conditional.
    let innovations = y.windows(2).map(|p| p[1] - phi * p[0]);
    let mu = (w * y[0] + (1.0 - phi) * innovations.clone().sum::<f64>())
        / (w + (n - 1.0) * (1.0 - phi) * (1.0 - phi));
    let s = w * (y[0] - mu).powi(2)
        + innovations
            .map(|e| (e - mu * (1.0 - phi)).powi(2))
            .sum::<f64>();
    (mu, -0.5 * n * (s / n).max(1e-300).ln() + 0.5 * w.ln())
}

/// The maximiser of a unimodal `f` on `[a, b]` by golden-section search.
fn golden_max(f: impl Fn(f64) -> f64, mut a: f64, mut b: f64) -> f64 {
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - g * (b - a);
    let mut d = a + g * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..REFINE {
        if fc >= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    (a + b) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_simulated_ar1() {
        // y_t - 0.5 = 0.6 (y_{t-1} - 0.5) + e_t with a fixed pseudo-random e.
        let mut y = vec![0.5];
        let mut state = 12345u64;
        for _ in 0..4000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let e = ((state >> 11) as f64 / (1u64 << 53) as f64) - 0.5;
            let prev = *y.last().unwrap();
            y.push(0.5 + 0.6 * (prev - 0.5) + e);
        }
        let h: Vec<f64> = y
            .iter()
            .scan(0.0, |level, d| {
                *level += d;
                Some(*level)
            })
            .collect();
        let m = Arima110::fit(&h);
        assert!((m.phi - 0.6).abs() < 0.05, "{m:?}");
        assert!((m.drift - 0.5).abs() < 0.05, "{m:?}");
    }

    /// Reference values from statsmodels 0.15 `ARIMA(h, order=(1,1,0), trend='t').fit()` (exact
    /// diffuse MLE, the same likelihood) on p3 windows ending at intervals 57, 279 and 464.
    #[test]
    fn matches_statsmodels_on_p3_windows() {
        let cases: [([f64; 12], f64, f64, [f64; 3]); 3] = [
            (
                [32., 32., 32., 32., 32., 32., 26., 26., 23., 22., 21., 21.],
                -0.216_951_55,
                -1.033_501_94,
                [19.742_278, 18.757_421, 17.713_366],
            ),
            (
                [23., 23., 19., 19., 19., 19., 19., 19., 19., 19., 22., 28.],
                0.562_510_93,
                0.936_822_4,
                [31.784_915, 34.323_821, 36.161_833],
            ),
            (
                [26., 26., 26., 23., 23., 23., 23., 23., 23., 23., 23., 21.],
                -0.174_521_78,
                -0.439_403_2,
                [20.832_955, 20.346_019, 19.914_912],
            ),
        ];
        for (h, phi, drift, forecast) in cases {
            let m = Arima110::fit(&h);
            assert!((m.phi - phi).abs() < 2e-3, "{m:?} vs φ {phi}");
            assert!((m.drift - drift).abs() < 2e-3, "{m:?} vs drift {drift}");
            for (got, want) in m.forecast(&h, 3).into_iter().zip(forecast) {
                assert!((got - want).abs() < 5e-3, "{got} vs {want}");
            }
        }
    }

    #[test]
    fn linear_series_continues_its_slope() {
        let h = [10.0, 12.0, 14.0, 16.0, 18.0];
        let m = Arima110::fit(&h);
        assert_eq!(m.forecast(&h, 3), vec![20.0, 22.0, 24.0]);
    }

    #[test]
    fn forecast_integrates_a_decaying_difference() {
        let m = Arima110 {
            phi: 0.5,
            drift: 0.0,
        };
        // Last difference 4: next differences 2, 1, 0.5.
        assert_eq!(m.forecast(&[10.0, 14.0], 3), vec![16.0, 17.0, 17.5]);
    }

    #[test]
    fn mle_beats_neighbours() {
        let h = [
            20.0, 22.0, 21.0, 25.0, 24.0, 24.0, 27.0, 26.0, 29.0, 30.0, 28.0, 31.0,
        ];
        let y: Vec<f64> = h.windows(2).map(|w| w[1] - w[0]).collect();
        let m = Arima110::fit(&h);
        let best = concentrated(&y, m.phi).1;
        for d in [-0.05, 0.05] {
            let phi = (m.phi + d).clamp(-PHI_LIMIT, PHI_LIMIT);
            assert!(concentrated(&y, phi).1 <= best + 1e-9);
        }
        assert!(
            m.phi < 0.0,
            "alternating differences give a negative φ: {m:?}"
        );
    }
}
