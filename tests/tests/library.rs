//! The library API: a user-defined Burn model (not the built-in GPT, see
//! `node/examples/token_mlp.rs`) trained across two processes through `parcae_node::Trainer`,
//! whose `run` returns in each once the job is done.

use std::net::SocketAddr;
use std::time::Duration;

use parcae_api::client::Client;
use parcae_testnet::supervise::{Spawn, Supervisor};
use parcae_tests::{free_port, node_example, serial, wait_for};

#[test]
fn a_user_model_trains_across_two_processes() {
    let _serial = serial();
    let bin = node_example("token_mlp");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    parcae_node::key::ClusterKey::generate()
        .store(&key)
        .unwrap();
    let status: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    // Killed (and reaped) however the test ends.
    let mut children = Supervisor::default();
    let mut ids = Vec::new();
    let mut spawn = |i: usize, bootstrap: Option<String>| {
        let mut args = vec![
            dir.path().join(format!("n{i}")).display().to_string(),
            status[i].to_string(),
            key.display().to_string(),
        ];
        args.extend(bootstrap);
        let id = children
            .spawn(&Spawn {
                program: &bin,
                args: &args,
                env: &[],
                log: &dir.path().join(format!("n{i}.log")),
            })
            .unwrap();
        ids.push(id);
    };
    let client = Client::with_timeout(Duration::from_secs(1));
    spawn(0, None);
    let founder = wait_for(Duration::from_secs(20), || {
        client.status(status[0]).ok()?.p2p_addr()
    })
    .expect("first process serves /status");
    spawn(1, Some(founder));
    let logs = || -> Vec<String> {
        (0..2)
            .map(|i| {
                std::fs::read_to_string(dir.path().join(format!("n{i}.log"))).unwrap_or_default()
            })
            .collect()
    };
    // `run` returns in both processes once the 40th step is committed and stored (a child's
    // exit is reaped once, so each is kept as it comes).
    let mut exited = [None; 2];
    let exits = wait_for(Duration::from_secs(120), || {
        for (exit, &id) in exited.iter_mut().zip(&ids) {
            if exit.is_none() {
                *exit = children.try_exit(id);
            }
        }
        exited.iter().copied().collect::<Option<Vec<_>>>()
    })
    .unwrap_or_else(|| panic!("the processes did not return from run\n{}", logs().concat()));
    let logs = logs();
    for (exit, log) in exits.iter().zip(&logs) {
        assert!(exit.success(), "{exit:?}\n{log}");
    }
    // Each prints the outcome `run` returned; the loss is down from ln(64) = 4.16 at the start.
    let outcome = |log: &str| -> (u64, f64) {
        let line = log
            .lines()
            .find(|l| l.starts_with("finished after "))
            .unwrap_or_else(|| panic!("no outcome printed\n{log}"));
        assert!(
            line.ends_with("weights after 40 steps on the nodes' disks only"),
            "{line}"
        );
        let number = |after: &str| {
            let rest = &line[line.find(after).expect(after) + after.len()..];
            rest.split([' ', ';', ',']).next().unwrap().to_string()
        };
        (
            number("finished after ").parse().unwrap(),
            number("last loss ").parse().unwrap(),
        )
    };
    let (a, b) = (outcome(&logs[0]), outcome(&logs[1]));
    assert_eq!(a, b, "both processes saw the same end");
    assert_eq!(a.0, 40);
    assert!(a.1 < 0.5 * 64f64.ln(), "loss fell to {}", a.1);
    // The two stages of one pipeline, one a process.
    assert!(
        logs[0].contains("StageSlot { pipeline: 0, stage: 0 }"),
        "{}",
        logs[0]
    );
    assert!(
        logs[1].contains("StageSlot { pipeline: 0, stage: 1 }"),
        "{}",
        logs[1]
    );
}

/// The README's library example is `node/examples/token_mlp.rs` (from its first `use` on), the
/// example the test above builds and runs.
#[test]
fn the_readme_s_library_example_is_the_example_ci_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let example = std::fs::read_to_string(root.join("node/examples/token_mlp.rs")).unwrap();
    let code = &example[example.find("use anyhow").expect("the example's first use")..];
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("```rust\n{code}```\n")),
        "README.md's \"Your own Burn model\" block differs from node/examples/token_mlp.rs"
    );
}
