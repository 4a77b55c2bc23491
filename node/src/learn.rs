//! `parcae-node learn`: what synchronising every step (`step`) or every `H` steps (DiLoCo,
//! `diloco:H`) does to learning, at equal samples, in one process with no network: the
//! reference the testnet's groups are held to, as one process is for the training tests.
//!
//! `groups` groups of `replicas` data-parallel pipelines each train the job's sample order:
//! step `k`'s global batch is cut into one contiguous share a replica, as a node cuts it, so
//! every mode trains the same samples in the same steps. Under `step` one all-reduce spans every
//! replica (the synchronous job). Under `diloco:H` each group all-reduces inside itself only and
//! keeps its own AdamW moments; after every `H` steps (and after the last) each stage's
//! pseudo-gradient (the round's outer weights minus the group's) travels in the wire form, the
//! groups' average weighted by their samples takes DiLoCo's outer Nesterov step, and every
//! replica continues from the same outer weights. Validation loss is measured on the outer
//! weights: at every `eval_every` samples under `step`, at the first round end at or after them
//! under DiLoCo (between rounds the groups' weights differ).
//!
//! The bytes between groups are priced, not sent: the all-reduce by zone
//! (`dataplane::collective::zones`) sends `2 (G - 1) / G` of a buffer across from each of `G`
//! groups, so `2 (G - 1)` buffers a step under `step` (f32 gradients) and a round under DiLoCo
//! (the encoded pseudo-gradients).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use parcae_api::{LearnReport, LearnRun, ValPoint};
use parcae_model::{
    Batch, ByteTextDataset, Dataset, Gpt, OptimizerConfig, Pipeline, Sampler, StageConfig,
    SyntheticTask, data_parallel_step, default_device, even_ranges, split_validation, token_batch,
};
use parcae_outer::{Contribution, OuterSettings, SyncMode, Wire, codec};

use crate::config::ModelPreset;
use crate::profile::model_name;

/// Most groups, replicas a group and stages.
const MAX_PARTS: u32 = 64;

/// Most samples a run trains.
const MAX_SAMPLES: u64 = 1 << 30;

/// Most samples per step.
const MAX_BATCH: u32 = 1 << 16;

/// Largest width, number of blocks and tokens per sample a run may ask for: the GPT-2 family's
/// and a margin, so that a mistyped size is refused instead of exhausting memory.
const MAX_SIZE: usize = 8192;

/// Share of the examples held out for validation.
const VALIDATION_FRACTION: f64 = 0.05;

/// Seed of the validation batches' order: the same examples for every run.
const VALIDATION_SEED: u64 = 0;

/// Seed of the synthetic task: the same data for every run (a run's seed draws its weights
/// and its sample order).
const TASK_SEED: u64 = 1;

/// What `parcae-node learn` is asked to run.
#[derive(Debug, Clone, clap::Args)]
pub struct LearnOptions {
    /// The modes compared, each a run per seed: `step`, `diloco:H`.
    #[arg(long, value_delimiter = ',', default_value = "step,diloco:20")]
    pub sync: Vec<SyncMode>,
    /// Seeds of the weights and the sample order.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub seeds: Vec<u64>,
    /// Groups (zones) that train apart between rounds.
    #[arg(long, default_value_t = 2)]
    pub groups: u32,
    /// Data-parallel pipelines in each group.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Stages of each pipeline.
    #[arg(long, default_value_t = 1)]
    pub stages: u32,
    /// The model, as `[train] model` names it.
    #[arg(long, default_value = "tiny")]
    pub model: ModelPreset,
    /// Model width (the preset's without it).
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Transformer blocks (the preset's without it).
    #[arg(long)]
    pub n_blocks: Option<usize>,
    /// Tokens per sample (the preset's without it).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// `synthetic` (the project's seeded task), or a text file read byte by byte.
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// Samples each run trains (rounded up to whole steps).
    #[arg(long, default_value_t = 16_384)]
    pub samples: u64,
    /// Samples per step, over every replica of every group.
    #[arg(long, default_value_t = 32)]
    pub global_batch: u32,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: u32,
    /// AdamW's peak learning rate (warmup, then cosine decay over the run).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Steps of learning-rate warmup.
    #[arg(long, default_value_t = 20)]
    pub warmup_steps: u64,
    /// Samples between validations.
    #[arg(long, default_value_t = 2048)]
    pub eval_every: u64,
    /// Held-out samples each validation evaluates.
    #[arg(long, default_value_t = 256)]
    pub val_samples: u32,
    /// The outer Nesterov SGD's learning rate.
    #[arg(long, default_value_t = parcae_outer::sync::DEFAULT_OUTER_LR)]
    pub outer_lr: f32,
    /// The outer Nesterov SGD's momentum.
    #[arg(long, default_value_t = parcae_outer::sync::DEFAULT_OUTER_MOMENTUM)]
    pub outer_momentum: f32,
    /// The pseudo-gradient's wire form: f32, bf16 or int8.
    #[arg(long, default_value = "f32")]
    pub pseudo_gradient: Wire,
    /// Where to write the report (JSON).
    #[arg(long)]
    pub out: PathBuf,
}

/// The job every run trains: the model, its data split, the batch's cut.
struct Job {
    gpt: Arc<Gpt>,
    ranges: Vec<std::ops::Range<usize>>,
    train: Arc<dyn Dataset>,
    validation: Vec<Batch>,
    steps: u64,
    /// Samples of each replica's share of a step.
    share: u64,
    optimizer: OptimizerConfig,
    outer: OuterSettings,
}

/// Runs every mode from every seed and writes the report to `opts.out`.
pub fn learn(opts: &LearnOptions) -> anyhow::Result<LearnReport> {
    let job = Job::new(opts)?;
    let mut runs = Vec::new();
    for &seed in &opts.seeds {
        for &mode in &opts.sync {
            let run = job
                .run(opts, mode, seed)
                .with_context(|| format!("{mode} from seed {seed}"))?;
            println!(
                "{:<12} seed {seed}: val loss {:.4} after {} samples, {} bytes between groups, {:.1} s",
                run.sync, run.val_loss_last, run.samples, run.cross_group_bytes, run.secs
            );
            runs.push(run);
        }
    }
    let report = LearnReport {
        model: model_name(opts.model),
        d_model: job.gpt.config().d_model,
        n_blocks: job.gpt.config().n_blocks,
        seq_len: job.gpt.config().seq_len,
        params: job.gpt_params()?,
        data: opts.data.clone(),
        groups: opts.groups,
        replicas: opts.replicas,
        stages: opts.stages,
        global_batch: opts.global_batch,
        micro_batch: opts.micro_batch,
        lr: opts.lr,
        outer_lr: job.outer.lr,
        outer_momentum: job.outer.momentum,
        pseudo_gradient: job.outer.wire.to_string(),
        runs,
    };
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&opts.out, json).with_context(|| format!("writing {}", opts.out.display()))?;
    Ok(report)
}

impl Job {
    fn new(opts: &LearnOptions) -> anyhow::Result<Self> {
        check(opts)?;
        let mut config = opts.model.gpt();
        for (field, value) in [
            (&mut config.d_model, opts.d_model),
            (&mut config.n_blocks, opts.n_blocks),
            (&mut config.seq_len, opts.seq_len),
        ] {
            if let Some(v) = value {
                *field = v;
            }
        }
        let data: Arc<dyn Dataset> = if opts.data == "synthetic" {
            Arc::new(SyntheticTask::default_for(
                TASK_SEED,
                config.vocab_size,
                config.seq_len,
            )?)
        } else {
            config.vocab_size = 256;
            Arc::new(
                ByteTextDataset::from_file(std::path::Path::new(&opts.data), config.seq_len)
                    .with_context(|| format!("--data {}", opts.data))?,
            )
        };
        let gpt = Arc::new(Gpt::new(config)?);
        let stages = opts.stages as usize;
        let layers = parcae_model::PipelineModel::num_layers(gpt.as_ref());
        ensure!(
            stages <= layers,
            "--stages {stages}: the model has {layers} layers"
        );
        let ranges = even_ranges(layers, stages)?;
        let (train, held_out) = split_validation(data, VALIDATION_FRACTION)?;
        let sampler = Sampler::new(VALIDATION_SEED, held_out.len())?;
        let micro = u64::from(opts.micro_batch);
        let validation = (0..u64::from(opts.val_samples) / micro)
            .map(|k| {
                token_batch(
                    held_out.as_ref(),
                    &sampler,
                    k * micro,
                    micro as usize,
                    &default_device(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batch = u64::from(opts.global_batch);
        let steps = opts.samples.div_ceil(batch);
        let outer = OuterSettings {
            lr: opts.outer_lr,
            momentum: opts.outer_momentum,
            wire: opts.pseudo_gradient,
        };
        outer.check()?;
        Ok(Self {
            gpt,
            ranges,
            train,
            validation,
            steps,
            share: batch / u64::from(opts.groups * opts.replicas),
            optimizer: OptimizerConfig {
                peak_lr: opts.lr,
                min_lr: opts.lr / 10.0,
                warmup_steps: opts.warmup_steps,
                total_steps: steps,
                epsilon: 1e-5,
                ..OptimizerConfig::default()
            },
            outer,
        })
    }

    fn gpt_params(&self) -> anyhow::Result<u64> {
        let pipeline = self.pipeline(0)?;
        Ok(pipeline
            .stages()
            .iter()
            .map(|s| s.num_params() as u64)
            .sum())
    }

    fn pipeline(&self, seed: u64) -> anyhow::Result<Pipeline<Gpt>> {
        let config = StageConfig {
            optimizer: self.optimizer.clone(),
            ..StageConfig::default()
        };
        Ok(Pipeline::new(
            self.gpt.clone(),
            &self.ranges,
            seed,
            &default_device(),
            config,
        )?)
    }

    /// Trains `mode` from `seed` for the job's steps.
    fn run(&self, opts: &LearnOptions, mode: SyncMode, seed: u64) -> anyhow::Result<LearnRun> {
        let started = Instant::now();
        let groups = opts.groups as usize;
        let per_group = opts.replicas as usize;
        let mut replicas = (0..groups * per_group)
            .map(|_| self.pipeline(seed))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut outer = Outer::new(&mut replicas, self.outer)?;
        let sampler = Sampler::new(seed, self.train.len())?;
        let batch = u64::from(opts.global_batch);
        let inner_steps = mode.inner_steps().map(u64::from);
        let mut curve = vec![ValPoint {
            samples: 0,
            val_loss: self.validate(&replicas[0])?,
        }];
        let mut next_eval = opts.eval_every;
        let (mut cross, mut rounds, mut since_round) = (0u64, 0u64, 0u64);
        for step in 0..self.steps {
            let shards = self.shards(&sampler, step * batch, replicas.len(), opts)?;
            match inner_steps {
                None => {
                    data_parallel_step(&mut replicas, &shards)?;
                    cross += between_groups(groups, 4 * outer.params as u64);
                }
                Some(_) => {
                    for (group, shard) in
                        replicas.chunks_mut(per_group).zip(shards.chunks(per_group))
                    {
                        data_parallel_step(group, shard)?;
                    }
                }
            }
            since_round += 1;
            let trained = (step + 1) * batch;
            let last = step + 1 == self.steps;
            let round_due = inner_steps.is_some_and(|h| since_round == h || last);
            if round_due {
                let group_samples = since_round * batch / groups as u64;
                cross += outer.round(&mut replicas, per_group, group_samples)?;
                rounds += 1;
                since_round = 0;
            }
            let settled = inner_steps.is_none() || round_due;
            if settled && (trained >= next_eval || last) {
                curve.push(ValPoint {
                    samples: trained,
                    val_loss: self.validate(&replicas[0])?,
                });
                while next_eval <= trained {
                    next_eval += opts.eval_every;
                }
            }
        }
        Ok(LearnRun {
            sync: mode.to_string(),
            seed,
            samples: self.steps * batch,
            val_loss_last: curve.last().map_or(f64::NAN, |p| p.val_loss),
            curve,
            cross_group_bytes: cross,
            rounds,
            secs: started.elapsed().as_secs_f64(),
        })
    }

    /// Each replica's share of the step whose samples start at `first`, as micro-batches.
    fn shards(
        &self,
        sampler: &Sampler,
        first: u64,
        replicas: usize,
        opts: &LearnOptions,
    ) -> anyhow::Result<Vec<Vec<Batch>>> {
        let micro = u64::from(opts.micro_batch);
        (0..replicas as u64)
            .map(|d| {
                (0..self.share / micro)
                    .map(|k| {
                        let at = first + d * self.share + k * micro;
                        let batch = token_batch(
                            self.train.as_ref(),
                            sampler,
                            at,
                            micro as usize,
                            &default_device(),
                        )?;
                        Ok(batch)
                    })
                    .collect()
            })
            .collect()
    }

    /// The mean loss of the validation batches on `pipeline`.
    fn validate(&self, pipeline: &Pipeline<Gpt>) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for batch in &self.validation {
            sum += f64::from(pipeline.evaluate(batch)?);
        }
        Ok(sum / self.validation.len() as f64)
    }
}

/// Bytes `groups` groups send each other to all-reduce a buffer of `bytes` by zone.
fn between_groups(groups: usize, bytes: u64) -> u64 {
    2 * (groups as u64).saturating_sub(1) * bytes
}

/// DiLoCo's outer loop over the replicas: each stage keeps its outer state as a node's does
/// (`Stage::begin_outer`, `pseudo_gradient`, `outer_step`), and the groups' pseudo-gradients
/// pass through the wire form between them.
struct Outer {
    settings: OuterSettings,
    /// Parameters of the whole model.
    params: usize,
}

impl Outer {
    /// The outer loop from the replicas' starting weights.
    fn new(replicas: &mut [Pipeline<Gpt>], settings: OuterSettings) -> anyhow::Result<Self> {
        for stage in replicas.iter_mut().flat_map(|r| r.stages_mut().iter_mut()) {
            stage.begin_outer()?;
        }
        let params = replicas
            .first()
            .map_or(0, |r| r.stages().iter().map(|s| s.num_params()).sum());
        Ok(Self { settings, params })
    }

    /// One outer round over `replicas` (groups of `per_group`, each group having trained
    /// `samples` since the last): every stage's pseudo-gradients through the wire form, their
    /// weighted average, the outer step on every replica (the same on each, as on every node).
    /// Returns the bytes priced between the groups.
    fn round(
        &mut self,
        replicas: &mut [Pipeline<Gpt>],
        per_group: usize,
        samples: u64,
    ) -> anyhow::Result<u64> {
        let groups = replicas.len() / per_group;
        let wire = self.settings.wire;
        let stages = replicas.first().map_or(0, |r| r.stages().len());
        let mut bytes = 0;
        for s in 0..stages {
            let mut received = Vec::with_capacity(groups);
            let mut sent_len = 0;
            for group in replicas.chunks(per_group) {
                let gradient = group[0].stages()[s].pseudo_gradient()?;
                let sent = codec::encode(&gradient, wire)?;
                sent_len = sent.len() as u64;
                received.push(codec::decode(&sent, wire, gradient.len())?);
            }
            bytes += between_groups(groups, sent_len);
            let contributions: Vec<Contribution<'_>> = received
                .iter()
                .map(|g| Contribution {
                    samples: samples as f64,
                    pseudo_gradient: g,
                })
                .collect();
            let averaged = parcae_outer::average(&contributions)?;
            for replica in replicas.iter_mut() {
                replica.stages_mut()[s].outer_step(&averaged, &self.settings)?;
            }
        }
        Ok(bytes)
    }
}

/// Refuses options no run can train.
fn check(opts: &LearnOptions) -> anyhow::Result<()> {
    for (name, v) in [
        ("--groups", opts.groups),
        ("--replicas", opts.replicas),
        ("--stages", opts.stages),
    ] {
        ensure!(
            (1..=MAX_PARTS).contains(&v),
            "{name} {v}: expected 1 to {MAX_PARTS}"
        );
    }
    for (name, v) in [
        ("--d-model", opts.d_model),
        ("--n-blocks", opts.n_blocks),
        ("--seq-len", opts.seq_len),
    ] {
        if let Some(v) = v {
            ensure!(
                (1..=MAX_SIZE).contains(&v),
                "{name} {v}: expected 1 to {MAX_SIZE}"
            );
        }
    }
    ensure!(!opts.sync.is_empty(), "--sync names no mode");
    ensure!(!opts.seeds.is_empty(), "--seeds names no seed");
    ensure!(
        (1..=MAX_SAMPLES).contains(&opts.samples),
        "--samples {}: expected 1 to {MAX_SAMPLES}",
        opts.samples
    );
    ensure!(
        (1..=MAX_BATCH).contains(&opts.global_batch) && opts.micro_batch >= 1,
        "--global-batch {} and --micro-batch {}: expected 1 to {MAX_BATCH}",
        opts.global_batch,
        opts.micro_batch
    );
    let replicas = opts.groups * opts.replicas;
    let per_replica = opts.global_batch / replicas;
    if !opts.global_batch.is_multiple_of(replicas) || !per_replica.is_multiple_of(opts.micro_batch)
    {
        bail!(
            "--global-batch {} cannot be cut into {replicas} equal shares of whole micro-batches of {}",
            opts.global_batch,
            opts.micro_batch
        );
    }
    ensure!(
        opts.eval_every >= 1 && opts.val_samples >= opts.micro_batch,
        "--eval-every must be at least 1 and --val-samples at least one micro-batch"
    );
    ensure!(
        opts.lr.is_finite() && opts.lr > 0.0,
        "--lr {}: expected a positive number",
        opts.lr
    );
    Ok(())
}

#[cfg(test)]
mod tests;
