//! The failures of a testnet run that a user must be able to tell apart: each message names
//! the thing that is wrong (the binary, the node and its log, the port) so that no one has to
//! read a backtrace to fix their setup.

use std::path::PathBuf;

/// Why a testnet run could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum TestnetError {
    /// The `parcae-node` executable is missing or cannot be run.
    #[error("parcae-node binary not built: {path}: {reason}")]
    NodeBinary {
        /// Where it was looked for.
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The node binary ran on where a `parcae-node` stops at once (its configuration probe).
    #[error(
        "{path} did not stop within {secs} s of reading a configuration with a missing cluster key, as a parcae-node does at once: is it a parcae-node?"
    )]
    NodeHung {
        /// The binary.
        path: PathBuf,
        /// How long it was given.
        secs: u64,
    },
    /// A node process exited on its own while starting.
    #[error("{node} crashed at start ({exit}); last lines of {log}:\n{tail}")]
    NodeCrashed {
        /// The node's name (`node3`).
        node: String,
        /// Its exit status.
        exit: String,
        /// Its log file.
        log: PathBuf,
        /// The end of the log.
        tail: String,
    },
    /// A node process runs but never answered `GET /status`.
    #[error("{node} did not serve /status on {addr} within {secs} s; last lines of {log}:\n{tail}")]
    NodeSilent {
        /// The node's name.
        node: String,
        /// Its status address.
        addr: String,
        /// The timeout.
        secs: u64,
        /// Its log file.
        log: PathBuf,
        /// The end of the log.
        tail: String,
    },
    /// A port the testnet was told to use is taken.
    #[error(
        "port {port} ({what}) is already in use; pick another --base-port or leave it out for ephemeral ports"
    )]
    PortInUse {
        /// The port.
        port: u16,
        /// What it was meant for (`status of node2`).
        what: String,
    },
    /// A local resource of the testnet (file, port, metadata server) could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system error.
        source: std::io::Error,
    },
    /// `--base-port` leaves no room for the nodes of the run.
    #[error("--base-port {base}: port numbers for node{node} exceed 65535")]
    PortRange {
        /// The base port.
        base: u16,
        /// The first node that does not fit.
        node: usize,
    },
    /// The node rejected the configuration the testnet generated.
    #[error("parcae-node rejected the generated config {path}: {message}")]
    ConfigRejected {
        /// The config file.
        path: PathBuf,
        /// The node's error output.
        message: String,
    },
    /// The cluster did not form.
    #[error("the cluster did not form within {secs} s: {detail}")]
    NoCluster {
        /// The timeout.
        secs: u64,
        /// What was seen.
        detail: String,
    },
    /// Every node of the cluster is gone, so a new one has nothing to join.
    #[error("no node of the cluster is running any more; cannot start new nodes")]
    NoLiveNode,
    /// The network namespaces of `--netns` could not be made or changed.
    #[error("--netns: {step}: {reason}")]
    Netns {
        /// What was being done (the `ip` command line).
        step: String,
        /// Why it failed.
        reason: String,
    },
    /// A size-limited checkpoint disk could not be made, filled or emptied.
    #[error("checkpoint disk {dir}: {reason}")]
    Disk {
        /// Its directory.
        dir: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// SIGINT, SIGTERM or SIGHUP reached the testnet.
    #[error("interrupted; every node was stopped")]
    Interrupted,
}
