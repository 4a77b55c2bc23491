//! Harness for multi-process tests: real `parcae-node` processes on 127.0.0.1.
//!
//! Finding the binary: `CARGO_BIN_EXE_*` only exists inside the crate that owns a binary, so this
//! crate looks for `parcae-node` in the profile directory of its own executable
//! (`target/<profile>/`), after
//! asking cargo to build it once per test process (`$CARGO build --workspace --bin
//! parcae-node`, a no-op when up to date). `PARCAE_NODE_BIN` overrides both.
//!
//! Clusters are the testnet's own harness ([`LocalCluster`]) in a temporary directory: every
//! node process is killed (SIGKILL) and reaped when the cluster is dropped, and killed by the
//! kernel if the test process dies, so a failing assertion never leaves nodes behind. Tests
//! that start clusters take [`serial`] so that at most one cluster runs at a time on a small
//! machine, whichever test binary they are in and however the runner schedules them.
//!
//! Every wait is stretched by one factor, `PARCAE_TEST_TIME_FACTOR` (the harness's [`wait_for`]
//! and cluster waits apply it; a test's own deadlines take [`secs`]), for machines slower than
//! the two shared cores the waits were set on.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

pub mod training;

use parcae_api::client::Client;
use parcae_testnet::clock_skew::ClockSkew;
use parcae_testnet::interrupt::Interrupt;
pub use parcae_testnet::local_cluster::LocalCluster;
use parcae_testnet::local_cluster::{ClusterSetup, Ports};
pub use parcae_testnet::node_process::wait_for;

/// Held while a test runs its cluster: one cluster at a time on the machine.
pub struct ClusterLock {
    /// The locked file; closing it releases the lock.
    _file: File,
}

/// Serialises the tests that start clusters across every test binary of the workspace: an
/// exclusive lock on a file in the target directory, held until the guard is dropped (and
/// released by the kernel if the test process dies). `cargo test` runs the binaries one after
/// another, but a runner that runs them at once (nextest) would put several clusters on two
/// cores, where their nodes time each other out.
pub fn serial() -> ClusterLock {
    let path = profile_dir()
        .parent()
        .expect("target directory")
        .join("parcae-cluster-tests.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cluster test lock {}: {e}", path.display()));
    file.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    ClusterLock { _file: file }
}

/// `n` seconds stretched by the time factor (`PARCAE_TEST_TIME_FACTOR`), for a test's own
/// deadlines; the harness's waits stretch theirs themselves.
pub fn secs(n: u64) -> Duration {
    parcae_testnet::time_factor::scaled(Duration::from_secs(n))
}

/// Whether this executable is a test (`target/<profile>/deps/<test>`) rather than a bench
/// binary (`target/<profile>/<bin>`).
fn running_as_test() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.file_name()? == "deps"))
        .unwrap_or(false)
}

/// `target/<profile>` of this executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let mut dir = exe.parent().expect("executable directory").to_path_buf();
    if running_as_test() {
        dir.pop();
    }
    dir
}

/// Runs cargo with `args` (e.g. `build --workspace --example x`) in this executable's profile
/// and returns `target/<profile>/<relative>`.
fn build(args: &[&str], relative: &str) -> PathBuf {
    let dir = profile_dir();
    let mut build = parcae_testnet::cargo::command();
    build.args(args);
    if cfg!(feature = "cuda") {
        build.args(["--features", "parcae-node/cuda"]);
    }
    if dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo build");
    assert!(status.success(), "cargo {args:?} failed");
    let bin = dir.join(relative);
    assert!(bin.exists(), "{} not found after build", bin.display());
    bin
}

/// Path of the `parcae-node` binary (built on first use; `PARCAE_NODE_BIN` overrides).
///
/// A test builds it with `cargo test --workspace --no-run --test cli` (the binary of the node
/// package's CLI test): exactly the feature set of `cargo test --workspace`, so inside a
/// workspace test run nothing is built, where `cargo build` would resolve features without
/// the dev-dependencies and rebuild Burn. A bench binary builds it like itself, with
/// `cargo build --workspace`.
pub fn node_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("PARCAE_NODE_BIN") {
            return PathBuf::from(p);
        }
        if running_as_test() {
            build(
                &["test", "--workspace", "--no-run", "--test", "cli"],
                "parcae-node",
            )
        } else {
            build(
                &["build", "--workspace", "--bin", "parcae-node"],
                "parcae-node",
            )
        }
    })
    .clone()
}

/// Path of an example of the `parcae-node` crate: `cargo test --workspace` builds examples, so
/// it is there in a workspace run; otherwise it is built here.
pub fn node_example(name: &str) -> PathBuf {
    let built = profile_dir().join("examples").join(name);
    if built.exists() {
        return built;
    }
    build(
        &["build", "--workspace", "--example", name],
        &format!("examples/{name}"),
    )
}

/// The Python of the tests' virtual environment (`target/python`, made with the system's
/// `python3 -m venv`), with `packages` installed by pip unless `imports` already import.
fn python_venv(imports: &str, packages: &[&str]) -> PathBuf {
    let venv = profile_dir()
        .parent()
        .expect("target directory")
        .join("python");
    let python = venv.join("bin").join("python");
    let ready = || {
        Command::new(&python)
            .args(["-c", &format!("import {imports}")])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready() {
        if !python.exists() {
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .expect("python3 runs");
            assert!(made.success(), "python3 -m venv {}", venv.display());
        }
        let installed = Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet"])
            .args(packages)
            .status()
            .expect("pip runs");
        assert!(installed.success(), "pip install {packages:?}");
        assert!(ready(), "{imports} import after pip install");
    }
    python
}

/// A Python interpreter that imports `numpy` and `safetensors` (the tests that read exported
/// weights with numpy need it).
pub fn python_with_numpy() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| python_venv("numpy, safetensors", &["numpy", "safetensors"]))
        .clone()
}

/// An S3-compatible server on 127.0.0.1 (moto's server mode, installed by pip into the tests'
/// virtual environment) with one bucket; killed when dropped.
pub struct S3Server {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
}

impl S3Server {
    /// Starts the server and creates `bucket`.
    pub fn start(bucket: &str) -> S3Server {
        static PYTHON: OnceLock<PathBuf> = OnceLock::new();
        let python = PYTHON
            .get_or_init(|| python_venv("moto.server, boto3", &["moto[server]"]))
            .clone();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto server starts");
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_string(),
        };
        let script = format!(
            "import boto3\nboto3.client('s3', endpoint_url='{}', region_name='us-east-1', \
             aws_access_key_id='test', aws_secret_access_key='test').create_bucket(Bucket='{bucket}')",
            server.endpoint
        );
        let created = wait_for(Duration::from_secs(30), || {
            Command::new(&python)
                .args(["-c", &script])
                .stderr(std::process::Stdio::null())
                .status()
                .ok()
                .filter(|s| s.success())
        });
        assert!(created.is_some(), "the S3 server did not come up");
        server
    }

    /// The environment a node reaches the server with (as the AWS SDKs take it).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ]
    }

    /// The keys of the bucket's objects under `prefix` (the first thousand), from one
    /// unsigned `ListObjectsV2` request (the server does not check signatures): milliseconds,
    /// so a test can watch the bucket while a cluster trains.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        use std::io::{Read, Write};
        let addr = self.endpoint.trim_start_matches("http://");
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return Vec::new();
        };
        let request = format!(
            "GET /{}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
            self.bucket
        );
        let mut body = String::new();
        if stream.write_all(request.as_bytes()).is_err()
            || stream.read_to_string(&mut body).is_err()
        {
            return Vec::new();
        }
        body.split("<Key>")
            .skip(1)
            .filter_map(|rest| Some(rest.split_once("</Key>")?.0.to_string()))
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checkpoint files `(steps, layers, path)` under a node's data directory.
pub fn checkpoint_files(data_dir: &Path) -> Vec<(u64, std::ops::Range<usize>, PathBuf)> {
    let checkpoints = parcae_node::data_dir::DataDir::new(data_dir).checkpoints();
    let Ok(entries) = std::fs::read_dir(checkpoints) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let rest = name
                .strip_prefix("ckpt-")?
                .strip_suffix(".state")?
                .to_string();
            let v: Vec<usize> = rest.split('-').filter_map(|x| x.parse().ok()).collect();
            (v.len() == 3).then(|| (v[0] as u64, v[1]..v[2], e.path()))
        })
        .collect()
}

/// A free TCP port on 127.0.0.1 for a node process to bind (below the ephemeral range, so
/// that no node's outgoing connection takes it before the node binds it).
pub fn free_port() -> u16 {
    parcae_testnet::ports::reserve_loopback_port().expect("free port")
}

/// The resident set size of process `pid` in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Fetches `http://addr/path` with a short timeout; `None` on any failure.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(1000)))
            .build(),
    );
    let mut resp = agent.get(&format!("http://{addr}{path}")).call().ok()?;
    resp.body_mut().read_to_string().ok()
}

/// Configuration used by the control-plane tests: fast raft timing and planning, short grace,
/// no training.
pub const TEST_CONFIG: &str = "grace_secs = 4.0\n[raft]\ntick_ms = 100\nelection_ticks = 10\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n[planner]\ninterval_secs = 1.0\n[train]\nenabled = false\n";

/// Raft and grace settings of the training tests (the `[train]` and `[planner]` sections are
/// added by each test).
pub const TRAIN_BASE_CONFIG: &str = "grace_secs = 10.0\n[raft]\ntick_ms = 100\nelection_ticks = 10\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n";

/// A cluster of nodes in a temporary directory, with a fresh key and `config` (TOML) for every
/// node; starts nothing.
pub fn new_cluster(config: &str) -> LocalCluster {
    new_cluster_with_env(config, Vec::new())
}

/// [`new_cluster`] whose nodes get `env` besides `RUST_LOG`.
pub fn new_cluster_with_env(config: &str, env: Vec<(&'static str, String)>) -> LocalCluster {
    create_cluster(config, env, None)
}

/// [`new_cluster`] whose every third node, from the founder, has its wall clock `secs` off
/// ([`ClockSkew`]).
pub fn new_cluster_with_clock_skew(config: &str, secs: u64) -> LocalCluster {
    create_cluster(config, Vec::new(), Some(ClockSkew { secs }))
}

fn create_cluster(
    config: &str,
    env: Vec<(&'static str, String)>,
    clock_skew: Option<ClockSkew>,
) -> LocalCluster {
    let log = std::env::var("PARCAE_TEST_LOG").unwrap_or_else(|_| "info".into());
    LocalCluster::create(ClusterSetup {
        program: node_binary(),
        dir: None,
        config: config.to_string(),
        ports: Ports::Ephemeral,
        env: [("RUST_LOG", log)].into_iter().chain(env).collect(),
        clock_skew,
        client: Client::with_timeout(Duration::from_millis(1000)),
        interrupt: Interrupt::never(),
    })
    .expect("creating the cluster")
}

/// A founder and `n - 1` nodes bootstrapping through it, each serving `/status`.
pub fn start_cluster(config: &str, n: usize) -> LocalCluster {
    let mut c = new_cluster(config);
    if let Err(e) = c.start_nodes(n) {
        panic!("starting {n} nodes: {e}\n{}", c.logs());
    }
    c
}
