//! Which job a node trains: a joiner adopts the cluster's, and one whose own job differs is
//! refused, naming the setting, and never planned.

use std::time::Duration;

use parcae_api::TrainingPhase;
use parcae_tests::training::*;
use parcae_tests::{LocalCluster, TRAIN_BASE_CONFIG, serial, start_cluster, wait_for};

/// The error of node `i` once it refuses the cluster's job (`what` names it in the panic).
fn refusal(c: &LocalCluster, i: usize, what: &str) -> String {
    wait_for(Duration::from_secs(60), || {
        let t = c.nodes[i].status()?.training?;
        (t.phase == TrainingPhase::Refused).then_some(t.error?)
    })
    .unwrap_or_else(|| panic!("{what}\n{}", c.logs()))
}

/// A joiner with `job = "adopt"` and no job key in its file trains the founder's job (its
/// status shows the job, it gets a slot and the cluster trains on with it); one that adopts
/// but sets a job key of its own to another value is refused, naming the key, and so is one
/// whose data file is another (naming the data's hash).
#[test]
fn a_joiner_that_adopts_the_job_trains_it_and_one_whose_own_key_differs_is_refused() {
    let _serial = serial();
    let mut c = start_cluster(&train_config("", "checkpoint_every = 0"), 1);
    let job = wait_for(Duration::from_secs(30), || c.nodes[0].status()?.job)
        .unwrap_or_else(|| panic!("no job defined\n{}", c.logs()));
    assert_eq!(
        job.get("seed").map(String::as_str),
        Some(SEED.to_string().as_str())
    );
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let adopting = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\n[train]\njob = \"adopt\"\n\
         peer_timeout_secs = 5.0\n"
    );
    let conflicting = format!("{adopting}seed = {}\n", SEED + 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let text = dir.path().join("other.txt");
    std::fs::write(&text, "another corpus entirely. ".repeat(200)).expect("text");
    let other_data = format!("{adopting}data = {:?}\n", text.display().to_string());
    let adopter = c
        .spawn_with_config(std::slice::from_ref(&founder), &adopting)
        .expect("spawn");
    let other = c
        .spawn_with_config(std::slice::from_ref(&founder), &conflicting)
        .expect("spawn");
    let other_dataset = c
        .spawn_with_config(std::slice::from_ref(&founder), &other_data)
        .expect("spawn");
    let error = refusal(&c, other, "the conflicting joiner was not refused");
    assert!(
        error.contains(&format!(
            "seed: the cluster's job has \"{SEED}\", this node's \"{}\"",
            SEED + 1
        )),
        "{error}"
    );
    let error = refusal(
        &c,
        other_dataset,
        "the joiner with other data was not refused",
    );
    assert!(
        error.contains(&format!(
            "data.sha256: the cluster's job has \"{}\"",
            job["data.sha256"]
        )),
        "{error}"
    );
    wait_for(Duration::from_secs(60), || {
        c.nodes[adopter].status()?.training?.slot.map(|_| ())
    })
    .unwrap_or_else(|| panic!("the adopting joiner got no slot\n{}", c.logs()));
    assert_eq!(c.nodes[adopter].status().and_then(|s| s.job), Some(job));
    let before = last_step(&c).unwrap_or(0);
    trains_on(&c, before, 3, Duration::from_secs(60));
    assert_eq!(
        c.nodes[other].status().and_then(|s| s.training?.slot),
        None,
        "the refused joiner is never planned"
    );
    committed_sequence(&c);
}

/// The founder's job is the cluster's; a joiner whose config trains something else (another
/// seed) is told which setting differs, is not ready and never gets a slot, while a joiner
/// with the same job is planned in.
#[test]
fn a_joiner_whose_job_differs_is_refused_naming_the_setting_and_never_planned() {
    let _serial = serial();
    let config = train_config("", "");
    let mut c = start_cluster(&config, 1);
    let job = wait_for(Duration::from_secs(30), || c.nodes[0].status()?.job)
        .unwrap_or_else(|| panic!("no job defined\n{}", c.logs()));
    assert_eq!(job.get("seed").map(String::as_str), Some("3"));
    assert_eq!(job.get("batch.global").map(String::as_str), Some("16"));
    assert_eq!(job["data.sha256"].len(), 64, "{job:?}");
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let other_seed = config.replace(&format!("seed = {SEED}"), "seed = 4");
    assert_ne!(other_seed, config);
    let other = c
        .spawn_with_config(std::slice::from_ref(&founder), &other_seed)
        .expect("spawn");
    let same = c
        .spawn_with_config(std::slice::from_ref(&founder), &config)
        .expect("spawn");
    let error = refusal(&c, other, "the other job was not refused");
    assert!(
        error.contains("seed: the cluster's job has \"3\", this node's \"4\""),
        "{error}"
    );
    // The matching joiner trains beside the founder; the other is never given a slot.
    wait_for(Duration::from_secs(60), || {
        let slot = c.nodes[same].status()?.training?.slot;
        slot.is_some().then_some(())
    })
    .unwrap_or_else(|| panic!("the joiner with the same job got no slot\n{}", c.logs()));
    let before = last_step(&c).unwrap_or(0);
    trains_on(&c, before, 3, Duration::from_secs(60));
    let refused = c.nodes[other].status().expect("status");
    assert_eq!(refused.training.and_then(|t| t.slot), None);
    let readyz = parcae_tests::http_get(c.nodes[other].status_addr, "/readyz");
    assert!(
        readyz.is_none(),
        "a refused node answers /readyz with 503: {readyz:?}"
    );
}
