//! What the emulated hardware takes for one stage's work: sums of the profiled per-layer costs
//! of the layers the stage holds, and the profiled link for what it sends.

use std::ops::Range;
use std::time::Duration;

use parcae_consensus::state::LinkTime;
use parcae_outer::Wire;
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::analytic::{Hardware, MIB, stage_allreduce_ms};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::profile::{ProfileError, emulated};
use parcae_strategies::cost::rounds::bytes_per_value;
use parcae_strategies::cost::spec::{ModelSpec, RestartKind};
use parcae_strategies::cost::traffic::{by_zone_time, share};
use parcae_strategies::cost::transfer::TransferModel;

/// Slowest a derived emulated device may be against the profiled one.
pub const MIN_SPEED: f64 = 0.01;
/// Fastest a derived emulated device may be against the profiled one.
pub const MAX_SPEED: f64 = 100.0;

/// Why an emulation cannot be set up; each names the bad value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmulationError {
    /// Neither a built-in profiled model nor a usable profile file.
    #[error("emulation: {0}")]
    Profile(#[from] ProfileError),
    /// The time scale is not a positive finite number.
    #[error("emulation time_scale must be a positive finite number, got {0}")]
    TimeScale(f64),
    /// A device speed outside [`MIN_SPEED`]..=[`MAX_SPEED`].
    #[error("emulation speed must be a number from {MIN_SPEED} to {MAX_SPEED}, got {0}")]
    Speed(f64),
    /// The stage's layers are not layers of the emulated model.
    #[error("layers {start}..{end} are not within the {layers} layers of {profile}")]
    Layers {
        /// The emulated model.
        profile: String,
        /// Its layer count.
        layers: usize,
        /// First layer asked for.
        start: usize,
        /// End of the layers asked for.
        end: usize,
    },
}

/// The emulated model on the emulated hardware, at a time scale.
#[derive(Debug, Clone)]
pub struct Emulation {
    /// The built-in model or the profile file, as named.
    name: String,
    spec: ModelSpec,
    hardware: Hardware,
    link: TransferModel,
    /// The link between two zones: the cloud's ([`Links::default`], 5 Gb/s against the 10
    /// within a zone), which a fleet over zones pays for what crosses.
    across: TransferModel,
    time_scale: f64,
}

/// Which of a stage's transfers leave its node's zone: the activations to the next stage, the
/// gradients to the previous one, and the ring of its replicas (when they are in more than one
/// zone). Nothing crosses in a cluster of one zone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Crossings {
    /// The next stage's node is in another zone.
    pub next: bool,
    /// The previous stage's node is in another zone.
    pub prev: bool,
    /// The stage's replicas are in more than one zone.
    pub ring: bool,
    /// They all-reduce by zone: how they spread over the zones.
    pub by_zone: Option<ZoneSpread>,
    /// Under DiLoCo, the round's all-reduce of the stage's pseudo-gradient (`None`: no rounds).
    pub round: Option<RoundCrossing>,
}

/// A DiLoCo round's all-reduce of a stage's pseudo-gradient over every replica: by zone, f32
/// inside each zone and the job's wire form between zones, as the data plane sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundCrossing {
    /// How the stage's replicas spread over the zones.
    pub spread: ZoneSpread,
    /// The pseudo-gradient's form between zones.
    pub wire: Wire,
}

/// How a stage's replicas spread over zones, as the all-reduce by zone's time depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneSpread {
    /// Replicas.
    pub replicas: u32,
    /// Zones they are in.
    pub zones: u32,
    /// Replicas of the zone holding the fewest.
    pub fewest: u32,
    /// Replicas of the zone holding the most.
    pub most: u32,
}

/// The layers fetched from one live holder, whether that holder is in another zone, and what
/// else it sends at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The layers it sent.
    pub layers: Range<usize>,
    /// It is in another zone: the state crossed the link between zones.
    pub across: bool,
    /// The layers it sends to other nodes entering the same plan, one range a piece
    /// (`crate::train::egress`): its link carries them beside this piece.
    pub beside: Vec<Range<usize>>,
}

impl From<Range<usize>> for Fetched {
    /// Layers fetched within the zone from a holder that sends nothing else.
    fn from(layers: Range<usize>) -> Self {
        Self {
            layers,
            across: false,
            beside: Vec::new(),
        }
    }
}

/// What a reconfiguration rebuilds on the node besides moving state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// The communication groups only: the node kept its stage.
    Groups,
    /// The groups and the stage module: the node built a stage of other layers.
    Stage,
    /// Everything: Parcae's whole profiled restart.
    Restart,
}

/// What the emulated hardware takes for one stage's work, divided by the time scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedStage {
    /// Forward of one micro-batch through the stage's layers.
    pub forward: Duration,
    /// Backward of one micro-batch.
    pub backward: Duration,
    /// The optimizer step of the stage's layers.
    pub optimizer: Duration,
    /// One activation to the next stage over its link.
    pub to_next: Duration,
    /// One gradient to the previous stage over its link.
    pub to_prev: Duration,
    /// The ring all-reduce of the stage's gradients among its replicas.
    pub all_reduce: Duration,
    /// A DiLoCo round's all-reduce of the stage's pseudo-gradient (zero without rounds).
    pub round: Duration,
    /// The stage's whole state (weights and optimizer moments) over the link.
    pub state: Duration,
}

/// The width of the narrow stand-in ([`Emulation::stand_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandInWidth {
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Sequence length.
    pub seq_len: usize,
}

/// The stand-in's width: small, with every part of GPT's block kept (several heads, a wider
/// feed-forward, a causal sequence). Narrower saves nothing: d 8 and sequence 4 measured the
/// same, as the cost is per operation; the stand-in runs each block as one fused operation
/// ([`parcae_model::BlockKernel::Fused`]: 27 us forward and backward per block and micro-batch
/// where Burn's composed block takes 102 us, `cargo bench -p parcae-model --bench block`).
pub const STAND_IN: StandInWidth = StandInWidth {
    d_model: 16,
    n_heads: 2,
    d_ff: 32,
    seq_len: 8,
};

impl StandInWidth {
    fn apply(self, base: parcae_model::GptConfig) -> parcae_model::GptConfig {
        parcae_model::GptConfig {
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            seq_len: self.seq_len,
            kernel: parcae_model::BlockKernel::Fused,
            ..base
        }
    }
}

impl Emulation {
    /// The built-in profiled model `profile` (e.g. `gpt-1.5b`) on Parcae's 10 Gb/s cluster of
    /// V100s, or the card of the profile file at `profile` (`*.json`, `parcae-node profile`) on
    /// the same links; every duration divided by `time_scale`.
    pub fn new(profile: &str, time_scale: f64) -> Result<Self, EmulationError> {
        if !(time_scale.is_finite() && time_scale > 0.0) {
            return Err(EmulationError::TimeScale(time_scale));
        }
        let emulated = emulated(profile)?;
        Ok(Self {
            name: profile.to_string(),
            spec: emulated.spec,
            hardware: emulated.hardware,
            link: TransferModel::Profiled10Gbps,
            across: across_zones(),
            time_scale,
        })
    }

    /// The same emulation on a device `speed` times as fast at every layer's forward, backward
    /// and optimizer step (its memory and links unchanged): a second device kind derived from
    /// the profiled one, as `cost::mixed::DeviceCosts::derived` derives it.
    pub fn faster(mut self, speed: f64) -> Result<Self, EmulationError> {
        if !(speed.is_finite() && (MIN_SPEED..=MAX_SPEED).contains(&speed)) {
            return Err(EmulationError::Speed(speed));
        }
        for l in &mut self.spec.layers {
            l.forward_ms /= speed;
            l.backward_ms /= speed;
            l.optimizer_ms /= speed;
        }
        Ok(self)
    }

    /// The emulated model as named: a built-in model's name or the profile file's path.
    pub fn profile(&self) -> &str {
        &self.name
    }

    /// Every emulated duration is divided by this.
    pub fn time_scale(&self) -> f64 {
        self.time_scale
    }

    /// Entries of the emulated model's layer list (gpt-1.5b: embedding, 48 blocks, head).
    pub fn layers(&self) -> usize {
        self.spec.layers.len()
    }

    /// Usable memory of the emulated device, MiB (Parcae's p3.2xlarge: a 16 GB V100; a profile's
    /// card: what it measured).
    pub fn memory_mb(&self) -> f64 {
        self.hardware.memory_mb
    }

    /// The shallowest pipeline whose stages fit the emulated device: the smallest depth Parcae
    /// profiled the model at (gpt-1.5b: 6), or for a profile file the smallest whose stages hold
    /// their training state and activations in flight. A memory limit of the device, as
    /// [`Self::memory_mb`] is, not a cost: the planner's own memory estimate leaves out the
    /// gradients and the framework's overhead and would plan stages that do not fit.
    pub fn min_depth(&self) -> u32 {
        self.spec.depths.iter().copied().min().unwrap_or(1)
    }

    /// Parameters of layer `layer` and the bytes of its output for a micro-batch of
    /// `micro_batch` samples, as the emulated model has them.
    pub fn layer_size(&self, layer: usize, micro_batch: u32) -> Option<(f64, f64)> {
        let l = self.spec.layers.get(layer)?;
        Some((l.params, self.boundary_bytes(micro_batch)))
    }

    /// Bytes of the activation that crosses a stage boundary for a micro-batch of
    /// `micro_batch` samples.
    fn boundary_bytes(&self, micro_batch: u32) -> f64 {
        self.spec.boundary_bytes * self.per_sample(micro_batch)
    }

    /// What one boundary activation takes on the link within a zone, on the paced clock, as a
    /// node timing its sends would find: the profiled curve at the activation's size.
    pub fn boundary_link(&self, micro_batch: u32) -> LinkTime {
        let bytes = self.boundary_bytes(micro_batch);
        LinkTime {
            bytes: bytes as u64,
            secs: self.ms(self.link.cost_ms(bytes)).as_secs_f64(),
        }
    }

    fn per_sample(&self, micro_batch: u32) -> f64 {
        f64::from(micro_batch) / f64::from(self.spec.micro_batch.max(1))
    }

    /// Transformer blocks of the emulated model (its layer list less embedding and head).
    pub fn blocks(&self) -> usize {
        self.layers().saturating_sub(2)
    }

    /// The narrow model that stands in for the emulated one: `base` with the emulated model's
    /// blocks at [`STAND_IN`]'s width, each block one fused operation. Its real work is what the
    /// emulated cluster's pacing has to hide on the host's cores, and at these sizes a composed
    /// block is Burn's fixed per-operation overhead: gpt-1.5b's 48 blocks x 128 micro-batches of
    /// a step took ~1.5 s of CPU at `tiny`'s width (d 32, sequence 16), a third less at this
    /// one, and a quarter of that fused (docs/testnet.md). A `[train]` width override keeps the
    /// fused kernel, which is plain loops: meant for narrow widths.
    pub fn stand_in(&self, base: parcae_model::GptConfig) -> parcae_model::GptConfig {
        parcae_model::GptConfig {
            n_blocks: self.blocks(),
            ..STAND_IN.apply(base)
        }
    }

    /// What the stage holding `layers` takes with micro-batches of `micro_batch` samples and
    /// `replicas` replicas, every transfer inside one zone. The profile is per micro-batch of
    /// the emulated job's size; other sizes scale compute and boundary bytes linearly.
    pub fn stage(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        replicas: u32,
    ) -> Result<EmulatedStage, EmulationError> {
        self.stage_crossing(layers, micro_batch, replicas, Crossings::default())
    }

    /// [`Self::stage`] with the transfers `crossings` names over the link between zones.
    pub fn stage_crossing(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        replicas: u32,
        crossings: Crossings,
    ) -> Result<EmulatedStage, EmulationError> {
        // The first stage of several also reduces the tied embedding with the last one's.
        let first_of_several = layers.start == 0 && layers.end < self.layers();
        let entries = self.entries(layers)?;
        let per_sample = self.per_sample(micro_batch);
        let sum = |f: fn(&parcae_strategies::cost::spec::LayerCost) -> f64| {
            entries.iter().map(f).sum::<f64>()
        };
        let params = sum(|l| l.params);
        let boundary = |across: bool| {
            self.ms(self
                .link_for(across)
                .cost_ms(self.boundary_bytes(micro_batch)))
        };
        Ok(EmulatedStage {
            forward: self.ms(sum(|l| l.forward_ms) * per_sample),
            backward: self.ms(sum(|l| l.backward_ms) * per_sample),
            optimizer: self.ms(sum(|l| l.optimizer_ms)),
            to_next: boundary(crossings.next),
            to_prev: boundary(crossings.prev),
            all_reduce: self.ms(stage_allreduce_ms(
                &self.spec,
                params,
                replicas,
                first_of_several,
                self.allreduce_mb_per_ms(crossings),
            )),
            round: self.ms(self.round_ms(params, crossings.round)),
            state: self.ms(self.link.cost_ms(self.spec.state_bytes(params))),
        })
    }

    /// The rate at which the emulated ring within a zone runs, bytes per second of the paced
    /// (time-scaled) clock, as a node timing it would find: the hardware's, as the simulator
    /// has it.
    pub fn allreduce_rate(&self) -> f64 {
        self.hardware.allreduce_mb_per_ms * MIB * 1000.0 * self.time_scale
    }

    /// The all-reduce rate of a ring within a zone (the hardware's, as the simulator has it),
    /// of one that spans zones (the cloud's link between them, as the zone-aware planner has
    /// it), or of the flat ring that takes as long as the all-reduce by zone over the two,
    /// MiB per ms.
    fn allreduce_mb_per_ms(&self, crossings: Crossings) -> f64 {
        let (within, across) = (
            self.hardware.allreduce_mb_per_ms,
            Links::default().across.mib_per_ms(),
        );
        match crossings.by_zone {
            Some(spread) => {
                let inside = share(spread.most) / within;
                let time = by_zone_time(inside, spread.zones, spread.fewest, across);
                share(spread.replicas) / time
            }
            None if crossings.ring => across,
            None => within,
        }
    }

    /// A round's all-reduce by zone of `params` pseudo-gradient values, ms: the reduce-scatter
    /// and all-gather inside the zone of the most replicas at the hardware's ring rate, in f32,
    /// and each zone's shard across the zones on the cloud's link between them, in the wire form
    /// (what `dataplane::collective::all_reduce_mean_by_zone` sends). Nothing without rounds or
    /// replicas. The outer step's own arithmetic (one elementwise pass over the stage's values,
    /// no profile has it) is not paced.
    fn round_ms(&self, params: f64, round: Option<RoundCrossing>) -> f64 {
        let Some(RoundCrossing { spread, wire }) = round else {
            return 0.0;
        };
        let wire_mib = params * bytes_per_value(wire) / MIB;
        // `by_zone_time` is per byte of one form; the f32 parts inside weigh f32's bytes over
        // the wire form's as much.
        let inside = share(spread.most) / self.hardware.allreduce_mb_per_ms
            * bytes_per_value(Wire::F32)
            / bytes_per_value(wire);
        let across = Links::default().across.mib_per_ms();
        wire_mib * by_zone_time(inside, spread.zones, spread.fewest, across)
    }

    /// The link within a zone, or the one between zones.
    fn link_for(&self, across: bool) -> &TransferModel {
        if across { &self.across } else { &self.link }
    }

    /// What a reconfiguration of this node into `to` takes on the emulated cluster: Parcae's
    /// profiled rebuild of the communication groups, and the profiled build of the stage module
    /// when the node `built` a new stage (its layers changed), or for a `restart` its whole
    /// profiled restart (process, rendezvous when nodes joined, groups, model build); then the
    /// state of the layers `fetched` from live holders (one range per source; the sources send
    /// at once over this node's one link, [`Self::fetch`]) and of the layers `restored` from
    /// checkpoints, at the emulated state size over the link.
    pub fn switch(
        &self,
        to: ParallelConfig,
        kind: RestartKind,
        rebuild: Rebuild,
        fetched: &[Fetched],
        restored: &[Range<usize>],
    ) -> Result<Duration, EmulationError> {
        let (_, fetch_ms) = self.fetch_ms(fetched)?;
        let mut restore_ms = 0.0;
        for layers in restored {
            restore_ms += self.state_ms(layers)?.1;
        }
        let restart = &self.spec.restart;
        let rebuild_ms = match rebuild {
            Rebuild::Restart => restart.restart_ms(to, kind),
            Rebuild::Stage => restart.rebuild_ms(to, kind),
            Rebuild::Groups => restart.groups_ms(to, kind),
        };
        Ok(self.ms(rebuild_ms + fetch_ms + restore_ms))
    }

    /// What the reactive baseline's restart into `to` takes on the emulated cluster: the
    /// checkpoint-restart system Parcae measures against
    /// (`parcae_strategies::baselines::restart_ms`, as the simulator charges it): the profiled
    /// restart, the checkpoint saved and loaded, and every stage's state reloaded one after
    /// another. Whatever the node's real restart fetched from live peers (which keeps its
    /// training exact), a checkpoint-restart system has no live peers to fetch from.
    pub fn reactive_restart(
        &self,
        to: ParallelConfig,
        kind: RestartKind,
    ) -> Result<Duration, EmulationError> {
        let mut reload_ms = 0.0;
        for stage in self.spec.partition(to.p).windows(2) {
            reload_ms += self.state_ms(&(stage[0]..stage[1]))?.1;
        }
        Ok(self.ms(parcae_strategies::baselines::restart_reloading_ms(
            &self.spec, to, kind, true, reload_ms,
        )))
    }

    /// What fetching the state of the layers `fetched` from live holders moves and takes on the
    /// emulated links: (bytes, emulated seconds at the time scale). The sources send at once,
    /// and everything they send arrives over this node's one link: the fetch takes the link's
    /// time for all of it, or the time of what crosses zones over the slower link between them
    /// where that is longer, or the time a holder's own link takes to carry its piece beside
    /// the others it sends at once (shared fairly: a piece of `b` bytes is through once the
    /// link has carried `b` of each piece, or each whole piece that is smaller). A node
    /// receives no faster than its own link, however many holders send to it, and a holder
    /// sends no faster than its own, however many nodes fetch from it.
    pub fn fetch(&self, fetched: &[Fetched]) -> Result<(f64, f64), EmulationError> {
        let (bytes, ms) = self.fetch_ms(fetched)?;
        Ok((bytes, self.ms(ms).as_secs_f64()))
    }

    /// The rate each link carried in a fetch of `fetched`, bytes per second of the paced clock:
    /// (within the zone, across zones), each over the bytes that took it (`None` where none
    /// did). What a node timing the fetch learns of its links.
    pub fn fetch_rates(
        &self,
        fetched: &[Fetched],
    ) -> Result<(Option<f64>, Option<f64>), EmulationError> {
        let (within, across) = self.fetched_bytes(fetched)?;
        let rate = |link: &TransferModel, bytes: f64| {
            (bytes > 0.0).then(|| bytes / self.ms(link.cost_ms(bytes)).as_secs_f64())
        };
        Ok((rate(&self.link, within), rate(&self.across, across)))
    }

    /// [`Self::fetch`] in unscaled emulated milliseconds.
    fn fetch_ms(&self, fetched: &[Fetched]) -> Result<(f64, f64), EmulationError> {
        let (within, across) = self.fetched_bytes(fetched)?;
        let bytes = within + across;
        if bytes == 0.0 {
            return Ok((0.0, 0.0));
        }
        let crossing = if across > 0.0 {
            self.across.cost_ms(across)
        } else {
            0.0
        };
        let mut ms = self.link.cost_ms(bytes).max(crossing);
        for f in fetched {
            let piece = self.state_bytes(&f.layers)?;
            let mut shared = piece;
            for other in &f.beside {
                shared += self.state_bytes(other)?.min(piece);
            }
            ms = ms.max(self.link_for(f.across).cost_ms(shared));
        }
        Ok((bytes, ms))
    }

    /// The emulated state bytes of `fetched`: (from holders within the zone, from across).
    fn fetched_bytes(&self, fetched: &[Fetched]) -> Result<(f64, f64), EmulationError> {
        let (mut within, mut across) = (0.0, 0.0);
        for f in fetched {
            let b = self.state_bytes(&f.layers)?;
            if f.across {
                across += b;
            } else {
                within += b;
            }
        }
        Ok((within, across))
    }

    /// The emulated state bytes of `layers` and their time over the link within a zone, ms.
    fn state_ms(&self, layers: &Range<usize>) -> Result<(f64, f64), EmulationError> {
        let bytes = self.state_bytes(layers)?;
        Ok((bytes, self.link.cost_ms(bytes)))
    }

    /// The emulated state bytes of `layers`: weights and optimizer moments.
    fn state_bytes(&self, layers: &Range<usize>) -> Result<f64, EmulationError> {
        let params = self.entries(layers.clone())?.iter().map(|l| l.params).sum();
        Ok(self.spec.state_bytes(params))
    }

    /// The profiled entries of `layers` (non-empty and within the model).
    fn entries(
        &self,
        layers: Range<usize>,
    ) -> Result<&[parcae_strategies::cost::spec::LayerCost], EmulationError> {
        self.spec
            .layers
            .get(layers.clone())
            .filter(|e| !e.is_empty())
            .ok_or_else(|| EmulationError::Layers {
                profile: self.spec.name.clone(),
                layers: self.layers(),
                start: layers.start,
                end: layers.end,
            })
    }

    /// Emulated milliseconds as a wall-clock duration at the time scale.
    fn ms(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms / 1000.0 / self.time_scale).max(0.0))
    }
}

/// The link between two zones as the emulated transfers are paced on it.
fn across_zones() -> TransferModel {
    let across = Links::default().across;
    TransferModel::Linear {
        latency_ms: across.latency_ms,
        bytes_per_sec: across.gbit_per_s * 1e9 / 8.0,
    }
}

#[cfg(test)]
mod tests;
