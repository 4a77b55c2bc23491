//! `parcae-node export`: the model a cluster's checkpoints describe, as one safetensors file
//! under Hugging Face GPT-2's names, for `transformers`, numpy or a later `[train] init`.
//!
//! Checkpoints are per stage (`ckpt-STEP-FIRST-END.state` in a node's data directory); the
//! export takes the newest step whose stage checkpoints, from any of the directories given,
//! cover every layer, and verifies each part's checksums and model fingerprint on import. From
//! a job's durable store (`--store`, [`crate::store`]) it takes the newest complete stored cut,
//! each part checked against the SHA-256 raft committed for it.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use burn::tensor::{Int, Tensor, TensorData};
use parcae_model::{
    Activation, Gpt, GptConfig, LayerWeights, PipelineModel, Stage, StageConfig,
    write_gpt2_safetensors,
};
use sha2::{Digest, Sha256};

use crate::checkpoint::CheckpointStore;
use crate::config::{DeviceChoice, NodeConfig};
use crate::data_dir::CHECKPOINTS;
use crate::device_info::burn_device;
use crate::store::JobStore;

/// The file formats `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// safetensors, f32, Hugging Face GPT-2 tensor names.
    Safetensors,
}

/// What `parcae-node export` is asked to do.
#[derive(Debug, clap::Args)]
pub struct ExportOptions {
    /// The nodes' TOML configuration (the model's `[train]` sizes); the defaults without it.
    #[arg(long, env = "PARCAE_CONFIG")]
    pub config: Option<PathBuf>,
    /// A node's data directory or a directory of its checkpoints (repeatable: the stages of
    /// one step may be spread over several nodes).
    #[arg(long = "checkpoints", required_unless_present = "store")]
    pub checkpoints: Vec<PathBuf>,
    /// The job's checkpoint store instead (a directory, or an `s3://`, `gs://`, `az://` URL
    /// with credentials from the environment).
    #[arg(long, conflicts_with = "checkpoints")]
    pub store: Option<String>,
    /// The job in the store (a prefix of its directory name), when it holds several.
    #[arg(long, requires = "store")]
    pub job: Option<String>,
    /// The step to export (the number of steps the checkpoint had taken); default: the newest
    /// step the checkpoints cover whole.
    #[arg(long)]
    pub step: Option<u64>,
    /// The file format.
    #[arg(long, value_enum, default_value = "safetensors")]
    pub format: ExportFormat,
    /// Where to write the file.
    #[arg(long)]
    pub out: PathBuf,
    /// The device the checkpoints are loaded on and the logits computed on: cpu, cuda or
    /// cuda:N.
    #[arg(long, env = "PARCAE_DEVICE", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Token ids (comma-separated) whose logits the exported model computes on `--device`
    /// and writes to `--logits-out`: what another reader of the file (transformers, numpy)
    /// must reproduce.
    #[arg(long, value_delimiter = ',', requires = "logits_out")]
    pub logits_tokens: Vec<i64>,
    /// Where to write those logits: positions x vocabulary, f32 little-endian.
    #[arg(long, requires = "logits_tokens")]
    pub logits_out: Option<PathBuf>,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// Steps the exported model had taken.
    pub step: u64,
    /// The stage checkpoints it came from, by layer range.
    pub parts: Vec<Range<usize>>,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}

/// The stage ranges of the newest step (or `step`) at which `found` (checkpoints as `(steps,
/// layers)`) has a set of ranges that covers `0..layers` end to end.
pub fn pick_cut(
    found: &[(u64, Range<usize>)],
    layers: usize,
    step: Option<u64>,
) -> Result<(u64, Vec<Range<usize>>), String> {
    let steps: BTreeSet<u64> = found.iter().map(|(s, _)| *s).collect();
    let candidates: Vec<u64> = match step {
        Some(s) => vec![s],
        None => steps.iter().rev().copied().collect(),
    };
    for s in candidates {
        let ranges: BTreeSet<(usize, usize)> = found
            .iter()
            .filter(|(k, _)| *k == s)
            .map(|(_, r)| (r.start, r.end))
            .collect();
        if let Some(chain) = chain_from(0, layers, &ranges) {
            return Ok((s, chain));
        }
    }
    Err(match step {
        Some(s) => format!("the checkpoints of step {s} do not cover layers 0..{layers}"),
        None if steps.is_empty() => "no checkpoint files found".into(),
        None => format!(
            "no step's checkpoints cover layers 0..{layers} (steps found: {:?})",
            steps
        ),
    })
}

/// Ranges from `ranges` that follow each other from `start` to `end`.
fn chain_from(
    start: usize,
    end: usize,
    ranges: &BTreeSet<(usize, usize)>,
) -> Option<Vec<Range<usize>>> {
    if start == end {
        return Some(Vec::new());
    }
    ranges
        .iter()
        .filter(|(a, b)| *a == start && *b > start && *b <= end)
        .find_map(|&(a, b)| {
            let mut rest = chain_from(b, end, ranges)?;
            rest.insert(0, a..b);
            Some(rest)
        })
}

/// A node's checkpoint directory: `dir/checkpoints` for a data directory, else `dir`.
fn checkpoint_dir(dir: &Path) -> PathBuf {
    let inner = dir.join(CHECKPOINTS);
    if inner.is_dir() {
        inner
    } else {
        dir.to_path_buf()
    }
}

/// Steps taken, and each stage checkpoint's layers and bytes.
type StepParts = (u64, Vec<(Range<usize>, Vec<u8>)>);

/// The parts of the newest complete cut in the job's store at `location` (or the one after
/// `step` steps), each checked against its committed digest.
fn from_store(location: &str, job: Option<&str>, step: Option<u64>) -> anyhow::Result<StepParts> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = JobStore::open_existing(location, job).await?;
        let cut = store.stored_cut(step).await?.with_context(|| match step {
            Some(s) => format!("no complete checkpoint after {s} steps in {location}"),
            None => format!("no complete checkpoint in {location}"),
        })?;
        let steps = cut.steps_trained();
        let mut parts = Vec::with_capacity(cut.parts.len());
        for part in &cut.parts {
            let range = part.layers.start as usize..part.layers.end as usize;
            let bytes = store.get_verified_part(steps, part, MAX_PART_BYTES).await?;
            parts.push((range, bytes));
        }
        Ok((steps, parts))
    })
}

/// The largest stage part read from a store (a 1.5B-parameter model's state is about 18 GB).
const MAX_PART_BYTES: u64 = 64 << 30;

/// The parts of the newest step (or `step`) the checkpoint directories cover end to end.
fn from_directories(
    dirs: &[PathBuf],
    layers: usize,
    step: Option<u64>,
) -> anyhow::Result<StepParts> {
    let stores: Vec<CheckpointStore> = dirs
        .iter()
        .map(|d| {
            if !d.is_dir() {
                bail!("--checkpoints {}: not a directory", d.display());
            }
            Ok(CheckpointStore::new(checkpoint_dir(d)))
        })
        .collect::<anyhow::Result<_>>()?;
    let found: Vec<(u64, Range<usize>)> = stores.iter().flat_map(|s| s.list()).collect();
    let (step, ranges) = pick_cut(&found, layers, step).map_err(anyhow::Error::msg)?;
    let parts = ranges
        .into_iter()
        .map(|range| {
            let bytes = stores
                .iter()
                .find_map(|s| s.load(step, &range).ok())
                .with_context(|| format!("checkpoint of layers {range:?} at step {step}"))?;
            Ok((range, bytes))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((step, parts))
}

/// Writes the model of the chosen step to `opts.out`.
pub fn export(opts: &ExportOptions) -> anyhow::Result<Exported> {
    let config = match &opts.config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    let gpt = config.model();
    let model = Arc::new(Gpt::new(gpt.clone())?);
    let (step, parts) = match &opts.store {
        Some(location) => from_store(location, opts.job.as_deref(), opts.step)?,
        None => from_directories(&opts.checkpoints, model.num_layers(), opts.step)?,
    };
    let device = burn_device(opts.device, false)?;
    let mut layers = Vec::with_capacity(model.num_layers());
    let mut stages = Vec::with_capacity(parts.len());
    for (range, bytes) in &parts {
        let mut stage = Stage::new(
            model.clone(),
            range.clone(),
            0,
            &device,
            StageConfig::default(),
        )?;
        stage
            .import_state(bytes, range.clone())
            .with_context(|| format!("checkpoint of layers {range:?} at step {step}"))?;
        for layer in range.clone() {
            layers.push(LayerWeights {
                layer,
                infos: stage.param_infos(layer).unwrap_or_default().to_vec(),
                values: stage.param_values(layer)?,
            });
        }
        stages.push(stage);
    }
    match opts.format {
        ExportFormat::Safetensors => write_gpt2_safetensors(&gpt, &layers, &opts.out)?,
    }
    if let Some(path) = &opts.logits_out {
        let logits = logits(&stages, &gpt, &opts.logits_tokens)?;
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| path.display().to_string())?;
    }
    let written = std::fs::read(&opts.out).with_context(|| opts.out.display().to_string())?;
    Ok(Exported {
        step,
        parts: parts.into_iter().map(|(range, _)| range).collect(),
        sha256: hex::encode(Sha256::digest(&written)),
    })
}

/// The logits of `tokens` (one sequence) through `stages` in order, positions x vocabulary.
fn logits(stages: &[Stage<Gpt>], gpt: &GptConfig, tokens: &[i64]) -> anyhow::Result<Vec<f32>> {
    if tokens.is_empty() || tokens.len() > gpt.seq_len {
        bail!(
            "--logits-tokens: {} tokens, the model reads 1 to {}",
            tokens.len(),
            gpt.seq_len
        );
    }
    if let Some(t) = tokens
        .iter()
        .find(|&&t| !(0..gpt.vocab_size as i64).contains(&t))
    {
        bail!(
            "--logits-tokens: token {t} is outside the vocabulary (0..{})",
            gpt.vocab_size
        );
    }
    let Some(first) = stages.first() else {
        bail!("no stage to compute logits with");
    };
    let input = Tensor::<2, Int>::from_data(
        TensorData::new(tokens.to_vec(), [1, tokens.len()]),
        first.device(),
    );
    let mut x = Activation::Tokens(input);
    for stage in stages {
        x = stage.infer(x)?;
    }
    let logits = x.into_hidden("logits")?.try_into_data();
    Ok(logits
        .map_err(|e| anyhow::anyhow!("reading the logits back from the device: {e}"))?
        .try_to_vec::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_of_tokens_the_model_cannot_read_are_refused_by_name() {
        let gpt = GptConfig::tiny();
        let model = Arc::new(Gpt::new(gpt.clone()).unwrap());
        let device = burn::tensor::Device::flex();
        let whole = 0..model.num_layers();
        let stage = Stage::new(model, whole, 0, &device, StageConfig::default()).unwrap();
        let stages = [stage];
        let err = |tokens: &[i64]| logits(&stages, &gpt, tokens).unwrap_err().to_string();
        assert!(err(&[1, 64]).contains("token 64 is outside the vocabulary (0..64)"));
        assert!(err(&[-1]).contains("token -1 is outside"));
        assert!(err(&[]).contains("0 tokens, the model reads 1 to 16"));
        assert!(err(&[1; 17]).contains("17 tokens"));
        let values = logits(&stages, &gpt, &[1, 2, 3]).unwrap();
        assert_eq!(values.len(), 3 * gpt.vocab_size);
        assert!(values.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn the_newest_step_covered_end_to_end_is_chosen() {
        let found = vec![
            (20, 0..2),
            (20, 2..5),
            (30, 0..3),
            (30, 0..2),
            (30, 3..5),
            (40, 0..2),
        ];
        assert_eq!(pick_cut(&found, 5, None), Ok((30, vec![0..3, 3..5])));
        assert_eq!(pick_cut(&found, 5, Some(20)), Ok((20, vec![0..2, 2..5])));
        assert!(
            pick_cut(&found, 5, Some(40))
                .unwrap_err()
                .contains("step 40")
        );
        assert!(
            pick_cut(&[], 5, None)
                .unwrap_err()
                .contains("no checkpoint")
        );
        assert!(pick_cut(&[(1, 0..4)], 5, None).is_err());
    }
}
