//! The command line of `parcae-node run` as every harness starts a node with it (the testnet's
//! clusters and the multi-process tests), so that a flag renamed in the node is renamed once.

use std::net::SocketAddr;
use std::path::Path;

/// One node to start: its directories, addresses, key, configuration and bootstrap peers.
pub struct NodeLaunch<'a> {
    /// Data directory (identity, raft log, checkpoints).
    pub data_dir: &'a Path,
    /// libp2p listen address.
    pub listen: &'a str,
    /// HTTP status address.
    pub status_addr: SocketAddr,
    /// Cluster key file.
    pub cluster_key: &'a Path,
    /// TOML configuration file.
    pub config: &'a Path,
    /// p2p addresses to join through (none, and no `--bootstrap-file` in `extra`: found a
    /// cluster).
    pub bootstrap: &'a [String],
    /// Further arguments, as given (e.g. `--bootstrap-file PATH`).
    pub extra: &'a [String],
}

impl NodeLaunch<'_> {
    /// The arguments of `parcae-node` for this node.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "run".to_string(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--listen".into(),
            self.listen.to_string(),
            "--cluster-key".into(),
            self.cluster_key.display().to_string(),
            "--status-addr".into(),
            self.status_addr.to_string(),
            "--config".into(),
            self.config.display().to_string(),
        ];
        for b in self.bootstrap {
            args.push("--bootstrap".into());
            args.push(b.clone());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_and_each_bootstrap_peer() {
        let boot = [
            "/ip4/127.0.0.1/tcp/1/p2p/a".to_string(),
            "/ip4/127.0.0.1/tcp/2/p2p/b".into(),
        ];
        let args = NodeLaunch {
            data_dir: Path::new("/d"),
            listen: "/ip4/127.0.0.1/tcp/0",
            status_addr: SocketAddr::from(([127, 0, 0, 1], 9)),
            cluster_key: Path::new("/k"),
            config: Path::new("/c.toml"),
            bootstrap: &boot,
            extra: &["--notice".into(), "none".into()],
        }
        .args();
        assert_eq!(
            args.join(" "),
            "run --data-dir /d --listen /ip4/127.0.0.1/tcp/0 --cluster-key /k \
             --status-addr 127.0.0.1:9 --config /c.toml \
             --bootstrap /ip4/127.0.0.1/tcp/1/p2p/a --bootstrap /ip4/127.0.0.1/tcp/2/p2p/b \
             --notice none"
        );
    }
}
