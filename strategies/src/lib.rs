//! `parcae-strategies`: the decision Parcae-rs takes every interval, as a pure library.
//!
//! Everything here is deterministic for a given seed and free of I/O except parsing, so the
//! leader of a cluster, a simulator and a property test all compute the same answers.
//!
//! * [`trace`]: availability traces (event, count and replay formats, synthetic bands), binned
//!   into planning intervals.
//! * [`predict`]: forecasts of future availability (Parcae's ARIMA rules, exponential
//!   smoothing, notice-aware).
//! * [`cost`]: throughput of a `(D, P)` configuration and the cost of migrating between
//!   configurations.

pub mod assign;
pub mod baselines;
pub mod config;
pub mod cost;
pub mod error;
pub mod liveput;
pub mod predict;
pub mod sim;
pub mod trace;

pub use config::ParallelConfig;
pub use error::ParseError;
