//! The testnet's own process concerns: Ctrl-C and friends as a flag the run loop checks
//! ([`Interrupt`]), and a fresh directory per run. Children are supervised by
//! [`parcae_testnet::supervise`].

use std::path::{Path, PathBuf};
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

    /// An interrupt that never fires (unit tests).
    #[cfg(test)]
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

/// A fresh directory for one run's keys, configs, data and logs.
pub fn run_dir(explicit: Option<&Path>, label: &str) -> std::io::Result<PathBuf> {
    let dir = match explicit {
        Some(d) => d.join(label),
        None => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            std::env::temp_dir().join(format!(
                "parcae-testnet-{}-{stamp}-{label}",
                std::process::id()
            ))
        }
    };
    if dir.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} already exists", dir.display()),
        ));
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
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
