//! The `[device]` section: what a stage's work runs on.

use parcae_consensus::state::Capabilities;
use parcae_consensus::state::limits::MAX_LABEL_BYTES;
use serde::Deserialize;

use super::error::ConfigError;
use crate::emulate::Emulation;

/// Where a stage's work runs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// Burn's CPU backend, at its own speed.
    #[default]
    Cpu,
    /// An emulated GPU ([`crate::emulate`]): the model's layer structure is the profile's, the
    /// work runs on the CPU at a small width and is paced to the profiled GPU's times.
    Emulated,
    /// Burn's CUDA backend on GPU `index` (a build with the `cuda` feature).
    Cuda,
    /// Burn's Cube backend on this CPU, wgpu's Vulkan on Mesa's lavapipe (a build with the
    /// `cube-cpu` feature): the code a GPU runs, checked where there is none; slow.
    CubeCpu,
}

/// The `[device]` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// CPU, an emulated accelerator or a CUDA GPU.
    pub kind: DeviceKind,
    /// Which CUDA GPU (`cuda:index`), counted as the driver lists the visible ones.
    pub index: usize,
    /// The profiled model an emulated accelerator runs (a built-in of `parcae-strategies`).
    pub profile: String,
    /// Emulated durations are divided by this (2: the emulated cluster runs twice as fast).
    pub time_scale: f64,
    /// An emulated device this many times as fast as the profiled one at its layers' forward,
    /// backward and optimizer work (its links unchanged): a second device kind, derived.
    pub speed: f64,
    /// Burn's balanced gradient checkpointing: the backward pass recomputes the activations of
    /// cheap (memory-bound) ops instead of keeping them from the forward pass, for less memory
    /// at the cost of the recomputation; the arithmetic, and so the training, is the same.
    pub gradient_checkpointing: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Cpu,
            index: 0,
            profile: "gpt-1.5b".into(),
            time_scale: 1.0,
            speed: 1.0,
            gradient_checkpointing: false,
        }
    }
}

/// The one refusal of a CUDA device by a build without it.
const CUDA_NOT_BUILT: &str = "device kind \"cuda\" needs parcae-node built with the `cuda` \
     feature: `cargo build --release -p parcae-node --features cuda` (it links LLVM for cubecl; \
     see the README's GPUs section)";

/// The one refusal of the Cube CPU runtime by a build without it.
const CUBE_CPU_NOT_BUILT: &str = "device kind \"cube-cpu\" needs parcae-node built with the \
     `cube-cpu` feature: `scripts/setup-cube-cpu.sh`, then `cargo build --release -p parcae-node \
     --features cube-cpu` (docs/gpu.md)";

/// A device named on the command line (`--device`, `PARCAE_DEVICE`): `cpu`, `cube-cpu`, `cuda`
/// or `cuda:N`; it replaces the configuration file's kind and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceChoice {
    /// CPU or CUDA.
    pub kind: DeviceKind,
    /// The CUDA GPU (0 on the CPU).
    pub index: usize,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let choice = |kind, index| Ok(Self { kind, index });
        match s.trim() {
            "cpu" => choice(DeviceKind::Cpu, 0),
            "cube-cpu" => choice(DeviceKind::CubeCpu, 0),
            "cuda" => choice(DeviceKind::Cuda, 0),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(index)) => choice(DeviceKind::Cuda, index),
                _ => Err(format!(
                    "unknown device {other:?} (expected cpu, cube-cpu, cuda or cuda:N with N a \
                     GPU index)"
                )),
            },
        }
    }
}

impl DeviceConfig {
    /// The device's name in the membership: `cpu`, `cuda`, or `emulated:` and the profile (a
    /// built-in name, or a profile file's name), every character the membership does not take
    /// replaced by `_`, cut to its length.
    pub fn name(&self) -> String {
        let name = match self.kind {
            DeviceKind::Cpu => "cpu".to_owned(),
            DeviceKind::CubeCpu => "cube-cpu".to_owned(),
            DeviceKind::Cuda => "cuda".to_owned(),
            DeviceKind::Emulated => {
                let profile = std::path::Path::new(&self.profile)
                    .file_name()
                    .map_or(self.profile.clone(), |f| f.to_string_lossy().into_owned());
                if self.speed == 1.0 {
                    format!("emulated:{profile}")
                } else {
                    format!("emulated:{profile}:x{}", self.speed)
                }
            }
        };
        name.chars()
            .map(|c| if Capabilities::allows(c) { c } else { '_' })
            .take(MAX_LABEL_BYTES)
            .collect()
    }

    /// The command line's device in place of the file's.
    pub fn choose(&mut self, choice: DeviceChoice) {
        self.kind = choice.kind;
        self.index = choice.index;
    }

    /// How much faster than real time the device runs: the time scale of an emulated device
    /// (validated with the rest of the configuration), 1 on a real one.
    pub fn emulated_time_scale(&self) -> f64 {
        match self.kind {
            DeviceKind::Emulated => self.time_scale,
            DeviceKind::Cpu | DeviceKind::CubeCpu | DeviceKind::Cuda => 1.0,
        }
    }

    /// The emulation this section asks for (`None` on a real device).
    pub fn emulation(&self) -> Result<Option<Emulation>, ConfigError> {
        match self.kind {
            DeviceKind::Cpu | DeviceKind::CubeCpu | DeviceKind::Cuda => Ok(None),
            DeviceKind::Emulated => Emulation::new(&self.profile, self.time_scale)
                .and_then(|e| e.faster(self.speed))
                .map(Some)
                .map_err(|e| ConfigError::Invalid(format!("device: {e}"))),
        }
    }

    /// Usable memory of the section's device, MiB, where the node knows it (an emulated
    /// device's profile); 0 elsewhere, and the planner assumes its own device's.
    pub fn memory_mib(&self) -> u64 {
        match self.emulation() {
            Ok(Some(e)) => e.memory_mb().round() as u64,
            _ => 0,
        }
    }

    /// Whether this build can run the section's device.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kind == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return Err(ConfigError::Invalid(CUDA_NOT_BUILT.into()));
        }
        if self.kind == DeviceKind::CubeCpu && !cfg!(feature = "cube-cpu") {
            return Err(ConfigError::Invalid(CUBE_CPU_NOT_BUILT.into()));
        }
        if self.kind != DeviceKind::Emulated && self.speed != 1.0 {
            return Err(ConfigError::Invalid(format!(
                "device.speed = {}: only an emulated device's speed can be set",
                self.speed
            )));
        }
        self.emulation().map(|_| ())
    }

    /// The Burn device the stage trains on (with autodiff, and its gradient checkpointing where
    /// asked): Flex on the CPU (an emulated accelerator's work runs there too), the Cube CPU
    /// runtime, or CUDA GPU `index`.
    pub fn burn_device(&self) -> Result<burn::tensor::Device, ConfigError> {
        self.validate()?;
        let backend = match self.kind {
            DeviceKind::Cpu | DeviceKind::Emulated => parcae_model::Backend::Flex,
            DeviceKind::Cuda => parcae_model::Backend::Cuda(self.index),
            DeviceKind::CubeCpu => parcae_model::Backend::CubeCpu,
        };
        let device = backend
            .device()
            .map_err(|e| ConfigError::Invalid(format!("device: {e}")))?;
        Ok(if self.gradient_checkpointing {
            device.gradient_checkpointing()
        } else {
            device
        })
    }
}
