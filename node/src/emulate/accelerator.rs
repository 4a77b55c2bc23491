//! An emulated accelerator as a trainer holds it: what it emulates, and the pacer that counts
//! its overruns.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use parcae_consensus::ControlState;
use parcae_consensus::state::{LinkTime, Plan};
use parcae_model::LayerCost;
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::spec::RestartKind;

use super::costs::{Crossings, Emulation, EmulationError, Fetched, Rebuild};
use super::pacer::{Overrun, Pacer};
use super::pacing::{Change, MeasuredFetch, Pacing, StepPacing};
use crate::metrics::Metrics;
use crate::status::{EmulatedView, MigrationKind};

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
    /// micro-batches of `micro_batch` samples): the emulated device's times, and the emulated
    /// model's parameters and output bytes (the narrow stand-in's are not what the emulated
    /// cluster moves). This is the only way the emulated costs reach the planner: as
    /// measurements. The host's time is not the device's: a node's probe runs cold, while every
    /// node of the host starts, and the planner's rates from probes that counted it were 0.77
    /// (8 nodes) and about half (32 nodes) of the emulated model's, where the same work in
    /// training fit the emulated times (1-2 % overrun). Real work that outlasts the emulated
    /// time in training is the pacer's overrun, counted, reported and checked, not a cost.
    pub fn measured(
        &self,
        real: &LayerCost,
        micro_batch: u32,
    ) -> Result<LayerCost, EmulationError> {
        let e = self
            .emulation
            .stage(real.layer..real.layer + 1, micro_batch, 1)?;
        let ms = |emulated: Duration| emulated.as_secs_f64() * 1e3;
        let (params, output_bytes) = self
            .emulation
            .layer_size(real.layer, micro_batch)
            .unwrap_or((real.param_count as f64, real.output_bytes as f64));
        Ok(LayerCost {
            param_count: params as usize,
            output_bytes: output_bytes as usize,
            forward_ms: ms(e.forward),
            backward_ms: ms(e.backward),
            optimizer_ms: ms(e.optimizer),
            ..real.clone()
        })
    }

    /// What timing a state fetch on this device's links finds, given what the real fetch of
    /// the narrow stand-in's state took (`real_secs`): the emulated state bytes over this
    /// node's emulated link ([`Emulation::fetch`]), the real fetch waited out to that time, as
    /// the pacer makes it; each source at the rate its link (within the zone or across)
    /// carried, unless the real fetch was slower. The rates the planner learns are the
    /// emulated links', not loopback's for a model a thousand times smaller.
    pub fn measured_fetch(
        &self,
        fetched: &[Fetched],
        real_secs: f64,
    ) -> Result<MeasuredFetch, EmulationError> {
        let (bytes, emulated) = self.emulation.fetch(fetched)?;
        let secs = emulated.max(real_secs);
        let (within, across) = self.emulation.fetch_rates(fetched)?;
        let real_rate = bytes / real_secs;
        Ok(MeasuredFetch {
            secs,
            rates: fetched
                .iter()
                .map(|f| {
                    let link = if f.across { across } else { within };
                    link.map_or(real_rate, |r| r.min(real_rate))
                })
                .collect(),
        })
    }
}

impl Pacing for Accelerator {
    fn step(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        replicas: u32,
        crossings: Crossings,
    ) -> Result<StepPacing<'_>, EmulationError> {
        let stage = self
            .emulation
            .stage_crossing(layers, micro_batch, replicas, crossings)?;
        Ok(StepPacing {
            clock: Some((stage, &self.pacer)),
        })
    }

    fn committed(&self, ended: u64) {
        self.pacer.received(ended);
    }

    fn optimizer(
        &self,
        layers: Range<usize>,
        micro_batch: u32,
        real: Duration,
    ) -> Result<(), EmulationError> {
        let emulated = self.emulation.stage(layers, micro_batch, 1)?;
        self.pacer.after(real, emulated.optimizer);
        Ok(())
    }

    /// Every change of plan after the job's start is paid ([`paced_on_the_device`]): the
    /// reactive strategy's as the checkpoint-restart system it stands for pays it, the others
    /// as Parcae's profiled rebuild of the groups (or restart) plus the state they moved.
    fn reconfiguration(&self, change: &Change<'_>, real: Duration) -> Result<(), EmulationError> {
        if !paced_on_the_device(change.previous, change.plan, change.next) {
            self.pacer.idled();
            return Ok(());
        }
        let to = ParallelConfig::new(change.plan.data_parallel, change.plan.pipeline_stages);
        let emulated = if change.reactive {
            self.emulation.reactive_restart(to, change.restart)?
        } else {
            let rebuild = if change.kind == MigrationKind::Restart {
                Rebuild::Restart
            } else if change.built {
                Rebuild::Stage
            } else {
                Rebuild::Groups
            };
            self.emulation.switch(
                to,
                change.restart,
                rebuild,
                &change.fetched,
                &change.restored,
            )?
        };
        self.pacer.after_reconfiguration(real, emulated);
        Ok(())
    }

    fn measured_layer(
        &self,
        real: LayerCost,
        micro_batch: u32,
    ) -> Result<LayerCost, EmulationError> {
        self.measured(&real, micro_batch)
    }

    fn measured_fetch(
        &self,
        fetched: &[Fetched],
        _: u64,
        real_secs: f64,
    ) -> Result<MeasuredFetch, EmulationError> {
        Accelerator::measured_fetch(self, fetched, real_secs)
    }

    fn allreduce_rate(&self) -> Option<f64> {
        Some(self.emulation.allreduce_rate())
    }

    fn boundary_link(&self, micro_batch: u32) -> Option<LinkTime> {
        Some(self.emulation.boundary_link(micro_batch))
    }

    fn report(&self, metrics: &Metrics) -> Option<EmulatedView> {
        let view = self.view();
        metrics.emulated_overruns.set(view.overrun_count);
        metrics
            .emulated_overrun_ms
            .set((view.overrun_secs * 1e3) as u64);
        metrics.emulated_busy_ms.set((view.busy_secs * 1e3) as u64);
        Some(view)
    }
}

/// Whether a move into `plan` brings in nodes that were not in `previous`, spares or new ones
/// (a full rendezvous in the restart cost of Parcae's migrations, spec 3.3).
pub fn restart_kind(previous: Option<&Plan>, plan: &Plan) -> RestartKind {
    let joined = plan
        .assignment
        .keys()
        .any(|n| previous.is_none_or(|p| !p.assignment.contains_key(n)));
    if joined {
        RestartKind::Add
    } else {
        RestartKind::Remove
    }
}

/// Whether the reactive baseline's restart into `plan` after `previous` rendezvouses with new
/// nodes: Parcae's throughput-optimised system restarts with a rendezvous when nodes arrived
/// since its last restart (or at the job's start), and without one after departures alone,
/// whichever nodes its new configuration takes (spec 5): a spare it takes in after a kill was
/// in the job already, and an arrival it leaves idle joined all the same. A member arrived
/// when its join came after `previous` was made (`Plan::joins_before`).
pub fn reactive_restart_kind(
    state: &ControlState,
    previous: Option<&Plan>,
    plan: &Plan,
) -> RestartKind {
    let arrived = previous.is_none_or(|p| {
        let joined_since = p.joins_before..plan.joins_before;
        state
            .members
            .values()
            .any(|m| joined_since.contains(&m.join_seq))
    });
    if arrived {
        RestartKind::Add
    } else {
        RestartKind::Remove
    }
}

/// Whether an emulated device pays for entering `plan` at step `next` after `previous`: every
/// change of plan after the job's start, a joiner's first one too (on the emulated cluster it
/// pays its rendezvous and fetch as the others pay theirs, and one that started at once would
/// wait out their pacing on its neighbours' links, past their timeout). Not the plan the node
/// was already in, entered again after an abandoned step: the emulated cluster retries a step
/// over the groups it has, and a reactive node that paid a whole restart for the retry (up to a
/// minute of emulated time, while the new plan that the failure brings waited behind it) paid
/// two restarts for one change, where the system it stands for pays one.
pub fn paced_on_the_device(previous: Option<&Plan>, plan: &Plan, next: u64) -> bool {
    next > 0 && previous.is_none_or(|p| p.epoch != plan.epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::NodeId;
    use parcae_consensus::state::StageSlot;

    fn cpu(layer: usize, ms: f64) -> LayerCost {
        LayerCost {
            layer,
            name: format!("layer{layer}"),
            forward_ms: ms,
            backward_ms: ms,
            optimizer_ms: ms,
            param_count: 12_704,
            param_bytes: 4 * 12_704,
            optimizer_state_bytes: 8 * 12_704,
            output_bytes: 256,
            activation_bytes: None,
        }
    }

    #[test]
    fn measuring_finds_the_emulated_layer_whatever_the_host_took() {
        let device = Accelerator::new(Emulation::new("gpt-1.5b", 2.0).unwrap());
        let block = device.measured(&cpu(5, 0.1), 1).unwrap();
        assert!((block.forward_ms - 6.51 / 2.0).abs() < 1e-9);
        assert!((block.backward_ms - 13.448 / 2.0).abs() < 1e-9);
        assert!((block.optimizer_ms - 2.117 / 2.0).abs() < 1e-9);
        assert_eq!(block.param_count, 30_740_800);
        assert_eq!(block.output_bytes, 1024 * 1600 * 4);
        assert_eq!(block.name, "layer5");
        // A host slower than the emulated GPU overruns when training; the planner prices the
        // device.
        let slow = device.measured(&cpu(5, 100.0), 1).unwrap();
        assert_eq!(slow.forward_ms, block.forward_ms);
        assert!(device.measured(&cpu(50, 0.1), 1).is_err());
        assert_eq!(device.view().busy_secs, 0.0);
    }

    #[test]
    fn a_commit_seen_late_is_owed_from_the_step_s_end() {
        let device = Accelerator::new(Emulation::new("gpt-1.5b", 2.0).unwrap());
        let pacer = device.pacer();
        pacer.after(Duration::ZERO, Duration::ZERO);
        let ended = pacer.stamp();
        // The host took 60 ms to commit the step: owed, not added to the emulated step.
        std::thread::sleep(Duration::from_millis(60));
        device.committed(ended);
        let now = crate::emulate::pacer::wall_nanos();
        let owed = Duration::from_nanos(now.saturating_sub(pacer.stamp()));
        assert!(owed >= Duration::from_millis(50), "{owed:?}");
    }

    #[test]
    fn timing_a_fetch_finds_the_emulated_link_unless_the_real_fetch_is_slower() {
        let device = Accelerator::new(Emulation::new("gpt-1.5b", 2.0).unwrap());
        let far = Fetched {
            layers: 3..5,
            across: true,
            beside: Vec::new(),
        };
        let fetched = [(1..3).into(), far.clone()];
        let (bytes, emulated) = device.emulation().fetch(&fetched).unwrap();
        // Two blocks from a source in the zone, two from one in another: the bytes add up and
        // all four arrive over this node's link, which takes longer than the two that cross
        // zones take over the slower link between them.
        let (near, near_secs) = device.emulation().fetch(&[(1..3).into()]).unwrap();
        let (_, far_secs) = device.emulation().fetch(&[far]).unwrap();
        let (_, four_secs) = device.emulation().fetch(&[(1..5).into()]).unwrap();
        assert!(far_secs > near_secs && four_secs > far_secs);
        assert!((emulated - four_secs).abs() < 1e-12);
        assert!((bytes - 2.0 * near).abs() < 1e-3);
        let quick = device.measured_fetch(&fetched, 0.001).unwrap();
        assert_eq!(quick.secs, emulated);
        assert_eq!(quick.rates, vec![near / near_secs, near / far_secs]);
        // About the profiled 10 Gb/s link within the zone and 5 Gb/s across, twice as fast at
        // time scale 2.
        assert!((1.5e9..3.0e9).contains(&quick.rates[0]), "{quick:?}");
        assert!((1.1e9..1.3e9).contains(&quick.rates[1]), "{quick:?}");
        let slow = device.measured_fetch(&fetched, 100.0).unwrap();
        assert_eq!(slow.secs, 100.0);
        assert_eq!(slow.rates, vec![bytes / 100.0; 2]);
        assert!(device.measured_fetch(&[(60..61).into()], 1.0).is_err());
    }

    fn plan(nodes: &[u64]) -> Plan {
        Plan {
            epoch: 1,
            data_parallel: 1,
            pipeline_stages: nodes.len() as u32,
            partition: (0..=nodes.len() as u32).collect(),
            assignment: nodes
                .iter()
                .enumerate()
                .map(|(s, &n)| {
                    let slot = StageSlot {
                        pipeline: 0,
                        stage: s as u32,
                    };
                    (NodeId(n), slot)
                })
                .collect(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        }
    }

    #[test]
    fn a_restart_adds_when_a_node_joined() {
        let before = plan(&[1, 2, 3]);
        assert_eq!(
            restart_kind(Some(&before), &plan(&[1, 2])),
            RestartKind::Remove
        );
        assert_eq!(
            restart_kind(Some(&before), &plan(&[3, 1, 2])),
            RestartKind::Remove
        );
        assert_eq!(
            restart_kind(Some(&before), &plan(&[1, 4])),
            RestartKind::Add
        );
        assert_eq!(restart_kind(None, &plan(&[1])), RestartKind::Add);
    }

    #[test]
    fn the_reactive_baseline_rendezvouses_when_nodes_arrived_whichever_nodes_it_takes() {
        let mut state = ControlState::default();
        let join = |state: &mut ControlState, k: u8| {
            let peer = parcae_consensus::state::PeerInfo {
                peer_id: vec![k],
                ..Default::default()
            };
            let node = NodeId::from_peer_bytes(&[k]);
            state
                .apply(&parcae_consensus::Command::Join { node, peer })
                .unwrap();
        };
        for k in 1..=4 {
            join(&mut state, k);
        }
        let known = |nodes: &[u64], joins_before: u64| Plan {
            joins_before,
            ..plan(nodes)
        };
        // Made when all four had joined: the first three train, the fourth is a spare.
        let before = known(&[1, 2, 3], 4);
        // A kill: the restart takes the spare in, without a rendezvous (spec 5), where a
        // liveput migration would rendezvous with it (spec 3.3).
        let after_kill = known(&[1, 2, 4], 4);
        assert_eq!(
            reactive_restart_kind(&state, Some(&before), &after_kill),
            RestartKind::Remove
        );
        assert_eq!(restart_kind(Some(&before), &after_kill), RestartKind::Add);
        // An arrival the restart leaves idle: a rendezvous all the same.
        join(&mut state, 5);
        let after_arrival = known(&[1, 2, 3], 5);
        assert_eq!(
            reactive_restart_kind(&state, Some(&before), &after_arrival),
            RestartKind::Add
        );
        assert_eq!(
            restart_kind(Some(&before), &after_arrival),
            RestartKind::Remove
        );
        // The job's start, or a joiner's first plan.
        assert_eq!(
            reactive_restart_kind(&state, None, &after_arrival),
            RestartKind::Add
        );
    }

    #[test]
    fn a_change_of_plan_is_paced_and_a_retry_of_the_same_plan_is_not() {
        let before = plan(&[1, 2, 3]);
        let mut after = plan(&[1, 2]);
        after.epoch = 2;
        // The job's start is free; a joiner's first plan and every change are paid.
        assert!(!paced_on_the_device(None, &before, 0));
        assert!(paced_on_the_device(None, &before, 5));
        assert!(paced_on_the_device(Some(&before), &after, 5));
        // The same plan again after an abandoned step.
        assert!(!paced_on_the_device(Some(&after), &after, 5));
    }

    #[test]
    fn a_retry_starts_from_idle_and_owes_nothing_from_the_step_it_abandoned() {
        let device = Accelerator::new(Emulation::new("gpt-1.5b", 2.0).unwrap());
        let pacer = device.pacer();
        pacer.after(Duration::ZERO, Duration::ZERO);
        // The abandoned step waited 80 ms for neighbours that never sent.
        std::thread::sleep(Duration::from_millis(80));
        let mut retried = plan(&[1, 2]);
        retried.epoch = 2;
        let change = Change {
            previous: Some(&retried),
            plan: &retried,
            next: 5,
            kind: MigrationKind::Intra,
            restart: RestartKind::Remove,
            built: false,
            reactive: false,
            fetched: Vec::new(),
            restored: Vec::new(),
        };
        device.reconfiguration(&change, Duration::ZERO).unwrap();
        // The retry's first 30 ms of work takes its 30 ms (owing the 80 it would take none).
        let started = std::time::Instant::now();
        pacer.after(Duration::ZERO, Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(29));
        assert_eq!(device.view().overrun_count, 0);
    }
}
