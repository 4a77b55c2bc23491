use parcae_consensus::state::{CutPart, LayerRange, OptimizerScalars, StepEnd};
use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, SyntheticTask, data_parallel_step, default_device,
};
use sha2::{Digest, Sha256};

use super::*;
use crate::train::samples::pipeline_share;

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

/// A 2 x 2 cluster's training, in this process: two pipelines of two stages, each on its
/// share of the step's samples, gradients averaged; its checkpoints after steps 9 and 19
/// written to the job's store at `location` as a cluster writes them. Returns the committed
/// steps.
fn train_like_a_cluster(job: &ReplayJob<Gpt>, location: &str) -> Vec<StepRecord> {
    let what = Identity::of(job.model.as_ref(), job.dataset.as_ref(), None).unwrap();
    let digest = job.spec.job(&what, &[]).unwrap().digest();
    let store = JobStore::open(location, &digest).unwrap().keeping(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let data = data_source(job.dataset.clone(), &job.spec).unwrap();
    let device = default_device();
    let ranges = [0..2, 2..4];
    let config = StageConfig {
        optimizer: job.spec.optimizer.clone(),
        ..StageConfig::default()
    };
    let mut replicas: Vec<Pipeline<Gpt>> = (0..2)
        .map(|_| Pipeline::new(job.model.clone(), &ranges, SEED, &device, config.clone()).unwrap())
        .collect();
    let mut steps = Vec::new();
    for step in 0..20u64 {
        let start = 16 * step;
        let shards: Vec<Vec<Batch>> = (0..2)
            .map(|d| {
                micro_batches(pipeline_share(start, 16, (d, 2), &[]), 2)
                    .into_iter()
                    .map(|m| {
                        token_batch(data.dataset.as_ref(), &data.sampler, m.start, 2, &device)
                            .unwrap()
                    })
                    .collect()
            })
            .collect();
        let loss = data_parallel_step(&mut replicas, &shards).unwrap();
        steps.push(StepRecord {
            loss: f64::from(loss),
            ..record(step, 0)
        });
        if (step + 1) % 10 == 0 {
            let parts = ranges
                .iter()
                .enumerate()
                .map(|(s, r)| {
                    let bytes = replicas[0].stages()[s].export_state(r.clone()).unwrap();
                    let digest: [u8; 32] = Sha256::digest(&bytes).into();
                    let layers = r.start as u32..r.end as u32;
                    rt.block_on(store.put_part(step + 1, layers.clone(), &digest, bytes))
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
                .collect();
            let cut = Cut {
                parts,
                ..cut(0, step)
            };
            rt.block_on(store.put_cut(&cut)).unwrap();
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
