//! Reading a node's `/status` and `/steps`: responses are untrusted, so bodies are size-capped
//! and every request times out. A node that does not answer, or answers something else, reads
//! as `None`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::{StatusSnapshot, StepRecord};

/// Largest `/status` body read.
pub const MAX_STATUS_BYTES: u64 = 4 << 20;
/// Largest `/steps` body read (about 400k steps).
pub const MAX_STEPS_BYTES: u64 = 64 << 20;

/// HTTP client for the node API.
pub struct Client {
    agent: ureq::Agent,
}

impl Default for Client {
    /// A client for once-per-second polls: a node that takes longer is skipped.
    fn default() -> Self {
        Self::with_timeout(Duration::from_millis(1500))
    }
}

impl Client {
    /// A client whose requests give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            agent: ureq::Agent::new_with_config(
                ureq::Agent::config_builder()
                    .timeout_global(Some(timeout))
                    .build(),
            ),
        }
    }

    fn get<T: DeserializeOwned>(&self, addr: SocketAddr, path: &str, limit: u64) -> Option<T> {
        let mut resp = self
            .agent
            .get(&format!("http://{addr}{path}"))
            .call()
            .ok()?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_string()
            .ok()?;
        serde_json::from_str(&body).ok()
    }

    /// `GET /status`; `None` when the node does not answer with a status object.
    pub fn status(&self, addr: SocketAddr) -> Option<StatusSnapshot> {
        self.get(addr, "/status", MAX_STATUS_BYTES)
    }

    /// `GET /steps`; `None` when the node does not answer (or has no such endpoint).
    pub fn steps(&self, addr: SocketAddr) -> Option<Vec<StepRecord>> {
        self.get(addr, "/steps", MAX_STEPS_BYTES)
    }
}
