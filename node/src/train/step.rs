//! One training step of this node's stage across processes: under DiLoCo a round's outer step
//! first when one is due, 1F1B over the pipeline links, the gradient all-reduce
//! ([`super::reduce`]), and the global clipping norm (with the stages' digests) along the
//! pipeline, each paced by the device ([`crate::emulate::Pacing`]). The optimizer
//! update is not part of it: it is applied only once the step has committed in raft (see
//! [`super::commit`]), so a step abandoned half-way changes nothing. The one exception, a
//! DiLoCo job's last step, applies its update and closes the round after it, keeping the
//! stage's state from before the step to put back if it does not commit.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parcae_consensus::ControlState;
use parcae_consensus::state::{Digest32, StageSlot};
use parcae_model::{
    Batch, MicroBatches, PipelineModel, Stage, StagePosition, run_one_f_one_b, token_batch,
};
use parcae_outer::{OuterSettings, SyncMode};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::error::TrainError;
use super::neighbours::{LinkNeighbours, Side};
use super::reduce::{ReduceIo, StepSync, close_round, reduce, step_sync};
use super::samples::{DataSource, micro_batches, pipeline_share};
use super::waiter::Waiter;
use crate::dataplane::links::EpochLinks;
use crate::dataplane::protocol::{MsgKind, NormUp, Round, parse_norm};
use crate::emulate::{Crossings, Pacing, StepPacing};
use crate::metrics::Metrics;

/// What one step is: the plan's shape, this node's slot and the samples.
#[derive(Debug, Clone)]
pub struct StepSpec {
    /// Plan epoch.
    pub epoch: u64,
    /// Training step.
    pub step: u64,
    /// This node's slot.
    pub slot: StageSlot,
    /// D.
    pub data_parallel: u32,
    /// P.
    pub stages: u32,
    /// First sample of the step (the replicated cursor).
    pub sample_start: u64,
    /// Samples in the step.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// The plan's samples per pipeline where they differ (empty: an even cut).
    pub batch_shares: Vec<u32>,
    /// This stage's state digest before the step, when known for free (the step starts from a
    /// checkpoint this node just saved); the step is audited only when every stage knows it.
    pub digest: Option<Digest32>,
    /// Its transfers that leave its zone.
    pub crossings: Crossings,
    /// Replicas the step averages its gradients with, itself included (D, or under DiLoCo its
    /// zone's), as the device paces the all-reduce.
    pub step_replicas: u32,
    /// How replicas in different zones agree.
    pub sync: SyncMode,
    /// DiLoCo's outer optimizer.
    pub outer: OuterSettings,
    /// The job's step limit (0: none): under DiLoCo its last step closes a round.
    pub max_steps: u64,
}

/// The step's result at this node, before the optimizer update.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Sum over stages of the squared gradient norms (after the all-reduce).
    pub global_sq_norm: f64,
    /// At the last stage of pipeline 0: what to commit.
    pub report: Option<StepReport>,
    /// Where the step ended on an emulated device's timeline ([`StepPacing::stamp`]).
    pub ended: Option<u64>,
    /// The stage's state before a round's outer step (the step that closed one): put back if
    /// the step does not commit, so a round's result stands only with its step.
    pub before_round: Option<Vec<u8>>,
    /// The optimizer update was applied in the step (a DiLoCo job's last step, whose closing
    /// round follows it): the commit must not apply it again.
    pub applied: bool,
}

/// What the last stage of pipeline 0 reports of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The mean training loss over every pipeline.
    pub loss: f64,
    /// The loss on the held-out samples, on the steps that evaluate them.
    pub validation_loss: Option<f64>,
    /// Every stage's digest (none when some stage had none).
    pub stage_digests: Vec<Digest32>,
    /// Every stage's outer weights' digest after the round the step opened (none on other
    /// steps).
    pub outer_digests: Vec<Digest32>,
}

/// What a step talks to: its links, the data, the runtime, the replicated state, the device.
pub struct StepIo<'a> {
    /// The links of the epoch.
    pub links: &'a mut EpochLinks,
    /// The runtime the data plane runs on.
    pub rt: &'a Runtime,
    /// Where samples come from.
    pub data: &'a DataSource,
    /// Time a neighbour may take.
    pub timeout: Duration,
    /// The replicated state: a newer plan ends a step that waits on a neighbour at once.
    pub view: watch::Receiver<Arc<ControlState>>,
    /// How the device's time passes.
    pub pacing: &'a dyn Pacing,
    /// The node's metrics (what the all-reduce sends).
    pub metrics: &'a Metrics,
}

/// Runs forward and backward of the step and combines gradients and norms with the other
/// nodes. On failure the stage is left as before the step (nothing in flight, no gradient).
pub fn run<M: PipelineModel>(
    io: &mut StepIo<'_>,
    stage: &mut Stage<M>,
    spec: &StepSpec,
) -> Result<StepResult, TrainError> {
    let sync = step_sync(spec.sync, spec.step, spec.max_steps);
    if sync != StepSync::Everywhere && !stage.has_outer() {
        stage.begin_outer()?;
    }
    let before_round = sync
        .rounds()
        .then(|| stage.export_state(stage.layer_range()))
        .transpose()?;
    match run_inner(io, stage, spec, sync) {
        Ok(result) => Ok(StepResult {
            before_round,
            ..result
        }),
        Err(e) => {
            stage.abort_in_flight();
            stage.clear_grads();
            if let Some(before) = before_round {
                stage.import_state(&before, stage.layer_range())?;
            }
            Err(e)
        }
    }
}

fn run_inner<M: PipelineModel>(
    io: &mut StepIo<'_>,
    stage: &mut Stage<M>,
    spec: &StepSpec,
    sync: StepSync,
) -> Result<StepResult, TrainError> {
    let w = Waiter::new(io.rt, io.timeout, io.view.clone(), spec.epoch, spec.step);
    let round = Round {
        epoch: spec.epoch,
        step: spec.step,
    };
    let position = StagePosition {
        stage: spec.slot.stage as usize,
        stages: spec.stages as usize,
    };
    let samples = StepSamples::of(io.data, spec)?;
    let device = stage.device().clone();
    let mut batches = MicroBatches {
        count: samples.train.len(),
        evaluate: samples.held_out.len(),
        batch: |i: usize| samples.batch(i, &device),
        weight: |i: usize| samples.weight(i),
    };
    let pacing = io.pacing.step(
        stage.layer_range(),
        spec.micro_batch,
        spec.step_replicas,
        spec.crossings,
    )?;
    let links = &mut *io.links;
    let reduce_io = ReduceIo {
        waiter: &w,
        round,
        metrics: io.metrics,
        pacing,
    };
    let outer = if sync.opens_round() {
        close_round(stage, links.reduce.as_mut(), &reduce_io, &spec.outer)?;
        stage.outer_digest()
    } else {
        None
    };
    let began = Instant::now();
    let mut neighbours = LinkNeighbours {
        waiter: &w,
        round,
        prev: links.prev.as_mut(),
        next: links.next.as_mut(),
    };
    let validation = run_one_f_one_b(
        stage,
        &mut pacing.neighbours(&mut neighbours),
        position,
        &mut batches,
    )?;
    let scheduled = began.elapsed();
    let validation_loss = (!samples.held_out.is_empty()).then_some(validation);
    // Where gradients cross a ring they are read once (joined on the device), then the loss,
    // then the reduced norm; else the norm and the loss are the step's one read.
    let (reduced_loss, local) = match links.reduce.as_mut() {
        Some(links) => reduce(stage, links, &reduce_io, sync)?,
        None => {
            pacing.reduced_alone();
            let totals = stage.step_totals()?;
            (totals.loss, totals.grad_sq_norm)
        }
    };
    let reduced = began.elapsed();
    let ours = (local, outer);
    let up = global_norm(&mut neighbours, ours, spec, position, pacing)?;
    let global_sq_norm = up.partial;
    let applied = sync.closes_job();
    if applied {
        stage.optimizer_step(global_sq_norm)?;
        close_round(stage, links.reduce.as_mut(), &reduce_io, &spec.outer)?;
    }
    let last = position.is_last();
    // Where a step's wall time goes outside its paced work: the exchanges after the schedule
    // wait on every replica and every stage, and on the emulated accelerator on the host too.
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        step = spec.step,
        schedule_ms = ms(scheduled),
        all_reduce_ms = ms(reduced - scheduled),
        norm_ms = ms(began.elapsed() - reduced),
        "step parts"
    );
    Ok(StepResult {
        global_sq_norm,
        report: (last && spec.slot.pipeline == 0).then(|| StepReport {
            loss: reduced_loss.unwrap_or_default(),
            validation_loss,
            stage_digests: up.digests,
            outer_digests: up.outer,
        }),
        ended: pacing.stamp(),
        before_round: None,
        applied,
    })
}

/// The samples of one step at this node: its pipeline's training micro-batches, then the
/// held-out ones pipeline 0 evaluates after them.
struct StepSamples<'a> {
    data: &'a DataSource,
    train: Vec<Range<u64>>,
    held_out: Vec<Range<u64>>,
    /// The share of the global batch each training sample stands for, times its samples.
    data_parallel: u32,
    global_batch: u32,
}

impl<'a> StepSamples<'a> {
    fn of(data: &'a DataSource, spec: &StepSpec) -> Result<Self, TrainError> {
        let share = pipeline_share(
            spec.sample_start,
            spec.global_batch,
            (spec.slot.pipeline, spec.data_parallel),
            &spec.batch_shares,
        );
        if share.is_empty() {
            return Err(TrainError::Config(format!(
                "{} pipelines (shares {:?}) for a batch of {}",
                spec.data_parallel, spec.batch_shares, spec.global_batch
            )));
        }
        let held_out = match &data.validation {
            Some(v) if spec.slot.pipeline == 0 => v.micro_batches(spec.step, spec.micro_batch),
            _ => Vec::new(),
        };
        Ok(Self {
            data,
            train: micro_batches(share, spec.micro_batch),
            held_out,
            data_parallel: spec.data_parallel,
            global_batch: spec.global_batch,
        })
    }

    /// Micro-batch `i`: a training one, or past them a held-out one.
    fn batch(&self, i: usize, device: &burn::tensor::Device) -> Result<Batch, TrainError> {
        let (source, sampler, r) = match (i.checked_sub(self.train.len()), &self.data.validation) {
            (Some(j), Some(v)) => (&v.dataset, &v.sampler, &self.held_out[j]),
            _ => (&self.data.dataset, &self.data.sampler, &self.train[i]),
        };
        Ok(token_batch(
            source.as_ref(),
            sampler,
            r.start,
            (r.end - r.start) as usize,
            device,
        )?)
    }

    /// The scale of micro-batch `i`'s loss: its share of the global batch (of the held-out
    /// samples for a held-out one).
    fn weight(&self, i: usize) -> f32 {
        match (i.checked_sub(self.train.len()), &self.data.validation) {
            (Some(j), Some(v)) => {
                let r = &self.held_out[j];
                ((r.end - r.start) as f64 / f64::from(v.samples)) as f32
            }
            _ => {
                let r = &self.train[i];
                ((r.end - r.start) as f64 * f64::from(self.data_parallel)
                    / f64::from(self.global_batch)) as f32
            }
        }
    }
}

/// The global norm: partial sums (and digests) towards the last stage, the total back, each
/// message stamped on an emulated device. `ours`: this stage's squared norm and, on a step
/// that opened a round, its outer weights' digest. Returns the total in `partial` and, at the
/// last stage, every stage's state digest (none when some stage had none) and outer digest.
fn global_norm(
    neighbours: &mut LinkNeighbours<'_, '_>,
    (local_sq_norm, outer): (f64, Option<Digest32>),
    spec: &StepSpec,
    position: StagePosition,
    pacing: StepPacing<'_>,
) -> Result<NormUp, TrainError> {
    let s = spec.slot.stage as usize;
    let (first, last) = (position.is_first(), position.is_last());
    let mut up = if first {
        NormUp::default()
    } else {
        let bytes = pacing.unstamped(neighbours.recv(Side::Prev, MsgKind::NormUp, 0)?)?;
        NormUp::parse(&bytes, s, outer.is_some())?
    };
    match spec.digest {
        Some(d) if up.digests.len() == s => up.digests.push(d),
        _ => up.digests.clear(),
    }
    up.outer.extend(outer);
    up.partial += local_sq_norm;
    if !last {
        let bytes = pacing.stamped(up.payload());
        neighbours.send(Side::Next, MsgKind::NormUp, 0, &bytes)?;
        up.partial =
            parse_norm(&pacing.unstamped(neighbours.recv(Side::Next, MsgKind::NormDown, 0)?)?)?;
    }
    if !first {
        let down = pacing.stamped(up.partial.to_le_bytes().to_vec());
        neighbours.send(Side::Prev, MsgKind::NormDown, 0, &down)?;
    }
    Ok(up)
}

#[cfg(test)]
mod wire_tests {
    use std::sync::Arc;

    use burn::tensor::{Device, Tensor};
    use libp2p::identity::Keypair;
    use parcae_model::{
        Activation, Dataset, Gpt, GptConfig, Sampler, StageConfig, SyntheticTask, WireDType,
    };

    use super::*;
    use crate::dataplane::links::PipeLink;
    use crate::dataplane::protocol::Header;
    use crate::dataplane::{accept, connect};
    use crate::key::ClusterKey;

    /// A neighbour that sends an activation of the wrong shape costs the step, not the process:
    /// the step fails with a typed error and the stage is left with nothing in flight.
    #[test]
    fn an_activation_of_the_wrong_shape_is_refused() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let key = ClusterKey::generate();
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let b_id = b.public().to_peer_id();
        let (ours, mut theirs) = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let k = key.clone();
            let server = tokio::spawn(async move {
                let (s, _) = l.accept().await.unwrap();
                accept(s, &b, &[k], |_| async { true }).await.unwrap().1
            });
            let theirs = connect(addr, &a, b_id, &[key]).await.unwrap();
            (server.await.unwrap(), theirs)
        });
        let cfg = GptConfig::tiny();
        let model = Arc::new(Gpt::new(cfg.clone()).unwrap());
        let device = Device::flex();
        let mut stage = Stage::new(model, 1..4, 1, &device, StageConfig::default()).unwrap();
        let spec = StepSpec {
            epoch: 3,
            step: 0,
            slot: StageSlot {
                pipeline: 0,
                stage: 1,
            },
            data_parallel: 1,
            stages: 2,
            sample_start: 0,
            global_batch: 2,
            micro_batch: 2,
            batch_shares: Vec::new(),
            digest: None,
            crossings: Crossings::default(),
            step_replicas: 1,
            sync: SyncMode::Step,
            outer: OuterSettings::default(),
            max_steps: 0,
        };
        // Hidden states with 7 features where the model has 32.
        let wrong = Activation::Hidden(Tensor::zeros([2, cfg.seq_len, 7], &device))
            .to_wire(WireDType::F32)
            .unwrap();
        let tag = Header {
            kind: MsgKind::Activation,
            round: Round { epoch: 3, step: 0 },
            seq: 0,
        };
        rt.block_on(theirs.send(&tag.frame(&wrong))).unwrap();
        let mut links = EpochLinks {
            epoch: 3,
            prev: Some(rt.block_on(async { PipeLink::new(ours) })),
            next: None,
            reduce: None,
        };
        let task = SyntheticTask::default_for(1, cfg.vocab_size, cfg.seq_len).unwrap();
        let data = DataSource {
            sampler: Sampler::new(1, task.len()).unwrap(),
            dataset: Arc::new(task),
            validation: None,
        };
        let state = ControlState {
            plan: Some(parcae_consensus::state::Plan {
                epoch: 3,
                data_parallel: 1,
                pipeline_stages: 2,
                partition: vec![0, 1, 4],
                assignment: Default::default(),
                at_step: 0,
                joins_before: 0,
                batch_shares: Vec::new(),
                all_reduce: Default::default(),
            }),
            ..ControlState::default()
        };
        let (_keep, view) = watch::channel(Arc::new(state));
        let mut io = StepIo {
            links: &mut links,
            rt: &rt,
            data: &data,
            timeout: Duration::from_secs(5),
            view,
            pacing: &crate::emulate::RealTime,
            metrics: &Metrics::default(),
        };
        let err = run(&mut io, &mut stage, &spec).unwrap_err();
        assert!(matches!(err, TrainError::Model(_)), "{err}");
        assert!(
            err.to_string().contains('7'),
            "the error names the shape: {err}"
        );
        assert_eq!(stage.in_flight(), 0);
    }
}
