//! A fresh directory per run for the nodes' keys, configs, data and logs.

use std::path::{Path, PathBuf};

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
