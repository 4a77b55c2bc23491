//! The driver's part in rotating the cluster key: reading the staged key, proposing the
//! rotation on the leader once every member holds it, and keeping only the key in force once
//! the rotation applied.

use actix::prelude::*;
use parcae_consensus::Command;

use super::ControlDriver;
use crate::keyring::{Settled, rotation_due};

impl ControlDriver {
    /// Logs a problem with the keys once (until another one, or none, replaces it).
    fn key_problem(&mut self, problem: Option<String>) {
        if let Some(p) = &problem
            && self.key_problem.as_ref() != Some(p)
        {
            tracing::error!("{p}");
        }
        self.key_problem = problem;
    }

    /// Reads the staged key file again; on the leader, rotates to the staged key once every
    /// member holds it ([`rotation_due`]).
    pub(super) fn check_keys(&mut self, ctx: &mut Context<Self>) {
        match self.keys.reload_staged() {
            Ok(true) => {
                tracing::info!(
                    staged = %self.keys.staged().map(hex::encode).unwrap_or_default(),
                    "holding the staged cluster key beside the one in force; it goes into force once every member holds it"
                );
                self.key_problem(None);
            }
            Ok(false) => {}
            Err(e) => self.key_problem(Some(format!("the staged cluster key is not usable: {e}"))),
        }
        if self.node.is_leader()
            && let Some(key) = rotation_due(self.node.state(), self.keys.staged())
        {
            tracing::info!(key = %hex::encode(key), "every member holds the staged cluster key: rotating to it");
            self.propose_logged(Command::RotateKey { key }, ctx);
        }
    }

    /// Keeps only the key in force once the replicated state rotated to it.
    pub(super) fn settle_keys(&mut self) {
        let Some(in_force) = self.node.state().cluster_key else {
            return;
        };
        match self.keys.settle(in_force) {
            Ok(Settled::Unchanged) => {}
            Ok(Settled::Promoted) => tracing::info!(
                key = %hex::encode(in_force),
                "the staged cluster key is in force and written over the key file; the old key admits nobody now"
            ),
            Ok(Settled::NotHeld) => self.key_problem(Some(format!(
                "this node does not hold the cluster key in force ({}): stage it as KEY.next beside the key file",
                hex::encode(in_force)
            ))),
            Err(e) => self.key_problem(Some(format!(
                "the cluster key in force is used but could not be stored: {e}"
            ))),
        }
    }
}
