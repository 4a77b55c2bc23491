//! Parcae's baselines (spec 5): the reactive throughput-optimised system that restarts from a
//! checkpoint on every availability change, and the free-reconfiguration ideal (both run by
//! [`crate::sim`]).

use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::spec::{ModelSpec, RestartKind};

/// Saving and loading a checkpoint in the reactive baseline, ms.
pub const CHECKPOINT_MS: f64 = 14_000.0;

/// Cost of the reactive baseline's restart into `to`: the restart itself, the checkpoint
/// round trip when resuming, and every stage's state reloaded one after another.
pub fn restart_ms(model: &CostModel, to: ParallelConfig, kind: RestartKind, resume: bool) -> f64 {
    let reload: f64 = model.stage_transfer_ms(to.p).iter().sum();
    restart_reloading_ms(&model.spec, to, kind, resume, reload)
}

/// [`restart_ms`] when reloading every stage's state one after another takes `reload_ms`: an
/// emulated node charges the reactive baseline this, with the reload timed on its own link.
pub fn restart_reloading_ms(
    spec: &ModelSpec,
    to: ParallelConfig,
    kind: RestartKind,
    resume: bool,
    reload_ms: f64,
) -> f64 {
    spec.restart.restart_ms(to, kind) + if resume { CHECKPOINT_MS } else { 0.0 } + reload_ms
}
