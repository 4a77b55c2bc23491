//! Applying what raft committed: command entries to the state machine, configuration changes
//! to raft and the state, snapshots from the leader; resolving the matching proposal handles.

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeSingle, ConfChangeV2, Entry, EntryType, Snapshot};

use super::{NodeEvent, ProposeError, RaftError, RaftNode};
use crate::membership::RaftConf;
use crate::state::ControlState;

impl RaftNode {
    pub(super) fn install_snapshot(&mut self, snapshot: Snapshot) -> Result<(), RaftError> {
        let state =
            ControlState::decode_snapshot(snapshot.get_data()).map_err(RaftError::Snapshot)?;
        let index = snapshot.get_metadata().index;
        let conf = snapshot.get_metadata().get_conf_state().clone();
        self.raw.mut_store().apply_snapshot(snapshot)?;
        self.state = state;
        self.applied_conf = conf;
        self.last_snapshot_index = index;
        self.metrics.snapshots_installed += 1;
        let covered: Vec<u64> = self.proposals.range(..=index).map(|(i, _)| *i).collect();
        for i in covered {
            if let Some(p) = self.proposals.remove(&i) {
                let _ = p.tx.send(Err(ProposeError::OutcomeUnknown));
            }
        }
        self.push_event(NodeEvent::SnapshotInstalled { index });
        Ok(())
    }

    pub(super) fn apply_entries(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            self.metrics.applied_entries += 1;
            match entry.get_entry_type() {
                EntryType::EntryNormal => self.apply_normal(&entry),
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_conf_change(&entry)
                }
            }
            self.supersede_older_terms(entry.term);
        }
    }

    /// Terms never decrease along a committed log: once an entry of term `term` is applied, no
    /// proposal made in an earlier term can still commit at a later index. Resolving them here
    /// keeps their handles from waiting for an index the log may never reach.
    pub(super) fn supersede_older_terms(&mut self, term: u64) {
        let stale: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.term < term)
            .map(|(i, _)| *i)
            .collect();
        for index in stale {
            if let Some(p) = self.proposals.remove(&index) {
                let _ = p.tx.send(Err(ProposeError::Superseded));
            }
        }
    }

    pub(super) fn apply_normal(&mut self, entry: &Entry) {
        let pending = self.proposals.remove(&entry.index);
        if entry.get_data().is_empty() {
            // The empty entry a new leader appends; nobody proposed it.
            if let Some(p) = pending {
                let _ = p.tx.send(Err(ProposeError::Superseded));
            }
            return;
        }
        let (command, outcome) = self.state.apply_bytes(entry.get_data());
        if let Err(rejection) = &outcome {
            self.metrics.rejected_commands += 1;
            tracing::debug!(index = entry.index, %rejection, "command rejected");
        }
        if let Some(p) = pending {
            let result = if p.term == entry.term {
                outcome.clone().map_err(ProposeError::Rejected)
            } else {
                Err(ProposeError::Superseded)
            };
            let _ = p.tx.send(result);
        }
        self.push_event(NodeEvent::Applied {
            index: entry.index,
            command: command.map(Box::new),
            outcome,
        });
    }

    pub(super) fn apply_conf_change(&mut self, entry: &Entry) {
        if let Some(p) = self.proposals.remove(&entry.index) {
            let _ = p.tx.send(Err(ProposeError::Superseded));
        }
        let cc = if entry.get_entry_type() == EntryType::EntryConfChange {
            ConfChange::parse_from_bytes(entry.get_data()).map(conf_change_v1_to_v2)
        } else {
            ConfChangeV2::parse_from_bytes(entry.get_data())
        };
        let result = match cc {
            Ok(cc) => self.raw.apply_conf_change(&cc).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(cs) => {
                self.state.set_raft_roles(&cs.voters, &cs.learners);
                let conf = RaftConf::from_conf_state(&cs);
                self.applied_conf = cs;
                self.push_event(NodeEvent::ConfChanged {
                    index: entry.index,
                    voters: conf.voters.into_iter().collect(),
                    learners: conf.learners.into_iter().collect(),
                });
            }
            Err(error) => {
                self.metrics.rejected_conf_changes += 1;
                tracing::warn!(index = entry.index, %error, "configuration change refused");
            }
        }
    }
}

/// Converts a legacy single conf change (never proposed by this crate, but valid in a raft log)
/// to its V2 form, as raft-rs does internally.
fn conf_change_v1_to_v2(cc: ConfChange) -> ConfChangeV2 {
    let mut single = ConfChangeSingle {
        node_id: cc.node_id,
        ..ConfChangeSingle::default()
    };
    single.set_change_type(cc.get_change_type());
    let mut v2 = ConfChangeV2::default();
    v2.changes.push(single);
    v2
}
