//! One training step of this node's stage across processes: 1F1B over the pipeline links, the
//! gradient all-reduce on the ring, and the global clipping norm (with the stages' digests)
//! along the pipeline. The optimizer update is not part of it: it is applied only once the
//! step has committed in raft (see the worker), so a step abandoned half-way changes nothing.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use parcae_consensus::ControlState;
use parcae_consensus::state::{Digest32, StageSlot};
use parcae_model::{
    Collective, Dataset, MicroBatches, PipelineModel, Sampler, Stage, StagePosition,
    run_one_f_one_b, token_batch,
};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::TrainError;
use super::neighbours::{LinkNeighbours, RingCollective, Side};
use crate::dataplane::DataplaneError;
use crate::dataplane::links::EpochLinks;
use crate::dataplane::protocol::{MsgKind, Round, norm_up_payload, parse_norm, parse_norm_up};
use crate::emulate::{Accelerator, PacedCollective, PacedNeighbours};

/// Runs `f` on the trainer's runtime for at most `limit` (the timer is created inside the
/// runtime, which tokio requires).
pub fn block_on_timeout<F: std::future::Future>(
    rt: &Runtime,
    limit: Duration,
    f: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    rt.block_on(async { tokio::time::timeout(limit, f).await })
}

/// Where samples come from.
pub struct DataSource {
    /// The dataset (its training split when the job holds samples out).
    pub dataset: Arc<dyn Dataset>,
    /// Global sample index -> example.
    pub sampler: Sampler,
    /// The held-out samples the validation loss is measured on, if the job has them.
    pub validation: Option<Validation>,
}

/// Held-out samples and when pipeline 0 evaluates them.
pub struct Validation {
    /// The validation split: examples no step trains.
    pub dataset: Arc<dyn Dataset>,
    /// Its order; evaluations take its first `samples`, the same ones every time.
    pub sampler: Sampler,
    /// Steps that are multiples of this evaluate, after their training micro-batches.
    pub every: u64,
    /// Samples evaluated each time.
    pub samples: u32,
}

impl Validation {
    /// The held-out micro-batches of step `step` (none when it does not evaluate).
    pub fn micro_batches(&self, step: u64, micro_batch: u32) -> Vec<Range<u64>> {
        if self.every == 0 || !step.is_multiple_of(self.every) {
            return Vec::new();
        }
        micro_batches(0..u64::from(self.samples), micro_batch)
    }
}

/// What one step is: the plan's shape, this node's slot and the samples.
#[derive(Debug, Clone, Copy)]
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
    /// This stage's state digest before the step, when known for free (the step starts from a
    /// checkpoint this node just saved); the step is audited only when every stage knows it.
    pub digest: Option<Digest32>,
}

/// The samples of pipeline `d`: the global batch cut into `D` contiguous near-equal shares.
pub fn pipeline_share(start: u64, batch: u32, d: u32, pipelines: u32) -> Range<u64> {
    let (base, extra) = (u64::from(batch / pipelines), u64::from(batch % pipelines));
    let d = u64::from(d);
    let first = start + d * base + d.min(extra);
    first..first + base + u64::from(d < extra)
}

/// A share cut into micro-batches of at most `size` samples.
pub fn micro_batches(share: Range<u64>, size: u32) -> Vec<Range<u64>> {
    let size = u64::from(size.max(1));
    (share.start..share.end)
        .step_by(size as usize)
        .map(|s| s..(s + size).min(share.end))
        .collect()
}

/// The step's result at this node, before the optimizer update.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Sum over stages of the squared gradient norms (after the all-reduce).
    pub global_sq_norm: f64,
    /// At the last stage of pipeline 0: what to commit.
    pub report: Option<StepReport>,
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
}

/// What a step talks to: its links, the data, the runtime, the replicated state.
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
    /// The emulated accelerator the step is paced to, if any.
    pub accelerator: Option<&'a Accelerator>,
}

/// Waits on the network for one step: gives up after the timeout, or as soon as the replicated
/// state names another plan (a neighbour that is gone will not answer, and the new plan needs
/// this node's state now).
pub(crate) struct Waiter<'a> {
    rt: &'a Runtime,
    timeout: Duration,
    view: watch::Receiver<Arc<ControlState>>,
    epoch: u64,
    step: u64,
}

impl<'a> Waiter<'a> {
    /// Waits for work of `step` under the plan of `epoch`, for at most `timeout`.
    pub(crate) fn new(
        rt: &'a Runtime,
        timeout: Duration,
        view: watch::Receiver<Arc<ControlState>>,
        epoch: u64,
        step: u64,
    ) -> Self {
        Self {
            rt,
            timeout,
            view,
            epoch,
            step,
        }
    }

    /// Runs `f` until it finishes, the timeout passes or a newer plan appears.
    pub(crate) fn wait<T, E>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, TrainError>
    where
        TrainError: From<E>,
    {
        let mut view = self.view.clone();
        let epoch = self.epoch;
        self.rt.block_on(async {
            let superseded = async {
                let newer = view.wait_for(|s| s.plan.as_ref().map(|p| p.epoch) != Some(epoch));
                if newer.await.is_err() {
                    // The control driver is gone: only the timeout ends the wait.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = tokio::time::timeout(self.timeout, f) => match r {
                    Ok(r) => r.map_err(TrainError::from),
                    Err(_) => Err(DataplaneError::Timeout(format!("{what} of step {}", self.step)).into()),
                },
                () = superseded => Err(TrainError::Superseded(self.step)),
            }
        })
    }
}

/// Runs forward and backward of the step and combines gradients and norms with the other
/// nodes. On failure the stage is left as before the step (nothing in flight, no gradient).
pub fn run<M: PipelineModel>(
    io: &mut StepIo<'_>,
    stage: &mut Stage<M>,
    spec: &StepSpec,
) -> Result<StepResult, TrainError> {
    let result = run_inner(io, stage, spec);
    if result.is_err() {
        stage.abort_in_flight();
        stage.clear_grads();
    }
    result
}

fn run_inner<M: PipelineModel>(
    io: &mut StepIo<'_>,
    stage: &mut Stage<M>,
    spec: &StepSpec,
) -> Result<StepResult, TrainError> {
    let (data, digest) = (io.data, spec.digest);
    let w = Waiter::new(io.rt, io.timeout, io.view.clone(), spec.epoch, spec.step);
    let round = Round {
        epoch: spec.epoch,
        step: spec.step,
    };
    let (s, p) = (spec.slot.stage, spec.stages);
    let position = StagePosition {
        stage: s as usize,
        stages: p as usize,
    };
    let (first, last) = (position.is_first(), position.is_last());
    let share = pipeline_share(
        spec.sample_start,
        spec.global_batch,
        spec.slot.pipeline,
        spec.data_parallel,
    );
    if share.is_empty() {
        return Err(TrainError::Config(format!(
            "{} pipelines for a batch of {}",
            spec.data_parallel, spec.global_batch
        )));
    }
    let mbs = micro_batches(share, spec.micro_batch);
    let count = mbs.len();
    // Pipeline 0 evaluates the held-out samples after its training micro-batches.
    let held_out = match &data.validation {
        Some(v) if spec.slot.pipeline == 0 => v.micro_batches(spec.step, spec.micro_batch),
        _ => Vec::new(),
    };
    let device = stage.device().clone();
    let mut batches = MicroBatches {
        count,
        evaluate: held_out.len(),
        batch: |i: usize| {
            let (source, sampler, r) = match (i.checked_sub(count), &data.validation) {
                (Some(j), Some(v)) => (&v.dataset, &v.sampler, &held_out[j]),
                _ => (&data.dataset, &data.sampler, &mbs[i]),
            };
            Ok(token_batch(
                source.as_ref(),
                sampler,
                r.start,
                (r.end - r.start) as usize,
                &device,
            )?)
        },
        weight: |i: usize| match (i.checked_sub(count), &data.validation) {
            (Some(j), Some(v)) => {
                let r = &held_out[j];
                ((r.end - r.start) as f64 / f64::from(v.samples)) as f32
            }
            _ => {
                let r = &mbs[i];
                ((r.end - r.start) as f64 * f64::from(spec.data_parallel)
                    / f64::from(spec.global_batch)) as f32
            }
        },
    };
    let links = &mut *io.links;
    let mut neighbours = LinkNeighbours {
        waiter: &w,
        round,
        prev: links.prev.as_mut(),
        next: links.next.as_mut(),
    };
    let emulated = match io.accelerator {
        Some(device) => Some((
            device.pacer(),
            device
                .emulation()
                .stage(stage.layer_range(), spec.micro_batch, spec.data_parallel)?,
        )),
        None => None,
    };
    let losses = match emulated {
        Some((pacer, costs)) => run_one_f_one_b(
            stage,
            &mut PacedNeighbours::new(&mut neighbours, costs, pacer),
            position,
            &mut batches,
        )?,
        None => run_one_f_one_b(stage, &mut neighbours, position, &mut batches)?,
    };
    let mut loss = losses.train;
    let validation_loss = (!held_out.is_empty()).then_some(losses.validation);
    if let Some(ring) = links.ring.as_mut() {
        let mut values: Vec<f32> = stage
            .export_grads()?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if last {
            values.push(loss as f32);
        }
        let mut collective = RingCollective {
            waiter: &w,
            round,
            ring,
        };
        match emulated {
            Some((pacer, costs)) => {
                PacedCollective::new(&mut collective, costs, pacer).all_reduce_mean(&mut values)?
            }
            None => collective.all_reduce_mean(&mut values)?,
        }
        if last {
            loss = f64::from(values.pop().unwrap_or_default());
        }
        let mut bytes = Vec::with_capacity(values.len() * 4);
        values
            .iter()
            .for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
        stage.import_grads(&bytes)?;
    }
    // The global norm: partial sums (and digests) towards the last stage, the total back.
    let local = stage.grad_sq_norm();
    let (partial, mut digests) = if first {
        (0.0, Vec::new())
    } else {
        let up = neighbours.recv(Side::Prev, MsgKind::NormUp, 0)?;
        parse_norm_up(&up, s as usize)?
    };
    match digest {
        Some(d) if digests.len() == s as usize => digests.push(d),
        _ => digests.clear(),
    }
    let partial = partial + local;
    let total = if last {
        partial
    } else {
        neighbours.send(
            Side::Next,
            MsgKind::NormUp,
            0,
            &norm_up_payload(partial, &digests),
        )?;
        parse_norm(&neighbours.recv(Side::Next, MsgKind::NormDown, 0)?)?
    };
    if !first {
        neighbours.send(Side::Prev, MsgKind::NormDown, 0, &total.to_le_bytes())?;
    }
    Ok(StepResult {
        global_sq_norm: total,
        report: (last && spec.slot.pipeline == 0).then_some(StepReport {
            loss,
            validation_loss,
            stage_digests: digests,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_batch_exactly_once() {
        for d in 1..6u32 {
            let shares: Vec<_> = (0..d).map(|i| pipeline_share(100, 16, i, d)).collect();
            assert_eq!(shares[0].start, 100);
            assert_eq!(shares.last().unwrap().end, 116);
            assert!(shares.windows(2).all(|w| w[0].end == w[1].start));
        }
        assert_eq!(
            micro_batches(0..5, 2),
            vec![0..2, 2..4, 4..5],
            "the last micro-batch takes the rest"
        );
    }
}

#[cfg(test)]
mod wire_tests {
    use std::sync::Arc;

    use burn::tensor::{Device, Tensor};
    use libp2p::identity::Keypair;
    use parcae_model::{Activation, Gpt, GptConfig, StageConfig, SyntheticTask, WireDType};

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
            digest: None,
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
            ring: None,
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
            accelerator: None,
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
