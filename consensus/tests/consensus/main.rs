//! Cluster-level tests of parcae-consensus over the simulated network (see `sim.rs`).

mod bad_input;
mod churn;
mod faults;
mod liveness;
mod sim;
