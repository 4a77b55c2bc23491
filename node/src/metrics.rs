//! Process-wide counters and gauges, exposed on `/metrics` in the OpenMetrics text format by
//! `prometheus-client`.
//!
//! The metrics are atomics shared through an `Arc`: every actor bumps its counters without a
//! message hop, and a scrape never blocks an actor.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A value that goes up and down (all of ours are counts or indexes).
pub type UGauge = Gauge<u64, AtomicU64>;

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

macro_rules! metrics {
    ($( $field:ident : $kind:ty => $help:literal ),* $(,)?) => {
        /// All metrics of one node process, each named `parcae_<field>`.
        #[derive(Debug)]
        pub struct Metrics {
            $( #[doc = $help] pub $field: $kind, )*
            registry: Registry,
        }

        impl Default for Metrics {
            fn default() -> Self {
                let mut registry = Registry::with_prefix("parcae");
                $(
                    let $field = <$kind>::default();
                    // OpenMetrics counters are registered without the `_total` their samples get.
                    registry.register(
                        stringify!($field).trim_end_matches("_total"),
                        $help,
                        $field.clone(),
                    );
                )*
                Self { $( $field, )* registry }
            }
        }
    };
}

metrics! {
    connections_established_total: Counter => "Connections that passed admission.",
    connections_failed_total: Counter => "Connections refused or failed before admission completed.",
    peers_connected: UGauge => "Peers with at least one established connection.",
    control_frames_in_total: Counter => "Control frames received.",
    control_frames_out_total: Counter => "Control frames sent.",
    control_send_failures_total: Counter => "Control frames that could not be delivered.",
    control_streams_in_total: Counter => "Control streams peers opened to this node (one a peer while its stream lasts).",
    bad_input_disconnects_total: Counter => "Peers disconnected for malformed or oversized input.",
    notices_published_total: Counter => "Preemption notices this node gossiped.",
    notices_received_total: Counter => "Valid preemption notices received from peers.",
    notices_rejected_total: Counter => "Gossip messages on the notice topic that failed validation.",
    allreduce_bytes_total: Counter => "Bytes this node sent in gradient all-reduces.",
    allreduce_cross_zone_bytes_total: Counter => "Of them, bytes sent to a replica in another zone.",
    raft_term: UGauge => "Current raft term.",
    raft_is_leader: UGauge => "1 when this node is the raft leader.",
    raft_commit_index: UGauge => "Highest committed raft log index.",
    raft_applied_index: UGauge => "Highest raft log index applied to the control state.",
    raft_proposals_total: Counter => "Commands this node proposed or forwarded.",
    members: UGauge => "Members in the replicated membership.",
    raft_refused_messages: UGauge => "Raft messages refused: oversized, malformed, forged sender, non-member.",
    raft_rejected_commands: UGauge => "Committed commands the state machine rejected.",
    raft_membership_proposals: UGauge => "Configuration changes this node proposed as leader.",
    raft_snapshots_installed: UGauge => "Snapshots installed from a leader.",
    http_connections: UGauge => "Status-server connections open.",
    http_refused_total: Counter => "Status-server connections closed at once: their source held its share.",
    http_evicted_total: Counter => "Status-server connections closed to make room for a source holding fewer.",
    emulated_overruns: UGauge => "Pieces of work that outlasted their emulated accelerator time.",
    emulated_overrun_ms: UGauge => "Milliseconds by which real work outlasted its emulated time.",
    emulated_busy_ms: UGauge => "Emulated accelerator busy time paced so far, ms.",
    checkpoints_total: Counter => "Checkpoints this node took (its stage's part of a cut).",
    checkpoint_snapshot_ms_total: Counter => "Milliseconds the training loop spent taking checkpoint snapshots and their digests.",
    checkpoint_write_ms_total: Counter => "Milliseconds of checkpoint writes off the training loop: the local file with fsync and the copy to a peer.",
    checkpoint_upload_ms_total: Counter => "Milliseconds of checkpoint uploads to the job's store off the training loop.",
    checkpoint_write_failures_total: Counter => "Checkpoints whose local file could not be written (a full disk, an I/O error): training went on from memory, the next checkpoint tries again.",
}

impl Metrics {
    /// Every metric in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openmetrics_text() {
        let m = Metrics::default();
        m.control_frames_in_total.inc();
        m.control_frames_in_total.inc();
        m.raft_term.set(7);
        let text = m.render();
        assert!(
            text.contains(
                "# TYPE parcae_control_frames_in counter\nparcae_control_frames_in_total 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE parcae_raft_term gauge\nparcae_raft_term 7\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
