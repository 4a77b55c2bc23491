//! The library API: a user-defined Burn model (not the built-in GPT, see
//! `node/examples/token_mlp.rs`) trained across two processes through `parcae_node::Trainer`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use parcae_tests::{free_port, http_get, node_example, serial, wait_for};
use serde_json::Value;

/// Kills the example processes however the test ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_user_model_trains_across_two_processes() {
    let _serial = serial();
    let bin = node_example("token_mlp");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    parcae_node::key::ClusterKey::generate()
        .store(&key)
        .unwrap();
    let status: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let spawn = |i: usize, bootstrap: Option<String>| {
        let log = std::fs::File::create(dir.path().join(format!("n{i}.log"))).unwrap();
        Command::new(&bin)
            .arg(dir.path().join(format!("n{i}")))
            .arg(&status[i])
            .arg(&key)
            .args(bootstrap)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let get = |i: usize, path: &str| -> Option<Value> {
        serde_json::from_str(&http_get(status[i].parse().ok()?, path)?).ok()
    };
    let mut children = Children(vec![spawn(0, None)]);
    let founder = wait_for(Duration::from_secs(20), || {
        let s = get(0, "/status")?;
        let addr = s["listen_addrs"].as_array()?.first()?.as_str()?.to_string();
        Some(format!("{addr}/p2p/{}", s["peer_id"].as_str()?))
    })
    .expect("first process serves /status");
    children.0.push(spawn(1, Some(founder)));
    let steps = wait_for(Duration::from_secs(120), || {
        let s = get(1, "/steps")?;
        (s.as_array()?.len() >= 40).then_some(s)
    })
    .unwrap_or_else(|| {
        let logs: String = (0..2)
            .map(|i| {
                std::fs::read_to_string(dir.path().join(format!("n{i}.log"))).unwrap_or_default()
            })
            .collect();
        panic!("40 steps did not commit\n{logs}")
    });
    let loss = |k: usize| steps[k]["loss"].as_f64().unwrap();
    assert!(
        loss(39) < 0.8 * loss(0),
        "loss fell: {} -> {}",
        loss(0),
        loss(39)
    );
    let slots: Vec<Value> = (0..2)
        .map(|i| get(i, "/status").unwrap()["training"]["slot"].clone())
        .collect();
    assert_eq!(
        get(0, "/status").unwrap()["config"],
        serde_json::json!([1, 2])
    );
    assert!(
        slots.contains(&serde_json::json!([0, 0])) && slots.contains(&serde_json::json!([0, 1])),
        "{slots:?}"
    );
}
