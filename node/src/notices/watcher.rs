//! The `NoticeWatcher` actor: turns "this machine is going away" into one [`LeaveRequested`]
//! for the control driver.
//!
//! Sources: SIGTERM and SIGINT (deadline = now + grace), always, and the metadata poller of
//! the cloud `[notices] provider` names, or of the one [`detect`] finds (`auto`; deadline from
//! the provider), on a thread of its own that hands its notice to the driver itself (one hop,
//! not two). Only the first notice counts; a second SIGTERM or SIGINT while leaving means the
//! operator wants out now, and the process exits at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use actix::prelude::*;

use super::cloud::{CloudPlacement, MetadataPoller};
use super::detect;
use super::notice::NoticeSource;
use crate::config::{NodeConfig, NoticeConfig, PlacementConfig};
use crate::status::NoticeWatch;

/// Default interval between metadata polls.
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Timeout of one metadata request (and of one probe at start).
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
    notices: NoticeConfig,
    target: Recipient<LeaveRequested>,
    shown: Recipient<NoticeWatch>,
    placed: Recipient<CloudPlacement>,
    /// Whether a notice went to the driver already: shared with the metadata poller's thread.
    notified: Arc<AtomicBool>,
}

impl NoticeWatcher {
    /// Builds the watcher: notices go to `target`, the provider it watches to `shown`, where
    /// the provider says the machine runs to `placed`.
    pub fn new(
        config: &NodeConfig,
        target: Recipient<LeaveRequested>,
        shown: Recipient<NoticeWatch>,
        placed: Recipient<CloudPlacement>,
    ) -> Self {
        let n = &config.notices;
        Self {
            grace: config.grace(),
            poll_interval: n
                .poll_interval_ms
                .map(Duration::from_millis)
                .unwrap_or(DEFAULT_POLL_INTERVAL),
            notices: n.clone(),
            target,
            shown,
            placed,
            notified: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Where the metadata poller's notice goes: the driver, unless a notice went there already;
/// and where the machine's zone and instance type go.
struct PollerTarget {
    target: Recipient<LeaveRequested>,
    placed: Recipient<CloudPlacement>,
    notified: Arc<AtomicBool>,
}

/// Finds the provider to poll (probing them for `auto`), says so, then polls it until it
/// announces a notice (handed to the driver) or the driver is gone. Runs on a thread of its
/// own: metadata requests block.
fn watch_cloud(
    notices: &NoticeConfig,
    interval: Duration,
    to: &PollerTarget,
    shown: &Recipient<NoticeWatch>,
) {
    let Some(cloud) = detect::provider(notices, POLL_TIMEOUT) else {
        tracing::info!(
            provider = ?notices.provider,
            "no cloud metadata service to poll: notices come from SIGTERM and SIGINT only"
        );
        shown.do_send(NoticeWatch("none".into()));
        return;
    };
    let base = cloud.base_url(notices);
    tracing::info!(provider = cloud.name(), %base, "polling the cloud metadata service for preemption notices");
    shown.do_send(NoticeWatch(cloud.name().into()));
    let mut poller: Box<dyn MetadataPoller> = cloud.poller(&base, POLL_TIMEOUT);
    report_placement(poller.as_mut(), cloud.name(), &to.placed);
    loop {
        match poller.check() {
            Ok(Some(notice)) => {
                tracing::warn!(provider = cloud.name(), "cloud preemption notice");
                if !to.notified.swap(true, Ordering::SeqCst) {
                    to.target.do_send(LeaveRequested {
                        source: notice.source,
                        deadline: notice.deadline,
                    });
                }
                return;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(provider = cloud.name(), "poll failed: {e}"),
        }
        if !to.target.connected() {
            return;
        }
        std::thread::sleep(interval);
    }
}

/// Asks the metadata service once where the machine runs and hands the answer to `placed`
/// when the membership would take it (the service is trusted no more than any peer).
fn report_placement(
    poller: &mut dyn MetadataPoller,
    provider: &str,
    placed: &Recipient<CloudPlacement>,
) {
    match poller.placement() {
        Ok(found) => {
            let as_configured = PlacementConfig {
                zone: found.zone.clone(),
                instance_type: found.instance_type.clone(),
            };
            match as_configured.validate() {
                Ok(()) => placed.do_send(found),
                Err(e) => tracing::warn!(provider, "metadata placement refused: {e}"),
            }
        }
        Err(e) => tracing::info!(
            provider,
            "the metadata service did not say where this machine runs: {e}"
        ),
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
        let (notices, interval, shown) =
            (self.notices.clone(), self.poll_interval, self.shown.clone());
        let to = PollerTarget {
            target: self.target.clone(),
            placed: self.placed.clone(),
            notified: self.notified.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("notice-watch".into())
            .spawn(move || watch_cloud(&notices, interval, &to, &shown));
        if let Err(e) = spawned {
            tracing::error!("cannot start the metadata poller thread: {e}");
        }
    }
}

impl Handler<Signalled> for NoticeWatcher {
    type Result = ();

    fn handle(&mut self, msg: Signalled, _: &mut Context<Self>) {
        if self.notified.swap(true, Ordering::SeqCst) {
            tracing::warn!("second {}: exiting now", msg.0);
            System::current().stop_with_code(1);
            return;
        }
        tracing::info!(grace = ?self.grace, "{} received: leaving gracefully", msg.0);
        self.target.do_send(LeaveRequested {
            source: NoticeSource::Signal,
            deadline: crate::clock::now() + self.grace,
        });
    }
}
