//! A device profile: what `parcae-node profile` measured of one model on one card — per-layer
//! forward, backward and optimizer times of a micro-batch (medians after warm-up), the bytes of
//! parameters, gradients, optimizer state and activations, the device's peak memory and what
//! building a stage takes — as a JSON file the cost models read. The planner plans from it
//! (`[planner] profile`), and an emulated cluster is paced to it (`--emulate PROFILE.json`), so
//! the profile of one real card drives an emulated cluster of that card.
//!
//! A profile measures a card, not a network: links are Parcae's 10 Gb/s curve, as for the
//! built-in models, and a restart is Parcae's GPT restart with the profiled stage build.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::analytic::Hardware;
use super::builtin::{MODELS, builtin, per_block_restart};
use super::spec::{Family, LayerCost, ModelSpec};

/// The format tag every profile file carries.
pub const FORMAT: &str = "parcae-profile/1";

/// Most layers a profile may list.
pub const MAX_LAYERS: usize = 4096;

/// Largest profile file read, bytes (a 4096-layer profile is well under 2 MiB).
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Longest name (model, device, layer, precision) a profile may carry.
const MAX_NAME: usize = 128;

const MIB: f64 = 1024.0 * 1024.0;

/// Bytes a parameter takes on the device while training: f32 weight and gradient, two f32 AdamW
/// moments.
const TRAINING_BYTES_PER_PARAM: f64 = 16.0;

/// Why a profile cannot be used; each names the file or field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// Neither a built-in model nor a profile file.
    #[error(
        "unknown profile {0:?}: expected a built-in model ({known}) or a profile file (*.json) \
         written by `parcae-node profile`",
        known = MODELS.join(", ")
    )]
    Unknown(String),
    /// The file cannot be read (or is too large to be a profile).
    #[error("profile {path}: {problem}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        problem: String,
    },
    /// The text is not a profile, or a value in it is out of range.
    #[error("profile {source_name}: {problem}")]
    Invalid {
        /// Where the text came from.
        source_name: String,
        /// The field and what is wrong with it.
        problem: String,
    },
}

/// Where a profile's peak memory was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// The device allocator's reserved bytes (CUDA): what the card had to hold.
    DevicePool,
    /// The process's peak resident set (a CPU device, whose allocator reports nothing).
    ProcessRss,
}

/// What building a stage's module takes on the device (weights initialised and moved there):
/// the embedding and head once, each transformer block on top.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageBuild {
    /// Embedding plus head, ms.
    pub base_ms: f64,
    /// One transformer block, ms.
    pub per_block_ms: f64,
}

/// One layer of the model as measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfiledLayer {
    /// The layer's name (`embedding`, `block 1`, `head`).
    pub name: String,
    /// Forward of one micro-batch, ms.
    pub forward_ms: f64,
    /// Backward of one micro-batch, ms.
    pub backward_ms: f64,
    /// The optimizer step of the layer's parameters, ms.
    pub optimizer_ms: f64,
    /// Trainable scalars.
    pub params: u64,
    /// Bytes of the parameters.
    pub param_bytes: u64,
    /// Bytes of their gradients.
    pub grad_bytes: u64,
    /// Bytes of the optimizer's state for them.
    pub optimizer_state_bytes: u64,
    /// Bytes of the layer's output for one micro-batch (what a stage boundary after it sends).
    pub output_bytes: u64,
    /// Device bytes the layer's forward keeps for its backward, where the device reports its
    /// allocations (`None` on a CPU: the output stands in for it).
    pub activation_bytes: Option<u64>,
}

/// A model measured on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// [`FORMAT`].
    pub format: String,
    /// The model (`gpt2-124m`).
    pub model: String,
    /// The device as the profiler named it (`cuda:0 NVIDIA H100 80GB HBM3`, `cpu`).
    pub device: String,
    /// Number format of weights and compute (`f32`).
    pub precision: String,
    /// Samples per measured micro-batch.
    pub micro_batch: u32,
    /// Tokens per sample.
    pub seq_len: u32,
    /// Samples per step of the job the profile plans and emulates.
    pub global_batch: u32,
    /// Runs discarded before measuring (kernel compilation, autotuning).
    pub warmup: u32,
    /// Runs measured; each time is their median.
    pub repeats: u32,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_unix_s: u64,
    /// Usable memory of the device, MiB.
    pub memory_mb: f64,
    /// The most memory the measurement held, bytes.
    pub peak_memory_bytes: u64,
    /// Where [`Self::peak_memory_bytes`] was read.
    pub peak_memory_source: MemorySource,
    /// Building a stage.
    pub build: StageBuild,
    /// Embedding, blocks, head.
    pub layers: Vec<ProfiledLayer>,
}

/// A model to emulate and the device it runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Emulated {
    /// The model's layers, batch, depths and restarts.
    pub spec: ModelSpec,
    /// The device's memory and the all-reduce link.
    pub hardware: Hardware,
}

/// The model and device `profile` names: a built-in model on Parcae's V100s, or the profile
/// file at that path (a name ending in `.json`).
pub fn emulated(profile: &str) -> Result<Emulated, ProfileError> {
    if let Some((spec, _)) = builtin(profile) {
        return Ok(Emulated {
            spec,
            hardware: Hardware::default(),
        });
    }
    if !profile.ends_with(".json") {
        return Err(ProfileError::Unknown(profile.into()));
    }
    let p = DeviceProfile::load(Path::new(profile))?;
    Ok(Emulated {
        spec: p.spec(),
        hardware: p.hardware(),
    })
}

impl DeviceProfile {
    /// Reads and checks the profile file at `path`.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let read = |problem: String| ProfileError::Read {
            path: path.display().to_string(),
            problem,
        };
        let len = std::fs::metadata(path)
            .map_err(|e| read(e.to_string()))?
            .len();
        if len > MAX_FILE_BYTES {
            return Err(read(format!(
                "{len} bytes is more than a profile's {MAX_FILE_BYTES}"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a profile's JSON; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, ProfileError> {
        let invalid = |problem: String| ProfileError::Invalid {
            source_name: source.into(),
            problem,
        };
        let p: Self = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        p.check().map_err(invalid)?;
        Ok(p)
    }

    fn check(&self) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!(
                "format: expected {FORMAT:?}, got {:?}",
                self.format
            ));
        }
        for (field, name) in [
            ("model", &self.model),
            ("device", &self.device),
            ("precision", &self.precision),
        ] {
            check_name(field, name)?;
        }
        if self.micro_batch == 0 || self.seq_len == 0 || self.repeats == 0 {
            return Err("micro_batch, seq_len and repeats must be at least 1".into());
        }
        if self.global_batch < self.micro_batch {
            return Err(format!(
                "global_batch: {} is smaller than micro_batch {}",
                self.global_batch, self.micro_batch
            ));
        }
        if !(self.memory_mb.is_finite() && self.memory_mb > 0.0) {
            return Err(format!(
                "memory_mb: must be a positive number, got {}",
                self.memory_mb
            ));
        }
        check_ms("build.base_ms", self.build.base_ms)?;
        check_ms("build.per_block_ms", self.build.per_block_ms)?;
        if !(3..=MAX_LAYERS).contains(&self.layers.len()) {
            return Err(format!(
                "layers: a profile lists an embedding, at least one block and a head, at most \
                 {MAX_LAYERS} layers; got {}",
                self.layers.len()
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            let at = |field: &str| format!("layers[{i}].{field}");
            check_name(&at("name"), &l.name)?;
            check_ms(&at("forward_ms"), l.forward_ms)?;
            check_ms(&at("backward_ms"), l.backward_ms)?;
            check_ms(&at("optimizer_ms"), l.optimizer_ms)?;
        }
        Ok(())
    }

    /// Transformer blocks: the layers less embedding and head.
    pub fn blocks(&self) -> usize {
        self.layers.len().saturating_sub(2)
    }

    /// The device's memory and Parcae's 10 Gb/s all-reduce link.
    pub fn hardware(&self) -> Hardware {
        Hardware {
            memory_mb: self.memory_mb,
            ..Hardware::default()
        }
    }

    /// The shallowest pipeline whose every stage holds its weights, gradients and AdamW moments
    /// and, under 1F1B, the activations of its micro-batches in flight (stage `s` of `p` holds
    /// `p - s`), within the device's memory; `None` when even one layer per stage does not fit.
    pub fn min_depth(&self) -> Option<u32> {
        let budget = self.memory_mb * MIB;
        (1..=self.layers.len()).find_map(|p| {
            let bounds = super::spec::partition(self.layers.len(), p);
            let fits = bounds.windows(2).enumerate().all(|(s, w)| {
                let layers = &self.layers[w[0]..w[1]];
                let params: f64 = layers.iter().map(|l| l.params as f64).sum();
                let acts: f64 = layers.iter().map(ProfiledLayer::kept_bytes).sum();
                params * TRAINING_BYTES_PER_PARAM + acts * (p - s) as f64 <= budget
            });
            fits.then_some(p as u32)
        })
    }

    /// The cost models' view of the profile: its layers at the profiled micro-batch, the depths
    /// that fit the device, the activation between stages (the largest output of a layer that
    /// is not the head, whose logits never cross a boundary) and Parcae's GPT restart with the
    /// profiled stage build.
    pub fn spec(&self) -> ModelSpec {
        let n = self.layers.len() as u32;
        let min_depth = self.min_depth().unwrap_or(n);
        let boundary_bytes = self.layers[..self.layers.len().saturating_sub(1)]
            .iter()
            .map(|l| l.output_bytes as f64)
            .fold(0.0, f64::max);
        ModelSpec {
            name: self.model.clone(),
            family: Family::Transformer,
            layers: self.layers.iter().map(ProfiledLayer::cost).collect(),
            optimizer_states: 2,
            global_batch: self.global_batch,
            micro_batch: self.micro_batch,
            boundary_bytes,
            depths: (min_depth..=n).collect(),
            min_d: 1,
            restart: per_block_restart(
                self.build.base_ms,
                self.build.per_block_ms,
                self.blocks() as u32,
            ),
        }
    }
}

impl ProfiledLayer {
    /// Bytes the layer keeps for its backward: measured on the device, else its output.
    fn kept_bytes(&self) -> f64 {
        self.activation_bytes.unwrap_or(self.output_bytes) as f64
    }

    /// The layer as the cost models price it.
    pub fn cost(&self) -> LayerCost {
        LayerCost {
            forward_ms: self.forward_ms,
            backward_ms: self.backward_ms,
            optimizer_ms: self.optimizer_ms,
            activation_mb: self.kept_bytes() / MIB,
            params: self.params as f64,
        }
    }
}

fn check_ms(field: &str, ms: f64) -> Result<(), String> {
    if ms.is_finite() && ms >= 0.0 {
        Ok(())
    } else {
        Err(format!(
            "{field}: must be a finite number of ms >= 0, got {ms}"
        ))
    }
}

fn check_name(field: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(format!(
            "{field}: must be 1 to {MAX_NAME} printable characters, got {name:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
