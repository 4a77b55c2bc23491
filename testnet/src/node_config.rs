//! The TOML configuration every testnet node gets, generated in one place.
//!
//! The node rejects unknown keys (a typo must not fall back to a default), so keys that only
//! newer nodes know are written only when the binary accepts them: [`probe`] asks the binary
//! once per run by letting it parse the full configuration (it parses the file before it
//! needs anything else, so the probe starts no node). Those keys are the training section and
//! the planner's strategy ([`training_keys`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use parcae_outer::{SyncMode, Wire};
use parcae_pool::Pool;
use parcae_testnet::error::TestnetError;

use crate::gpus::Devices;

/// What the nodes of one run share (per-node differences are the metadata URL).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Seconds between a notice and the node's exit (SIGTERM grace).
    pub grace_secs: f64,
    /// Planning interval of the compressed trace, seconds.
    pub interval_secs: f64,
    /// Milliseconds a member may be unreachable before it is declared lost.
    pub lost_timeout_ms: u64,
    /// Planning strategy (`liveput`, `reactive`, ...).
    pub strategy: String,
    /// The cluster size the job asked for (the run's most nodes).
    pub max_nodes: u32,
    /// Model preset (`tiny`, `small`).
    pub model: String,
    /// `synthetic` or a dataset path.
    pub data: String,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Steps after which training stops (0: no limit).
    pub max_steps: u64,
    /// Compute threads per node process.
    pub threads: u32,
    /// The emulated accelerator of every node, if any.
    pub emulate: Option<Emulate>,
    /// CPU, or the CUDA GPU each node trains on.
    pub devices: Devices,
    /// The job's durable checkpoint store shared by every node (a directory of the run), so
    /// that nodes started after a whole-cluster outage resume from it.
    pub checkpoint_store: Option<PathBuf>,
    /// Complete checkpoints the job's store keeps (`None`: the node's default; 0: every one).
    pub keep_checkpoints: Option<usize>,
    /// `[D, P]` every plan is pinned to, if any.
    pub pin: Option<[u32; 2]>,
    /// The zones of a run over zones (`run --zones`), each with its emulated device's speed
    /// against the profiled one: each node is started in one of them.
    pub zones: Vec<(String, f64)>,
    /// Each zone's price of a node-hour: when given, the nodes plan over zones for samples
    /// per dollar (`[planner] objective` and `zone_prices`).
    pub zone_prices: Vec<(String, f64)>,
    /// Every ring across zones flat (`[planner] all_reduce_by_zone = false`).
    pub flat_rings: bool,
    /// How replicas in different zones agree (`[train] sync`).
    pub sync: SyncMode,
    /// DiLoCo's outer learning rate and momentum, where not the node's defaults.
    pub outer: Option<(f32, f32)>,
    /// The form DiLoCo's pseudo-gradients cross zones in (`[train] pseudo_gradient`).
    pub pseudo_gradient: Wire,
}

/// Samples per step of a run on CPU nodes (an emulated device brings its profiled job's).
pub const CPU_GLOBAL_BATCH: u32 = 16;
/// Samples per micro-batch of a run on CPU nodes.
const CPU_MICRO_BATCH: u32 = 2;

/// An emulated GPU for every node: a profiled model at a time scale. The job then has the
/// emulated job's batch shape, so that its steps are the profiled ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Emulate {
    /// The profiled model (`gpt-1.5b`), or the absolute path of a profile file.
    pub profile: String,
    /// Emulated durations are divided by this.
    pub time_scale: f64,
    /// The profiled job's samples per step.
    pub global_batch: u32,
    /// The profiled job's samples per micro-batch.
    pub micro_batch: u32,
}

impl Emulate {
    /// The built-in profile or the profile file `profile` at `time_scale`; an unknown name is
    /// an error naming the known ones, a bad file one naming the file and the field. A file is
    /// named to the nodes by its absolute path (they run in directories of their own).
    pub fn new(profile: &str, time_scale: f64) -> Result<Self, String> {
        let emulated =
            parcae_strategies::cost::profile::emulated(profile).map_err(|e| e.to_string())?;
        if !(time_scale.is_finite() && time_scale > 0.0) {
            return Err(format!("--time-scale must be > 0, got {time_scale}"));
        }
        let profile = match std::path::Path::new(profile) {
            file if profile.ends_with(".json") => std::fs::canonicalize(file)
                .map_err(|e| format!("{profile}: {e}"))?
                .display()
                .to_string(),
            _ => profile.to_string(),
        };
        Ok(Self {
            profile,
            time_scale,
            global_batch: emulated.spec.global_batch,
            micro_batch: emulated.spec.micro_batch,
        })
    }
}

/// Which optional keys the node binary understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// `[train]` and `[planner] strategy`.
    pub training: bool,
}

/// Metadata poll period when notices come from the fake metadata server, ms.
const METADATA_POLL_MS: u64 = 200;

/// Renders the configuration of node `k`, started in zone `zone` of the run's zones if given;
/// `aws_base_url` points its metadata poller at a fake server.
pub fn render(
    s: &NodeSettings,
    dialect: Dialect,
    k: usize,
    aws_base_url: Option<&str>,
    zone: Option<usize>,
) -> String {
    let mut out = format!(
        "grace_secs = {grace:?}\n\
         [raft]\n\
         tick_ms = 100\n\
         election_ticks = 10\n\
         heartbeat_ticks = 2\n\
         lost_timeout_ms = {lost}\n\
         [planner]\n\
         interval_secs = {interval:?}\n",
        grace = s.grace_secs,
        lost = s.lost_timeout_ms,
        interval = s.interval_secs,
    );
    if s.flat_rings {
        out.push_str("all_reduce_by_zone = false\n");
    }
    if !s.zone_prices.is_empty() {
        let prices: Vec<String> = s
            .zone_prices
            .iter()
            .map(|(zone, usd)| format!("{zone:?} = {usd:?}"))
            .collect();
        out.push_str(&format!(
            "objective = \"samples-per-dollar\"\nzone_prices = {{ {} }}\n",
            prices.join(", ")
        ));
    }
    let zone = zone.and_then(|z| s.zones.get(z));
    if dialect.training {
        out.push_str(&training_keys(s));
        if let Some((_, speed)) = zone.filter(|(_, speed)| *speed != 1.0 && s.emulate.is_some()) {
            out.push_str(&format!("speed = {speed:?}\n"));
        }
    }
    if let Some(section) = s.devices.section(k) {
        out.push_str(&section);
    }
    // A pool (`ZONE/TYPE`) is a zone's nodes of one instance type; `--zones` checked its name.
    if let Some(pool) = zone.and_then(|(name, _)| name.parse::<Pool>().ok()) {
        out.push_str(&format!("[placement]\nzone = {:?}\n", pool.zone()));
        if let Some(kind) = pool.instance_type() {
            out.push_str(&format!("instance_type = {kind:?}\n"));
        }
    }
    if let Some(url) = aws_base_url {
        out.push_str(&format!(
            "[notices]\npoll_interval_ms = {METADATA_POLL_MS}\naws_base_url = {url:?}\n"
        ));
    }
    out
}

/// The validation split of a testnet run: 1 % of the examples held out, 16 of them evaluated
/// every 10 steps.
const VALIDATION_KEYS: &str = "val_fraction = 0.01\nval_every = 10\nval_samples = 16\n";

/// The keys of the trainer: `[planner] strategy` (continuing the `[planner]` table that
/// [`render`] opened), the `[train]` table, and `[device]` when emulated.
fn training_keys(s: &NodeSettings) -> String {
    let pin = s
        .pin
        .map_or(String::new(), |[d, p]| format!("pin = [{d}, {p}]\n"));
    let mut out = format!(
        "strategy = {strategy:?}\n\
         max_nodes = {max_nodes}\n\
         {pin}\
         [train]\n\
         model = {model:?}\n\
         data = {data:?}\n\
         seed = {seed}\n\
         max_steps = {max_steps}\n",
        strategy = s.strategy,
        max_nodes = s.max_nodes,
        model = s.model,
        data = s.data,
        seed = s.seed,
        max_steps = s.max_steps,
    );
    if let Some(store) = &s.checkpoint_store {
        out.push_str(&format!(
            "checkpoint_store = {:?}\n",
            store.display().to_string()
        ));
    }
    if let Some(keep) = s.keep_checkpoints {
        out.push_str(&format!("keep_checkpoints = {keep}\n"));
    }
    match &s.emulate {
        // An emulated run is measured against the simulator, which knows nothing of
        // evaluation: its nodes spend no time on it.
        Some(_) => {}
        None => out.push_str(&format!(
            "{VALIDATION_KEYS}global_batch = {CPU_GLOBAL_BATCH}\nmicro_batch = {CPU_MICRO_BATCH}\n"
        )),
    }
    if s.sync != SyncMode::Step {
        out.push_str(&format!("sync = \"{}\"\n", s.sync));
    }
    if let Some((lr, momentum)) = s.outer {
        out.push_str(&format!(
            "outer_lr = {lr:?}\nouter_momentum = {momentum:?}\n"
        ));
    }
    if s.pseudo_gradient != Wire::F32 {
        out.push_str(&format!("pseudo_gradient = \"{}\"\n", s.pseudo_gradient));
    }
    if let Some(e) = &s.emulate {
        out.push_str(&format!(
            "global_batch = {}\nmicro_batch = {}\n\
             [device]\nkind = \"emulated\"\nprofile = {:?}\ntime_scale = {:?}\n",
            e.global_batch, e.micro_batch, e.profile, e.time_scale
        ));
    }
    out
}

/// What the node said of a configuration it parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// It parsed and checked it (and stopped at the missing key file).
    Accepted,
    /// It predates a key: the line that says which.
    UnknownField(String),
    /// It refused a value (a device this build lacks, a bound): the line that says why.
    Refused(String),
}

/// Reads the node's error output: the parse error `unknown field` first, then the checks'
/// `config: ...` refusals (the node's checks of its configuration say so).
fn verdict(message: &str) -> Verdict {
    let line = |needle: &str| {
        message
            .lines()
            .find(|l| l.contains(needle))
            .map(|l| l.trim().to_string())
    };
    if let Some(l) = line("unknown field") {
        Verdict::UnknownField(l)
    } else if let Some(l) = line("config: ") {
        Verdict::Refused(l)
    } else {
        Verdict::Accepted
    }
}

/// Finds out which keys `bin` accepts by letting it parse the configuration in `dir`.
///
/// `parcae-node run` loads its config before its cluster key; the probe names a key file that
/// does not exist, so the node stops right after parsing. "unknown field" in its error output
/// means the binary predates the training keys; the returned note then quotes that line. A
/// value the node refuses (a CUDA device in a build without it) stops the run with the node's
/// own message.
pub fn probe(
    bin: &Path,
    dir: &Path,
    s: &NodeSettings,
) -> Result<(Dialect, Option<String>), TestnetError> {
    let path = dir.join("probe.toml");
    let attempt = |dialect: Dialect| -> Result<Option<String>, TestnetError> {
        std::fs::write(&path, render(s, dialect, 0, None, None)).map_err(|source| {
            TestnetError::Io {
                what: format!("writing {}", path.display()),
                source,
            }
        })?;
        match verdict(&run_probe(bin, dir, &path)?) {
            Verdict::Accepted => Ok(None),
            Verdict::UnknownField(line) => Ok(Some(line)),
            Verdict::Refused(message) => Err(TestnetError::ConfigRejected {
                path: path.clone(),
                message,
            }),
        }
    };
    let full = Dialect { training: true };
    let basic = Dialect { training: false };
    let chosen = match attempt(full)? {
        None => (full, None),
        Some(refusal) => match attempt(basic)? {
            None => (basic, Some(refusal)),
            Some(message) => return Err(TestnetError::ConfigRejected { path, message }),
        },
    };
    let _ = std::fs::remove_file(&path);
    Ok(chosen)
}

/// Longest a node may take to parse its configuration and stop at the missing key: a real
/// one takes well under a second; a binary that runs on (not a `parcae-node`, or one that
/// ignores its key) would hold the testnet forever.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the node on `config` with a missing key file; returns its error output.
fn run_probe(bin: &Path, dir: &Path, config: &Path) -> Result<String, TestnetError> {
    let missing_key: PathBuf = dir.join("probe-no-such.key");
    let output = dir.join("probe-output.log");
    let io = |what: &str, source: std::io::Error| TestnetError::Io {
        what: format!("{what} {}", output.display()),
        source,
    };
    let log = std::fs::File::create(&output).map_err(|e| io("creating", e))?;
    let log_err = log.try_clone().map_err(|e| io("opening", e))?;
    let mut child = Command::new(bin)
        .args(["run", "--data-dir"])
        .arg(dir.join("probe-data"))
        .args([
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--status-addr",
            "127.0.0.1:0",
            "--cluster-key",
        ])
        .arg(&missing_key)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| TestnetError::NodeBinary {
            path: bin.to_path_buf(),
            reason: format!("cannot run it: {e}"),
        })?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestnetError::NodeHung {
                    path: bin.to_path_buf(),
                    secs: PROBE_TIMEOUT.as_secs(),
                });
            }
        }
    }
    let text = std::fs::read(&output).map_err(|e| io("reading", e))?;
    let _ = std::fs::remove_file(&output);
    Ok(String::from_utf8_lossy(&text).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> NodeSettings {
        NodeSettings {
            grace_secs: 3.0,
            interval_secs: 10.0,
            lost_timeout_ms: 2000,
            strategy: "liveput".into(),
            max_nodes: 6,
            model: "tiny".into(),
            data: "synthetic".into(),
            seed: 7,
            max_steps: 0,
            threads: 1,
            emulate: None,
            devices: Devices::Cpu,
            checkpoint_store: None,
            keep_checkpoints: None,
            pin: None,
            zones: Vec::new(),
            zone_prices: Vec::new(),
            flat_rings: false,
            sync: SyncMode::Step,
            outer: None,
            pseudo_gradient: Wire::F32,
        }
    }

    #[test]
    fn an_emulated_device_brings_the_profiled_batch_shape() {
        let s = NodeSettings {
            emulate: Some(Emulate::new("gpt-1.5b", 2.0).unwrap()),
            ..settings()
        };
        let text = render(&s, Dialect { training: true }, 0, None, None);
        assert!(
            text.ends_with(
                "max_steps = 0\nglobal_batch = 128\nmicro_batch = 1\n\
             [device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = 2.0\n"
            ),
            "{text}"
        );
        assert!(
            Emulate::new("gpt-9b", 1.0)
                .unwrap_err()
                .contains("gpt-1.5b")
        );
        assert!(Emulate::new("gpt-1.5b", 0.0).is_err());
    }

    #[test]
    fn each_node_gets_its_gpu_and_a_refused_value_stops_the_probe() {
        let s = NodeSettings {
            devices: Devices::Cuda(vec![0, 1]),
            ..settings()
        };
        let third = render(&s, Dialect { training: true }, 2, None, None);
        assert!(
            third.contains("[device]\nkind = \"cuda\"\nindex = 0\n"),
            "{third}"
        );
        let second = render(&s, Dialect { training: false }, 1, None, None);
        assert!(
            second.ends_with("[device]\nkind = \"cuda\"\nindex = 1\n"),
            "{second}"
        );
        assert!(
            !render(&settings(), Dialect { training: true }, 1, None, None).contains("[device]")
        );
        let refusal =
            "Error: config: device kind \"cuda\" needs parcae-node built with the `cuda` feature";
        assert_eq!(
            verdict(&format!("{refusal}\n")),
            Verdict::Refused(refusal.into())
        );
        assert!(matches!(
            verdict("Error: config file x: unknown field `strategy`"),
            Verdict::UnknownField(_)
        ));
        assert_eq!(
            verdict("Error: cluster key x: No such file or directory"),
            Verdict::Accepted
        );
    }

    #[test]
    fn basic_dialect_has_only_todays_keys() {
        let text = render(&settings(), Dialect { training: false }, 0, None, None);
        assert!(text.contains("grace_secs = 3.0\n"));
        assert!(text.contains("[planner]\ninterval_secs = 10.0\n"));
        assert!(text.contains("lost_timeout_ms = 2000\n"));
        assert!(!text.contains("[train]"));
        assert!(!text.contains("strategy"));
        assert!(!text.contains("[notices]"));
    }

    #[test]
    fn a_node_of_a_zone_says_so_and_runs_its_zones_emulated_device() {
        let s = NodeSettings {
            emulate: Some(Emulate::new("gpt-1.5b", 6.0).unwrap()),
            zones: vec![("us-east-1a".into(), 1.0), ("us-east-1b".into(), 1.5)],
            ..settings()
        };
        let training = Dialect { training: true };
        let slow = render(&s, training, 1, None, Some(0));
        let fast = render(&s, training, 2, None, Some(1));
        assert!(
            slow.contains("[placement]\nzone = \"us-east-1a\"\n"),
            "{slow}"
        );
        assert!(!slow.contains("speed"), "{slow}");
        assert!(fast.contains("time_scale = 6.0\nspeed = 1.5\n"), "{fast}");
        assert!(
            fast.contains("[placement]\nzone = \"us-east-1b\"\n"),
            "{fast}"
        );
        assert!(!render(&s, training, 3, None, None).contains("[placement]"));
    }

    #[test]
    fn a_node_of_a_pool_says_its_zone_and_its_instance_type() {
        let s = NodeSettings {
            zones: vec![("us-east-1a/g5.xlarge".into(), 0.6)],
            ..settings()
        };
        let text = render(&s, Dialect { training: true }, 1, None, Some(0));
        assert!(
            text.contains("[placement]\nzone = \"us-east-1a\"\ninstance_type = \"g5.xlarge\"\n"),
            "{text}"
        );
    }

    #[test]
    fn priced_zones_make_the_planner_after_samples_per_dollar() {
        let s = NodeSettings {
            zones: vec![("us-east-1a".into(), 1.0), ("us-east-1b".into(), 1.5)],
            zone_prices: vec![("us-east-1a".into(), 0.918), ("us-east-1b".into(), 1.2)],
            ..settings()
        };
        let text = render(&s, Dialect { training: true }, 0, None, Some(0));
        let priced = text
            .find(
                "objective = \"samples-per-dollar\"\n\
                 zone_prices = { \"us-east-1a\" = 0.918, \"us-east-1b\" = 1.2 }\n",
            )
            .unwrap_or_else(|| panic!("{text}"));
        // Inside the [planner] table, before the next table starts.
        let planner = text.find("[planner]").unwrap();
        let train = text.find("[train]").unwrap();
        assert!(planner < priced && priced < train, "{text}");
        let unpriced = render(&settings(), Dialect { training: true }, 0, None, None);
        assert!(!unpriced.contains("objective"), "{unpriced}");
    }

    #[test]
    fn training_dialect_and_metadata_url() {
        let text = render(
            &settings(),
            Dialect { training: true },
            0,
            Some("http://127.0.0.1:4000"),
            None,
        );
        let planner = text.find("[planner]").unwrap();
        let strategy = text.find("strategy = \"liveput\"").unwrap();
        let train = text.find("[train]").unwrap();
        assert!(planner < strategy && strategy < train, "{text}");
        assert!(text.contains("model = \"tiny\"\ndata = \"synthetic\"\nseed = 7\nmax_steps = 0\n"));
        assert!(text.contains(
            "[notices]\npoll_interval_ms = 200\naws_base_url = \"http://127.0.0.1:4000\"\n"
        ));
    }

    #[test]
    fn probe_classifies_the_binarys_answer() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        // Rejects [train] but knows the rest.
        let old = script(
            "old",
            r#"cfg=""; while [ $# -gt 0 ]; do [ "$1" = --config ] && cfg="$2"; shift; done
               grep -q '\[train\]' "$cfg" && { echo 'unknown field `train`' >&2; exit 1; }
               echo 'cluster key: no such file' >&2; exit 1"#,
        );
        let new = script("new", "echo 'cluster key: no such file' >&2; exit 1");
        let broken = script("broken", "echo 'unknown field `grace_secs`' >&2; exit 1");
        let s = settings();
        let (dialect, note) = probe(&old, dir.path(), &s).unwrap();
        assert_eq!(dialect, Dialect { training: false });
        assert!(note.unwrap().contains("unknown field `train`"));
        assert_eq!(
            probe(&new, dir.path(), &s).unwrap(),
            (Dialect { training: true }, None)
        );
        let err = probe(&broken, dir.path(), &s).unwrap_err().to_string();
        assert!(err.contains("rejected the generated config"), "{err}");
        assert!(err.contains("grace_secs"), "{err}");
    }
}
