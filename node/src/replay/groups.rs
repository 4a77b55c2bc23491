//! A DiLoCo history replayed (issue 68). Between rounds each group (a zone's replicas of the
//! step, `StepRecord::groups`) trains apart, so the replay keeps one model per group: each
//! trains its pipelines' shares of every step as its replicas did, each pipeline's gradient on
//! its own and their f32 sum scaled as the zone's ring takes their mean; a step that opens a
//! round first takes the outer step on every group along the mean of the pseudo-gradients over
//! the step's replicas, summed zone by zone in f32 as the all-reduce by zone sums them, and a
//! job's last step closes one more after its update. Summed in the cluster's order, the replay
//! is exact (a steady two-zone run: 48 windows, every weight equal); in another order, DiLoCo
//! grows the roundings past any useful tolerance (AdamW on a group's few samples, the outer
//! momentum). The checkpoint a window ends at holds pipeline 0's group (pipeline 0's replicas
//! write it): that group is compared with it.
//!
//! Each group's model is cut into the stages of the step's plan (`StepRecord::partition`): each
//! stage's ring averages its own buffer, and the norm is the stages' sum in stage order.
//!
//! A window needs every group's state at its start: the seeded start, a checkpoint the cluster
//! rolled back to (every group resumed from it), or a checkpoint that holds every group's state
//! (the first replica of each stage in every other zone stores its group's with it). When the
//! plan changes, a slot takes its layers from a holder of its zone where one holds them, else
//! from any holder: where one group trained before the change, every group after it holds that
//! group's state (a cluster whose second zone joins after it began); among several, the steps
//! do not record whose state each group took (a zone whose holders all died takes another's).
//! That, and a rollback inside a window (every group then took one group's state), skip the
//! window, with the reason.

use std::collections::BTreeMap;
use std::ops::Range;

use anyhow::{Context as _, bail, ensure};
use parcae_api::{StepGroup, StepRecord};
use parcae_consensus::state::CutPart;
use parcae_model::{Pipeline, PipelineModel};

use super::replayer::{Replayer, WindowResult};
use super::windows::{Plan, Window};
use crate::dataplane::collective::{ZoneLayout, mean_by_zone_in_process, ring_mean_in_process};
use crate::train::reduce::step_sync;

/// Moves the windows of `plan` (over `steps`) that a replay by groups cannot train to its
/// skipped ones, with why.
pub(super) fn keep_replayable(plan: &mut Plan, steps: &[StepRecord]) {
    let first = steps.first().map_or(0, |r| r.step);
    for w in std::mem::take(&mut plan.windows) {
        let at = (w.steps.start - first) as usize;
        let records = &steps[at..(w.steps.end - first) as usize];
        let before = at.checked_sub(1).map(|i| &steps[i]);
        match why_not(&w, records, before) {
            None => plan.windows.push(w),
            Some(why) => {
                plan.skipped.push(format!("steps {:?}: {why}", w.steps));
                plan.not_replayed += w.steps.end - w.steps.start;
            }
        }
    }
}

/// Where each group's model comes from at a window's start.
#[derive(Debug, PartialEq)]
pub(super) enum Starts<'w> {
    /// Every group from the window's start: the seeded start, or a checkpoint every group
    /// resumed from (the cluster rolled back to it).
    Shared,
    /// Each group that trained the checkpoint's step from its state in the checkpoint, by
    /// zone: the cut's own parts (pipeline 0's group, `None`), or the group's.
    ByGroup(Vec<(&'w str, Option<&'w [CutPart]>)>),
}

/// Where each group's model comes from at the start of window `w` over `records` (`before`:
/// the step before it, which the checkpoint it starts from ends with), or why that is not
/// known.
pub(super) fn starts<'w>(
    w: &'w Window,
    records: &[StepRecord],
    before: Option<&'w StepRecord>,
) -> Result<Starts<'w>, String> {
    let (Some(cut), Some(first)) = (&w.from, records.first()) else {
        return Ok(Starts::Shared);
    };
    if first.history != cut.history {
        return Ok(Starts::Shared);
    }
    let b = before
        .filter(|b| b.step == cut.end.step && !b.groups.is_empty())
        .ok_or_else(|| format!("the groups of step {} are not recorded", cut.end.step))?;
    let zero = b
        .groups
        .iter()
        .find(|g| first_pipeline(b, g))
        .map(|g| &g.zone);
    b.groups
        .iter()
        .map(|g| match cut.stored_group(&g.zone) {
            _ if Some(&g.zone) == zero => Ok((g.zone.as_str(), None)),
            Some(parts) => Ok((g.zone.as_str(), Some(parts))),
            None => Err(format!(
                "the checkpoint after step {} holds no stored state of group {:?}",
                cut.end.step, g.zone
            )),
        })
        .collect::<Result<_, _>>()
        .map(Starts::ByGroup)
}

/// Whether `g` holds pipeline 0 of step `r` (whose share is the step's first samples).
fn first_pipeline(r: &StepRecord, g: &StepGroup) -> bool {
    g.shares.first().is_some_and(|s| s[0] == r.sample_start)
}

/// Why window `w` over `records` (`before`: the step before it) cannot be replayed group by
/// group; `None` where it can.
fn why_not(w: &Window, records: &[StepRecord], before: Option<&StepRecord>) -> Option<String> {
    let mut before = match starts(w, records, before) {
        Err(why) => return Some(why),
        Ok(Starts::Shared) => None,
        Ok(Starts::ByGroup(_)) => before,
    };
    for r in records {
        if r.groups.is_empty() {
            return Some(format!(
                "step {}: its groups are not recorded (a pipeline spanned zones, or the node \
                 applied it under a plan it did not hold)",
                r.step
            ));
        }
        if r.partition.is_empty() {
            return Some(format!(
                "step {}: its stages are not recorded (a node before the partition's record)",
                r.step
            ));
        }
        if let Some(b) = before {
            if r.history != b.history {
                return Some(format!(
                    "step {}: the cluster rolled back there, and every group resumed from one \
                     group's state",
                    r.step
                ));
            }
            let replanned = r.epoch != b.epoch
                || r.groups
                    .iter()
                    .any(|g| !b.groups.iter().any(|o| o.zone == g.zone));
            if replanned && b.groups.len() > 1 {
                return Some(format!(
                    "step {}: the plan changed while {} groups trained, and whose state each \
                     group took is not recorded",
                    r.step,
                    b.groups.len()
                ));
            }
        }
        before = Some(r);
    }
    None
}

/// Each group's samples of a step, checked to cover the step's samples exactly once.
fn shares_of(r: &StepRecord, samples: &Range<u64>) -> anyhow::Result<Vec<Vec<Range<u64>>>> {
    let shares: Vec<Vec<Range<u64>>> = r
        .groups
        .iter()
        .map(|g| g.shares.iter().map(|&[a, b]| a..b).collect())
        .collect();
    let mut all: Vec<&Range<u64>> = shares.iter().flatten().collect();
    all.sort_by_key(|s| s.start);
    let covered = all.iter().try_fold(samples.start, |next, s| {
        (s.start == next && s.end > s.start).then_some(s.end)
    });
    if covered != Some(samples.end) {
        bail!(
            "step {}: its groups' shares do not cover its samples {samples:?} once",
            r.step
        );
    }
    Ok(shares)
}

/// The models of a window's groups, by zone.
type Groups<M> = BTreeMap<String, Pipeline<M>>;

impl<M: PipelineModel> Replayer<'_, M> {
    /// Trains `records` from the window's start, one model per group, and compares pipeline
    /// 0's group with the window's end.
    pub(super) fn window_by_groups(
        &self,
        w: &Window,
        records: &[StepRecord],
        before: Option<&StepRecord>,
    ) -> anyhow::Result<WindowResult> {
        let spec = &self.job.spec;
        let mut groups: Groups<M> = BTreeMap::new();
        if let (Starts::ByGroup(starts), Some(cut)) = (
            starts(w, records, before).map_err(anyhow::Error::msg)?,
            &w.from,
        ) {
            for (zone, parts) in starts {
                let model = match parts {
                    None => self.start(w)?,
                    Some(parts) => self.model_from(Some((cut, parts)), w.steps.start)?,
                };
                groups.insert(zone.to_string(), model);
            }
        }
        let mut max_loss_diff = 0.0f64;
        let mut first_group = None;
        for r in records {
            let samples = self.samples_of(r)?;
            let shares = shares_of(r, &samples)?;
            let joined: Vec<&StepGroup> = r
                .groups
                .iter()
                .filter(|g| !groups.contains_key(&g.zone))
                .collect();
            for g in joined {
                let model = match groups.values().next() {
                    None => self.start(w)?,
                    Some(only) => self.copy_of(only)?,
                };
                groups.insert(g.zone.clone(), model);
            }
            groups.retain(|zone, _| r.groups.iter().any(|g| &g.zone == zone));
            let ranges = stage_ranges(r)?;
            for pipe in groups.values_mut() {
                if !same_cut(pipe, &ranges) {
                    *pipe = self.recut(pipe, &ranges)?;
                }
                for stage in pipe.stages_mut() {
                    if !stage.has_outer() {
                        stage.begin_outer()?;
                    }
                }
            }
            let sync = step_sync(spec.sync, r.step, spec.max_steps);
            if sync.opens_round() {
                self.round(&mut groups, &r.groups)?;
            }
            let pipelines: usize = shares.iter().map(Vec::len).sum();
            let mut loss = 0.0;
            for (g, share) in r.groups.iter().zip(&shares) {
                let pipe = groups.get_mut(&g.zone).context("a group without a model")?;
                let n = share.len() as f64;
                let trained = self.train_as_replicas(pipe, r, share, pipelines)?;
                loss += f64::from(trained) * n / pipelines as f64;
            }
            if sync.closes_job() {
                self.round(&mut groups, &r.groups)?;
            }
            max_loss_diff = max_loss_diff.max((loss - r.loss).abs());
            first_group = r
                .groups
                .iter()
                .find(|g| first_pipeline(r, g))
                .map(|g| g.zone.clone());
        }
        let zone = first_group.context("no step in the window")?;
        let pipe = groups
            .get(&zone)
            .context("pipeline 0's group has no model")?;
        Ok(WindowResult {
            max_abs_diff: self.compare(pipe, w)?,
            max_loss_diff,
        })
    }

    /// A group's step as its replicas take it: each pipeline's share on its own (micro-batches
    /// weighted `len * D / G`), each stage's gradients averaged as that stage's ring in the
    /// zone averages them (its members in pipeline order, the last stage's loss at the end of
    /// its buffer), the stages' squared norms summed in stage order, then the optimizer's step.
    /// Returns the group's loss.
    fn train_as_replicas(
        &self,
        pipe: &mut Pipeline<M>,
        r: &StepRecord,
        shares: &[Range<u64>],
        pipelines: usize,
    ) -> anyhow::Result<f32> {
        let mut each: Vec<Vec<Vec<f32>>> =
            vec![Vec::with_capacity(shares.len()); pipe.stages().len()];
        let mut with_loss = vec![false; each.len()];
        for share in shares {
            self.accumulate(pipe, r, std::slice::from_ref(share), pipelines as f64)?;
            for (s, stage) in pipe.stages_mut().iter_mut().enumerate() {
                let mut values: Vec<f32> = stage
                    .export_grads()?
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let loss = stage.step_loss()?;
                with_loss[s] = loss.is_some();
                values.extend(loss.map(|loss| loss as f32));
                stage.clear_grads();
                each[s].push(values);
            }
        }
        let mut loss = None;
        for (s, stage) in pipe.stages_mut().iter_mut().enumerate() {
            let mut mean = ring_mean_in_process(&each[s]);
            if with_loss[s] {
                loss = mean.pop();
            }
            let bytes: Vec<u8> = mean.iter().flat_map(|v| v.to_le_bytes()).collect();
            stage.import_grads(&bytes)?;
        }
        let norm = pipe.grad_sq_norm()?;
        pipe.optimizer_step(norm)?;
        Ok(loss.unwrap_or_default())
    }

    /// A model in `pipe`'s state.
    fn copy_of(&self, pipe: &Pipeline<M>) -> anyhow::Result<Pipeline<M>> {
        let ranges: Vec<Range<usize>> = pipe.stages().iter().map(|s| s.layer_range()).collect();
        self.recut(pipe, &ranges)
    }

    /// A model in `pipe`'s state cut into stages of `ranges`: each stage takes its layers'
    /// state (weights, moments, outer state, random streams) from the stages that held them.
    fn recut(&self, pipe: &Pipeline<M>, ranges: &[Range<usize>]) -> anyhow::Result<Pipeline<M>> {
        let states = pipe
            .stages()
            .iter()
            .map(|s| Ok((s.layer_range(), s.export_state(s.layer_range())?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut cut = Pipeline::new(
            self.job.model.clone(),
            ranges,
            self.job.spec.seed,
            &self.device,
            self.stage_config.clone(),
        )?;
        for stage in cut.stages_mut() {
            let mine = stage.layer_range();
            for (held, bytes) in &states {
                let both = held.start.max(mine.start)..held.end.min(mine.end);
                if !both.is_empty() {
                    stage.import_state(bytes, both)?;
                }
            }
        }
        Ok(cut)
    }

    /// A round over `groups` as the step's `layout` holds them, stage by stage: every group's
    /// pseudo-gradient brought by each of its replicas, their mean as the stage's all-reduce by
    /// zone takes it, and the outer step on every group.
    fn round(&self, groups: &mut Groups<M>, layout: &[StepGroup]) -> anyhow::Result<()> {
        let zone_of: Vec<&str> = layout
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.zone.as_str(), g.shares.len()))
            .collect();
        let zones = ZoneLayout::new(&zone_of);
        let stages = groups.values().next().map_or(0, |p| p.stages().len());
        for s in 0..stages {
            let mut values = Vec::with_capacity(zone_of.len());
            for g in layout {
                let pipe = groups.get(&g.zone).context("a group without a model")?;
                let stage = pipe
                    .stages()
                    .get(s)
                    .context("groups cut into unlike stages")?;
                values.extend(std::iter::repeat_n(
                    stage.pseudo_gradient()?,
                    g.shares.len(),
                ));
            }
            let mean = mean_by_zone_in_process(&zones, &values);
            for pipe in groups.values_mut() {
                let stage = pipe
                    .stages_mut()
                    .get_mut(s)
                    .context("groups cut into unlike stages")?;
                stage.outer_step(&mean, &self.job.spec.outer)?;
            }
        }
        Ok(())
    }
}

/// The layers of each of step `r`'s stages, from its recorded partition.
fn stage_ranges(r: &StepRecord) -> anyhow::Result<Vec<Range<usize>>> {
    ensure!(
        r.partition.len() >= 2,
        "step {}: a partition of {} bounds holds no stage",
        r.step,
        r.partition.len()
    );
    Ok(r.partition
        .windows(2)
        .map(|w| w[0] as usize..w[1] as usize)
        .collect())
}

/// Whether `pipe`'s stages hold `ranges`.
fn same_cut<M: PipelineModel>(pipe: &Pipeline<M>, ranges: &[Range<usize>]) -> bool {
    pipe.stages().len() == ranges.len()
        && pipe
            .stages()
            .iter()
            .zip(ranges)
            .all(|(s, r)| s.layer_range() == *r)
}
