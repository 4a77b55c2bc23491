//! The node's HTTP API as the testnet reads it: `GET /status` and `GET /steps`.
//!
//! Every field has a serde default, so a node that does not report something yet (an older
//! binary, or a node that is still starting) parses as "nothing known" instead of failing the
//! run. Responses are untrusted: bodies are size-capped and requests time out.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

/// Largest `/status` body read.
const MAX_STATUS_BYTES: u64 = 4 << 20;
/// Largest `/steps` body read (about 400k steps).
const MAX_STEPS_BYTES: u64 = 64 << 20;

/// A member of the replicated membership.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Member {
    /// libp2p peer id.
    pub peer_id: String,
    /// `active`, `spare`, `leaving` or `lost`.
    pub status: String,
}

/// The trainer's part of `/status`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Training {
    /// `[pipeline, stage]` while the node trains.
    pub slot: Option<(u32, u32)>,
    /// The planner's throughput estimates from its measured cost model (on the leader).
    pub estimates: Vec<Estimate>,
}

/// A throughput estimate of the planner.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Estimate {
    /// `[D, P]`.
    pub config: (u32, u32),
    /// Estimated samples per second.
    pub samples_per_sec: f64,
}

/// A reconfiguration the node took part in.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Migration {
    /// Epoch the reconfiguration started.
    pub epoch: u64,
    /// `initial`, `intra`, `inter`, `repartition` or `restart`.
    pub kind: String,
    /// Step at which the new configuration took over.
    pub at_step: u64,
    /// Seconds it took on this node.
    pub secs: f64,
}

/// `GET /status`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Status {
    /// This node's peer id.
    pub peer_id: String,
    /// Raft role.
    pub role: String,
    /// The leader's peer id, if known.
    pub leader: Option<String>,
    /// Replicated membership.
    pub members: Vec<Member>,
    /// Plan epoch.
    pub epoch: u64,
    /// Current `(D, P)`.
    pub config: Option<(u32, u32)>,
    /// Last committed step.
    pub step: u64,
    /// Loss of the last committed step.
    pub loss: Option<f64>,
    /// Global sample cursor.
    pub samples: u64,
    /// Listen addresses (with or without `/p2p/<peer id>`).
    pub listen_addrs: Vec<String>,
    /// The node's training slot.
    pub training: Option<Training>,
    /// Reconfigurations this node took part in.
    pub migrations: Vec<Migration>,
}

impl Status {
    /// The loopback listen address ending in `/p2p/<id>`, for `--bootstrap`.
    pub fn p2p_addr(&self) -> Option<String> {
        if self.peer_id.is_empty() {
            return None;
        }
        let addr = self
            .listen_addrs
            .iter()
            .find(|a| a.starts_with("/ip4/127.0.0.1/tcp/"))?;
        Some(if addr.contains("/p2p/") {
            addr.clone()
        } else {
            format!("{addr}/p2p/{}", self.peer_id)
        })
    }

    /// Members that count as part of the cluster (active or spare).
    pub fn healthy_members(&self) -> usize {
        self.members
            .iter()
            .filter(|m| matches!(m.status.as_str(), "active" | "spare"))
            .count()
    }
}

/// One committed step as applied on a node (`GET /steps`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct StepRecord {
    /// Step number.
    pub step: u64,
    /// Plan epoch it was trained in.
    pub epoch: u64,
    /// First sample of the step (global cursor).
    pub sample_start: u64,
    /// Samples trained.
    pub samples: u64,
    /// Its loss.
    pub loss: f64,
}

/// HTTP client for the node API with a short timeout.
pub struct Client {
    agent: ureq::Agent,
}

impl Default for Client {
    /// A client for the once-per-second polls: a node that takes longer is skipped.
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

    fn get<T: serde::de::DeserializeOwned>(
        &self,
        addr: SocketAddr,
        path: &str,
        limit: u64,
    ) -> Option<T> {
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
    pub fn status(&self, addr: SocketAddr) -> Option<Status> {
        self.get(addr, "/status", MAX_STATUS_BYTES)
    }

    /// `GET /steps`; `None` when the node does not answer (or has no such endpoint).
    pub fn steps(&self, addr: SocketAddr) -> Option<Vec<StepRecord>> {
        self.get(addr, "/steps", MAX_STEPS_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn todays_status_parses_with_defaults_for_missing_fields() {
        let s: Status = serde_json::from_str(
            r#"{"peer_id":"12D3","role":"leader","leader":"12D3","term":2,
                "members":[{"peer_id":"12D3","voter":true,"status":"active"},
                           {"peer_id":"12D4","voter":false,"status":"lost"}],
                "epoch":3,"config":[2,1],"step":0,"commit_index":9,
                "listen_addrs":["/ip4/10.0.0.1/tcp/1","/ip4/127.0.0.1/tcp/7"]}"#,
        )
        .unwrap();
        assert_eq!(s.config, Some((2, 1)));
        assert_eq!(s.loss, None);
        assert_eq!(s.samples, 0);
        assert!(s.migrations.is_empty());
        assert_eq!(s.healthy_members(), 1);
        assert_eq!(
            s.p2p_addr().as_deref(),
            Some("/ip4/127.0.0.1/tcp/7/p2p/12D3")
        );
        let with_id = Status {
            listen_addrs: vec!["/ip4/127.0.0.1/tcp/8/p2p/12D3".into()],
            ..s
        };
        assert_eq!(
            with_id.p2p_addr().as_deref(),
            Some("/ip4/127.0.0.1/tcp/8/p2p/12D3")
        );
    }

    #[test]
    fn training_fields_parse() {
        let s: Status = serde_json::from_str(
            r#"{"peer_id":"a","loss":2.5,"samples":640,
                "training":{"slot":[1,0],"phase":"training",
                            "estimates":[{"config":[2,2],"samples_per_sec":31.5}]},
                "migrations":[{"epoch":2,"kind":"intra","at_step":40,"secs":0.25}]}"#,
        )
        .unwrap();
        assert_eq!(s.loss, Some(2.5));
        assert_eq!(s.samples, 640);
        let training = s.training.clone().unwrap();
        assert_eq!(training.slot, Some((1, 0)));
        assert_eq!(training.estimates[0].config, (2, 2));
        assert_eq!(training.estimates[0].samples_per_sec, 31.5);
        assert_eq!(s.migrations[0].kind, "intra");
        assert_eq!(s.migrations[0].at_step, 40);
        let steps: Vec<StepRecord> = serde_json::from_str(
            r#"[{"step":1,"epoch":1,"sample_start":0,"samples":16,"loss":4.1}]"#,
        )
        .unwrap();
        assert_eq!(steps[0].samples, 16);
        assert!(serde_json::from_str::<Status>("[1,2]").is_err());
    }
}
