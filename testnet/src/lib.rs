//! What the testnet shares with other harnesses that start `parcae-node` processes (the
//! workspace's multi-process tests): the node's command line, choosing the ports the nodes
//! listen on, supervising the node processes, and the fake cloud metadata service that
//! announces preemptions.

pub mod imds;
pub mod launch;
pub mod ports;
pub mod supervise;
