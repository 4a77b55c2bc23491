//! Process-wide counters and gauges, rendered as Prometheus text by the status server.
//!
//! Plain atomics shared through an `Arc`: every actor bumps its counters without a message hop,
//! and a scrape never blocks an actor.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Replaces the value.
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! metrics {
    ($( $field:ident : $kind:ident => $help:literal ),* $(,)?) => {
        /// All metrics of one node process.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( #[doc = $help] pub $field: $kind, )*
        }

        impl Metrics {
            /// Renders every metric in the Prometheus text exposition format (version 0.0.4),
            /// each name prefixed with `parcae_`.
            pub fn render(&self) -> String {
                let mut out = String::new();
                $(
                    let kind = match stringify!($kind) { "Counter" => "counter", _ => "gauge" };
                    let _ = writeln!(out, "# HELP parcae_{} {}", stringify!($field), $help);
                    let _ = writeln!(out, "# TYPE parcae_{} {}", stringify!($field), kind);
                    let _ = writeln!(out, "parcae_{} {}", stringify!($field), self.$field.get());
                )*
                out
            }
        }
    };
}

metrics! {
    connections_established_total: Counter => "Connections that passed admission.",
    connections_failed_total: Counter => "Connections refused or failed before admission completed.",
    peers_connected: Gauge => "Peers with at least one established connection.",
    control_frames_in_total: Counter => "Control frames received.",
    control_frames_out_total: Counter => "Control frames sent.",
    control_send_failures_total: Counter => "Control frames that could not be delivered.",
    bad_input_disconnects_total: Counter => "Peers disconnected for malformed or oversized input.",
    notices_published_total: Counter => "Preemption notices this node gossiped.",
    notices_received_total: Counter => "Valid preemption notices received from peers.",
    notices_rejected_total: Counter => "Gossip messages on the notice topic that failed validation.",
    raft_term: Gauge => "Current raft term.",
    raft_is_leader: Gauge => "1 when this node is the raft leader.",
    raft_commit_index: Gauge => "Highest committed raft log index.",
    raft_applied_index: Gauge => "Highest raft log index applied to the control state.",
    raft_proposals_total: Counter => "Commands this node proposed or forwarded.",
    members: Gauge => "Members in the replicated membership.",
    raft_refused_messages: Gauge => "Raft messages refused: oversized, malformed, forged sender, non-member.",
    raft_rejected_commands: Gauge => "Committed commands the state machine rejected.",
    raft_membership_proposals: Gauge => "Configuration changes this node proposed as leader.",
    raft_snapshots_installed: Gauge => "Snapshots installed from a leader.",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.control_frames_in_total.inc();
        m.control_frames_in_total.inc();
        m.raft_term.set(7);
        let text = m.render();
        assert!(text.contains(
            "# TYPE parcae_control_frames_in_total counter\nparcae_control_frames_in_total 2\n"
        ));
        assert!(text.contains("# TYPE parcae_raft_term gauge\nparcae_raft_term 7\n"));
    }
}
