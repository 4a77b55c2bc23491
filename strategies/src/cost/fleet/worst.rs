//! The device a zone-blind planner believes every node is.

use crate::cost::mixed::DeviceCosts;
use crate::cost::spec::{LayerCost, ModelSpec};

/// Each layer as slow as the slowest kind runs it, with the least memory of any kind.
pub(super) fn worst_device(spec: &ModelSpec, devices: &[&DeviceCosts]) -> DeviceCosts {
    let layers = (0..spec.layers.len())
        .map(|i| {
            let on = |f: fn(&LayerCost) -> f64| {
                devices.iter().map(|d| f(&d.layers[i])).fold(0.0, f64::max)
            };
            LayerCost {
                forward_ms: on(|l| l.forward_ms),
                backward_ms: on(|l| l.backward_ms),
                optimizer_ms: on(|l| l.optimizer_ms),
                ..spec.layers[i]
            }
        })
        .collect();
    let memory_mb = devices
        .iter()
        .map(|d| d.memory_mb)
        .fold(f64::INFINITY, f64::min);
    DeviceCosts {
        name: "worst".into(),
        layers,
        memory_mb,
    }
}
