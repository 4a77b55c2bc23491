//! Training across real `parcae-node` processes: a 2 x 2 run matches a single-process run, and
//! the cluster trains through a notice, a kill and a join.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, Pipeline, Sampler, Stage, StageConfig, SyntheticTask,
    data_parallel_step, token_batch,
};
use parcae_tests::{TRAIN_BASE_CONFIG, TestCluster, http_get, serial, wait_for};
use serde_json::Value;

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
fn steps(c: &TestCluster, i: usize) -> Vec<Value> {
    http_get(c.nodes[i].status_addr, "/steps")
        .and_then(|t| serde_json::from_str::<Vec<Value>>(&t).ok())
        .unwrap_or_default()
}

/// Checkpoint files `(steps, layers, path)` under a node's data directory.
fn checkpoints(dir: &Path) -> Vec<(u64, std::ops::Range<usize>, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir.join("checkpoints")) else {
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
    let c = TestCluster::start(&config, 4);
    let done = wait_for(Duration::from_secs(240), || {
        (0..4).find_map(|i| (steps(&c, i).len() as u64 == steps_total).then_some(i))
    });
    let Some(i) = done else {
        panic!("30 steps did not commit\n{}", c.logs());
    };
    let record = steps(&c, i);
    for (k, s) in record.iter().enumerate() {
        assert_eq!(s["step"], k as u64);
        assert_eq!(s["sample_start"], k as u64 * BATCH, "exactly-once cursor");
    }
    let first = record[0]["loss"].as_f64().unwrap();
    let last = record[record.len() - 1]["loss"].as_f64().unwrap();
    assert!(last < 0.8 * first, "loss fell: {first} -> {last}");
    let status = c.nodes[i].status().unwrap();
    assert_eq!(status["config"], serde_json::json!([2, 2]));

    // The first replica of each stage checkpoints after the last step.
    let files = wait_for(Duration::from_secs(30), || {
        let mut f: Vec<_> = c
            .nodes
            .iter()
            .flat_map(|n| checkpoints(&n.data_dir))
            .filter(|(s, _, _)| *s == steps_total)
            .collect();
        f.sort_by_key(|(_, r, _)| r.start);
        f.dedup_by_key(|(_, r, _)| r.start);
        (f.len() == 2).then_some(f)
    })
    .unwrap_or_else(|| panic!("no final checkpoints\n{}", c.logs()));
    let ranges: Vec<_> = files.iter().map(|(_, r, _)| r.clone()).collect();

    // The same 30 steps in one process: two pipelines of the same stages, same data order.
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
