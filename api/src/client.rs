//! Reading a node's `/status` and `/steps`: responses are untrusted, so bodies are size-capped
//! and every request times out; a node that does not answer, or answers something else, is an
//! [`ApiError`] that says which.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::{StatusSnapshot, StepRecord};

/// Largest `/status` body read.
pub const MAX_STATUS_BYTES: u64 = 4 << 20;
/// Largest `/steps` body read (about 400k steps).
pub const MAX_STEPS_BYTES: u64 = 64 << 20;

/// Why a node's document could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request failed (refused, timed out, not 200, body over the cap).
    #[error("GET {url}: {source}")]
    Request {
        /// The URL.
        url: String,
        /// What the HTTP client said.
        source: ureq::Error,
    },
    /// The body is not the document asked for.
    #[error("{url} did not return {what}: {source}")]
    Decode {
        /// The URL.
        url: String,
        /// The document expected.
        what: &'static str,
        /// What the JSON decoder said.
        source: serde_json::Error,
    },
}

/// HTTP client for the node API (clones share one connection pool).
#[derive(Clone)]
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

    fn get_text(&self, addr: SocketAddr, path: &str, limit: u64) -> Result<String, ApiError> {
        let url = format!("http://{addr}{path}");
        let request = |source| ApiError::Request {
            url: url.clone(),
            source,
        };
        let mut resp = self.agent.get(&url).call().map_err(request)?;
        resp.body_mut()
            .with_config()
            .limit(limit)
            .read_to_string()
            .map_err(request)
    }

    fn get<T: DeserializeOwned>(
        &self,
        addr: SocketAddr,
        path: &str,
        limit: u64,
        what: &'static str,
    ) -> Result<T, ApiError> {
        let body = self.get_text(addr, path, limit)?;
        serde_json::from_str(&body).map_err(|source| ApiError::Decode {
            url: format!("http://{addr}{path}"),
            what,
            source,
        })
    }

    /// `GET /status`.
    pub fn status(&self, addr: SocketAddr) -> Result<StatusSnapshot, ApiError> {
        self.get(addr, "/status", MAX_STATUS_BYTES, "a status object")
    }

    /// `GET /metrics` (OpenMetrics text).
    pub fn metrics(&self, addr: SocketAddr) -> Result<String, ApiError> {
        self.get_text(addr, "/metrics", MAX_STATUS_BYTES)
    }

    /// `GET /steps`.
    pub fn steps(&self, addr: SocketAddr) -> Result<Vec<StepRecord>, ApiError> {
        self.get(addr, "/steps", MAX_STEPS_BYTES, "a list of steps")
    }
}
