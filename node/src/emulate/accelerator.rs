//! An emulated accelerator as a trainer holds it: what it emulates, and the pacer that counts
//! its overruns.

use std::sync::Arc;
use std::time::Duration;

use parcae_model::LayerCost;

use super::costs::{Emulation, EmulationError};
use super::pacer::{Overrun, Pacer};
use crate::status::EmulatedView;

/// The emulated device of one node.
#[derive(Debug, Clone)]
pub struct Accelerator {
    emulation: Emulation,
    overrun: Arc<Overrun>,
    pacer: Pacer,
}

impl Accelerator {
    /// A device emulating `emulation`, with no work paced yet.
    pub fn new(emulation: Emulation) -> Self {
        let overrun = Arc::new(Overrun::default());
        Self {
            pacer: Pacer::new(overrun.clone()),
            overrun,
            emulation,
        }
    }

    /// What it emulates.
    pub fn emulation(&self) -> &Emulation {
        &self.emulation
    }

    /// Its pacer.
    pub fn pacer(&self) -> &Pacer {
        &self.pacer
    }

    /// Its pacing so far, for `/status`.
    pub fn view(&self) -> EmulatedView {
        let s = self.overrun.snapshot();
        EmulatedView {
            profile: self.emulation.profile().to_string(),
            time_scale: self.emulation.time_scale(),
            overrun_count: s.count,
            overrun_secs: s.overrun_secs,
            busy_secs: s.busy_secs,
        }
    }

    /// What measuring a layer on this device finds, given what it took on the CPU (`real`,
    /// micro-batches of `micro_batch` samples): the real work, waited out to the emulated
    /// time, as the pacer does for every step. This is the only way the emulated costs reach
    /// the planner: as measurements.
    pub fn measured(
        &self,
        real: &LayerCost,
        micro_batch: u32,
    ) -> Result<LayerCost, EmulationError> {
        let e = self
            .emulation
            .stage(real.layer..real.layer + 1, micro_batch, 1)?;
        let at_least = |real_ms: f64, emulated: Duration| real_ms.max(emulated.as_secs_f64() * 1e3);
        Ok(LayerCost {
            forward_ms: at_least(real.forward_ms, e.forward),
            backward_ms: at_least(real.backward_ms, e.backward),
            optimizer_ms: at_least(real.optimizer_ms, e.optimizer),
            ..real.clone()
        })
    }
}
