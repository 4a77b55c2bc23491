//! What the testnet shares with other harnesses that start `parcae-node` processes (the
//! workspace's multi-process tests): choosing the ports the nodes listen on, and the fake cloud
//! metadata service that announces preemptions.

pub mod imds;
pub mod ports;
