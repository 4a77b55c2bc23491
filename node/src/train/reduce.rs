//! How a step's gradients are averaged over the stage's replicas, under the job's sync mode
//! (issue 68):
//! * `step`: over every replica, every step (the plan's ring, or its all-reduce by zone);
//! * `diloco:H`: the replicas in one zone are a group. Every step averages gradients inside
//!   the zone only, then every replica of the stage meets the others in a barrier of one value
//!   (the training loss) by zone, so a committed step still means every group trained it and
//!   samples stay exactly-once. The first step of each round (a positive multiple of H) opens
//!   with the outer step: every replica's pseudo-gradient (its outer weights minus its
//!   weights) averaged over every replica, then DiLoCo's Nesterov step on the outer weights,
//!   which every replica continues from. Equal shares of the batch per replica make the mean
//!   over replicas the groups' average weighted by the samples they trained. A job's last step
//!   (under a step limit) closes the round it ends after its own update, so the job's result
//!   is the outer weights, the same in every group, whatever the limit is modulo H.

use parcae_model::{Collective, PipelineModel, Stage};
use parcae_outer::{OuterSettings, SyncMode, Wire};

use super::error::TrainError;
use super::neighbours::{Reach, RingCollective};
use super::waiter::Waiter;
use crate::dataplane::links::ReduceLink;
use crate::dataplane::protocol::Round;
use crate::emulate::{Reduction, StepPacing};
use crate::metrics::Metrics;

/// What a step's reduction spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSync {
    /// Every replica (`step`).
    Everywhere,
    /// The replica's zone, with the rounds between zones the step opens or ends with.
    InZone {
        /// The step opens with the outer step of the round its predecessors trained.
        opens_round: bool,
        /// The job's last step: its update is applied before the commit and the round it
        /// ends is closed after it, both tentative until the step commits.
        closes_job: bool,
    },
}

impl StepSync {
    /// Whether the step opens with a round's outer step.
    pub fn opens_round(self) -> bool {
        matches!(self, StepSync::InZone { opens_round, .. } if opens_round)
    }

    /// Whether the step is a DiLoCo job's last, which applies its update and then closes the
    /// round it ends, so the job ends on the outer weights in every group.
    pub fn closes_job(self) -> bool {
        matches!(self, StepSync::InZone { closes_job, .. } if closes_job)
    }

    /// Whether the step closes a round (and so changes the stage before it commits).
    pub fn rounds(self) -> bool {
        self.opens_round() || self.closes_job()
    }
}

/// What step `step` of a job synchronised by `sync` and limited to `max_steps` steps (0: no
/// limit) spans: under `diloco:H`, a round closes before steps H, 2H, ... (a job's step 0
/// starts the first round; an outer step with no inner step behind it would average nothing)
/// and after the job's last step.
pub fn step_sync(sync: SyncMode, step: u64, max_steps: u64) -> StepSync {
    match sync.inner_steps() {
        Some(h) => StepSync::InZone {
            opens_round: step > 0 && step.is_multiple_of(u64::from(h)),
            closes_job: max_steps > 0 && step + 1 == max_steps,
        },
        None => StepSync::Everywhere,
    }
}

/// What a step's all-reduces talk through, and how the device paces them.
pub(crate) struct ReduceIo<'w, 'l> {
    pub(crate) waiter: &'w Waiter<'w>,
    pub(crate) round: Round,
    pub(crate) metrics: &'l Metrics,
    pub(crate) pacing: StepPacing<'l>,
}

impl<'w, 'l> ReduceIo<'w, 'l> {
    fn over<'r>(&self, links: Reach<'r>) -> RingCollective<'w, 'r>
    where
        'l: 'r,
    {
        RingCollective {
            waiter: self.waiter,
            round: self.round,
            links,
            metrics: self.metrics,
            across: Wire::F32,
        }
    }
}

/// Closes a round at the stage: the pseudo-gradient averaged over every replica (`links`;
/// none when the stage has no replica; in the outer optimizer's wire form between zones, paced
/// as the emulated links take it), then the outer step, which the stage's weights become.
pub(crate) fn close_round<M: PipelineModel>(
    stage: &mut Stage<M>,
    links: Option<&mut ReduceLink>,
    io: &ReduceIo<'_, '_>,
    outer: &OuterSettings,
) -> Result<(), TrainError> {
    let mut mean = stage.pseudo_gradient()?;
    if let Some(links) = links {
        let mut all = io.over(Reach::Replicas(links)).across_as(outer.wire);
        io.pacing
            .collective(&mut all, Reduction::Round)
            .all_reduce_mean(&mut mean)?;
    }
    stage.outer_step(&mean, outer)?;
    Ok(())
}

/// Averages the stage's gradients over the replicas `sync` names (and, at the last stage, the
/// training loss over every replica); returns the mean loss at the last stage and the stage's
/// squared gradient norm.
pub(crate) fn reduce<M: PipelineModel>(
    stage: &mut Stage<M>,
    links: &mut ReduceLink,
    io: &ReduceIo<'_, '_>,
    sync: StepSync,
) -> Result<(Option<f64>, f64), TrainError> {
    let ReduceLink::ByZone(by_zone) = links else {
        // One ring: every replica, or under DiLoCo the one zone they share.
        let loss = reduce_gradients(stage, io.over(Reach::Replicas(links)), io.pacing)?;
        return Ok((loss, stage.grad_sq_norm()?));
    };
    if sync == StepSync::Everywhere {
        let loss = reduce_gradients(stage, io.over(Reach::Replicas(links)), io.pacing)?;
        return Ok((loss, stage.grad_sq_norm()?));
    }
    let replicas = by_zone.layout.replicas();
    let (loss, norm) = match by_zone.zone_ring.as_mut() {
        Some(ring) => {
            let loss = reduce_gradients(stage, io.over(Reach::Zone(ring)), io.pacing)?;
            (loss, stage.grad_sq_norm()?)
        }
        None => {
            io.pacing.reduced_alone();
            let totals = stage.step_totals()?;
            (totals.loss, totals.grad_sq_norm)
        }
    };
    let loss = barrier(loss, io.over(Reach::Replicas(links)), replicas)?;
    Ok((loss, norm))
}

/// Every replica of the stage meets the others once (a step no group finished commits
/// nowhere), bringing the mean of the replicas' losses at the last stage.
fn barrier(
    loss: Option<f64>,
    mut all: RingCollective<'_, '_>,
    replicas: usize,
) -> Result<Option<f64>, TrainError> {
    // A length at which every zone's parts of the all-reduce by zone hold values.
    let mut values = vec![0.0f32; replicas * replicas];
    values[0] = loss.unwrap_or_default() as f32;
    all.all_reduce_mean(&mut values)?;
    Ok(loss.map(|_| f64::from(values[0])))
}

/// Averages the stage's gradients over `ring`'s replicas (and, at the last stage, the
/// training loss with them); returns the mean loss at the last stage.
fn reduce_gradients<M: PipelineModel>(
    stage: &mut Stage<M>,
    mut ring: RingCollective<'_, '_>,
    pacing: StepPacing<'_>,
) -> Result<Option<f64>, TrainError> {
    let loss = stage.step_loss()?;
    let mut values: Vec<f32> = stage
        .export_grads()?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if let Some(loss) = loss {
        values.push(loss as f32);
    }
    pacing
        .collective(&mut ring, Reduction::Gradients)
        .all_reduce_mean(&mut values)?;
    let loss = loss.map(|_| f64::from(values.pop().unwrap_or_default()));
    let mut bytes = Vec::with_capacity(values.len() * 4);
    values
        .iter()
        .for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
    stage.import_grads(&bytes)?;
    Ok(loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_close_before_every_positive_multiple_of_h_and_after_the_last_step() {
        assert_eq!(step_sync(SyncMode::Step, 20, 21), StepSync::Everywhere);
        let diloco = SyncMode::Diloco(20);
        let opens = |k| step_sync(diloco, k, 0).opens_round();
        assert!(!opens(0), "step 0 starts the first round");
        assert!(!opens(19) && opens(20) && !opens(21) && opens(40));
        assert!((1..20).all(|k| step_sync(SyncMode::Diloco(1), k, 0).rounds()));
        let at = |k, limit| step_sync(diloco, k, limit);
        assert!(!at(21, 0).rounds(), "no limit, no closing round");
        assert_eq!(
            at(22, 23),
            StepSync::InZone {
                opens_round: false,
                closes_job: true
            }
        );
        assert_eq!(
            at(40, 41),
            StepSync::InZone {
                opens_round: true,
                closes_job: true
            },
            "a limit of kH + 1: the last step opens a round of its own and closes it"
        );
        assert!(!at(21, 23).rounds());
    }
}
