//! `parcae-node profile`: measures a model on this machine's device, as Parcae profiles a model
//! before planning it — every layer's forward, backward and optimizer step on one micro-batch
//! (medians after warm-up runs that compile and autotune the kernels), the bytes of
//! parameters, gradients, optimizer state and activations, the device's peak memory and what
//! building a stage takes — and writes a profile file (`parcae_strategies::cost::profile`) that
//! the planner plans from (`[planner] profile`) and an emulated cluster is paced to
//! (`parcae-testnet --emulate PROFILE.json`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use parcae_model::{
    Dataset, Gpt, LayerCost, PipelineModel, Runs, Sampler, Stage, StageConfig, SyntheticTask,
    median, token_batch,
};
use parcae_strategies::cost::profile::{DeviceProfile, FORMAT, ProfiledLayer, StageBuild};

use crate::config::{DeviceChoice, ModelPreset};
use crate::device_info::{Card, burn_device, peak_memory};

/// Most samples a profiled micro-batch may hold.
const MAX_MICRO_BATCH: u32 = 4096;

/// Most warm-up or measured runs.
const MAX_RUNS: usize = 1000;

/// Seed of the profiled model's weights and probe batch (the times do not depend on it).
const SEED: u64 = 0;

/// Runs of each stage build: one to warm up, three measured.
const BUILD_RUNS: Runs = Runs {
    warmup: 1,
    repeats: 3,
};

/// What `parcae-node profile` is asked to measure.
#[derive(Debug, clap::Args)]
pub struct ProfileOptions {
    /// The device: cpu, cube-cpu, cuda or cuda:N.
    #[arg(long, env = "PARCAE_DEVICE", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Burn's balanced gradient checkpointing (`[device] gradient_checkpointing`): less memory
    /// held between the forward and the backward pass, some of it recomputed.
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// The model, as `[train] model` names it (tiny, small, gpt2-124m, gpt2-355m, ...).
    #[arg(long, default_value = "gpt2-124m")]
    pub model: ModelPreset,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u32,
    /// Tokens per sample (the model's own sequence length without it).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Samples per step of the job the profile is planned and emulated with.
    #[arg(long, default_value_t = 128)]
    pub global_batch: u32,
    /// Runs discarded before measuring (kernel compilation and autotuning happen in them).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Runs measured; each time is their median.
    #[arg(long, default_value_t = 10)]
    pub repeats: usize,
    /// Usable memory of the device, MiB (read from nvidia-smi or /proc/meminfo without it).
    #[arg(long)]
    pub memory_mb: Option<f64>,
    /// Where to write the profile (JSON).
    #[arg(long, env = "PARCAE_OUT")]
    pub out: PathBuf,
}

impl ProfileOptions {
    fn check(&self) -> anyhow::Result<()> {
        if !(1..=MAX_MICRO_BATCH).contains(&self.micro_batch) {
            bail!(
                "--micro-batch must be 1 to {MAX_MICRO_BATCH}, got {}",
                self.micro_batch
            );
        }
        if self.global_batch < self.micro_batch {
            bail!(
                "--global-batch {} is smaller than --micro-batch {}",
                self.global_batch,
                self.micro_batch
            );
        }
        if !(1..=MAX_RUNS).contains(&self.repeats) || self.warmup > MAX_RUNS {
            bail!(
                "--repeats must be 1 to {MAX_RUNS} and --warmup at most {MAX_RUNS}, got {} and {}",
                self.repeats,
                self.warmup
            );
        }
        if let Some(mb) = self.memory_mb.filter(|mb| !(mb.is_finite() && *mb > 0.0)) {
            bail!("--memory-mb must be a positive number, got {mb}");
        }
        Ok(())
    }
}

/// Measures the model on the device and writes the profile to `opts.out`.
pub fn profile(opts: &ProfileOptions) -> anyhow::Result<DeviceProfile> {
    opts.check()?;
    let device = burn_device(opts.device, opts.gradient_checkpointing)?;
    let card = Card::of(opts.device)?;
    let mut gpt = opts.model.gpt();
    if let Some(seq_len) = opts.seq_len {
        gpt.seq_len = seq_len;
    }
    let seq_len = gpt.seq_len;
    let model = Arc::new(Gpt::new(gpt.clone()).context("model")?);
    let n = model.num_layers();
    let build_ms = |layers: Range<usize>| -> anyhow::Result<f64> {
        let mut times = Vec::with_capacity(BUILD_RUNS.repeats);
        for run in 0..BUILD_RUNS.warmup + BUILD_RUNS.repeats {
            let t = Instant::now();
            let _stage = Stage::new(
                model.clone(),
                layers.clone(),
                SEED,
                &device,
                StageConfig::default(),
            )?;
            device
                .sync()
                .map_err(|e| anyhow::anyhow!("device: {e:?}"))?;
            if run >= BUILD_RUNS.warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(median(times))
    };
    let build = StageBuild {
        base_ms: build_ms(0..1)? + build_ms(n - 1..n)?,
        per_block_ms: if n > 2 { build_ms(1..2)? } else { 0.0 },
    };
    let stage = Stage::new(model.clone(), 0..n, SEED, &device, StageConfig::default())?;
    let task = SyntheticTask::default_for(SEED, gpt.vocab_size, seq_len)?;
    let sampler = Sampler::new(SEED, task.len())?;
    let probe = token_batch(&task, &sampler, 0, opts.micro_batch as usize, &device)?;
    let runs = Runs {
        warmup: opts.warmup,
        repeats: opts.repeats,
    };
    let costs = stage
        .measure_layer_costs(probe.inputs, Some(&probe.targets), runs)
        .context("measuring the layers")?;
    let (peak_memory_bytes, peak_memory_source) = peak_memory(&device)?;
    let profile = DeviceProfile {
        format: FORMAT.into(),
        model: model_name(opts.model),
        device: card.name,
        precision: "f32".into(),
        micro_batch: opts.micro_batch,
        seq_len: seq_len as u32,
        global_batch: opts.global_batch,
        warmup: opts.warmup as u32,
        repeats: opts.repeats as u32,
        measured_unix_s: crate::clock::now_secs(),
        memory_mb: opts.memory_mb.unwrap_or(card.memory_mb),
        peak_memory_bytes,
        peak_memory_source,
        build,
        layers: costs.iter().map(profiled).collect(),
    };
    crate::data_dir::write_report(&opts.out, &profile)?;
    Ok(profile)
}

/// The preset as `[train] model` spells it.
pub(crate) fn model_name(preset: ModelPreset) -> String {
    serde_json::to_value(preset)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn profiled(c: &LayerCost) -> ProfiledLayer {
    ProfiledLayer {
        name: c.name.clone(),
        forward_ms: c.forward_ms,
        backward_ms: c.backward_ms,
        optimizer_ms: c.optimizer_ms,
        params: c.param_count as u64,
        param_bytes: c.param_bytes as u64,
        grad_bytes: c.param_bytes as u64,
        optimizer_state_bytes: c.optimizer_state_bytes as u64,
        output_bytes: c.output_bytes as u64,
        activation_bytes: c.activation_bytes.map(|b| b as u64),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;
    use crate::emulate::Emulation;

    /// Options profiling the tiny model on the CPU into `out`.
    pub(crate) fn tiny(out: &Path) -> ProfileOptions {
        ProfileOptions {
            device: "cpu".parse().unwrap(),
            gradient_checkpointing: false,
            model: ModelPreset::Tiny,
            micro_batch: 2,
            seq_len: None,
            global_batch: 16,
            warmup: 1,
            repeats: 3,
            memory_mb: None,
            out: out.to_path_buf(),
        }
    }

    #[test]
    fn a_tiny_model_profiles_into_a_file_the_emulator_paces_to() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("tiny.json");
        let written = profile(&tiny(&out)).unwrap();
        let p = DeviceProfile::load(&out).unwrap();
        // serde_json reads floats back to within a unit of the last place.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        assert!(close(p.build.per_block_ms, written.build.per_block_ms));
        for (read, measured) in p.layers.iter().zip(&written.layers) {
            assert!(close(read.backward_ms, measured.backward_ms));
            assert_eq!(read.params, measured.params);
        }
        let names: Vec<&str> = p.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["embedding", "block 1", "block 2", "head"]);
        let gpt = parcae_model::GptConfig::tiny();
        assert_eq!(p.seq_len as usize, gpt.seq_len);
        assert_eq!(p.layers.iter().map(|l| l.params).sum::<u64>(), 30_080);
        assert_eq!(
            p.layers[1].output_bytes as usize,
            2 * gpt.seq_len * gpt.d_model * 4
        );
        for l in &p.layers {
            assert!(l.forward_ms > 0.0 && l.backward_ms > 0.0 && l.optimizer_ms > 0.0);
            assert_eq!(l.grad_bytes, l.param_bytes);
            assert_eq!(l.optimizer_state_bytes, 2 * l.param_bytes);
            assert_eq!(l.activation_bytes, None, "Flex reports no allocations");
        }
        assert_eq!(
            p.peak_memory_source,
            parcae_strategies::cost::profile::MemorySource::ProcessRss
        );
        assert!(p.peak_memory_bytes > 1 << 20);
        assert!(p.memory_mb > 256.0, "{}", p.memory_mb);
        assert!(p.build.per_block_ms > 0.0);
        let e = Emulation::new(out.to_str().unwrap(), 2.0).unwrap();
        assert_eq!(e.layers(), 4);
        assert_eq!(e.memory_mb(), p.memory_mb);
        let block = e.stage(1..2, 4, 1).unwrap();
        let want = p.layers[1].forward_ms * 2.0 / 2.0;
        assert!(
            (block.forward.as_secs_f64() * 1e3 - want).abs() < 1e-3,
            "twice the profiled micro-batch at time scale 2: {:?} vs {want} ms",
            block.forward
        );
    }

    #[test]
    fn bad_options_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.json");
        let refused = |edit: &dyn Fn(&mut ProfileOptions)| {
            let mut o = tiny(&out);
            edit(&mut o);
            profile(&o).unwrap_err().to_string()
        };
        assert!(refused(&|o| o.micro_batch = 0).contains("--micro-batch"));
        assert!(refused(&|o| o.global_batch = 1).contains("--global-batch"));
        assert!(refused(&|o| o.repeats = 0).contains("--repeats"));
        assert!(refused(&|o| o.memory_mb = Some(f64::NAN)).contains("--memory-mb"));
        assert!(refused(&|o| o.out = dir.path().join("no/such/dir/p.json")).contains("writing"));
        assert!(!out.exists());
    }

    #[test]
    fn a_preset_is_named_as_the_configuration_names_it() {
        assert_eq!(model_name("gpt2-124m".parse().unwrap()), "gpt2-124m");
        assert_eq!(model_name(ModelPreset::Tiny), "tiny");
        assert!(
            "gpt5"
                .parse::<ModelPreset>()
                .unwrap_err()
                .contains("gpt2-355m")
        );
    }
}
