//! The library API: a user-defined Burn model (not the built-in GPT, see
//! `node/examples/token_mlp.rs`) trained across two processes through `parcae_node::Trainer`.

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
    let mut spawn = |i: usize, bootstrap: Option<String>| {
        let mut args = vec![
            dir.path().join(format!("n{i}")).display().to_string(),
            status[i].to_string(),
            key.display().to_string(),
        ];
        args.extend(bootstrap);
        children
            .spawn(&Spawn {
                program: &bin,
                args: &args,
                env: &[],
                log: &dir.path().join(format!("n{i}.log")),
            })
            .unwrap();
    };
    let client = Client::with_timeout(Duration::from_secs(1));
    spawn(0, None);
    let founder = wait_for(Duration::from_secs(20), || {
        client.status(status[0]).ok()?.p2p_addr()
    })
    .expect("first process serves /status");
    spawn(1, Some(founder));
    let steps = wait_for(Duration::from_secs(120), || {
        let s = client.steps(status[1]).ok()?;
        (s.len() >= 40).then_some(s)
    })
    .unwrap_or_else(|| {
        let logs: String = (0..2)
            .map(|i| {
                std::fs::read_to_string(dir.path().join(format!("n{i}.log"))).unwrap_or_default()
            })
            .collect();
        panic!("40 steps did not commit\n{logs}")
    });
    let loss = |k: usize| steps[k].loss;
    assert!(
        loss(39) < 0.8 * loss(0),
        "loss fell: {} -> {}",
        loss(0),
        loss(39)
    );
    let slots: Vec<Option<[u32; 2]>> = (0..2)
        .map(|i| {
            client
                .status(status[i])
                .unwrap()
                .training
                .and_then(|t| t.slot)
        })
        .collect();
    assert_eq!(client.status(status[0]).unwrap().config, Some((1, 2)));
    assert!(
        slots.contains(&Some([0, 0])) && slots.contains(&Some([0, 1])),
        "{slots:?}"
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
