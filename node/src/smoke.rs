//! `parcae-node smoke`: the first command on a new device — a handful of tensor operations and
//! one training step of a small GPT, on the device and on Flex from the same weights, compared
//! within a tolerance (`parcae_model::smoke`). On CUDA it also proves that the kernels the
//! linked LLVM compiled load on the driver. Exits 1 when a comparison fails.

use std::path::PathBuf;

use parcae_model::SmokeReport;
use serde::Serialize;

use crate::config::DeviceChoice;
use crate::device_info::{Card, burn_device};

/// What `parcae-node smoke` is asked to compare.
#[derive(Debug, clap::Args)]
pub struct SmokeOptions {
    /// The device compared with Flex: cpu, cube-cpu, cuda or cuda:N.
    #[arg(long, env = "PARCAE_DEVICE", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Largest difference accepted, relative to the larger of 1 and Flex's largest magnitude
    /// (TF32 matmuls differ from f32 by ~1e-3).
    #[arg(long, default_value_t = 1e-2)]
    pub tolerance: f64,
    /// Where to write the comparisons (JSON).
    #[arg(long, env = "PARCAE_OUT")]
    pub out: PathBuf,
}

/// The comparisons of one device.
#[derive(Debug, Serialize)]
pub struct Smoke {
    /// The device compared with Flex.
    pub device: String,
    /// What was compared.
    #[serde(flatten)]
    pub report: SmokeReport,
}

/// Compares the device with Flex and writes the result to `opts.out`.
pub fn smoke(opts: &SmokeOptions) -> anyhow::Result<Smoke> {
    let device = burn_device(opts.device, false)?;
    let smoke = Smoke {
        device: Card::of(opts.device)?.name,
        report: parcae_model::smoke(&device, opts.tolerance)?,
    };
    crate::data_dir::write_report(&opts.out, &smoke)?;
    Ok(smoke)
}
