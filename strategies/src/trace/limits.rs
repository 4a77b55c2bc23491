//! The bounds of an untrusted trace, and Parcae's interval length.

/// Parcae's interval length (spec 1.1).
pub const DEFAULT_INTERVAL_SECS: u64 = 60;
/// Largest trace file or text accepted (bytes).
pub const MAX_INPUT_BYTES: usize = 64 << 20;
/// Most intervals a trace may have (about two years of one-minute intervals).
pub const MAX_INTERVALS: usize = 1 << 20;
/// Most nodes alive at once.
pub const MAX_NODES: u32 = 1 << 20;
/// Longest interval accepted (one day).
pub const MAX_INTERVAL_SECS: u64 = 86_400;
