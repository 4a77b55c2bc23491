//! Cloud metadata pollers: AWS IMDSv2 spot instance-action, GCE preemption, Azure Scheduled
//! Events. Each answers "is this machine about to go, and when?", and once, at start, "where
//! does it run?" (its zone and instance type, for the membership).
//!
//! Base URLs are configurable so that tests can point them at a local fake server. The pollers
//! are blocking (ureq) and run on their own threads: a slow metadata endpoint must never stall
//! an actor. Responses are untrusted: bodies are size-capped and every parse error is typed.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::notice::NoticeSource;

/// Largest metadata response body read.
const MAX_BODY: u64 = 64 * 1024;
/// Lead time assumed when the provider does not say (GCE gives 30 s, Azure Spot at least 30 s).
const DEFAULT_LEAD: Duration = Duration::from_secs(30);
/// IMDSv2 token lifetime requested.
const AWS_TOKEN_TTL_SECS: u32 = 21600;

/// A preemption announced by the cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudNotice {
    /// Which provider said so.
    pub source: NoticeSource,
    /// When the machine will be taken.
    pub deadline: SystemTime,
}

/// Why a poll failed (the poller logs it and tries again at the next interval).
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The HTTP request failed.
    #[error("metadata request {url}: {source}")]
    Http {
        /// The URL.
        url: String,
        /// The client error.
        source: Box<ureq::Error>,
    },
    /// The endpoint answered with an unexpected status.
    #[error("metadata request {url}: unexpected status {status}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The body could not be parsed.
    #[error("metadata response {url}: {reason}")]
    Parse {
        /// The URL.
        url: String,
        /// What was wrong.
        reason: String,
    },
}

/// Where the machine runs, as its metadata service says: untrusted text, checked by the caller
/// against the membership's rules before it goes into the node's record.
#[derive(Debug, Clone, Default, PartialEq, Eq, actix::Message)]
#[rtype(result = "()")]
pub struct CloudPlacement {
    /// The zone: `us-east-1a` (AWS), `us-central1-a` (GCE), `eastus-1` (Azure: region and zone
    /// number, or the region alone for a VM outside any zone).
    pub zone: String,
    /// The instance type: `p3.2xlarge`, `a2-highgpu-1g`, `Standard_NC6s_v3`.
    pub instance_type: String,
}

/// One provider's metadata check.
pub trait MetadataPoller: Send {
    /// Whether this provider's metadata service answers here, as only it does (the address
    /// alone says nothing: AWS and Azure both serve at 169.254.169.254).
    fn answers(&mut self) -> bool;
    /// Checks once; `Ok(None)` means no preemption is scheduled.
    fn check(&mut self) -> Result<Option<CloudNotice>, PollError>;
    /// Where this machine runs.
    fn placement(&mut self) -> Result<CloudPlacement, PollError>;
}

/// A metadata service endpoint: base URL and an HTTP agent with a global timeout.
struct MetadataClient {
    base: String,
    agent: ureq::Agent,
}

impl MetadataClient {
    fn new(base: &str, timeout: Duration) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            agent: ureq::Agent::new_with_config(
                ureq::Agent::config_builder()
                    .timeout_global(Some(timeout))
                    .http_status_as_error(false)
                    .build(),
            ),
        }
    }
}

impl MetadataClient {
    /// `GET` of `path` with `header`: the trimmed body of a 200 answer.
    fn get_text(&self, path: &str, header: (&str, &str)) -> Result<String, PollError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .agent
            .get(&url)
            .header(header.0, header.1)
            .call()
            .map_err(http_err(&url))?;
        let (status, body) = read_body(&url, resp)?;
        if status != 200 {
            return Err(PollError::Status { url, status });
        }
        Ok(body.trim().to_owned())
    }
}

fn read_body(
    url: &str,
    mut resp: ureq::http::Response<ureq::Body>,
) -> Result<(u16, String), PollError> {
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_string()
        .map_err(|e| PollError::Http {
            url: url.to_owned(),
            source: Box::new(e),
        })?;
    Ok((status, body))
}

fn http_err(url: &str) -> impl FnOnce(ureq::Error) -> PollError + '_ {
    move |e| PollError::Http {
        url: url.to_owned(),
        source: Box::new(e),
    }
}

/// AWS IMDSv2: `PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action`
/// (404 until AWS schedules an interruption, then `{"action": "...", "time": "RFC 3339"}`).
pub struct AwsPoller {
    client: MetadataClient,
}

#[derive(Deserialize)]
struct AwsInstanceAction {
    action: String,
    time: String,
}

impl AwsPoller {
    /// A poller against `base` (no trailing slash needed).
    pub fn new(base: &str, timeout: Duration) -> Self {
        Self {
            client: MetadataClient::new(base, timeout),
        }
    }

    /// An IMDSv2 session token (`PUT /latest/api/token`).
    fn token(&self) -> Result<String, PollError> {
        let token_url = format!("{}/latest/api/token", self.client.base);
        let resp = self
            .client
            .agent
            .put(&token_url)
            .header(
                "X-aws-ec2-metadata-token-ttl-seconds",
                AWS_TOKEN_TTL_SECS.to_string(),
            )
            .send_empty()
            .map_err(http_err(&token_url))?;
        let (status, token) = read_body(&token_url, resp)?;
        match status {
            200 => Ok(token),
            status => Err(PollError::Status {
                url: token_url,
                status,
            }),
        }
    }
}

impl MetadataPoller for AwsPoller {
    fn answers(&mut self) -> bool {
        self.token().is_ok_and(|t| !t.trim().is_empty())
    }

    fn check(&mut self) -> Result<Option<CloudNotice>, PollError> {
        let token = self.token()?;
        let url = format!("{}/latest/meta-data/spot/instance-action", self.client.base);
        let resp = self
            .client
            .agent
            .get(&url)
            .header("X-aws-ec2-metadata-token", token.trim())
            .call()
            .map_err(http_err(&url))?;
        let (status, body) = read_body(&url, resp)?;
        match status {
            404 => Ok(None),
            200 => {
                let action: AwsInstanceAction =
                    serde_json::from_str(&body).map_err(|e| PollError::Parse {
                        url: url.clone(),
                        reason: e.to_string(),
                    })?;
                let deadline = parse_rfc3339_utc(&action.time).ok_or_else(|| PollError::Parse {
                    url: url.clone(),
                    reason: format!("bad time {:?} for action {}", action.time, action.action),
                })?;
                Ok(Some(CloudNotice {
                    source: NoticeSource::Aws,
                    deadline,
                }))
            }
            status => Err(PollError::Status { url, status }),
        }
    }

    fn placement(&mut self) -> Result<CloudPlacement, PollError> {
        let token = self.token()?;
        let header = ("X-aws-ec2-metadata-token", token.trim());
        Ok(CloudPlacement {
            zone: self
                .client
                .get_text("/latest/meta-data/placement/availability-zone", header)?,
            instance_type: self
                .client
                .get_text("/latest/meta-data/instance-type", header)?,
        })
    }
}

/// GCE: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` answers
/// `TRUE` once the instance is being preempted (30 s before it stops).
pub struct GcePoller {
    client: MetadataClient,
}

impl GcePoller {
    /// A poller against `base`.
    pub fn new(base: &str, timeout: Duration) -> Self {
        Self {
            client: MetadataClient::new(base, timeout),
        }
    }
}

impl MetadataPoller for GcePoller {
    fn answers(&mut self) -> bool {
        let url = format!("{}/computeMetadata/v1/instance/preempted", self.client.base);
        self.client
            .agent
            .get(&url)
            .header("Metadata-Flavor", "Google")
            .call()
            .is_ok_and(|r| {
                r.status() == 200
                    && r.headers()
                        .get("Metadata-Flavor")
                        .is_some_and(|v| v.as_bytes() == b"Google")
            })
    }

    fn check(&mut self) -> Result<Option<CloudNotice>, PollError> {
        let path = "/computeMetadata/v1/instance/preempted";
        match self.client.get_text(path, GCE_FLAVOR)?.as_str() {
            "TRUE" => Ok(Some(CloudNotice {
                source: NoticeSource::Gce,
                deadline: crate::clock::now() + DEFAULT_LEAD,
            })),
            "FALSE" => Ok(None),
            other => Err(PollError::Parse {
                url: format!("{}{path}", self.client.base),
                reason: format!("expected TRUE or FALSE, got {:?}", truncate(other)),
            }),
        }
    }

    fn placement(&mut self) -> Result<CloudPlacement, PollError> {
        // Both are resource paths: `projects/123/zones/us-central1-a`.
        let last = |path: String| path.rsplit('/').next().unwrap_or_default().to_owned();
        Ok(CloudPlacement {
            zone: last(
                self.client
                    .get_text("/computeMetadata/v1/instance/zone", GCE_FLAVOR)?,
            ),
            instance_type: last(
                self.client
                    .get_text("/computeMetadata/v1/instance/machine-type", GCE_FLAVOR)?,
            ),
        })
    }
}

/// The header every GCE metadata request carries.
const GCE_FLAVOR: (&str, &str) = ("Metadata-Flavor", "Google");

/// Azure: `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true`; an event
/// of type `Preempt` or `Terminate` means the machine is going (Spot gives at least 30 s).
pub struct AzurePoller {
    client: MetadataClient,
}

#[derive(Deserialize)]
struct AzureEvents {
    #[serde(rename = "Events")]
    events: Vec<AzureEvent>,
}

#[derive(Deserialize)]
struct AzureEvent {
    #[serde(rename = "EventType")]
    event_type: String,
    /// When the event starts at the earliest (RFC 1123); empty once it has started.
    #[serde(rename = "NotBefore", default)]
    not_before: String,
}

impl AzurePoller {
    /// A poller against `base`.
    pub fn new(base: &str, timeout: Duration) -> Self {
        Self {
            client: MetadataClient::new(base, timeout),
        }
    }

    /// The JSON answer to `GET path` (with the `Metadata: true` header Azure requires).
    fn json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, PollError> {
        let body = self.client.get_text(path, ("Metadata", "true"))?;
        serde_json::from_str(&body).map_err(|e| PollError::Parse {
            url: format!("{}{path}", self.client.base),
            reason: e.to_string(),
        })
    }
}

impl MetadataPoller for AzurePoller {
    fn answers(&mut self) -> bool {
        let url = format!(
            "{}/metadata/instance?api-version=2021-02-01",
            self.client.base
        );
        let Ok(resp) = self
            .client
            .agent
            .get(&url)
            .header("Metadata", "true")
            .call()
        else {
            return false;
        };
        matches!(read_body(&url, resp), Ok((200, body))
            if serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| v.get("compute").is_some()))
    }

    fn check(&mut self) -> Result<Option<CloudNotice>, PollError> {
        let events: AzureEvents = self.json("/metadata/scheduledevents?api-version=2020-07-01")?;
        let now = crate::clock::now();
        let deadline = events
            .events
            .iter()
            .filter(|e| matches!(e.event_type.as_str(), "Preempt" | "Terminate"))
            .map(|e| azure_deadline(&e.not_before, now))
            .min();
        Ok(deadline.map(|deadline| CloudNotice {
            source: NoticeSource::Azure,
            deadline,
        }))
    }

    fn placement(&mut self) -> Result<CloudPlacement, PollError> {
        let c: AzureCompute = self.json("/metadata/instance/compute?api-version=2021-02-01")?;
        Ok(CloudPlacement {
            zone: if c.zone.is_empty() {
                c.location
            } else {
                format!("{}-{}", c.location, c.zone)
            },
            instance_type: c.vm_size,
        })
    }
}

/// The parts of Azure's instance metadata (`compute`) that say where the VM runs.
#[derive(Deserialize)]
struct AzureCompute {
    location: String,
    /// The availability zone's number, empty outside zones.
    #[serde(default)]
    zone: String,
    #[serde(rename = "vmSize")]
    vm_size: String,
}

/// An Azure event's deadline: its `NotBefore`, or [`DEFAULT_LEAD`] from `now` when that is
/// empty (the event started), unparsable, or past.
fn azure_deadline(not_before: &str, now: SystemTime) -> SystemTime {
    httpdate::parse_http_date(not_before.trim())
        .ok()
        .filter(|t| *t > now)
        .unwrap_or(now + DEFAULT_LEAD)
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (the form AWS uses), with optional fractional seconds.
pub fn parse_rfc3339_utc(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(s.trim()).ok()
}

#[cfg(test)]
mod tests;
