//! Ctrl-C and friends as a flag that every waiting loop of a harness checks, so that an
//! interrupted run unwinds through the drops that stop its node processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::TestnetError;

/// Set when SIGINT, SIGTERM or SIGHUP arrived; the run loop then stops and cleans up.
#[derive(Clone)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Installs the handlers. A second signal exits immediately with status 130 (the
    /// children then die through their parent-death signal).
    pub fn install() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone())?;
            signal_hook::flag::register(sig, flag.clone())?;
        }
        Ok(Self(flag))
    }

    /// An interrupt that never fires, for harnesses without signal handling (tests).
    pub fn never() -> Self {
        Self(Arc::new(AtomicBool::new(false)))
    }

    /// `Err(Interrupted)` once a signal arrived.
    pub fn check(&self) -> Result<(), TestnetError> {
        if self.0.load(Ordering::Relaxed) {
            Err(TestnetError::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Sleeps until `until`, waking every 50 ms to notice signals.
    pub fn sleep_until(&self, until: Instant) -> Result<(), TestnetError> {
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_is_quiet_until_signalled() {
        let i = Interrupt::never();
        assert!(i.check().is_ok());
        i.0.store(true, Ordering::Relaxed);
        assert!(matches!(i.check(), Err(TestnetError::Interrupted)));
        assert!(
            i.sleep_until(Instant::now() + Duration::from_secs(5))
                .is_err()
        );
    }
}
