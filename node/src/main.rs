//! `parcae-node`: run a node, make a cluster key, or query a node's status.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use libp2p::Multiaddr;
use parcae_node::config::NodeConfig;
use parcae_node::key::ClusterKey;
use parcae_node::runtime::{self, RunOptions};

#[derive(Parser)]
#[command(
    name = "parcae-node",
    version,
    about = "Parcae-rs node: spot-instance training cluster member"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Run {
        /// Directory for the identity key and the raft log (created if missing).
        #[arg(long)]
        data_dir: PathBuf,
        /// libp2p listen address, e.g. /ip4/0.0.0.0/tcp/7000 (repeatable).
        #[arg(long, required = true)]
        listen: Vec<Multiaddr>,
        /// Peers to join through, each ending in /p2p/PEER_ID (repeatable). Without any, the node
        /// starts a new cluster (unless its data directory already holds one).
        #[arg(long, num_args = 1..)]
        bootstrap: Vec<Multiaddr>,
        /// File holding the cluster key (see `keygen`).
        #[arg(long)]
        cluster_key: PathBuf,
        /// Address of the HTTP status server (/status, /metrics).
        #[arg(long)]
        status_addr: SocketAddr,
        /// Optional TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Create a new cluster key file.
    Keygen {
        /// Where to write the key (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a running node's /status.
    Status {
        /// The node's status address, e.g. 127.0.0.1:9000.
        #[arg(long)]
        addr: SocketAddr,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run {
            data_dir,
            listen,
            bootstrap,
            cluster_key,
            status_addr,
            config,
        } => {
            let config = match config {
                Some(path) => NodeConfig::load(&path)?,
                None => NodeConfig::default(),
            };
            let cluster_key = ClusterKey::load(&cluster_key)?;
            let code = runtime::run(RunOptions {
                data_dir,
                listen,
                bootstrap,
                cluster_key,
                status_addr,
                config,
            })?;
            std::process::exit(code);
        }
        Command::Keygen { out } => {
            let key = ClusterKey::generate();
            key.store(&out)?;
            println!(
                "wrote {} (fingerprint {})",
                out.display(),
                key.fingerprint()
            );
            Ok(())
        }
        Command::Status { addr } => {
            let url = format!("http://{addr}/status");
            let agent = ureq::Agent::new_with_config(
                ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_secs(5)))
                    .build(),
            );
            let mut resp = agent
                .get(&url)
                .call()
                .with_context(|| format!("GET {url}"))?;
            let body = resp
                .body_mut()
                .with_config()
                .limit(4 << 20)
                .read_to_string()
                .with_context(|| format!("reading {url}"))?;
            let value: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("{url} did not return JSON"))?;
            if !value.is_object() {
                bail!("{url} returned {value}, not a status object");
            }
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(())
        }
    }
}
