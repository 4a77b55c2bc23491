//! Starting nodes the way spot VMs do (issue 18), with real `parcae-node` processes on
//! 127.0.0.1: seed addresses without peer ids (an IP, a DNS name, a seeds file whose first entry
//! is dead), rejoining from memory with no `--bootstrap` at all, `--notice auto` against local
//! fakes of each cloud's metadata service, `/healthz` and `/readyz`, and flags from the
//! environment.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use parcae_api::client::Client;
use parcae_api::{MemberState, StatusSnapshot};
use parcae_node::data_dir::DataDir;
use parcae_testnet::imds::{FakeCloud, FakeMetadata};
use parcae_testnet::supervise::{ChildId, Spawn, Supervisor};
use parcae_tests::{
    TEST_CONFIG, free_port, new_cluster, node_binary, secs, serial, start_cluster, wait_for,
};

/// The TCP port of a `/ip4/127.0.0.1/tcp/P` listen address.
fn port_of(listen: &str) -> u16 {
    listen
        .rsplit('/')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {listen}"))
}

/// Drops `--bootstrap X` and `--bootstrap-file X` from a node's arguments.
fn without_bootstrap(args: &mut Vec<String>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args.drain(..) {
        if skip {
            skip = false;
        } else if a == "--bootstrap" || a == "--bootstrap-file" {
            skip = true;
        } else {
            kept.push(a);
        }
    }
    *args = kept;
}

#[test]
fn seeds_without_peer_ids_find_the_cluster_and_restarted_nodes_rejoin_from_memory() {
    let _serial = serial();
    let mut c = new_cluster(TEST_CONFIG);
    let seed = c.spawn(&[], None).expect("founder");
    c.wait_serving(&[seed]).expect("founder serving");
    let seed_listen = c.nodes[seed].listen.clone();
    let by_ip = c
        .spawn_with_args(&["--bootstrap".into(), seed_listen.clone()])
        .expect("spawn");
    let by_name = c
        .spawn_with_args(&[
            "--bootstrap".into(),
            format!("/dns4/localhost/tcp/{}", port_of(&seed_listen)),
        ])
        .expect("spawn");
    c.wait_converged(&[seed, by_ip, by_name], 3, Duration::from_secs(20))
        .unwrap_or_else(|| {
            panic!(
                "joiners given addresses without peer ids did not join\n{}",
                c.logs()
            )
        });

    c.nodes[seed].kill();
    c.wait_converged(&[by_ip, by_name], 2, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the survivors did not settle\n{}", c.logs()));
    let seeds_file = c.dir().join("seeds.txt");
    std::fs::write(
        &seeds_file,
        format!(
            "# the founder is gone; the second entry is a live member\n{seed_listen}\n{}\n",
            c.nodes[by_ip].listen
        ),
    )
    .expect("seeds file");
    let late = c
        .spawn_with_args(&["--bootstrap-file".into(), seeds_file.display().to_string()])
        .expect("spawn");
    c.wait_converged(&[by_ip, by_name, late], 3, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the node with a seeds file did not join\n{}", c.logs()));
    let remembered = std::fs::read_to_string(DataDir::new(&c.nodes[late].data_dir).known_peers())
        .expect("the late node remembers the members");
    let member = c.nodes[by_ip].peer_id().expect("peer id");
    assert!(
        remembered.contains(&format!("/p2p/{member}")),
        "{remembered}"
    );

    // Every node, the dead founder too, restarted with no --bootstrap at all.
    for i in [by_ip, by_name, late] {
        c.nodes[i].kill();
    }
    for i in [seed, by_ip, by_name, late] {
        c.nodes[i]
            .restart_with_args(without_bootstrap)
            .expect("restart");
    }
    // The founder was removed from raft while it was down: it rejoins after 3 election
    // timeouts without a leader and a relayed Join, and the new leader (perhaps `late`, whom
    // it never knew) must dial it (a lost member that rejoins at the same addresses is dialled
    // again since the membership view counts lost status; before that, such runs never
    // converged). The whole restart now converges in about 10 s; the bound leaves room for
    // two loaded cores.
    c.wait_converged(&[seed, by_ip, by_name, late], 4, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the restarted nodes did not rejoin\n{}", c.logs()));
}

#[test]
fn notice_auto_polls_the_cloud_that_answers_and_its_notice_drains_the_node() {
    let _serial = serial();
    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let clouds = [
        (FakeCloud::Aws, "aws"),
        (FakeCloud::Gce, "gce"),
        (FakeCloud::Azure, "azure"),
    ];
    let mut spot = Vec::new();
    for (cloud, name) in clouds {
        let fake = FakeMetadata::start(cloud).expect("fake metadata server");
        // All three providers are pointed at this one fake, as AWS and Azure share
        // 169.254.169.254: only the probe of the cloud it speaks for may answer.
        let url = fake.url();
        let config = format!(
            "{TEST_CONFIG}[notices]\nprovider = \"auto\"\npoll_interval_ms = 200\n\
             aws_base_url = \"{url}\"\ngce_base_url = \"{url}\"\nazure_base_url = \"{url}\"\n"
        );
        let i = c
            .spawn_with_config(std::slice::from_ref(&founder), &config)
            .expect("spawn");
        spot.push((i, name, fake));
    }
    c.wait_converged(&[0, 1, 2, 3, 4, 5], 6, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the spot nodes did not join\n{}", c.logs()));
    for (i, name, _) in &spot {
        let seen = wait_for(Duration::from_secs(10), || {
            c.nodes[*i].status()?.notice_provider
        });
        assert_eq!(seen.as_deref(), Some(*name), "node {i}\n{}", c.logs());
    }

    // AWS and Azure state the deadline; GCE does not (the node takes its documented 30 s).
    let deadline = SystemTime::now() + secs(10);
    for (_, _, fake) in &spot {
        fake.arm(deadline);
    }
    let gce_deadline = SystemTime::now() + Duration::from_secs(31);
    for (i, name, _) in &spot {
        let peer = c.nodes[*i].peer_id().expect("peer id");
        wait_for(Duration::from_secs(5), || {
            let s = c.nodes[0].status()?;
            s.members
                .iter()
                .any(|m| m.peer_id == peer && m.status == MemberState::Leaving)
                .then_some(())
        })
        .unwrap_or_else(|| panic!("the {name} notice was not replicated\n{}", c.logs()));
    }
    for (i, name, _) in &spot {
        let due = if *name == "gce" {
            gce_deadline
        } else {
            deadline
        };
        let left = due
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .saturating_add(Duration::from_secs(3));
        let exit = c.nodes[*i]
            .wait_exit(left)
            .unwrap_or_else(|| panic!("the {name} node outlived its deadline\n{}", c.logs()));
        assert!(exit.success(), "{name}: {exit:?}");
    }
}

/// A `parcae-node run` configured only through the environment; killed when dropped.
struct EnvNode {
    supervisor: Supervisor,
    child: ChildId,
    status_addr: SocketAddr,
}

impl EnvNode {
    fn start(dir: &Path, name: &str, env: &[(&str, String)]) -> Self {
        let status_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut all: Vec<(&str, String)> = vec![
            ("PARCAE_DATA_DIR", dir.join(name).display().to_string()),
            ("PARCAE_STATUS_ADDR", status_addr.to_string()),
            ("PARCAE_NOTICE", "none".into()),
        ];
        all.extend(env.iter().cloned());
        Self::spawn(
            &node_binary(),
            &dir.join(format!("{name}.log")),
            &all,
            status_addr,
        )
    }

    /// Runs `program run` with `env` only, serving its API at `status_addr`.
    fn spawn(program: &Path, log: &Path, env: &[(&str, String)], status_addr: SocketAddr) -> Self {
        let mut supervisor = Supervisor::default();
        let child = supervisor
            .spawn(&Spawn {
                program,
                args: &["run".to_string()],
                env,
                log,
            })
            .expect("spawn");
        Self {
            supervisor,
            child,
            status_addr,
        }
    }

    /// `(status code, body)` of `GET path`.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(1)))
                .http_status_as_error(false)
                .build(),
        );
        let mut r = agent
            .get(&format!("http://{}{path}", self.status_addr))
            .call()
            .ok()?;
        Some((r.status().as_u16(), r.body_mut().read_to_string().ok()?))
    }

    fn status(&self) -> Option<StatusSnapshot> {
        Client::with_timeout(Duration::from_secs(1))
            .status(self.status_addr)
            .ok()
    }
}

#[test]
fn probes_answer_as_documented_and_flags_come_from_the_environment() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("cluster.key");
    parcae_node::key::ClusterKey::generate()
        .store(&key)
        .expect("key");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, TEST_CONFIG).expect("config");
    let p2p = free_port();
    let common = |listen: u16| {
        vec![
            ("PARCAE_CLUSTER_KEY", key.display().to_string()),
            ("PARCAE_CONFIG", config.display().to_string()),
            ("PARCAE_LISTEN", format!("/ip4/127.0.0.1/tcp/{listen}")),
        ]
    };
    let founder = EnvNode::start(dir.path(), "founder", &common(p2p));
    let ready = wait_for(Duration::from_secs(15), || {
        founder.get("/readyz").filter(|(code, _)| *code == 200)
    });
    assert_eq!(ready, Some((200, "ready\n".into())));
    assert_eq!(founder.get("/healthz"), Some((200, "ok\n".into())));
    let s = founder.status().expect("status");
    assert_eq!(s.listen_addrs, [format!("/ip4/127.0.0.1/tcp/{p2p}")]);
    assert_eq!(s.notice_provider.as_deref(), Some("none"));

    // A node whose only seed is dead is up (healthz) but not ready.
    let mut lonely_env = common(free_port());
    lonely_env.push((
        "PARCAE_BOOTSTRAP",
        format!("/ip4/127.0.0.1/tcp/{}", free_port()),
    ));
    let lonely = EnvNode::start(dir.path(), "lonely", &lonely_env);
    let health = wait_for(Duration::from_secs(10), || lonely.get("/healthz"));
    assert_eq!(health, Some((200, "ok\n".into())));
    assert_eq!(
        lonely.get("/readyz"),
        Some((503, "not ready: not a member of a cluster yet\n".into()))
    );

    // A joiner given its seed as a comma-separated list in the environment becomes ready.
    let mut joiner_env = common(free_port());
    joiner_env.push((
        "PARCAE_BOOTSTRAP",
        format!(
            "/ip4/127.0.0.1/tcp/{},/dns4/localhost/tcp/{p2p}",
            free_port()
        ),
    ));
    let joiner = EnvNode::start(dir.path(), "joiner", &joiner_env);
    let joined = wait_for(Duration::from_secs(20), || {
        joiner.get("/readyz").filter(|(code, _)| *code == 200)
    });
    assert!(joined.is_some(), "the joiner never became ready");

    // A draining node is not ready.
    founder
        .supervisor
        .signal(founder.child, nix::sys::signal::Signal::SIGTERM);
    let draining = wait_for(Duration::from_secs(5), || {
        founder.get("/readyz").filter(|(code, _)| *code == 503)
    });
    assert_eq!(
        draining,
        Some((503, "not ready: leaving (preemption notice)\n".into()))
    );
}

/// `parcae-node run` with a fresh key and data directory and `env` besides: it must refuse to
/// start; returns what it wrote to stderr.
fn refused_start(dir: &Path, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let key = dir.join("cluster.key");
    parcae_node::key::ClusterKey::generate()
        .store(&key)
        .expect("key");
    let out = std::process::Command::new(node_binary())
        .arg("run")
        .env("PARCAE_DATA_DIR", dir.join("d"))
        .env("PARCAE_LISTEN", "/ip4/127.0.0.1/tcp/0")
        .env("PARCAE_CLUSTER_KEY", &key)
        .env("PARCAE_STATUS_ADDR", "127.0.0.1:0")
        .envs(env.iter().copied())
        .output()
        .expect("run");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_seed_from_the_environment_is_refused_naming_the_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = std::ffi::OsStr::new("/ip4/127.0.0.1/udp/7000");
    let err = refused_start(dir.path(), &[("PARCAE_BOOTSTRAP", seed)]);
    assert!(
        err.contains("bootstrap address /ip4/127.0.0.1/udp/7000"),
        "{err}"
    );
}

/// A node told to adopt the cluster's job with no cluster to join refuses to start and says
/// what to do, instead of waiting forever for a job nobody defines.
#[test]
fn a_founder_that_would_adopt_the_job_is_refused_with_the_remedy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "[train]\njob = \"adopt\"\n").expect("config");
    let err = refused_start(dir.path(), &[("PARCAE_CONFIG", config.as_os_str())]);
    assert!(
        err.contains("this node founds one: give it --bootstrap"),
        "{err}"
    );
}

/// The repository's `deploy/` folder.
fn deploy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A release folder as `deploy/cloud-init.sh` downloads it: the binary, its digest, the unit.
fn release(dir: &Path, digest_of: &Path) -> std::path::PathBuf {
    let release = dir.join("release");
    std::fs::create_dir_all(&release).expect("release dir");
    std::fs::copy(node_binary(), release.join("parcae-node")).expect("binary");
    std::fs::copy(
        deploy_dir().join("parcae-node.service"),
        release.join("parcae-node.service"),
    )
    .expect("unit");
    let sum = std::process::Command::new("sha256sum")
        .arg(digest_of)
        .output()
        .expect("sha256sum");
    std::fs::write(release.join("parcae-node.sha256"), sum.stdout).expect("digest");
    release
}

/// Runs the cloud-init script into `root` with `env`; its exit status and stderr.
fn cloud_init(root: &Path, release: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(deploy_dir().join("cloud-init.sh"))
        .env("PARCAE_PREFIX", root)
        .env(
            "PARCAE_RELEASE_URL",
            format!("file://{}", release.display()),
        );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_systemd_unit_and_the_cloud_init_script_check_out_and_install_a_node_that_runs() {
    let _serial = serial();
    let script = deploy_dir().join("cloud-init.sh");
    let syntax = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .expect("bash -n");
    assert!(syntax.success(), "bash -n {}", script.display());
    if let Ok(out) = std::process::Command::new("shellcheck")
        .arg(&script)
        .output()
    {
        assert!(
            out.status.success(),
            "shellcheck:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = node_binary();
    if let Ok(verify) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        && verify.status.success()
    {
        // The unit as installed, with ExecStart at the binary under test.
        let unit = std::fs::read_to_string(deploy_dir().join("parcae-node.service"))
            .expect("unit")
            .replace("/usr/local/bin/parcae-node", &binary.display().to_string());
        let path = dir.path().join("parcae-node.service");
        std::fs::write(&path, unit).expect("unit copy");
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze verify");
        assert!(
            out.status.success(),
            "systemd-analyze verify:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let key = "ab".repeat(32);
    let release = release(dir.path(), &binary);
    let root = dir.path().join("root");
    let (ok, err) = cloud_init(&root, &release, &[("PARCAE_CLUSTER_KEY_HEX", "nope")]);
    assert!(
        !ok && err.contains("PARCAE_CLUSTER_KEY_HEX must be"),
        "{err}"
    );
    let tampered = release.join("parcae-node.sha256");
    let good_digest = std::fs::read(&tampered).expect("digest");
    std::fs::write(&tampered, format!("{}  parcae-node\n", "0".repeat(64))).expect("tamper");
    let (ok, err) = cloud_init(&root, &release, &[("PARCAE_CLUSTER_KEY_HEX", &key)]);
    assert!(!ok && err.contains("does not match"), "{err}");
    std::fs::write(&tampered, good_digest).expect("restore");

    let (ok, err) = cloud_init(
        &root,
        &release,
        &[
            ("PARCAE_CLUSTER_KEY_HEX", &key),
            ("PARCAE_BOOTSTRAP", "/dns4/seed.internal/tcp/7000"),
        ],
    );
    assert!(ok, "{err}");
    let installed = root.join("usr/local/bin/parcae-node");
    assert_eq!(
        std::fs::read(&installed).expect("installed binary"),
        std::fs::read(&binary).expect("binary")
    );
    let key_file = root.join("etc/parcae/cluster.key");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_file)
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the key is private");
    let env_text = std::fs::read_to_string(root.join("etc/parcae/parcae.env")).expect("env");
    assert!(
        env_text.contains("PARCAE_BOOTSTRAP=/dns4/seed.internal/tcp/7000\n"),
        "{env_text}"
    );

    // The installed binary runs on the environment file, its paths moved under the prefix.
    let status_port = free_port();
    let env: Vec<(&str, String)> = env_text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = match k {
                "PARCAE_DATA_DIR" | "PARCAE_CLUSTER_KEY" => {
                    format!("{}{v}", root.display())
                }
                "PARCAE_LISTEN" => format!("/ip4/127.0.0.1/tcp/{}", free_port()),
                "PARCAE_STATUS_ADDR" => format!("127.0.0.1:{status_port}"),
                "PARCAE_BOOTSTRAP" => String::new(),
                "PARCAE_NOTICE" => "none".into(),
                _ => v.to_owned(),
            };
            (k, v)
        })
        .collect();
    let node = EnvNode::spawn(
        &installed,
        &dir.path().join("installed.log"),
        &env,
        SocketAddr::from(([127, 0, 0, 1], status_port)),
    );
    let ready = wait_for(Duration::from_secs(15), || {
        node.get("/readyz").filter(|(code, _)| *code == 200)
    });
    assert!(
        ready.is_some(),
        "the installed node never became ready\n{}",
        std::fs::read_to_string(dir.path().join("installed.log")).unwrap_or_default()
    );
}
