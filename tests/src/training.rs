//! What the training tests share: the job they train (its seed and batch), the configuration
//! of their clusters, the single-process run a cluster's model is held to, and the questions
//! they ask a cluster (its committed steps, its workers, its reconfigurations).

use std::sync::Arc;
use std::time::Duration;

use parcae_api::{MigrationView, RoleView, StepRecord};
use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, Pipeline, Sampler, Stage, StageConfig, SyntheticTask,
    data_parallel_step, token_batch,
};

use crate::{LocalCluster, TRAIN_BASE_CONFIG, checkpoint_files, start_cluster, wait_for};

/// Seed of the training tests' job.
pub const SEED: u64 = 3;

/// Samples per step.
pub const BATCH: u64 = 16;

/// Samples per micro-batch.
pub const MICRO: u64 = 2;

/// A node configuration of the training job, with planner and `[train]` lines added.
pub fn train_config(extra_planner: &str, extra_train: &str) -> String {
    format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\n{extra_planner}\n[train]\nseed = {SEED}\n\
         global_batch = {BATCH}\nmicro_batch = {MICRO}\npeak_lr = 0.01\nwarmup_steps = 10\n\
         peer_timeout_secs = 5.0\n{extra_train}\n"
    )
}

/// The optimizer `train_config`'s `[train]` describes, as the single-process run needs it.
pub fn optimizer() -> OptimizerConfig {
    OptimizerConfig {
        peak_lr: 0.01,
        min_lr: 0.001,
        warmup_steps: 10,
        epsilon: 1e-5,
        ..OptimizerConfig::default()
    }
}

/// The committed steps as a node applied them.
pub fn steps(c: &LocalCluster, i: usize) -> Vec<StepRecord> {
    c.nodes[i].steps().unwrap_or_default()
}

/// The samples of pipeline `d` of `pipelines` in the step starting at `start`, as micro-batches.
pub fn shard(
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

/// The checkpoints the first replica of each stage took after the last step equal the model
/// one process trains over the same steps: two pipelines of the same stages, same data order.
pub fn assert_model_equals_one_process(c: &LocalCluster, steps_total: u64) {
    assert_model_equals_one_process_as(c, steps_total, [2, 2]);
}

/// [`assert_model_equals_one_process`] of a cluster that trained as `[d, p]`.
pub fn assert_model_equals_one_process_as(c: &LocalCluster, steps_total: u64, [d, p]: [u64; 2]) {
    let files = wait_for(Duration::from_secs(30), || {
        let mut f: Vec<_> = c
            .nodes
            .iter()
            .flat_map(|n| checkpoint_files(&n.data_dir))
            .filter(|(s, _, _)| *s == steps_total)
            .collect();
        f.sort_by_key(|(_, r, _)| r.start);
        f.dedup_by_key(|(_, r, _)| r.start);
        (f.len() as u64 == p).then_some(f)
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
    let mut replicas: Vec<Pipeline<Gpt>> = (0..d)
        .map(|_| {
            Pipeline::new(model.clone(), &ranges, SEED, &device, stage_config.clone()).unwrap()
        })
        .collect();
    for k in 0..steps_total {
        let shards: Vec<Vec<Batch>> = (0..d)
            .map(|i| shard(&task, &sampler, k * BATCH, i, d))
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

/// The longest committed step sequence any running node shows, checked for exactly-once data:
/// steps `0..n` in order, each starting where the previous ended.
pub fn committed_sequence(c: &LocalCluster) -> Vec<StepRecord> {
    committed_sequence_of(c, BATCH)
}

/// [`committed_sequence`] of a job with `batch` samples per step.
pub fn committed_sequence_of(c: &LocalCluster, batch: u64) -> Vec<StepRecord> {
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

/// The newest step any running node applied.
pub fn last_step(c: &LocalCluster) -> Option<u64> {
    (0..c.nodes.len())
        .filter_map(|i| c.nodes[i].status())
        .filter(|s| s.loss.is_some())
        .map(|s| s.step)
        .max()
}

/// Index and slot of the running nodes that train, the leader excluded.
pub fn workers(c: &LocalCluster) -> Vec<(usize, [u64; 2])> {
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
pub fn training_cluster(config: &str, n: usize, min_step: u64) -> LocalCluster {
    let c = start_cluster(config, n);
    wait_for(Duration::from_secs(120), || {
        last_step(&c).filter(|s| *s >= min_step)
    })
    .unwrap_or_else(|| panic!("no training\n{}", c.logs()));
    c
}

/// Waits until training went `more` steps beyond `before`.
pub fn trains_on(c: &LocalCluster, before: u64, more: u64, timeout: Duration) -> Duration {
    let t = std::time::Instant::now();
    wait_for(timeout, || last_step(c).filter(|s| *s >= before + more))
        .unwrap_or_else(|| panic!("training did not go on past step {before}\n{}", c.logs()));
    t.elapsed()
}

/// Every reconfiguration the running nodes show.
pub fn migrations(c: &LocalCluster) -> Vec<MigrationView> {
    c.statuses()
        .into_iter()
        .flat_map(|(_, s)| s.migrations)
        .collect()
}
