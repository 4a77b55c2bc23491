//! A fresh directory per run for the nodes' keys, configs, data and logs.

use std::path::{Path, PathBuf};

/// The checkpoint store of a run's job, in its directory.
pub const STORE: &str = "store";

/// A run's directory, removed when dropped unless kept (`--work-dir`).
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl RunDir {
    /// `path`, removed at the end unless `keep`.
    pub fn new(path: PathBuf, keep: bool) -> Self {
        Self { path, keep }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where it is, when it outlives the run.
    pub fn kept(&self) -> Option<&Path> {
        self.keep.then_some(self.path.as_path())
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
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
