//! Training across real `parcae-node` processes: a 2 x 2 run matches a single-process run, and
//! the cluster trains through a notice, a kill and a join.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parcae_api::{MigrationKind, MigrationView, RoleView, StepRecord, TrainingPhase};
use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, Pipeline, Sampler, Stage, StageConfig, SyntheticTask,
    data_parallel_step, token_batch,
};
use parcae_tests::{
    LocalCluster, S3Server, TRAIN_BASE_CONFIG, checkpoint_files, new_cluster_with_env, rss_kib,
    serial, start_cluster, wait_for,
};

const SEED: u64 = 3;
const BATCH: u64 = 16;
const MICRO: u64 = 2;

fn train_config(extra_planner: &str, extra_train: &str) -> String {
    format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\n{extra_planner}\n[train]\nseed = {SEED}\n\
         global_batch = {BATCH}\nmicro_batch = {MICRO}\npeak_lr = 0.01\nwarmup_steps = 10\n\
         peer_timeout_secs = 5.0\n{extra_train}\n"
    )
}

fn optimizer() -> OptimizerConfig {
    OptimizerConfig {
        peak_lr: 0.01,
        min_lr: 0.001,
        warmup_steps: 10,
        epsilon: 1e-5,
        ..OptimizerConfig::default()
    }
}

/// The committed steps as a node applied them.
fn steps(c: &LocalCluster, i: usize) -> Vec<StepRecord> {
    c.nodes[i].steps().unwrap_or_default()
}

/// The samples of pipeline `d` of `pipelines` in the step starting at `start`, as micro-batches.
fn shard(
    task: &SyntheticTask,
    sampler: &Sampler,
    start: u64,
    d: u64,
    pipelines: u64,
) -> Vec<Batch> {
    let per = BATCH / pipelines;
    (0..per / MICRO)
        .map(|k| {
            let first = start + d * per + k * MICRO;
            token_batch(
                task,
                sampler,
                first,
                MICRO as usize,
                &parcae_model::default_device(),
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn two_by_two_across_processes_matches_one_process() {
    let _serial = serial();
    let steps_total = 30u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = {steps_total}"),
    );
    let c = start_cluster(&config, 4);
    let done = wait_for(Duration::from_secs(240), || {
        (0..4).find(|&i| steps(&c, i).len() as u64 == steps_total)
    });
    let Some(i) = done else {
        panic!("30 steps did not commit\n{}", c.logs());
    };
    let record = steps(&c, i);
    for (k, s) in record.iter().enumerate() {
        assert_eq!(s.step, k as u64);
        assert_eq!(s.sample_start, k as u64 * BATCH, "exactly-once cursor");
    }
    let first = record[0].loss;
    let last = record[record.len() - 1].loss;
    assert!(last < 0.8 * first, "loss fell: {first} -> {last}");
    let status = c.nodes[i].status().unwrap();
    assert_eq!(status.config, Some((2, 2)));
    assert_model_equals_one_process(&c, steps_total);
}

/// The checkpoints the first replica of each stage took after the last step equal the model
/// one process trains over the same steps: two pipelines of the same stages, same data order.
fn assert_model_equals_one_process(c: &LocalCluster, steps_total: u64) {
    let files = wait_for(Duration::from_secs(30), || {
        let mut f: Vec<_> = c
            .nodes
            .iter()
            .flat_map(|n| checkpoint_files(&n.data_dir))
            .filter(|(s, _, _)| *s == steps_total)
            .collect();
        f.sort_by_key(|(_, r, _)| r.start);
        f.dedup_by_key(|(_, r, _)| r.start);
        (f.len() == 2).then_some(f)
    })
    .unwrap_or_else(|| panic!("no final checkpoints\n{}", c.logs()));
    let ranges: Vec<_> = files.iter().map(|(_, r, _)| r.clone()).collect();
    let model = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
    let gpt = GptConfig::tiny();
    let task = SyntheticTask::default_for(SEED, gpt.vocab_size, gpt.seq_len).unwrap();
    let sampler = Sampler::new(SEED, parcae_model::Dataset::len(&task)).unwrap();
    let stage_config = StageConfig {
        optimizer: optimizer(),
        ..StageConfig::default()
    };
    let device = parcae_model::default_device();
    let mut replicas: Vec<Pipeline<Gpt>> = (0..2)
        .map(|_| {
            Pipeline::new(model.clone(), &ranges, SEED, &device, stage_config.clone()).unwrap()
        })
        .collect();
    for k in 0..steps_total {
        let shards: Vec<Vec<Batch>> = (0..2)
            .map(|d| shard(&task, &sampler, k * BATCH, d, 2))
            .collect();
        data_parallel_step(&mut replicas, &shards).unwrap();
    }
    for (s, (_, range, path)) in files.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        let mut stage = Stage::new(
            model.clone(),
            range.clone(),
            99,
            &device,
            stage_config.clone(),
        )
        .unwrap();
        stage.import_state(&bytes, range.clone()).unwrap();
        assert_eq!(stage.step(), steps_total);
        for layer in range.clone() {
            let ours = stage.param_values(layer).unwrap();
            let reference = replicas[0].stages()[s].param_values(layer).unwrap();
            let max = ours
                .iter()
                .flatten()
                .zip(reference.iter().flatten())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(max <= 1e-4, "layer {layer}: max abs difference {max}");
        }
    }
}

/// Both replicas of a stage are SIGKILLed at once in a 2 x 2 run: the cluster rolls back to
/// its newest complete checkpoint cut (no layer is restored from an older step than the live
/// ones), trains the rolled-back samples again, and ends with the model one process trains.
#[test]
fn losing_a_whole_stage_rolls_back_and_the_model_still_equals_one_process() {
    let _serial = serial();
    let steps_total = 30u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = 10"),
    );
    let mut c = training_cluster(&config, 6, 1);
    let stage_nodes = |stage: u64| -> Vec<usize> {
        workers(&c)
            .into_iter()
            .filter(|(_, slot)| slot[1] == stage)
            .map(|(i, _)| i)
            .collect()
    };
    let victims = [stage_nodes(0), stage_nodes(1)]
        .into_iter()
        .find(|v| v.len() == 2)
        .unwrap_or_else(|| panic!("a stage without the leader\n{}", c.logs()));
    // The stage dies between two checkpoints: its step is past the newest complete cut (which
    // ends at `cut` and so restores the state entering step `cut + 1`), so no cut holds the
    // step and the cluster must roll back.
    let cut = wait_for(Duration::from_secs(120), || {
        let cut = c
            .statuses()
            .into_iter()
            .filter_map(|(_, s)| s.checkpoint_step)
            .max()?;
        last_step(&c).filter(|s| *s > cut).map(|_| cut)
    })
    .unwrap_or_else(|| panic!("no checkpoint\n{}", c.logs()));
    for &v in &victims {
        c.nodes[v].kill();
    }
    eprintln!("killed nodes {victims:?} past the checkpoint of step {cut}");
    let rolled_back = wait_for(Duration::from_secs(90), || {
        c.statuses()
            .into_iter()
            .map(|(_, s)| s.rolled_back_steps)
            .find(|r| *r > 0)
    })
    .unwrap_or_else(|| panic!("no rollback\n{}", c.logs()));
    eprintln!("rolled back {rolled_back} steps");
    let done = wait_for(Duration::from_secs(240), || {
        (0..c.nodes.len())
            .filter(|i| !victims.contains(i))
            .find(|&i| steps(&c, i).len() as u64 == steps_total)
    })
    .unwrap_or_else(|| panic!("{steps_total} steps did not commit\n{}", c.logs()));
    let status = c.nodes[done].status().unwrap();
    assert_eq!(status.rolled_back_steps, rolled_back);
    assert_eq!(status.history, 1);
    let record = steps(&c, done);
    for (k, s) in record.iter().enumerate() {
        assert_eq!(s.step, k as u64);
        assert_eq!(s.sample_start, k as u64 * BATCH, "exactly-once cursor");
    }
    assert!(
        record.iter().any(|r| r.history == 1),
        "steps after the cut are committed in the new history"
    );
    let logs = c.logs();
    assert!(logs.contains("rolled back to the newest complete checkpoint"));
    assert!(!logs.contains("start afresh"));
    assert_model_equals_one_process(&c, steps_total);
}

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

/// The longest committed step sequence any running node shows, checked for exactly-once data:
/// steps `0..n` in order, each starting where the previous ended.
/// The error of node `i` once it refuses the cluster's job (`what` names it in the panic).
fn refusal(c: &LocalCluster, i: usize, what: &str) -> String {
    wait_for(Duration::from_secs(60), || {
        let t = c.nodes[i].status()?.training?;
        (t.phase == TrainingPhase::Refused).then_some(t.error?)
    })
    .unwrap_or_else(|| panic!("{what}\n{}", c.logs()))
}

fn committed_sequence(c: &LocalCluster) -> Vec<StepRecord> {
    committed_sequence_of(c, BATCH)
}

/// [`committed_sequence`] of a job with `batch` samples per step.
fn committed_sequence_of(c: &LocalCluster, batch: u64) -> Vec<StepRecord> {
    let best = (0..c.nodes.len())
        .map(|i| steps(c, i))
        .max_by_key(|s| s.len())
        .unwrap_or_default();
    for (k, s) in best.iter().enumerate() {
        assert_eq!(s.step, k as u64, "no committed step lost or repeated");
        assert_eq!(
            s.sample_start,
            k as u64 * batch,
            "no sample skipped or repeated"
        );
    }
    best
}

fn last_step(c: &LocalCluster) -> Option<u64> {
    (0..c.nodes.len())
        .filter_map(|i| c.nodes[i].status())
        .filter(|s| s.loss.is_some())
        .map(|s| s.step)
        .max()
}

/// Index and slot of the running nodes that train, the leader excluded.
fn workers(c: &LocalCluster) -> Vec<(usize, [u64; 2])> {
    c.statuses()
        .into_iter()
        .filter(|(_, s)| s.role != RoleView::Leader)
        .filter_map(|(i, s)| {
            let slot = s.training?.slot?;
            Some((i, slot.map(u64::from)))
        })
        .collect()
}

/// A cluster of `n` nodes that has committed at least `min_step` steps.
fn training_cluster(config: &str, n: usize, min_step: u64) -> LocalCluster {
    let c = start_cluster(config, n);
    wait_for(Duration::from_secs(120), || {
        last_step(&c).filter(|s| *s >= min_step)
    })
    .unwrap_or_else(|| panic!("no training\n{}", c.logs()));
    c
}

/// Waits until training went `more` steps beyond `before`.
fn trains_on(c: &LocalCluster, before: u64, more: u64, timeout: Duration) -> Duration {
    let t = std::time::Instant::now();
    wait_for(timeout, || last_step(c).filter(|s| *s >= before + more))
        .unwrap_or_else(|| panic!("training did not go on past step {before}\n{}", c.logs()));
    t.elapsed()
}

fn migrations(c: &LocalCluster) -> Vec<MigrationView> {
    c.statuses()
        .into_iter()
        .flat_map(|(_, s)| s.migrations)
        .collect()
}

#[test]
fn a_noticed_node_is_drained_before_its_deadline() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    let epoch_before = c.nodes[0].status().unwrap().epoch;
    let noticed_at = std::time::Instant::now();
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGTERM);
    // A new plan without the node is in force, and trained under, before the 10 s deadline.
    let survivor = (0..c.nodes.len())
        .find(|i| *i != victim)
        .expect("a survivor");
    let trained_after = wait_for(Duration::from_secs(10), || {
        let epoch = c.nodes[survivor].status()?.epoch;
        let under_new = steps(&c, survivor).iter().any(|r| r.epoch == epoch);
        (epoch > epoch_before && under_new).then_some(noticed_at.elapsed())
    })
    .unwrap_or_else(|| panic!("no reconfiguration before the deadline\n{}", c.logs()));
    assert!(trained_after < Duration::from_secs(10));
    let status = c.nodes[victim].status();
    let exit = c.nodes[victim].wait_exit(Duration::from_secs(15));
    assert_eq!(
        exit.and_then(|e| e.code()),
        Some(0),
        "the noticed node exits cleanly"
    );
    assert!(
        status.is_none_or(|s| s
            .training
            .is_none_or(|t| t.phase != TrainingPhase::Training)),
        "drained"
    );
    let m = migrations(&c);
    assert!(
        m.iter().any(|x| x.epoch > epoch_before
            && matches!(
                x.kind,
                MigrationKind::Intra | MigrationKind::Inter | MigrationKind::Repartition
            )
            && x.secs.is_finite()),
        "migration kind and duration in /status: {m:?}"
    );
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 3, Duration::from_secs(30));
    committed_sequence(&c);
    assert!(c.logs().contains("reconfiguration done"));
}

#[test]
fn training_resumes_after_a_kill() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    let before = last_step(&c).unwrap();
    c.nodes[victim].kill();
    let resumed = trains_on(&c, before, 2, Duration::from_secs(30));
    eprintln!("training resumed {resumed:?} after the kill");
    assert!(
        resumed < Duration::from_secs(15),
        "resumed after {resumed:?}"
    );
    let seq = committed_sequence(&c);
    assert!(seq.len() as u64 > before);
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
            let mut bytes = std::fs::read(path).expect("checkpoint");
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
    // at the kill has committed: the newest file on a disk may belong to a checkpoint the
    // victim never completed, which no restore reads.
    std::thread::sleep(Duration::from_millis(300));
    let newest = c
        .statuses()
        .into_iter()
        .filter_map(|(_, s)| s.checkpoint_step)
        .max()
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
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(last_step(&c), Some(stopped.1), "no step after the stop");
    let logs = c.logs();
    assert!(!logs.contains("start afresh"));
    let refusals = logs
        .matches("does not match the digest committed in raft")
        .count();
    assert!(refusals < 20, "{refusals} refusals: a restore loop\n{logs}");
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
        job.get("train.seed").map(String::as_str),
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

/// Every stage part in a job store directory gets one byte flipped.
fn damage_store_parts(store: &Path) {
    let jobs = std::fs::read_dir(store).into_iter().flatten().flatten();
    for part in jobs.flat_map(|job| {
        std::fs::read_dir(job.path().join("parts"))
            .into_iter()
            .flatten()
            .flatten()
    }) {
        let mut bytes = std::fs::read(part.path()).expect("part");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(part.path(), bytes).expect("damage");
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
    let (stopped_step, stopped_history) = wait_for(Duration::from_secs(90), || {
        c.statuses().into_iter().find_map(|(_, s)| {
            (s.training?.phase == TrainingPhase::Stopped).then_some((s.step, s.history))
        })
    })
    .unwrap_or_else(|| panic!("training did not stop\n{}", c.logs()));
    assert!(stopped_step > backed_up, "stopped at {stopped_step}");
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

#[test]
fn a_joining_node_is_put_to_work() {
    let _serial = serial();
    let mut c = training_cluster(&train_config("", "checkpoint_every = 0"), 2, 3);
    let founder = c.nodes[0].p2p_addr().unwrap();
    let new = c
        .spawn(std::slice::from_ref(&founder), None)
        .expect("spawn");
    let slot = wait_for(Duration::from_secs(60), || {
        let s = c.nodes[new].status()?;
        s.training.as_ref()?.slot?;
        s.config
    })
    .unwrap_or_else(|| panic!("the new node got no slot\n{}", c.logs()));
    let nodes = slot.0 * slot.1;
    assert_eq!(
        nodes, 3,
        "the larger configuration uses the new node: {slot:?}"
    );
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 2, Duration::from_secs(30));
    committed_sequence(&c);
}

#[test]
fn a_cut_off_node_stops_committing_and_rejoins_after_the_cut_heals() {
    let _serial = serial();
    let c = training_cluster(&train_config("", "checkpoint_every = 0"), 4, 5);
    let (victim, _) = *workers(&c).first().expect("a training non-leader");
    let peer = c.nodes[victim].peer_id().unwrap();
    // SIGSTOP cuts the node off: its peers see no traffic from it, it sends nothing.
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGSTOP);
    let before = last_step(&c).unwrap();
    let others: Vec<usize> = (0..c.nodes.len()).filter(|i| *i != victim).collect();
    wait_for(Duration::from_secs(60), || {
        others
            .iter()
            .filter_map(|i| c.nodes[*i].status())
            .map(|s| s.step)
            .max()
            .filter(|s| *s >= before + 3)
    })
    .unwrap_or_else(|| panic!("the others did not go on without it\n{}", c.logs()));
    c.nodes[victim].signal(nix::sys::signal::Signal::SIGCONT);
    // Healed: it is a healthy member again and follows the log.
    wait_for(Duration::from_secs(60), || {
        let s = c.nodes[others[0]].status()?;
        let healthy = s.member(&peer)?.status.is_healthy();
        let mine = c.nodes[victim].status()?;
        (healthy && mine.step + 2 >= s.step).then_some(())
    })
    .unwrap_or_else(|| panic!("the node did not rejoin\n{}", c.logs()));
    // No two configurations committed the same step: every node's record agrees.
    let reference = committed_sequence(&c);
    for i in 0..c.nodes.len() {
        for r in steps(&c, i) {
            let k = r.step as usize;
            if let Some(same) = reference.get(k) {
                assert_eq!(&r, same, "step {k} on node {i}");
            }
        }
    }
}

#[test]
fn hostile_data_plane_input_is_refused_and_training_goes_on() {
    use parcae_node::dataplane::protocol::{self, LinkKind, Reply, Request};
    let _serial = serial();
    let mut c = training_cluster(&train_config("pin = [1, 2]", "checkpoint_every = 0"), 3, 3);
    // Borrow the identity of the spare (a member, but assigned nothing) after stopping it.
    let spare = (0..3)
        .find(|i| {
            c.nodes[*i]
                .status()
                .is_some_and(|s| s.training.is_none_or(|t| t.slot.is_none()))
        })
        .expect("a spare");
    let (target, slot) = *workers(&c)
        .iter()
        .find(|(i, _)| *i != spare)
        .expect("a training non-leader");
    let status = c.nodes[target].status().unwrap();
    let addr: std::net::SocketAddr = status.data_addr.as_deref().unwrap().parse().unwrap();
    let target_peer: libp2p::PeerId = status.peer_id.parse().unwrap();
    let epoch = status.epoch;
    c.nodes[spare].kill();
    let keypair = parcae_node::identity::load_or_create(&parcae_node::data_dir::DataDir::new(
        &c.nodes[spare].data_dir,
    ))
    .unwrap();
    let key = parcae_node::key::ClusterKey::load(c.key()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connect = || {
            let (keypair, key) = (keypair.clone(), key.clone());
            async move {
                parcae_node::dataplane::connect(addr, &keypair, target_peer, &[key])
                    .await
                    .unwrap()
            }
        };
        let ask = |req: Request| async move {
            let mut s = connect().await;
            s.send(&protocol::encode(&req).unwrap()).await.unwrap();
            s.recv(1 << 16)
                .await
                .ok()
                .map(|b| protocol::decode::<Reply>(&b).unwrap())
        };
        // A link claiming another node's slot, and one of a stale epoch: closed without reply.
        let other = [slot[0] as u32, 1 - slot[1] as u32];
        let claim = parcae_node::dataplane::protocol::Request::Link {
            epoch,
            kind: LinkKind::Pipeline,
            from: parcae_node::dataplane::links::slot_at(other[0], other[1]),
        };
        assert_eq!(ask(claim).await, None);
        let stale = Request::Link {
            epoch: epoch.saturating_sub(1),
            kind: LinkKind::Ring,
            from: parcae_node::dataplane::links::slot_at(0, 0),
        };
        assert_eq!(ask(stale).await, None);
        // State it does not hold, an empty range.
        for (step, start, end) in [(1_000_000, 0, 1), (0, 3, 1)] {
            let r = ask(Request::Fetch {
                history: 0,
                step,
                start,
                end,
            })
            .await;
            assert!(matches!(r, Some(Reply::Refused(_))), "{r:?}");
        }
        // A checkpoint from a member the plan does not make a stage's first replica (its bytes
        // do not match their digest either): refused before its bytes are read.
        let mut s = connect().await;
        let put = Request::PutCheckpoint {
            steps: 4,
            start: 0,
            end: 1,
            digest: [7; 32],
        };
        s.send(&protocol::encode(&put).unwrap()).await.unwrap();
        s.send(b"not a state").await.unwrap();
        let r = protocol::decode::<Reply>(&s.recv(1 << 16).await.unwrap()).unwrap();
        assert!(matches!(r, Reply::Refused(_)), "{r:?}");
        // Random bytes instead of a handshake.
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        raw.write_all(&[0xAB; 4096]).await.unwrap();
    });
    let before = last_step(&c).unwrap();
    trains_on(&c, before, 3, Duration::from_secs(60));
    let logs = c.logs();
    assert!(logs.contains("link refused"), "{logs}");
    assert!(
        logs.contains("checkpoint refused: the sender has no slot in the plan"),
        "{logs}"
    );
    committed_sequence(&c);
}

#[test]
fn an_emulated_accelerator_paces_every_step_to_the_profile() {
    let _serial = serial();
    let scale = 50.0;
    let config = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\npin = [1, 2]\n[train]\nseed = {SEED}\n\
         global_batch = 128\nmicro_batch = 1\npeer_timeout_secs = 10.0\ncheckpoint_every = 0\n\
         [device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = {scale:?}\n"
    );
    let c = training_cluster(&config, 2, 2);
    // Whatever the partition, the slower of two stages holds at least half of the model's
    // forward and backward time, and a step runs it on all 128 micro-batches.
    let emulation = parcae_node::emulate::Emulation::new("gpt-1.5b", scale).unwrap();
    let whole = emulation.stage(0..emulation.layers(), 1, 1).unwrap();
    let floor_ms = 128.0 * (whole.forward + whole.backward).as_secs_f64() * 1e3 / 2.0;
    for (i, s) in c.statuses() {
        let t = s.training.expect("a training view");
        let e = t
            .emulated
            .unwrap_or_else(|| panic!("node{i} reports no emulated device"));
        assert_eq!((e.profile.as_str(), e.time_scale), ("gpt-1.5b", scale));
        assert!(e.busy_secs > 0.0, "node{i}: {e:?}");
        assert!(
            t.last_step_ms >= floor_ms,
            "node{i}: a step took {:.0} ms, the emulated profile at 1/{scale} at least {floor_ms:.0} ms",
            t.last_step_ms
        );
    }
    assert!(committed_sequence_of(&c, 128).len() >= 2);
}

#[test]
fn a_token_file_larger_than_memory_trains_without_being_read_whole() {
    let _serial = serial();
    // 2 GiB of u16 token ids, sparse: a repeating pattern in the first MiB, zeros after it.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("train.bin");
    let pattern: Vec<u8> = (0..(1u32 << 19))
        .flat_map(|i| ((i % 61 + 1) as u16).to_le_bytes())
        .collect();
    std::fs::write(&path, &pattern).expect("write");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(2 << 30)
        .expect("grow");
    let config = train_config(
        "pin = [1, 2]",
        &format!("data = {:?}\ntokens = \"u16\"", path.display().to_string()),
    );
    let c = training_cluster(&config, 2, 12);
    assert_loss_fell(&c);
    for i in 0..2 {
        let rss_mib = rss_kib(c.nodes[i].pid().expect("running")) / 1024;
        assert!(
            rss_mib < 1024,
            "node {i} holds {rss_mib} MiB of a 2 GiB file"
        );
    }
}

/// The first node's committed losses went down from the first step to the last.
fn assert_loss_fell(c: &LocalCluster) {
    let records = steps(c, 0);
    let (first, last) = (
        records.first().expect("steps"),
        records.last().expect("steps"),
    );
    assert!(
        last.loss < first.loss,
        "loss did not fall: {} -> {}",
        first.loss,
        last.loss
    );
}

/// A byte-level BPE tokenizer trained on `corpus` by the tokenizers crate, saved as
/// `tokenizer.json` in `dir`.
fn train_tokenizer(dir: &Path, corpus: &Path, vocab: usize) -> PathBuf {
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{
        DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
        TokenizerBuilder,
    };
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(0)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(ByteLevel::default().into()))
    .with_decoder(Some(ByteLevel::default().into()))
    .build()
    .expect("tokenizer");
    let path = dir.join("tokenizer.json");
    tokenizer
        .train_from_files(&mut trainer, vec![corpus.display().to_string()])
        .expect("train")
        .save(&path, false)
        .expect("save");
    path
}

#[test]
fn text_through_a_trained_tokenizer_becomes_a_token_file_the_cluster_trains_on() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = dir.path().join("corpus.txt");
    let text: String = (0..4000)
        .map(|i| {
            format!(
                "the spot cluster trains step {} of model {}\n",
                i % 17,
                i % 5
            )
        })
        .collect();
    std::fs::write(&corpus, &text).expect("corpus");
    let tokenizer_path = train_tokenizer(dir.path(), &corpus, 300);
    let out = dir.path().join("train.bin");
    let prepared = std::process::Command::new(parcae_tests::node_binary())
        .args(["prepare-data", "--tokenizer"])
        .arg(&tokenizer_path)
        .arg("--input")
        .arg(&corpus)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("prepare-data runs");
    let said = String::from_utf8_lossy(&prepared.stdout).into_owned();
    assert!(
        prepared.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).expect("load");
    let vocab = tokenizer.get_vocab_size(true);
    assert!(said.contains(&format!("vocab_size = {vocab}")), "{said}");
    assert!(said.contains("tokens = \"u16\""), "{said}");
    // The file is the tokenizer's encoding of every line, in order, as u16 ids.
    let expected: Vec<u8> = text
        .split_inclusive('\n')
        .flat_map(|line| {
            tokenizer
                .encode(line, false)
                .expect("encode")
                .get_ids()
                .to_vec()
        })
        .flat_map(|id| u16::try_from(id).expect("u16 id").to_le_bytes())
        .collect();
    assert_eq!(std::fs::read(&out).expect("token file"), expected);

    // GPT-2 124M's structure at width 64, with a tenth of the file held out.
    let config = train_config(
        "pin = [1, 2]",
        &format!(
            "data = {:?}\ntokens = \"u16\"\nvocab_size = {vocab}\nmodel = \"gpt2-124m\"\n\
             d_model = 64\nn_heads = 4\nd_ff = 256\nseq_len = 32\nval_fraction = 0.1\n\
             val_every = 4\nval_samples = 16",
            out.display().to_string()
        ),
    );
    let c = training_cluster(&config, 2, 12);
    assert_loss_fell(&c);
    let validation: Vec<(u64, f64)> = steps(&c, 0)
        .iter()
        .filter_map(|r| Some((r.step, r.validation_loss?)))
        .collect();
    assert_eq!(
        validation.iter().map(|v| v.0).take(4).collect::<Vec<_>>(),
        [0, 4, 8, 12],
        "steps 0, 4, 8, 12 evaluate and no other"
    );
    let (first, last) = (validation[0].1, validation[validation.len() - 1].1);
    assert!(
        last < first,
        "validation loss did not fall: {first} -> {last}"
    );
    let status = c.nodes[0].status().expect("status");
    assert!(status.validation_loss.is_some() && status.validation_step.is_some());
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
