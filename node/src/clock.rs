//! The node's wall clock: the system's, shifted by a test hook.
//!
//! Wall-clock time crosses the wire in two places: the time a proposal is signed at (checked for
//! freshness by the leader) and a preemption notice's deadline. Spot VMs run with clocks that
//! NTP keeps close, not equal, and a VM that wakes from a long freeze can be minutes off; the
//! testnet's clock-skew nemesis starts nodes with `PARCAE_CLOCK_SKEW_MS` set (signed
//! milliseconds added to the system clock) to check that the protocol does not depend on equal
//! clocks. Every wall-clock read of the node goes through [`now`], except the emulated
//! accelerator's pacer, which stands for hardware, not for the node's sense of time.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable of the test hook.
pub const SKEW_ENV: &str = "PARCAE_CLOCK_SKEW_MS";
/// Largest skew accepted: a day either way.
const MAX_SKEW_MS: i64 = 86_400_000;

static SKEW_MS: OnceLock<i64> = OnceLock::new();

/// Why the skew hook was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SKEW_ENV}={value:?}: {reason}")]
pub struct SkewError {
    value: String,
    reason: &'static str,
}

/// Parses a skew in signed milliseconds, at most a day either way.
pub fn parse_skew(value: &str) -> Result<i64, SkewError> {
    let refuse = |reason| SkewError {
        value: value.to_owned(),
        reason,
    };
    let ms: i64 = value
        .trim()
        .parse()
        .map_err(|_| refuse("not a whole number of milliseconds"))?;
    if ms.abs() > MAX_SKEW_MS {
        return Err(refuse("more than a day (86400000 ms) either way"));
    }
    Ok(ms)
}

/// Reads the hook once, at start; without it the clock is the system's. A second call keeps the
/// first value.
pub fn init_from_env() -> Result<(), SkewError> {
    let skew = match std::env::var(SKEW_ENV) {
        Ok(value) => parse_skew(&value)?,
        Err(_) => 0,
    };
    if skew != 0 {
        tracing::warn!(
            skew_ms = skew,
            "{SKEW_ENV}: this node's wall clock is shifted"
        );
    }
    SKEW_MS.get_or_init(|| skew);
    Ok(())
}

/// `t` moved by `skew_ms`.
fn shifted(t: SystemTime, skew_ms: i64) -> SystemTime {
    let by = Duration::from_millis(skew_ms.unsigned_abs());
    if skew_ms >= 0 {
        t.checked_add(by).unwrap_or(t)
    } else {
        t.checked_sub(by).unwrap_or(UNIX_EPOCH)
    }
}

/// The node's wall clock.
pub fn now() -> SystemTime {
    shifted(SystemTime::now(), SKEW_MS.get().copied().unwrap_or(0))
}

/// Milliseconds since the Unix epoch (0 for clocks before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// [`now`] in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    unix_ms(now())
}

/// [`now`] in seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skews_parse_within_a_day_and_name_what_is_wrong() {
        assert_eq!(parse_skew("600000"), Ok(600_000));
        assert_eq!(parse_skew(" -120000 "), Ok(-120_000));
        assert_eq!(parse_skew("0"), Ok(0));
        let e = parse_skew("ten minutes").unwrap_err().to_string();
        assert!(e.contains(SKEW_ENV) && e.contains("whole number"), "{e}");
        let e = parse_skew("86400001").unwrap_err().to_string();
        assert!(e.contains("more than a day"), "{e}");
    }

    #[test]
    fn a_shift_moves_the_clock_both_ways() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(unix_ms(shifted(t, 2_500)), 1_002_500);
        assert_eq!(unix_ms(shifted(t, -2_500)), 997_500);
        assert_eq!(unix_ms(shifted(t, -2_000_000)), 0);
    }
}
