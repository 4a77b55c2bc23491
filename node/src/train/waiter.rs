//! Waiting on the data plane's runtime from the trainer thread: every wait bounded, and a wait
//! for the work of one plan ended as soon as the replicated state names another.

use std::sync::Arc;
use std::time::Duration;

use parcae_consensus::ControlState;
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::error::TrainError;
use crate::dataplane::DataplaneError;

/// Runs `f` on the trainer's runtime for at most `limit` (the timer is created inside the
/// runtime, which tokio requires).
pub fn block_on_timeout<F: std::future::Future>(
    rt: &Runtime,
    limit: Duration,
    f: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    rt.block_on(async { tokio::time::timeout(limit, f).await })
}

/// Waits on the network for one step: gives up after the timeout, or as soon as the replicated
/// state names another plan (a neighbour that is gone will not answer, and the new plan needs
/// this node's state now).
pub(crate) struct Waiter<'a> {
    rt: &'a Runtime,
    timeout: Duration,
    view: watch::Receiver<Arc<ControlState>>,
    epoch: u64,
    step: u64,
}

impl<'a> Waiter<'a> {
    /// Waits for work of `step` under the plan of `epoch`, for at most `timeout`.
    pub(crate) fn new(
        rt: &'a Runtime,
        timeout: Duration,
        view: watch::Receiver<Arc<ControlState>>,
        epoch: u64,
        step: u64,
    ) -> Self {
        Self {
            rt,
            timeout,
            view,
            epoch,
            step,
        }
    }

    /// Runs `f` until it finishes, the timeout passes or a newer plan appears.
    pub(crate) fn wait<T, E>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, TrainError>
    where
        TrainError: From<E>,
    {
        let mut view = self.view.clone();
        let epoch = self.epoch;
        self.rt.block_on(async {
            let superseded = async {
                let newer = view.wait_for(|s| s.plan.as_ref().map(|p| p.epoch) != Some(epoch));
                if newer.await.is_err() {
                    // The control driver is gone: only the timeout ends the wait.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = tokio::time::timeout(self.timeout, f) => match r {
                    Ok(r) => r.map_err(TrainError::from),
                    Err(_) => Err(DataplaneError::Timeout(format!("{what} of step {}", self.step)).into()),
                },
                () = superseded => Err(TrainError::Superseded(self.step)),
            }
        })
    }
}
