//! The control plane as the rest of the node sees it: a cloneable handle to propose commands
//! and watch channels of what was applied (as in rust-libp2p's `file-sharing` client).
//!
//! The handle exists before the driver runs ([`ControlPlane::new`]): the trainer starts first
//! (its data-plane address goes into this node's membership record) and already holds the
//! handle it reports its steps through.

use std::sync::Arc;

use actix::dev::channel::{self, AddressReceiver};
use actix::prelude::*;
use parcae_consensus::{Command, ControlState};
use tokio::sync::watch;

use super::driver::ControlDriver;
use super::proposal::{Propose, ProposeFailed, Routed, Watches};

/// Proposals queued before the driver reads them; `submit` ignores the bound.
const MAILBOX: usize = 256;

/// A cloneable handle on the control plane.
#[derive(Clone)]
pub struct ControlHandle {
    driver: Addr<ControlDriver>,
    state: watch::Receiver<Arc<ControlState>>,
    leading: watch::Receiver<bool>,
}

impl ControlHandle {
    /// Proposes `command` and tells where it went (not whether it committed: watch the state).
    pub async fn propose(&self, command: Command) -> Result<Routed, ProposeFailed> {
        self.driver
            .send(Propose(command))
            .await
            .map_err(|_| ProposeFailed::Stopped)?
    }

    /// Proposes `command` without waiting for where it went (reports whose loss a retry or
    /// the next report covers).
    pub fn submit(&self, command: Command) {
        self.driver.do_send(Propose(command));
    }

    /// The applied replicated state, replaced after every ready cycle that applied something.
    pub fn state(&self) -> watch::Receiver<Arc<ControlState>> {
        self.state.clone()
    }

    /// Whether this node leads the cluster now.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// The driver's address, for the parts that feed it events (network, notice watcher).
    pub fn driver(&self) -> &Addr<ControlDriver> {
        &self.driver
    }
}

/// The control plane before its driver starts: the handle, and the ends the driver keeps.
pub struct ControlPlane {
    handle: ControlHandle,
    mailbox: AddressReceiver<ControlDriver>,
    state: watch::Sender<Arc<ControlState>>,
    leading: watch::Sender<bool>,
}

impl ControlPlane {
    /// A control plane whose handle works at once; proposals wait in the mailbox until
    /// [`ControlPlane::start`].
    pub fn new() -> Self {
        let (tx, mailbox) = channel::channel(MAILBOX);
        let (state, state_rx) = watch::channel(Arc::default());
        let (leading, leading_rx) = watch::channel(false);
        Self {
            handle: ControlHandle {
                driver: Addr::new(tx),
                state: state_rx,
                leading: leading_rx,
            },
            mailbox,
            state,
            leading,
        }
    }

    /// The handle.
    pub fn handle(&self) -> ControlHandle {
        self.handle.clone()
    }

    /// Starts the driver that `build` makes around the watch channels' senders, on
    /// `arbiter` (a thread of its own, so that no other actor's work delays a ready cycle).
    pub fn start<F>(self, arbiter: &ArbiterHandle, build: F)
    where
        F: FnOnce(Watches) -> ControlDriver + Send + 'static,
    {
        let watches = Watches {
            state: self.state,
            leading: self.leading,
        };
        let mailbox = self.mailbox;
        arbiter.spawn_fn(move || {
            let ctx = Context::with_receiver(mailbox);
            let driver = build(watches);
            actix::spawn(ctx.into_future(driver));
        });
    }
}

impl Default for ControlPlane {
    fn default() -> Self {
        Self::new()
    }
}
