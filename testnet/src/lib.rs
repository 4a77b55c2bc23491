//! What the testnet shares with other harnesses that start `parcae-node` processes (the
//! workspace's multi-process tests and benchmarks): the node's command line, one node process,
//! a local cluster of them with its ports, supervision of the processes, interruption, the
//! errors that name what went wrong, and the fake cloud metadata service that announces
//! preemptions.

pub mod background_http;
pub mod cargo;
pub mod clock_skew;
pub mod disks;
pub mod error;
pub mod imds;
pub mod interrupt;
pub mod launch;
pub mod local_cluster;
pub mod netns;
pub mod node_process;
pub mod ports;
pub mod supervise;
pub mod time_factor;
