//! Forwards raft-rs's slog records to `tracing` (target `raft`), so that raft logs follow
//! `RUST_LOG` like the rest of the node. raft's chatty `info` level maps to `debug`.

use std::fmt::Write as _;

use slog::{Drain, KV, Key, Level, OwnedKVList, Record, Serializer};

struct TracingDrain;

struct KvText(String);

impl Serializer for KvText {
    fn emit_arguments(&mut self, key: Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let level = match record.level() {
            Level::Critical | Level::Error => tracing::Level::ERROR,
            Level::Warning => tracing::Level::WARN,
            Level::Info => tracing::Level::DEBUG,
            Level::Debug | Level::Trace => tracing::Level::TRACE,
        };
        let enabled = match level {
            tracing::Level::ERROR => tracing::enabled!(target: "raft", tracing::Level::ERROR),
            tracing::Level::WARN => tracing::enabled!(target: "raft", tracing::Level::WARN),
            tracing::Level::DEBUG => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            _ => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut kv = KvText(String::new());
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let msg = record.msg();
        match level {
            tracing::Level::ERROR => tracing::error!(target: "raft", "{msg}{}", kv.0),
            tracing::Level::WARN => tracing::warn!(target: "raft", "{msg}{}", kv.0),
            tracing::Level::DEBUG => tracing::debug!(target: "raft", "{msg}{}", kv.0),
            _ => tracing::trace!(target: "raft", "{msg}{}", kv.0),
        }
        Ok(())
    }
}

/// A slog logger for raft-rs that writes through `tracing`, tagged with the node id.
pub(crate) fn raft_logger(node: u64) -> slog::Logger {
    slog::Logger::root(
        TracingDrain.fuse(),
        slog::o!("raft_id" => format!("{node:016x}")),
    )
}
