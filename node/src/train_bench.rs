//! `parcae-node train-bench`: one process trains the whole model as one stage for a number of
//! steps at a fixed batch and reports what a user compares across frameworks — tokens per
//! second (the median of the warm steps), model FLOPs utilisation against a peak the caller
//! names, peak memory, and the cold start (from the command's start to the end of its first
//! step: building the model and compiling and autotuning every kernel) apart from the warm
//! steps. The same model, batch and precision in PyTorch (`scripts/torch_bench.py`) gives the
//! ratio the GPU check reports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use parcae_model::{
    Batch, Dataset, Gpt, OpSet, OptimizerConfig, Pipeline, PipelineModel, Sampler, StageConfig,
    SyntheticTask, TokenDtype, TokenFileDataset, median, token_batch,
};
use parcae_strategies::cost::profile::MemorySource;
use serde::Serialize;

use crate::config::{DeviceChoice, ModelPreset};
use crate::device_info::{Card, burn_device, peak_memory};
use crate::profile::model_name;

/// Most steps a bench runs.
const MAX_STEPS: u32 = 100_000;

/// Most samples per step or micro-batch.
const MAX_BATCH: u32 = 1 << 16;

/// Seed of the weights and the sample order.
const SEED: u64 = 0;

/// What `parcae-node train-bench` is asked to run.
#[derive(Debug, clap::Args)]
pub struct TrainBenchOptions {
    /// The device: cpu, cube-cpu, cuda or cuda:N.
    #[arg(long, env = "PARCAE_DEVICE", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Burn's balanced gradient checkpointing (`[device] gradient_checkpointing`): less memory
    /// held between the forward and the backward pass, some of it recomputed.
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// The model, as `[train] model` names it.
    #[arg(long, default_value = "gpt2-124m")]
    pub model: ModelPreset,
    /// The stage's operations: `native` (attention, layer norm, GELU and the head's loss with
    /// their own backward, where the device has them) or `reference` (Burn's composition).
    #[arg(long, default_value = "native")]
    pub ops: OpSet,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: u32,
    /// Samples per step (a multiple of the micro-batch: the step accumulates the gradients of
    /// its micro-batches).
    #[arg(long, default_value_t = 32)]
    pub global_batch: u32,
    /// Steps trained; the first is the cold start, the rest give the warm median.
    #[arg(long, default_value_t = 30)]
    pub steps: u32,
    /// Tokens per sample (the model's own sequence length without it).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// A token file of little-endian u16 ids (`parcae-node prepare-data`); the synthetic task
    /// without it.
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// The device's peak FLOP/s, in TFLOP/s, that MFU is measured against (e.g. an H100 SXM's
    /// dense TF32: 494.7); no MFU without it.
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Where to write the report (JSON).
    #[arg(long, env = "PARCAE_OUT")]
    pub out: PathBuf,
}

/// What a bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBench {
    /// The model.
    pub model: String,
    /// Its trainable parameters.
    pub params: u64,
    /// The device.
    pub device: String,
    /// Number format of weights and compute.
    pub precision: String,
    /// Whether Burn's gradient checkpointing recomputed activations.
    pub gradient_checkpointing: bool,
    /// The stage's operations (`native` or `reference`).
    pub ops: String,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Samples per step.
    pub global_batch: u32,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Steps trained.
    pub steps: u32,
    /// The data: a token file's path or `synthetic`.
    pub data: String,
    /// From the command's start to the end of the first step, seconds.
    pub cold_start_s: f64,
    /// The first step alone, seconds.
    pub first_step_s: f64,
    /// The median of the steps after the first, seconds.
    pub warm_step_s: f64,
    /// Tokens trained per second at the warm median.
    pub tokens_per_s: f64,
    /// `6 x params x tokens_per_s` over the named peak.
    pub mfu: Option<f64>,
    /// The peak MFU is measured against, TFLOP/s.
    pub peak_tflops: Option<f64>,
    /// The most memory held, bytes.
    pub peak_memory_bytes: u64,
    /// Where that was read.
    pub peak_memory_source: MemorySource,
    /// Every step's mean loss.
    pub losses: Vec<f32>,
    /// Every step's time, seconds.
    pub step_s: Vec<f64>,
}

impl TrainBenchOptions {
    fn check(&self) -> anyhow::Result<()> {
        if !(2..=MAX_STEPS).contains(&self.steps) {
            bail!(
                "--steps must be 2 to {MAX_STEPS} (a cold step and warm ones), got {}",
                self.steps
            );
        }
        if !(1..=MAX_BATCH).contains(&self.micro_batch)
            || !(1..=MAX_BATCH).contains(&self.global_batch)
            || !self.global_batch.is_multiple_of(self.micro_batch)
        {
            bail!(
                "--global-batch {} must be a multiple of --micro-batch {} (both 1 to {MAX_BATCH})",
                self.global_batch,
                self.micro_batch
            );
        }
        if let Some(p) = self.peak_tflops.filter(|p| !(p.is_finite() && *p > 0.0)) {
            bail!("--peak-tflops must be a positive number, got {p}");
        }
        Ok(())
    }
}

/// GPT-2's AdamW settings at the full learning rate from the first step (a warm-up would leave a
/// short bench nothing to learn), decaying over the bench's steps; the optimizer's operations
/// as the model's.
fn stage_config(steps: u32, ops: OpSet) -> StageConfig {
    StageConfig {
        ops,
        optimizer: OptimizerConfig {
            warmup_steps: 0,
            total_steps: u64::from(steps),
            ..OptimizerConfig::default()
        },
        ..StageConfig::default()
    }
}

/// Trains the model for `opts.steps` steps and writes the report to `opts.out`.
pub fn train_bench(opts: &TrainBenchOptions) -> anyhow::Result<TrainBench> {
    let started = Instant::now();
    opts.check()?;
    let device = burn_device(opts.device, opts.gradient_checkpointing)?;
    let card = Card::of(opts.device)?;
    let mut gpt = opts.model.gpt();
    gpt.ops = opts.ops;
    if let Some(seq_len) = opts.seq_len {
        gpt.seq_len = seq_len;
    }
    let (data, data_name): (Arc<dyn Dataset>, String) = match &opts.tokens {
        Some(path) => (
            Arc::new(
                TokenFileDataset::open(path, TokenDtype::U16, gpt.seq_len, gpt.vocab_size)
                    .with_context(|| format!("--tokens {}", path.display()))?,
            ),
            path.display().to_string(),
        ),
        None => (
            Arc::new(SyntheticTask::default_for(
                SEED,
                gpt.vocab_size,
                gpt.seq_len,
            )?),
            "synthetic".into(),
        ),
    };
    let sampler = Sampler::new(SEED, data.len())?;
    let model = Arc::new(Gpt::new(gpt.clone()).context("model")?);
    let n = model.num_layers();
    let params = model.num_params() as u64;
    let whole = 0..n;
    let stages = std::slice::from_ref(&whole);
    let mut pipeline = Pipeline::new(
        model,
        stages,
        SEED,
        &device,
        stage_config(opts.steps, opts.ops),
    )?;
    let (mb, per_step) = (opts.micro_batch, opts.global_batch / opts.micro_batch);
    let (mut losses, mut step_s) = (Vec::new(), Vec::new());
    let mut cold_start_s = 0.0;
    for step in 0..u64::from(opts.steps) {
        let first = step * u64::from(opts.global_batch);
        let batches = (0..u64::from(per_step))
            .map(|k| {
                token_batch(
                    data.as_ref(),
                    &sampler,
                    first + k * u64::from(mb),
                    mb as usize,
                    &device,
                )
            })
            .collect::<Result<Vec<Batch>, _>>()?;
        let t = Instant::now();
        // The loss is read back, so the step's device work is done when it returns.
        losses.push(pipeline.train_step(&batches)?);
        step_s.push(t.elapsed().as_secs_f64());
        if step == 0 {
            cold_start_s = started.elapsed().as_secs_f64();
        }
    }
    let warm_step_s = median(step_s[1..].to_vec());
    let tokens_per_s = f64::from(opts.global_batch) * gpt.seq_len as f64 / warm_step_s;
    let (peak_memory_bytes, peak_memory_source) = peak_memory(&device)?;
    let report = TrainBench {
        model: model_name(opts.model),
        params,
        device: card.name,
        precision: "f32".into(),
        gradient_checkpointing: opts.gradient_checkpointing,
        ops: opts.ops.name().into(),
        micro_batch: mb,
        global_batch: opts.global_batch,
        seq_len: gpt.seq_len,
        steps: opts.steps,
        data: data_name,
        cold_start_s,
        first_step_s: step_s[0],
        warm_step_s,
        tokens_per_s,
        mfu: opts
            .peak_tflops
            .map(|peak| 6.0 * params as f64 * tokens_per_s / (peak * 1e12)),
        peak_tflops: opts.peak_tflops,
        peak_memory_bytes,
        peak_memory_source,
        losses,
        step_s,
    };
    crate::data_dir::write_report(&opts.out, &report)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(out: PathBuf) -> TrainBenchOptions {
        TrainBenchOptions {
            device: "cpu".parse().unwrap(),
            gradient_checkpointing: false,
            model: ModelPreset::Tiny,
            ops: OpSet::Native,
            micro_batch: 4,
            global_batch: 8,
            steps: 6,
            seq_len: None,
            tokens: None,
            peak_tflops: Some(1.0),
            out,
        }
    }

    #[test]
    fn a_tiny_model_trains_and_its_speed_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("train.json");
        let r = train_bench(&tiny(out.clone())).unwrap();
        assert_eq!((r.params, r.seq_len, r.steps), (30_080, 16, 6));
        assert_eq!(r.losses.len(), 6);
        assert!(r.losses[5] < r.losses[0], "the loss falls: {:?}", r.losses);
        let want = 8.0 * 16.0 / r.warm_step_s;
        assert!((r.tokens_per_s - want).abs() < 1e-6 * want);
        let mfu = r.mfu.unwrap();
        assert!((mfu - 6.0 * 30_080.0 * r.tokens_per_s / 1e12).abs() < 1e-12);
        assert!(r.cold_start_s >= r.first_step_s);
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(written["model"], "tiny");
        assert_eq!(written["peak_memory_source"], "process_rss");
    }

    #[test]
    fn gradient_checkpointing_trains_the_same_losses() {
        let dir = tempfile::tempdir().unwrap();
        let kept = train_bench(&tiny(dir.path().join("kept.json"))).unwrap();
        let mut opts = tiny(dir.path().join("recomputed.json"));
        opts.gradient_checkpointing = true;
        let recomputed = train_bench(&opts).unwrap();
        assert!(recomputed.gradient_checkpointing && !kept.gradient_checkpointing);
        for (a, b) in kept.losses.iter().zip(&recomputed.losses) {
            assert!(
                (a - b).abs() <= 1e-6,
                "{:?} vs {:?}",
                kept.losses,
                recomputed.losses
            );
        }
    }

    #[test]
    fn native_and_reference_operations_train_the_same_losses() {
        let dir = tempfile::tempdir().unwrap();
        let native = train_bench(&tiny(dir.path().join("native.json"))).unwrap();
        let mut opts = tiny(dir.path().join("reference.json"));
        opts.ops = OpSet::Reference;
        let reference = train_bench(&opts).unwrap();
        assert_eq!(
            (native.ops.as_str(), reference.ops.as_str()),
            ("native", "reference")
        );
        for (a, b) in native.losses.iter().zip(&reference.losses) {
            assert!(
                (a - b).abs() <= 1e-4,
                "{:?} vs {:?}",
                native.losses,
                reference.losses
            );
        }
    }

    #[test]
    fn bad_options_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let refused = |edit: &dyn Fn(&mut TrainBenchOptions)| {
            let mut o = tiny(dir.path().join("t.json"));
            edit(&mut o);
            train_bench(&o).unwrap_err().to_string()
        };
        assert!(refused(&|o| o.steps = 1).contains("--steps"));
        assert!(refused(&|o| o.global_batch = 6).contains("multiple of --micro-batch"));
        assert!(refused(&|o| o.peak_tflops = Some(-1.0)).contains("--peak-tflops"));
        let missing = dir.path().join("none.u16");
        assert!(refused(&|o| o.tokens = Some(missing.clone())).contains("none.u16"));
    }
}
