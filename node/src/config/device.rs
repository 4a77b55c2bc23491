//! The `[device]` section: what a stage's work runs on.

use serde::Deserialize;

use super::error::ConfigError;
use crate::emulate::Emulation;

/// Where a stage's work runs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Burn's CPU backend, at its own speed.
    #[default]
    Cpu,
    /// An emulated GPU ([`crate::emulate`]): the model's layer structure is the profile's, the
    /// work runs on the CPU at a small width and is paced to the profiled GPU's times.
    Emulated,
}

/// The `[device]` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// CPU or an emulated accelerator.
    pub kind: DeviceKind,
    /// The profiled model an emulated accelerator runs (a built-in of `parcae-strategies`).
    pub profile: String,
    /// Emulated durations are divided by this (2: the emulated cluster runs twice as fast).
    pub time_scale: f64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Cpu,
            profile: "gpt-1.5b".into(),
            time_scale: 1.0,
        }
    }
}

impl DeviceConfig {
    /// How much faster than real time the device runs: the time scale of an emulated device
    /// (validated with the rest of the configuration), 1 on a real one.
    pub fn emulated_time_scale(&self) -> f64 {
        match self.kind {
            DeviceKind::Emulated => self.time_scale,
            DeviceKind::Cpu => 1.0,
        }
    }

    /// The emulation this section asks for (`None` on the CPU).
    pub fn emulation(&self) -> Result<Option<Emulation>, ConfigError> {
        match self.kind {
            DeviceKind::Cpu => Ok(None),
            DeviceKind::Emulated => Emulation::new(&self.profile, self.time_scale)
                .map(Some)
                .map_err(|e| ConfigError::Invalid(format!("device: {e}"))),
        }
    }
}
