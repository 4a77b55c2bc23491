//! The `NoticeWatcher` actor: turns "this machine is going away" into one [`LeaveRequested`].
//!
//! Sources: SIGTERM and SIGINT (deadline = now + grace), always, and the metadata poller of
//! the cloud `[notices] provider` names, or of the one [`detect`] finds (`auto`; deadline from
//! the provider). Only the first notice counts; a second SIGTERM or SIGINT while leaving means
//! the operator wants out now, and the process exits at once.

pub mod cloud;
pub mod detect;

use std::time::{Duration, SystemTime};

use actix::prelude::*;

use crate::config::{NodeConfig, NoticeConfig};
use crate::notice::NoticeSource;
use crate::status::NoticeWatch;
use cloud::MetadataPoller;

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
    notified: bool,
}

impl NoticeWatcher {
    /// Builds the watcher: notices go to `target`, the provider it watches to `shown`.
    pub fn new(
        config: &NodeConfig,
        target: Recipient<LeaveRequested>,
        shown: Recipient<NoticeWatch>,
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
            notified: false,
        }
    }
}

/// Finds the provider to poll (probing them for `auto`), says so, then polls it until it
/// announces a notice or the watcher is gone. Runs on a thread of its own: metadata requests
/// block.
fn watch_cloud(
    notices: &NoticeConfig,
    interval: Duration,
    me: &Addr<NoticeWatcher>,
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
    loop {
        match poller.check() {
            Ok(Some(notice)) => {
                tracing::warn!(provider = cloud.name(), "cloud preemption notice");
                me.do_send(notice);
                return;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(provider = cloud.name(), "poll failed: {e}"),
        }
        if !me.connected() {
            return;
        }
        std::thread::sleep(interval);
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
        let spawned = std::thread::Builder::new()
            .name("notice-watch".into())
            .spawn(move || watch_cloud(&notices, interval, &me, &shown));
        if let Err(e) = spawned {
            tracing::error!("cannot start the metadata poller thread: {e}");
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
