//! What the machine says of a device: its name and memory (nvidia-smi for a GPU, /proc for the
//! CPU), and the most memory a measurement held on it.

use std::path::Path;

use anyhow::Context as _;
use parcae_model::device_memory;
use parcae_strategies::cost::profile::MemorySource;

use crate::config::{DeviceChoice, DeviceConfig, DeviceKind};

/// The Burn device (with autodiff, and Burn's gradient checkpointing where asked) `device` names;
/// a build without CUDA refuses `cuda`.
pub fn burn_device(
    device: DeviceChoice,
    gradient_checkpointing: bool,
) -> anyhow::Result<burn::tensor::Device> {
    let config = DeviceConfig {
        kind: device.kind,
        index: device.index,
        gradient_checkpointing,
        ..DeviceConfig::default()
    };
    Ok(config.burn_device()?)
}

/// The most memory held on `device` so far, bytes, and where that was read: the device
/// allocator's reserved bytes (its pools keep their pages) or, on a CPU, the process's peak
/// resident set.
pub fn peak_memory(device: &burn::tensor::Device) -> anyhow::Result<(u64, MemorySource)> {
    Ok(match device_memory(device) {
        Some((_, reserved)) => (reserved, MemorySource::DevicePool),
        None => (process_peak_rss()?, MemorySource::ProcessRss),
    })
}

/// The device's name and memory as the machine reports them.
pub struct Card {
    /// The device as named in reports (`cuda:0 NVIDIA H100 80GB HBM3`, `cpu`).
    pub name: String,
    /// Its memory, MiB.
    pub memory_mb: f64,
}

impl Card {
    /// The device `device` names, as this machine reports it.
    pub fn of(device: DeviceChoice) -> anyhow::Result<Card> {
        match device.kind {
            DeviceKind::Cuda => Self::gpu(device.index),
            DeviceKind::Cpu | DeviceKind::CubeCpu | DeviceKind::Emulated => {
                let meminfo = std::fs::read_to_string("/proc/meminfo")
                    .context("reading /proc/meminfo (or pass --memory-mb)")?;
                let kib = meminfo_kib(&meminfo, "MemTotal")
                    .context("no MemTotal in /proc/meminfo (pass --memory-mb)")?;
                let name = match device.kind {
                    DeviceKind::CubeCpu => "cube-cpu",
                    _ => "cpu",
                };
                Ok(Card {
                    name: name.into(),
                    memory_mb: kib as f64 / 1024.0,
                })
            }
        }
    }

    /// GPU `index`'s name and total memory from nvidia-smi.
    fn gpu(index: usize) -> anyhow::Result<Card> {
        let out = std::process::Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,memory.total",
                "--format=csv,noheader,nounits",
                &format!("--id={index}"),
            ])
            .output()
            .context("running nvidia-smi (or pass --memory-mb)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (name, mb) = text
            .trim()
            .rsplit_once(',')
            .filter(|_| out.status.success())
            .with_context(|| format!("nvidia-smi knows no GPU {index}: {}", text.trim()))?;
        Ok(Card {
            name: format!("cuda:{index} {}", name.trim()),
            memory_mb: mb
                .trim()
                .parse()
                .with_context(|| format!("nvidia-smi's memory.total {mb:?}"))?,
        })
    }
}

/// A `KEY: N kB` line of /proc/meminfo or /proc/self/status.
fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The most memory this process has held, bytes (`VmHWM`).
fn process_peak_rss() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(Path::new("/proc/self/status"))
        .context("reading /proc/self/status")?;
    let kib = meminfo_kib(&status, "VmHWM").context("no VmHWM in /proc/self/status")?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_lines_are_read_in_kib() {
        let text = "MemTotal:       24568000 kB\nMemFree:  10 kB\n";
        assert_eq!(meminfo_kib(text, "MemTotal"), Some(24_568_000));
        assert_eq!(meminfo_kib(text, "MemFree"), Some(10));
        assert_eq!(meminfo_kib(text, "VmHWM"), None);
        assert_eq!(meminfo_kib("VmHWM:\tnope kB", "VmHWM"), None);
    }
}
