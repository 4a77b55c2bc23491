use std::ops::Range;
use std::sync::Arc;

use parcae_api::StepGroup;
use parcae_consensus::state::{Cut, CutPart, GroupParts, LayerRange, OptimizerScalars, StepEnd};
use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, Pipeline, StageConfig, SyntheticTask,
    data_parallel_step, default_device, token_batch,
};
use parcae_outer::SyncMode;
use sha2::{Digest, Sha256};

use super::*;
use crate::job::JobSpec;
use crate::train::samples::{DataSource, micro_batches, pipeline_share};

fn record(step: u64, history: u64) -> StepRecord {
    StepRecord {
        step,
        epoch: 1,
        sample_start: 16 * step,
        samples: 16,
        loss: 1.0,
        validation_loss: None,
        history,
        outer_digests: Vec::new(),
        groups: Vec::new(),
        partition: Vec::new(),
    }
}

/// A cut after step `step` of `history` (its parts' contents do not matter to the plan).
fn cut(history: u64, step: u64) -> Cut {
    Cut {
        end: StepEnd {
            step,
            epoch: 1,
            sample_cursor: 16 * (step + 1),
            optimizer: OptimizerScalars::default(),
        },
        history,
        layers: 4,
        parts: vec![CutPart {
            layers: LayerRange { start: 0, end: 4 },
            holders: Vec::new(),
            digest: [0; 32],
            stored: true,
        }],
        groups: Vec::new(),
    }
}

#[test]
fn windows_run_between_the_checkpoints_of_the_history_and_skip_a_rolled_back_one() {
    // History 0 up to step 24, rolled back to its checkpoint after step 19: history 1 trains
    // steps 20.. again. The checkpoint of history 0 after step 39 was given up with it.
    let steps: Vec<StepRecord> = (0..50)
        .map(|s| record(s, if s < 20 { 0 } else { 1 }))
        .collect();
    let cuts = [cut(0, 19), cut(0, 39), cut(1, 39), cut(1, 99)];
    let p = plan(&cuts, &steps, 100);
    let spans: Vec<(Option<u64>, u64, Range<u64>)> = p
        .windows
        .iter()
        .map(|w| {
            (
                w.from.as_ref().map(|c| c.history),
                w.to.history,
                w.steps.clone(),
            )
        })
        .collect();
    assert_eq!(spans, vec![(None, 0, 0..20), (Some(0), 1, 20..40)]);
    assert_eq!(
        p.not_replayed, 10,
        "steps 40..50 come after the last checkpoint"
    );
    assert!(p.skipped.is_empty());
    assert!(
        p.unanchored.is_empty(),
        "history 1 resumed from the cut after step 19"
    );

    // Without that cut the rollback began from nothing stored.
    let p = plan(&[cut(0, 9), cut(1, 39)], &steps, 100);
    assert_eq!(p.unanchored, vec![20]);
}

#[test]
fn a_window_longer_than_the_longest_is_skipped_and_a_late_history_starts_at_its_first_cut() {
    let steps: Vec<StepRecord> = (0..100).map(|s| record(s, 0)).collect();
    let p = plan(&[cut(0, 19), cut(0, 79), cut(0, 99)], &steps, 50);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![0..20, 80..100]);
    assert_eq!(p.not_replayed, 60);
    assert!(p.skipped[0].contains("steps 20..80"), "{:?}", p.skipped);

    // Steps known from 30 on only (a node's /steps after a resume): nothing before the first
    // checkpoint in them can be replayed.
    let late: Vec<StepRecord> = (30..100).map(|s| record(s, 0)).collect();
    let p = plan(&[cut(0, 19), cut(0, 59), cut(0, 79)], &late, 50);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![60..80]);
    assert_eq!(p.not_replayed, 50);
    assert_eq!(plan(&[cut(0, 19)], &[], 50), Plan::default());
}

const SEED: u64 = 5;

fn job() -> ReplayJob<Gpt> {
    let gpt = GptConfig::tiny();
    ReplayJob {
        model: Arc::new(Gpt::new(gpt.clone()).unwrap()),
        dataset: Arc::new(SyntheticTask::default_for(SEED, gpt.vocab_size, gpt.seq_len).unwrap()),
        spec: JobSpec {
            seed: SEED,
            optimizer: OptimizerConfig {
                peak_lr: 0.01,
                min_lr: 0.001,
                warmup_steps: 10,
                epsilon: 1e-5,
                ..OptimizerConfig::default()
            },
            ..JobSpec::default()
        },
        initial_weights: None,
        program_settings: Vec::new(),
        device: default_device(),
    }
}

/// Pipelines trained in this process as a cluster's replicas train them, and
/// the job's store their checkpoints are written to as a cluster writes them.
struct InProcess {
    replicas: Vec<Pipeline<Gpt>>,
    stages: Vec<Range<usize>>,
    data: DataSource,
    store: JobStore,
    rt: tokio::runtime::Runtime,
}

impl InProcess {
    /// `pipelines` replicas of `job`'s seeded model in `stages`, its store at `location`.
    fn new(
        job: &ReplayJob<Gpt>,
        location: &str,
        pipelines: usize,
        stages: &[Range<usize>],
    ) -> Self {
        let what = Identity::of(job.model.as_ref(), job.dataset.as_ref(), None).unwrap();
        let digest = job.spec.job(&what, &[]).unwrap().digest();
        let config = StageConfig {
            optimizer: job.spec.optimizer.clone(),
            ..StageConfig::default()
        };
        Self {
            replicas: (0..pipelines)
                .map(|_| {
                    Pipeline::new(job.model.clone(), stages, SEED, &job.device, config.clone())
                        .unwrap()
                })
                .collect(),
            stages: stages.to_vec(),
            data: data_source(job.dataset.clone(), &job.spec).unwrap(),
            store: JobStore::open(location, &digest).unwrap().keeping(0),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// Each pipeline's share of the `batch` samples from `start`, in micro-batches of 2.
    fn shards(&self, start: u64, batch: u32) -> Vec<Vec<Batch>> {
        let d = self.replicas.len() as u32;
        (0..d)
            .map(|i| {
                micro_batches(pipeline_share(start, batch, (i, d), &[]), 2)
                    .into_iter()
                    .map(|m| {
                        let (dataset, sampler) = (self.data.dataset.as_ref(), &self.data.sampler);
                        token_batch(dataset, sampler, m.start, 2, &default_device()).unwrap()
                    })
                    .collect()
            })
            .collect()
    }

    /// Replica `replica`'s state after step `step` in the store, as its parts.
    fn store(&self, replica: usize, step: u64) -> Vec<CutPart> {
        self.stages
            .iter()
            .enumerate()
            .map(|(s, r)| {
                let bytes = self.replicas[replica].stages()[s]
                    .export_state(r.clone())
                    .unwrap();
                let digest: [u8; 32] = Sha256::digest(&bytes).into();
                let layers = r.start as u32..r.end as u32;
                self.rt
                    .block_on(
                        self.store
                            .put_part(step + 1, layers.clone(), &digest, bytes),
                    )
                    .unwrap();
                CutPart {
                    layers: LayerRange {
                        start: layers.start,
                        end: layers.end,
                    },
                    holders: Vec::new(),
                    digest,
                    stored: true,
                }
            })
            .collect()
    }

    /// Pipeline 0's state after step `step` stored as the cut of history 0 a cluster writes,
    /// with the states of `groups` (zone, the replica that writes it).
    fn checkpoint(&self, step: u64, groups: &[(&str, usize)]) {
        let cut = Cut {
            parts: self.store(0, step),
            groups: groups
                .iter()
                .map(|&(zone, replica)| GroupParts {
                    zone: zone.into(),
                    parts: self.store(replica, step),
                })
                .collect(),
            ..cut(0, step)
        };
        self.rt.block_on(self.store.put_cut(&cut)).unwrap();
    }
}

/// A 2 x 2 cluster's training, in this process: two pipelines of two stages, each on its
/// share of the step's samples, gradients averaged; its checkpoints after steps 9 and 19
/// written to the job's store at `location` as a cluster writes them. Returns the committed
/// steps.
fn train_like_a_cluster(job: &ReplayJob<Gpt>, location: &str) -> Vec<StepRecord> {
    let mut cluster = InProcess::new(job, location, 2, &[0..2, 2..4]);
    let mut steps = Vec::new();
    for step in 0..20u64 {
        let shards = cluster.shards(16 * step, 16);
        let loss = data_parallel_step(&mut cluster.replicas, &shards).unwrap();
        steps.push(StepRecord {
            loss: f64::from(loss),
            ..record(step, 0)
        });
        if (step + 1) % 10 == 0 {
            cluster.checkpoint(step, &[]);
        }
    }
    steps
}

#[test]
fn a_replay_of_what_the_cluster_trained_matches_and_one_wrong_step_does_not() {
    let job = job();
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().display().to_string();
    let steps = train_like_a_cluster(&job, &location);

    let report = replay(&job, &location, &steps, 1e-4, 200).unwrap();
    assert!(report.passed, "{report:?}");
    assert_eq!((report.windows, report.steps_replayed), (2, 20));
    assert_eq!(report.steps_not_replayed, 0);
    assert_eq!(report.last_checkpoint_step, Some(19));
    assert!(report.max_abs_diff < 1e-5, "{report:?}");
    assert!(report.max_loss_diff < 1e-4, "{report:?}");

    // The history says step 13 trained the samples of step 14: the checkpoint after step 19
    // is far from what one process trains on that history.
    let mut wrong = steps.clone();
    wrong[13].sample_start = wrong[14].sample_start;
    let report = replay(&job, &location, &wrong, 1e-4, 200).unwrap();
    assert!(!report.passed);
    assert!(report.max_abs_diff > 1e-3, "{report:?}");
    assert!(
        report.problems[0].contains("after step 19") && report.problems[0].contains("10..20"),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_store_without_the_jobs_checkpoints_and_a_broken_steps_file_are_named() {
    let job = job();
    let dir = tempfile::tempdir().unwrap();
    let e = format!(
        "{:#}",
        replay(
            &job,
            &dir.path().display().to_string(),
            &[record(0, 0)],
            1e-4,
            200
        )
        .unwrap_err()
    );
    assert!(e.contains("no complete checkpoint of this job"), "{e}");

    let file = dir.path().join("steps.json");
    std::fs::write(&file, "[{\"step\": 3}, {\"step\": 5}]").unwrap();
    let e = format!("{:#}", read_steps(&file).unwrap_err());
    assert!(e.contains("step 5 follows step 3"), "{e}");
    std::fs::write(&file, "{").unwrap();
    let e = format!("{:#}", read_steps(&file).unwrap_err());
    assert!(e.contains("not a JSON array of committed steps"), "{e}");
}

/// Step `step` of a DiLoCo history of 18 samples a step: group `a` holds pipeline 0, group
/// `b` pipelines 1 and 2, 6 samples each.
fn diloco_record(step: u64, history: u64) -> StepRecord {
    let start = 18 * step;
    let share = |d: u64| [start + 6 * d, start + 6 * (d + 1)];
    StepRecord {
        samples: 18,
        sample_start: start,
        groups: vec![
            StepGroup {
                zone: "a".into(),
                shares: vec![share(0)],
            },
            StepGroup {
                zone: "b".into(),
                shares: vec![share(1), share(2)],
            },
        ],
        partition: vec![0, 4],
        ..record(step, history)
    }
}

#[test]
fn a_diloco_window_starts_where_every_group_had_the_same_state() {
    let steps: Vec<StepRecord> = (0..40)
        .map(|s| diloco_record(s, if s < 20 { 0 } else { 1 }))
        .collect();
    // History 1 resumed every group from the cut after step 19; the cut after step 9 holds
    // group a's state only, and so does the one after step 29.
    let cuts = [cut(0, 9), cut(0, 19), cut(1, 29), cut(1, 39)];
    let mut p = plan(&cuts, &steps, 100);
    groups::keep_replayable(&mut p, &steps);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![0..10, 20..30]);
    assert_eq!(p.not_replayed, 20);
    assert!(
        p.skipped[0].contains("steps 10..20")
            && p.skipped[0].contains("no stored state of group \"b\""),
        "{:?}",
        p.skipped
    );

    // With group b's state stored beside it, the cut after step 9 starts a window.
    let stored_b = Cut {
        groups: vec![GroupParts {
            zone: "b".into(),
            parts: cut(0, 9).parts,
        }],
        ..cut(0, 9)
    };
    let with_b = [stored_b, cut(0, 19), cut(1, 29), cut(1, 39)];
    let mut p = plan(&with_b, &steps, 100);
    groups::keep_replayable(&mut p, &steps);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![0..10, 10..20, 20..30]);

    // Pipelines of two stages, each stage's ring summed on its own: the same windows, and
    // none where the steps do not say how their pipelines were cut.
    let mut two_stages = with_b.clone();
    for c in &mut two_stages[..2] {
        let mut second = c.parts[0].clone();
        c.parts[0].layers.end = 2;
        second.layers.start = 2;
        c.parts.push(second);
    }
    let mut cut_in_two = steps.clone();
    cut_in_two
        .iter_mut()
        .for_each(|r| r.partition = vec![0, 2, 4]);
    let mut p = plan(&two_stages, &cut_in_two, 100);
    groups::keep_replayable(&mut p, &cut_in_two);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![0..10, 10..20, 20..30]);
    cut_in_two[12].partition.clear();
    let mut p = plan(&two_stages, &cut_in_two, 100);
    groups::keep_replayable(&mut p, &cut_in_two);
    assert!(
        p.skipped[0].contains("step 12: its stages are not recorded"),
        "{:?}",
        p.skipped
    );

    // Zone b joins at step 3 (epoch 2), when group a alone trained: it took a's state. The
    // plan changes again at step 22 (epoch 3) while both trained: whose state each took (a
    // zone whose holders all died takes another's) is not known.
    let mut replanned = steps.clone();
    for r in &mut replanned[..3] {
        r.groups.truncate(1);
    }
    for r in &mut replanned[3..] {
        r.epoch = if r.step < 22 { 2 } else { 3 };
    }
    let mut p = plan(&cuts, &replanned, 100);
    groups::keep_replayable(&mut p, &replanned);
    let spans: Vec<Range<u64>> = p.windows.iter().map(|w| w.steps.clone()).collect();
    assert_eq!(spans, vec![0..10]);
    assert!(
        p.skipped[1].contains("step 22: the plan changed while 2 groups trained"),
        "{:?}",
        p.skipped
    );

    // A step whose groups are not known.
    let mut unknown = steps.clone();
    unknown[5].groups.clear();
    let mut p = plan(&cuts, &unknown, 100);
    groups::keep_replayable(&mut p, &unknown);
    assert!(
        p.skipped[0].contains("step 5: its groups are not recorded"),
        "{:?}",
        p.skipped
    );
}

/// The job of [`job`] under `diloco:3`.
fn diloco_job() -> ReplayJob<Gpt> {
    let mut job = job();
    job.spec.global_batch = 18;
    job.spec.micro_batch = 2;
    job.spec.sync = SyncMode::Diloco(3);
    job
}

/// A DiLoCo cluster's training, in this process: three pipelines of one stage, group `a`
/// pipeline 0 and group `b` pipelines 1 and 2 ([`diloco_record`]), each group averaging its
/// gradients inside itself, a round before every third step over the three replicas; its
/// checkpoints after steps 9 and 19 (pipeline 0's, and group b's by pipeline 1) written to the
/// job's store at `location`. Returns the committed steps.
fn train_like_diloco_groups(
    job: &ReplayJob<Gpt>,
    location: &str,
    stages: &[Range<usize>],
) -> Vec<StepRecord> {
    let mut cluster = InProcess::new(job, location, 3, stages);
    let partition: Vec<u32> = std::iter::once(0)
        .chain(stages.iter().map(|r| r.end as u32))
        .collect();
    for stage in cluster
        .replicas
        .iter_mut()
        .flat_map(|r| r.stages_mut().iter_mut())
    {
        stage.begin_outer().unwrap();
    }
    let mut steps = Vec::new();
    for step in 0..20u64 {
        if step > 0 && step % 3 == 0 {
            let replicas = &mut cluster.replicas;
            for s in 0..cluster.stages.len() {
                let pseudo: Vec<Vec<f32>> = replicas
                    .iter()
                    .map(|r| r.stages()[s].pseudo_gradient().unwrap())
                    .collect();
                let mean: Vec<f32> = (0..pseudo[0].len())
                    .map(|i| pseudo.iter().map(|p| p[i]).sum::<f32>() / 3.0)
                    .collect();
                for r in replicas.iter_mut() {
                    r.stages_mut()[s]
                        .outer_step(&mean, &job.spec.outer)
                        .unwrap();
                }
            }
        }
        let shards = cluster.shards(18 * step, 18);
        let (a, b) = cluster.replicas.split_at_mut(1);
        let loss_a = data_parallel_step(a, &shards[..1]).unwrap();
        let loss_b = data_parallel_step(b, &shards[1..]).unwrap();
        steps.push(StepRecord {
            loss: f64::from(loss_a + 2.0 * loss_b) / 3.0,
            partition: partition.clone(),
            ..diloco_record(step, 0)
        });
        if (step + 1) % 10 == 0 {
            cluster.checkpoint(step, &[("b", 1)]);
        }
    }
    steps
}

#[test]
fn a_replay_of_diloco_groups_matches_and_a_step_given_to_the_wrong_group_does_not() {
    let job = diloco_job();
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().display().to_string();
    let steps = train_like_diloco_groups(&job, &location, std::slice::from_ref(&(0..4)));

    let report = replay(&job, &location, &steps, 1e-4, 200).unwrap();
    assert!(report.passed, "{report:?}");
    // The second window starts from both groups' states in the checkpoint after step 9.
    assert_eq!((report.windows, report.steps_replayed), (2, 20));
    assert!(report.max_abs_diff < 1e-5, "{report:?}");
    assert!(report.max_loss_diff < 1e-4, "{report:?}");

    // Pipelines of two stages: the groups' models cut as the steps say, the second window
    // from each group's two stored parts.
    let two = tempfile::tempdir().unwrap();
    let two_location = two.path().display().to_string();
    let two_stages = train_like_diloco_groups(&job, &two_location, &[0..2, 2..4]);
    let report = replay(&job, &two_location, &two_stages, 1e-4, 200).unwrap();
    assert!(report.passed, "{report:?}");
    assert_eq!((report.windows, report.steps_replayed), (2, 20));
    assert!(report.max_abs_diff < 1e-5, "{report:?}");

    // Steps 4 and 14 with their shares swapped between the groups: each group trained the
    // other's samples, in both windows.
    let mut wrong = steps.clone();
    for k in [4, 14] {
        let r = &mut wrong[k];
        let (a, b) = (r.groups[0].shares[0], r.groups[1].shares[0]);
        r.groups[0].shares[0] = b;
        r.groups[1].shares[0] = a;
    }
    let report = replay(&job, &location, &wrong, 1e-4, 200).unwrap();
    assert!(!report.passed);
    assert!(report.max_abs_diff > 1e-3, "{report:?}");
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);

    // A lossy wire form is refused, naming it.
    let mut int8 = diloco_job();
    int8.spec.outer.wire = Wire::Int8;
    let e = format!(
        "{:#}",
        replay(&int8, &location, &steps, 1e-4, 200).unwrap_err()
    );
    assert!(e.contains("int8") && e.contains("only f32 rounds"), "{e}");
}
