//! Layers nobody holds come back from checkpoints: a peer's copy, an older cut when the newest
//! is damaged, a clear stop when none is left, the job's store after a whole-cluster outage,
//! and a backup given with `--restore`.

use std::path::Path;
use std::time::Duration;

use parcae_api::{MigrationKind, TrainingPhase};
use parcae_tests::training::*;
use parcae_tests::{
    LocalCluster, S3Server, checkpoint_files, new_cluster_with_env, serial, wait_for,
};

/// Every node of a 2 x 2 cluster is SIGKILLed; a new cluster on fresh data directories, with
/// the same job and the same checkpoint store (an S3 server on 127.0.0.1), resumes from the
/// newest complete checkpoint in the store, and its model at the end equals one process
/// trained on the same steps.
#[test]
fn after_a_whole_cluster_outage_a_new_cluster_resumes_from_the_s3_store() {
    let _serial = serial();
    let s3 = S3Server::start("parcae-test");
    let steps_total = 40u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!(
            "max_steps = {steps_total}\ncheckpoint_every = 5\n\
             checkpoint_store = \"s3://parcae-test/jobs\""
        ),
    );
    let start = |what: &str| {
        let mut c = new_cluster_with_env(&config, s3.env());
        if let Err(e) = c.start_nodes(4) {
            panic!("starting the {what} cluster: {e}\n{}", c.logs());
        }
        c
    };
    let mut first = start("first");
    let manifest = wait_for(Duration::from_secs(180), || {
        let cuts: Vec<String> = s3
            .keys("jobs/")
            .into_iter()
            .filter(|k| k.contains("/cuts/"))
            .collect();
        (!cuts.is_empty()).then_some(cuts)
    })
    .unwrap_or_else(|| panic!("no checkpoint reached the store\n{}", first.logs()));
    let before = last_step(&first).unwrap();
    for node in &mut first.nodes {
        node.kill();
    }
    eprintln!("every node killed after step {before}; stored cuts {manifest:?}");
    assert!(before + 1 < steps_total, "the outage came before the end");
    drop(first);

    let second = start("second");
    let done = wait_for(Duration::from_secs(240), || {
        (0..4).find(|&i| {
            steps(&second, i)
                .last()
                .is_some_and(|r| r.step + 1 == steps_total)
        })
    })
    .unwrap_or_else(|| panic!("the new cluster did not finish\n{}", second.logs()));
    let record = steps(&second, done);
    let resumed = record[0].step;
    assert!(
        resumed > 0 && resumed <= before + 1,
        "resumed at step {resumed}"
    );
    for (k, r) in record.iter().enumerate() {
        let step = resumed + k as u64;
        assert_eq!(r.step, step);
        assert_eq!(
            r.sample_start,
            step * BATCH,
            "exactly-once cursor across the outage"
        );
        assert_eq!(r.history, 1, "the new cluster's steps are a new history");
    }
    assert!(
        second
            .logs()
            .contains("resuming the job from the newest complete checkpoint in its store")
    );
    assert_model_equals_one_process(&second, steps_total);

    // `parcae-node export` from the store writes the same model as from the nodes' disks.
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("node.toml");
    std::fs::write(&config_file, &config).unwrap();
    let export = |args: &[&std::ffi::OsStr], out: &Path| {
        std::process::Command::new(parcae_tests::node_binary())
            .arg("export")
            .arg("--config")
            .arg(&config_file)
            .args(["--step", &steps_total.to_string()])
            .args(args)
            .arg("--out")
            .arg(out)
            .envs(s3.env())
            .output()
            .expect("export runs")
    };
    let stored = dir.path().join("stored.safetensors");
    wait_for(Duration::from_secs(30), || {
        export(
            &["--store".as_ref(), "s3://parcae-test/jobs".as_ref()],
            &stored,
        )
        .status
        .success()
        .then_some(())
    })
    .unwrap_or_else(|| panic!("no export from the store\n{}", second.logs()));
    let on_disks = dir.path().join("disks.safetensors");
    let dirs: Vec<&std::ffi::OsStr> = second
        .nodes
        .iter()
        .flat_map(|n| ["--checkpoints".as_ref(), n.data_dir.as_os_str()])
        .collect();
    let done = export(&dirs, &on_disks);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(
        std::fs::read(&stored).unwrap(),
        std::fs::read(&on_disks).unwrap()
    );
}

#[test]
fn losing_every_replica_of_a_stage_restores_from_a_peer_checkpoint() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("pin = [1, 2]", "checkpoint_every = 4"), 3, 9);
    // Kill the only node of the stage that is not on the leader... or the leader's, whichever
    // is not the leader: every replica of that stage is gone.
    let (victim, slot) = *workers(&c).first().expect("a training non-leader");
    let before = last_step(&c).unwrap();
    c.nodes[victim].kill();
    trains_on(&c, before, 2, Duration::from_secs(60));
    let m = migrations(&c);
    assert!(
        m.iter().any(|x| x.kind == MigrationKind::Restart),
        "stage {slot:?} restored from a checkpoint: {m:?}"
    );
    assert!(
        c.logs()
            .contains("restoring layers from the checkpoint of the step")
    );
    committed_sequence(&c);
}

/// Which checkpoint files `damage_checkpoints` damages.
#[derive(Clone, Copy)]
enum Damage {
    /// Those holding this many trained steps.
    Step(u64),
    /// Every one.
    All,
}

/// Damages the checkpoint files of the nodes other than `victim`.
fn damage_checkpoints(c: &LocalCluster, victim: usize, damage: Damage) {
    for (i, node) in c.nodes.iter().enumerate().filter(|(i, _)| *i != victim) {
        let files = checkpoint_files(&node.data_dir);
        let hit = |s: u64| match damage {
            Damage::Step(step) => s == step,
            Damage::All => true,
        };
        for (_, _, path) in files.iter().filter(|(s, _, _)| hit(*s)) {
            // The node may prune an old checkpoint between the listing and the read: gone, it
            // needs no damage.
            let mut bytes = match std::fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("checkpoint {}: {e}", path.display()),
            };
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xff;
            std::fs::write(path, bytes).expect("damage");
            eprintln!("damaged {} of node {i}", path.display());
        }
    }
}

/// Every surviving copy of the newest checkpoints is damaged after a stage's only replica
/// dies: the restore refuses them (their bytes are not the digest committed in raft) and
/// the cluster rolls back to the older complete checkpoint.
#[test]
fn a_damaged_checkpoint_is_refused_and_the_older_one_restores() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("pin = [1, 2]", "checkpoint_every = 2"), 3, 9);
    let (victim, slot) = *workers(&c).first().expect("a training non-leader");
    let before = last_step(&c).unwrap();
    c.nodes[victim].kill();
    // The newest complete checkpoint as the replicated state names it once a record in flight
    // at the kill has committed (the survivors agree on it and it stayed the same for half a
    // second): the newest file on a disk may belong to a checkpoint the victim never
    // completed, which no restore reads.
    let agreed = || {
        let steps: Vec<Option<u64>> = c
            .statuses()
            .into_iter()
            .map(|(_, s)| s.checkpoint_step)
            .collect();
        (steps.len() == 2 && steps[0] == steps[1]).then(|| steps[0])?
    };
    let mut seen: Option<(u64, std::time::Instant)> = None;
    let newest = wait_for(Duration::from_secs(10), || {
        let now = agreed()?;
        match seen {
            Some((step, since)) if step == now => {
                (since.elapsed() >= Duration::from_millis(500)).then_some(step)
            }
            _ => {
                seen = Some((now, std::time::Instant::now()));
                None
            }
        }
    })
    .unwrap_or_else(|| panic!("no complete checkpoint\n{}", c.logs()));
    // A checkpoint file is named by the steps trained into it: the cut ending at step `s`
    // holds `s + 1`.
    damage_checkpoints(&c, victim, Damage::Step(newest + 1));
    trains_on(&c, before, 2, Duration::from_secs(90));
    let logs = c.logs();
    assert!(
        logs.contains("does not match the digest committed in raft"),
        "stage {slot:?}: the damaged copy was not refused\n{logs}"
    );
    assert!(
        logs.contains("restoring layers from the checkpoint of the step"),
        "{logs}"
    );
    let rolled_back = c
        .statuses()
        .into_iter()
        .map(|(_, s)| s.rolled_back_steps)
        .max();
    assert!(rolled_back > Some(0), "{logs}");
    committed_sequence(&c);
}

/// Every copy of every checkpoint is damaged after a stage's only replica dies: training stops
/// with a clear status naming the missing layers, and nothing is retried in a loop or
/// re-initialised.
#[test]
fn with_every_checkpoint_damaged_training_stops_with_a_clear_status() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("pin = [1, 2]", "checkpoint_every = 2"), 3, 9);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    c.nodes[victim].kill();
    damage_checkpoints(&c, victim, Damage::All);
    let stopped = wait_for(Duration::from_secs(90), || {
        c.statuses().into_iter().find_map(|(_, s)| {
            let t = s.training?;
            (t.phase == TrainingPhase::Stopped).then_some((t.error?, s.step))
        })
    })
    .unwrap_or_else(|| panic!("training did not stop\n{}", c.logs()));
    assert!(
        stopped.0.contains("no complete checkpoint is left"),
        "{stopped:?}"
    );
    let stepped = wait_for(Duration::from_secs(5), || {
        (last_step(&c) != Some(stopped.1)).then_some(())
    });
    assert_eq!(stepped, None, "no step after the stop");
    let logs = c.logs();
    assert!(!logs.contains("start afresh"));
    let refusals = logs
        .matches("does not match the digest committed in raft")
        .count();
    assert!(refusals < 20, "{refusals} refusals: a restore loop\n{logs}");
}

/// `(history, step)` of the complete cuts whose manifests a job store directory holds.
fn stored_cuts(store: &Path) -> Vec<(u64, u64)> {
    let jobs = std::fs::read_dir(store).into_iter().flatten().flatten();
    jobs.flat_map(|job| {
        std::fs::read_dir(job.path().join("cuts"))
            .into_iter()
            .flatten()
            .flatten()
    })
    .filter_map(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        let (history, step) = name.strip_suffix(".json")?.split_once('-')?;
        Some((history.parse().ok()?, step.parse().ok()?))
    })
    .collect()
}

/// Every stage part in a job store directory gets one byte flipped. The nodes still run: a
/// part the store lets go of (it keeps the newest cuts) may vanish between the listing and the
/// damage, and is not written back.
fn damage_store_parts(store: &Path) {
    let jobs = std::fs::read_dir(store).into_iter().flatten().flatten();
    for part in jobs.flat_map(|job| {
        std::fs::read_dir(job.path().join("parts"))
            .into_iter()
            .flatten()
            .flatten()
    }) {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let mut bytes = match std::fs::read(part.path()) {
            Err(e) if gone(&e) => continue,
            read => read.expect("part"),
        };
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        let open = std::fs::OpenOptions::new().write(true).open(part.path());
        match open {
            Err(e) if gone(&e) => continue,
            file => std::io::Write::write_all(&mut file.expect("part"), &bytes).expect("damage"),
        }
    }
}

/// A stage's only replica dies and every copy of every checkpoint the cluster holds is damaged,
/// on the nodes' disks and in the job's store: training stops. A node started with a restore
/// location (`--restore`; here `[train] restore`) naming an earlier backup of the store copies
/// its checkpoint into the job's store; the stopped cluster resumes from it in a new history
/// and trains past the step it stopped at, every sample once in the final history.
#[test]
fn a_stopped_cluster_resumes_from_a_backup_given_with_restore() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, backup) = (dir.path().join("store"), dir.path().join("backup"));
    let store_setting = format!("checkpoint_store = {:?}", store.display().to_string());
    let config = train_config(
        "pin = [1, 2]",
        &format!("checkpoint_every = 2\n{store_setting}"),
    );
    let mut c = training_cluster(&config, 3, 1);
    wait_for(Duration::from_secs(60), || stored_cuts(&store).pop())
        .unwrap_or_else(|| panic!("no checkpoint in the store\n{}", c.logs()));
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&store)
        .arg(&backup)
        .status()
        .expect("cp");
    assert!(copied.success());
    let (_, backed_up) = stored_cuts(&backup)
        .into_iter()
        .max()
        .expect("a checkpoint in the backup");
    // Two newer complete checkpoints: the cluster no longer holds the backed-up one.
    wait_for(Duration::from_secs(120), || {
        c.statuses()
            .into_iter()
            .filter_map(|(_, s)| s.checkpoint_step)
            .find(|s| *s >= backed_up + 4)
    })
    .unwrap_or_else(|| panic!("no newer checkpoints\n{}", c.logs()));
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    c.nodes[victim].kill();
    damage_checkpoints(&c, victim, Damage::All);
    damage_store_parts(&store);
    // The stop after the damage: a node entering an early plan may stop for a moment where a
    // slot's layers are not reachable yet (the next plan clears it), which is not this stop.
    let (stopped_step, stopped_history) = wait_for(Duration::from_secs(90), || {
        c.statuses().into_iter().find_map(|(_, s)| {
            (s.training?.phase == TrainingPhase::Stopped && s.step > backed_up)
                .then_some((s.step, s.history))
        })
    })
    .unwrap_or_else(|| panic!("training did not stop after step {backed_up}\n{}", c.logs()));
    let live = (0..c.nodes.len())
        .find(|i| *i != victim)
        .expect("a live node");
    let seed = c.nodes[live].p2p_addr().expect("addr");
    let restoring = config.replace(
        &store_setting,
        &format!(
            "{store_setting}\nrestore = {:?}",
            backup.display().to_string()
        ),
    );
    let restorer = c
        .spawn_with_config(std::slice::from_ref(&seed), &restoring)
        .expect("spawn");
    // Progress in a history after the stop's: a status from before the stop (a node that has
    // not applied it yet) does not count.
    wait_for(Duration::from_secs(120), || {
        c.statuses().into_iter().find(|(_, s)| {
            s.history > stopped_history && s.loss.is_some() && s.step >= stopped_step + 2
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "training did not go on past step {stopped_step}\n{}",
            c.logs()
        )
    });
    let whole_log = |i: usize| c.nodes[i].log_tail(usize::MAX);
    assert!(
        whole_log(restorer).contains("copied the newest checkpoint of the job"),
        "{}",
        c.logs()
    );
    assert!(
        (0..c.nodes.len()).any(|i| whole_log(i)
            .contains("training resumes from a checkpoint given in the job's store")),
        "{}",
        c.logs()
    );
    let status = c.nodes[live].status().expect("status");
    assert!(status.history > stopped_history, "{status:?}");
    let record = committed_sequence(&c);
    assert!(
        record.iter().any(|r| r.history == status.history),
        "steps after the restore are committed in the new history"
    );
}
