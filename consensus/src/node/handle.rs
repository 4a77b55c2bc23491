//! Runtime-agnostic completion handles: plain futures over `futures::channel::oneshot`, usable
//! from actix, tokio or a blocking test alike.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::channel::oneshot;

use super::error::{ProposeError, ReadError};
use crate::state::StateEvent;

/// Resolves when the proposed command was applied (with its state events) or failed.
#[derive(Debug)]
pub struct ProposalHandle {
    pub(super) index: u64,
    pub(super) rx: oneshot::Receiver<Result<Vec<StateEvent>, ProposeError>>,
}

impl ProposalHandle {
    /// Log index the proposal was appended at.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The outcome if it is already known, without waiting.
    pub fn try_outcome(&mut self) -> Option<Result<Vec<StateEvent>, ProposeError>> {
        match self.rx.try_recv() {
            Ok(Some(outcome)) => Some(outcome),
            Ok(None) => None,
            Err(oneshot::Canceled) => Some(Err(ProposeError::Shutdown)),
        }
    }
}

impl Future for ProposalHandle {
    type Output = Result<Vec<StateEvent>, ProposeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(ProposeError::Shutdown)))
    }
}

/// Resolves with the applied index at which the local state became linearizable to read.
#[derive(Debug)]
pub struct ReadHandle {
    pub(super) rx: oneshot::Receiver<Result<u64, ReadError>>,
}

impl ReadHandle {
    /// The outcome if it is already known, without waiting.
    pub fn try_outcome(&mut self) -> Option<Result<u64, ReadError>> {
        match self.rx.try_recv() {
            Ok(Some(outcome)) => Some(outcome),
            Ok(None) => None,
            Err(oneshot::Canceled) => Some(Err(ReadError::Shutdown)),
        }
    }
}

impl Future for ReadHandle {
    type Output = Result<u64, ReadError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(ReadError::Shutdown)))
    }
}
