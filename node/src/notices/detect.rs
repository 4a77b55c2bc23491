//! Which cloud's metadata service to poll: the one `[notices] provider` names, or for `auto` the
//! one that answers a probe at start (AWS IMDSv2, GCE, Azure IMDS, probed at once, each with a
//! short timeout). A VM on none of them (or a laptop) watches signals only.

use std::time::Duration;

use super::cloud::{AwsPoller, AzurePoller, GcePoller, MetadataPoller};
use crate::config::{NoticeConfig, NoticeProvider};

/// AWS's instance metadata service.
pub const AWS_METADATA: &str = "http://169.254.169.254";
/// GCE's metadata server.
pub const GCE_METADATA: &str = "http://metadata.google.internal";
/// Azure's instance metadata service.
pub const AZURE_METADATA: &str = "http://169.254.169.254";

/// A cloud whose metadata service announces preemptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// Amazon EC2 spot.
    Aws,
    /// Google Compute Engine spot / preemptible.
    Gce,
    /// Azure Spot.
    Azure,
}

impl Cloud {
    /// Probe order of `auto`: when more than one answers, the first wins.
    pub const ALL: [Cloud; 3] = [Cloud::Aws, Cloud::Gce, Cloud::Azure];

    /// Its name in logs and `/status`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::Gce => "gce",
            Self::Azure => "azure",
        }
    }

    /// Its metadata base URL: configured, or the well-known one.
    pub fn base_url(self, notices: &NoticeConfig) -> String {
        let (configured, default) = match self {
            Self::Aws => (&notices.aws_base_url, AWS_METADATA),
            Self::Gce => (&notices.gce_base_url, GCE_METADATA),
            Self::Azure => (&notices.azure_base_url, AZURE_METADATA),
        };
        configured.clone().unwrap_or_else(|| default.to_owned())
    }

    /// A poller of its metadata service at `base`.
    pub fn poller(self, base: &str, timeout: Duration) -> Box<dyn MetadataPoller> {
        match self {
            Self::Aws => Box::new(AwsPoller::new(base, timeout)),
            Self::Gce => Box::new(GcePoller::new(base, timeout)),
            Self::Azure => Box::new(AzurePoller::new(base, timeout)),
        }
    }
}

/// The provider to poll, given which clouds `answers` (only asked for `auto`).
pub fn choose(provider: NoticeProvider, answers: &[Cloud]) -> Option<Cloud> {
    match provider {
        NoticeProvider::Auto => Cloud::ALL.into_iter().find(|c| answers.contains(c)),
        NoticeProvider::Aws => Some(Cloud::Aws),
        NoticeProvider::Gce => Some(Cloud::Gce),
        NoticeProvider::Azure => Some(Cloud::Azure),
        NoticeProvider::None => None,
    }
}

/// The provider to poll under `notices`: for `auto`, every cloud is probed at once (each within
/// `timeout`), and the first in [`Cloud::ALL`] order that answers wins as soon as every cloud
/// before it has failed (on AWS the answer comes without waiting for the other probes).
pub fn provider(notices: &NoticeConfig, timeout: Duration) -> Option<Cloud> {
    if notices.provider != NoticeProvider::Auto {
        return choose(notices.provider, &[]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for cloud in Cloud::ALL {
        let (probe_tx, base) = (tx.clone(), cloud.base_url(notices));
        let spawned = std::thread::Builder::new()
            .name(format!("probe-{}", cloud.name()))
            .spawn(move || {
                let _ = probe_tx.send((cloud, cloud.poller(&base, timeout).answers()));
            });
        if let Err(e) = spawned {
            tracing::warn!(cloud = cloud.name(), "cannot start a metadata probe: {e}");
            let _ = tx.send((cloud, false));
        }
    }
    drop(tx);
    let mut heard: Vec<(Cloud, bool)> = Vec::new();
    while let Ok(answer) = rx.recv() {
        heard.push(answer);
        if let Some(decided) = decided(&heard) {
            return decided;
        }
    }
    None
}

/// Whether the probe answers `heard` so far decide `auto`: `Some(Some(cloud))` when every cloud
/// before `cloud` failed and `cloud` answered, `Some(None)` when all failed, `None` while an
/// earlier probe is still out.
fn decided(heard: &[(Cloud, bool)]) -> Option<Option<Cloud>> {
    for cloud in Cloud::ALL {
        match heard.iter().find(|(c, _)| *c == cloud) {
            Some((_, true)) => return Some(Some(cloud)),
            Some((_, false)) => continue,
            None => return None,
        }
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_the_first_cloud_that_answered_and_a_named_one_is_taken_as_named() {
        assert_eq!(choose(NoticeProvider::Auto, &[]), None);
        assert_eq!(
            choose(NoticeProvider::Auto, &[Cloud::Azure]),
            Some(Cloud::Azure)
        );
        assert_eq!(
            choose(NoticeProvider::Auto, &[Cloud::Azure, Cloud::Gce]),
            Some(Cloud::Gce)
        );
        assert_eq!(choose(NoticeProvider::Gce, &[]), Some(Cloud::Gce));
        assert_eq!(choose(NoticeProvider::None, &Cloud::ALL), None);
    }

    #[test]
    fn auto_decides_as_soon_as_every_earlier_probe_failed() {
        assert_eq!(decided(&[]), None);
        assert_eq!(decided(&[(Cloud::Aws, true)]), Some(Some(Cloud::Aws)));
        assert_eq!(decided(&[(Cloud::Gce, true)]), None, "AWS may still answer");
        assert_eq!(
            decided(&[(Cloud::Gce, true), (Cloud::Aws, false)]),
            Some(Some(Cloud::Gce))
        );
        assert_eq!(
            decided(&[
                (Cloud::Azure, false),
                (Cloud::Aws, false),
                (Cloud::Gce, false)
            ]),
            Some(None)
        );
    }

    #[test]
    fn base_urls_default_to_the_well_known_services() {
        let mut n = NoticeConfig::default();
        assert_eq!(Cloud::Gce.base_url(&n), GCE_METADATA);
        n.azure_base_url = Some("http://127.0.0.1:9".into());
        assert_eq!(Cloud::Azure.base_url(&n), "http://127.0.0.1:9");
        assert_eq!(Cloud::Aws.base_url(&n), AWS_METADATA);
    }

    #[test]
    fn nothing_answers_on_a_dead_port() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dead = format!("http://127.0.0.1:{port}");
        let notices = NoticeConfig {
            aws_base_url: Some(dead.clone()),
            gce_base_url: Some(dead.clone()),
            azure_base_url: Some(dead),
            ..NoticeConfig::default()
        };
        assert_eq!(provider(&notices, Duration::from_millis(500)), None);
    }
}
