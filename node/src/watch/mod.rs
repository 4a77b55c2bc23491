//! The `NoticeWatcher` actor: turns "this machine is going away" into one [`LeaveRequested`].
//!
//! Sources: SIGTERM and SIGINT (deadline = now + grace), and the cloud metadata pollers of
//! [`cloud`] (deadline from the provider). Only the first notice counts; a second SIGTERM or
//! SIGINT while leaving means the operator wants out now, and the process exits at once.

pub mod cloud;

use std::time::{Duration, SystemTime};

use actix::prelude::*;

use crate::config::NodeConfig;
use crate::notice::NoticeSource;
use cloud::{AwsPoller, AzurePoller, GcePoller, MetadataPoller};

/// Default interval between metadata polls.
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Timeout of one metadata request.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// The node must leave by `deadline`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct LeaveRequested {
    /// What announced it.
    pub source: NoticeSource,
    /// When the node must be gone.
    pub deadline: SystemTime,
}

/// The actor.
pub struct NoticeWatcher {
    grace: Duration,
    poll_interval: Duration,
    pollers: Vec<Box<dyn MetadataPoller>>,
    target: Recipient<LeaveRequested>,
    notified: bool,
}

impl NoticeWatcher {
    /// Builds the watcher with the pollers whose base URLs are configured.
    pub fn new(config: &NodeConfig, target: Recipient<LeaveRequested>) -> Self {
        let n = &config.notices;
        let mut pollers: Vec<Box<dyn MetadataPoller>> = Vec::new();
        if let Some(url) = &n.aws_base_url {
            pollers.push(Box::new(AwsPoller::new(url, POLL_TIMEOUT)));
        }
        if let Some(url) = &n.gce_base_url {
            pollers.push(Box::new(GcePoller::new(url, POLL_TIMEOUT)));
        }
        if let Some(url) = &n.azure_base_url {
            pollers.push(Box::new(AzurePoller::new(url, POLL_TIMEOUT)));
        }
        Self {
            grace: config.grace(),
            poll_interval: n
                .poll_interval_ms
                .map(Duration::from_millis)
                .unwrap_or(DEFAULT_POLL_INTERVAL),
            pollers,
            target,
            notified: false,
        }
    }
}

/// A signal arrived.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Signalled(&'static str);

impl Actor for NoticeWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let me = ctx.address();
        for (kind, name) in [
            (tokio::signal::unix::SignalKind::terminate(), "SIGTERM"),
            (tokio::signal::unix::SignalKind::interrupt(), "SIGINT"),
        ] {
            match tokio::signal::unix::signal(kind) {
                Ok(mut stream) => {
                    let me = me.clone();
                    actix::spawn(async move {
                        while stream.recv().await.is_some() {
                            me.do_send(Signalled(name));
                        }
                    });
                }
                Err(e) => tracing::error!("cannot install {name} handler: {e}"),
            }
        }
        for mut poller in std::mem::take(&mut self.pollers) {
            let me = me.clone();
            let interval = self.poll_interval;
            let spawned = std::thread::Builder::new()
                .name(format!("poll-{}", poller.name()))
                .spawn(move || {
                    loop {
                        match poller.check() {
                            Ok(Some(notice)) => {
                                tracing::warn!(provider = poller.name(), "cloud preemption notice");
                                me.do_send(notice);
                                return;
                            }
                            Ok(None) => {}
                            Err(e) => tracing::debug!(provider = poller.name(), "poll failed: {e}"),
                        }
                        if !me.connected() {
                            return;
                        }
                        std::thread::sleep(interval);
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start metadata poller thread: {e}");
            }
        }
    }
}

impl Message for cloud::CloudNotice {
    type Result = ();
}

impl NoticeWatcher {
    fn request_leave(&mut self, source: NoticeSource, deadline: SystemTime) {
        if self.notified {
            return;
        }
        self.notified = true;
        self.target.do_send(LeaveRequested { source, deadline });
    }
}

impl Handler<Signalled> for NoticeWatcher {
    type Result = ();

    fn handle(&mut self, msg: Signalled, _: &mut Context<Self>) {
        if self.notified {
            tracing::warn!("second {}: exiting now", msg.0);
            System::current().stop_with_code(1);
            return;
        }
        tracing::info!(grace = ?self.grace, "{} received: leaving gracefully", msg.0);
        self.request_leave(NoticeSource::Signal, SystemTime::now() + self.grace);
    }
}

impl Handler<cloud::CloudNotice> for NoticeWatcher {
    type Result = ();

    fn handle(&mut self, msg: cloud::CloudNotice, _: &mut Context<Self>) {
        self.request_leave(msg.source, msg.deadline);
    }
}
