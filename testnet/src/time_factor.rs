//! How much longer the harness's waits may take on a slower machine: they were set on two
//! shared cores, and `PARCAE_TEST_TIME_FACTOR` (a positive number, 1 when unset) stretches every
//! one of them, the tests' and the testnet's alike.

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable.
pub const VARIABLE: &str = "PARCAE_TEST_TIME_FACTOR";

/// The factor the environment sets, or why its value is not one.
pub fn read() -> Result<f64, String> {
    match std::env::var(VARIABLE) {
        Err(_) => Ok(1.0),
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| format!("{VARIABLE}={text:?} is not a positive number")),
    }
}

/// The factor, read once. A bad value stops a test with its message; the testnet binary
/// refuses it before it starts anything ([`read`]).
pub fn factor() -> f64 {
    static FACTOR: OnceLock<f64> = OnceLock::new();
    *FACTOR.get_or_init(|| read().unwrap_or_else(|e| panic!("{e}")))
}

/// `wait` stretched by the factor.
pub fn scaled(wait: Duration) -> Duration {
    wait.mul_f64(factor())
}
