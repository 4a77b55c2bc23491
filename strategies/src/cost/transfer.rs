//! Point-to-point transfer time of a volume of bytes (spec 3.1).

use serde::{Deserialize, Serialize};

/// Profiled 10 Gb/s curve of Parcae's evaluation cluster: (bytes, microseconds).
const PROFILED_10GBPS: [(f64, f64); 29] = [
    (4.0, 142.907),
    (8.0, 139.679),
    (16.0, 143.102),
    (32.0, 139.210),
    (64.0, 143.954),
    (128.0, 140.836),
    (256.0, 141.442),
    (512.0, 144.788),
    (1024.0, 137.372),
    (2048.0, 140.417),
    (4096.0, 141.651),
    (8192.0, 145.364),
    (16384.0, 154.935),
    (32768.0, 162.665),
    (65536.0, 194.492),
    (131072.0, 230.588),
    (262144.0, 385.104),
    (524288.0, 689.821),
    (1048576.0, 1428.108),
    (2097152.0, 3006.771),
    (4194304.0, 5182.599),
    (8388608.0, 9727.047),
    (16777216.0, 18622.294),
    (33554432.0, 38560.219),
    (67108864.0, 74432.216),
    (134217728.0, 153550.589),
    (268435456.0, 305811.282),
    (536870912.0, 601380.752),
    (1073741824.0, 1198255.900),
];

/// How long moving bytes between two nodes takes.
///
/// Parcae used a profiled curve of its 10 Gb/s network; a running cluster replaces it with
/// the latency and bandwidth its nodes measured between each other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TransferModel {
    /// Parcae's profiled 10 Gb/s curve, linearly interpolated.
    Profiled10Gbps,
    /// A fixed per-transfer latency plus a bandwidth.
    Linear {
        /// Setup time of one transfer, ms.
        latency_ms: f64,
        /// Sustained rate, bytes per second.
        bytes_per_sec: f64,
    },
}

impl TransferModel {
    /// Time in ms to send `bytes` from one node to another.
    pub fn cost_ms(&self, bytes: f64) -> f64 {
        match self {
            Self::Profiled10Gbps => profiled_us(bytes) / 1000.0,
            Self::Linear {
                latency_ms,
                bytes_per_sec,
            } => latency_ms + bytes.max(0.0) / bytes_per_sec * 1000.0,
        }
    }
}

/// Interpolation rule of the artifact: first key >= v; below the first key the first value;
/// beyond the last key proportional to the last point.
fn profiled_us(bytes: f64) -> f64 {
    let table = &PROFILED_10GBPS;
    let first_at_least = table.partition_point(|&(k, _)| k < bytes);
    match Some(first_at_least).filter(|&i| i < table.len()) {
        Some(0) => table[0].1,
        Some(i) => {
            let (k0, v0) = table[i - 1];
            let (k1, v1) = table[i];
            v0 + (v1 - v0) * (bytes - k0) / (k1 - k0)
        }
        None => {
            let (k, v) = table[table.len() - 1];
            bytes / k * v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiled_curve_matches_spec_points() {
        let m = TransferModel::Profiled10Gbps;
        assert!((m.cost_ms(1.0) - 0.142907).abs() < 1e-9);
        assert!((m.cost_ms(50257.0 * 1024.0 * 4.0) - 234.815).abs() < 0.01);
        assert!((m.cost_ms(2.0 * 1073741824.0) - 2.0 * 1198.2559).abs() < 1e-6);
        let mid = m.cost_ms(1536.0);
        assert!((mid - (137.372 + 140.417) / 2000.0).abs() < 1e-9);
    }

    #[test]
    fn linear_model_scales_with_volume() {
        let m = TransferModel::Linear {
            latency_ms: 1.0,
            bytes_per_sec: 1e9,
        };
        assert!((m.cost_ms(1e9) - 1001.0).abs() < 1e-9);
    }
}
