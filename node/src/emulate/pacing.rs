//! The one pacing interface the trainer calls. A real device takes what it takes
//! ([`RealTime`]: every call a no-op, every measurement what was measured); an emulated one
//! ([`super::Accelerator`]) waits out the profile's remainder of each piece of work. The
//! trainer is given one at launch and reads the same either way.

use std::ops::Range;
use std::time::Duration;

use parcae_consensus::state::{LinkTime, Plan};
use parcae_model::LayerCost;
use parcae_strategies::cost::spec::RestartKind;

use super::costs::{Crossings, EmulatedStage, EmulationError, Fetched};
use super::pacer::Pacer;
use crate::metrics::Metrics;
use crate::status::{EmulatedView, MigrationKind};

/// A reconfiguration this node just made, as the pacing of its device needs it.
pub struct Change<'a> {
    /// The plan this node was in before (the one it entered last, if any).
    pub previous: Option<&'a Plan>,
    /// The plan it entered.
    pub plan: &'a Plan,
    /// The step it enters the plan at.
    pub next: u64,
    /// What kind of reconfiguration it was.
    pub kind: MigrationKind,
    /// Whether its restart, where it has one, rendezvouses with new nodes.
    pub restart: RestartKind,
    /// Whether the node built a stage of other layers (it did not keep its stage).
    pub built: bool,
    /// The reactive strategy's restart (every change rebuilds from checkpoints).
    pub reactive: bool,
    /// Layers fetched from live holders, one entry per holder.
    pub fetched: Vec<Fetched>,
    /// Layers restored from checkpoints, one range per part.
    pub restored: Vec<Range<usize>>,
}

/// What timing a state fetch found.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredFetch {
    /// Seconds the fetch took, every source sending at once.
    pub secs: f64,
    /// The rate of each source's link, bytes/s, in the fetch's order.
    pub rates: Vec<f64>,
}

/// How the stage's work is timed.
pub trait Pacing: Send + Sync {
    /// The pacing of one step of the stage holding `layers`, with micro-batches of
    /// `micro_batch` samples and `replicas` replicas of the stage, `crossings` its transfers
    /// that leave its zone.
    fn step(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        replicas: u32,
        crossings: Crossings,
    ) -> Result<StepPacing<'_>, EmulationError>;

    /// A step that ended at `ended` on this device's emulated timeline ([`StepPacing::stamp`])
    /// has just been seen committed. On the emulated cluster the commit takes a raft round
    /// trip within a zone, milliseconds that the cost model leaves out beside a step's
    /// seconds; where many nodes share the host's cores it takes tens of them, so the node
    /// resumes from the step's end as from a message's stamp ([`Pacer::received`]), owing the
    /// difference to its next waits.
    fn committed(&self, ended: u64);

    /// After the optimizer update of `layers`, which took `real`.
    fn optimizer(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        real: Duration,
    ) -> Result<(), EmulationError>;

    /// After a reconfiguration, which took `real`.
    fn reconfiguration(&self, change: &Change<'_>, real: Duration) -> Result<(), EmulationError>;

    /// What measuring a layer on this device finds, given what it took on the host (`real`).
    fn measured_layer(
        &self,
        real: LayerCost,
        micro_batch: u32,
    ) -> Result<LayerCost, EmulationError>;

    /// What timing a state fetch of the layers `fetched` on this device's links finds, given
    /// what the real one moved (`received_bytes`) and took (`real_secs`, all sources at once).
    fn measured_fetch(
        &self,
        fetched: &[Fetched],
        received_bytes: u64,
        real_secs: f64,
    ) -> Result<MeasuredFetch, EmulationError>;

    /// The rate of this device's gradient all-reduce within its zone, bytes/s as the cost
    /// model's ring counts it, when the device knows it (`None`: the planner takes the rate of
    /// the measured state fetches).
    fn allreduce_rate(&self) -> Option<f64>;

    /// What one boundary activation of a micro-batch of `micro_batch` samples takes on this
    /// device's link to a neighbouring stage, when the device knows it (`None`: the planner
    /// assumes a fixed latency beside the measured fetch rate).
    fn boundary_link(&self, micro_batch: u32) -> Option<LinkTime>;

    /// The pacing so far, into `metrics` and for `/status` (`None` on a real device).
    fn report(&self, metrics: &Metrics) -> Option<EmulatedView>;
}

/// A real device: nothing is paced, every measurement is what was measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealTime;

impl Pacing for RealTime {
    fn step(
        &self,
        _: Range<usize>,
        _: u32,
        _: u32,
        _: Crossings,
    ) -> Result<StepPacing<'_>, EmulationError> {
        Ok(StepPacing::default())
    }

    fn committed(&self, _: u64) {}

    fn optimizer(&self, _: Range<usize>, _: u32, _: Duration) -> Result<(), EmulationError> {
        Ok(())
    }

    fn reconfiguration(&self, _: &Change<'_>, _: Duration) -> Result<(), EmulationError> {
        Ok(())
    }

    fn measured_layer(&self, real: LayerCost, _: u32) -> Result<LayerCost, EmulationError> {
        Ok(real)
    }

    fn measured_fetch(
        &self,
        fetched: &[Fetched],
        received_bytes: u64,
        real_secs: f64,
    ) -> Result<MeasuredFetch, EmulationError> {
        // Only the whole fetch is timed: its aggregate rate bounds each source's link.
        let rate = received_bytes as f64 / real_secs;
        Ok(MeasuredFetch {
            secs: real_secs,
            rates: vec![rate; fetched.len()],
        })
    }

    fn allreduce_rate(&self) -> Option<f64> {
        None
    }

    fn boundary_link(&self, _: u32) -> Option<LinkTime> {
        None
    }

    fn report(&self, _: &Metrics) -> Option<EmulatedView> {
        None
    }
}

/// The pacing of one step: what the emulated stage takes and the pacer that waits it out, or
/// nothing on a real device (the decorators of [`super::paced`] then pass straight through).
#[derive(Default, Clone, Copy)]
pub struct StepPacing<'a> {
    pub(crate) clock: Option<(EmulatedStage, &'a Pacer)>,
}
