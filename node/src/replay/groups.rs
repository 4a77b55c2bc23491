//! A DiLoCo history replayed (issue 68). Between rounds each group (a zone's replicas of the
//! step, `StepRecord::groups`) trains apart, so the replay keeps one model per group: each
//! trains its pipelines' shares of every step as its replicas did (their gradients averaged
//! inside the group); a step that opens a round first takes the outer step on every group
//! along the mean of the pseudo-gradients over the step's replicas (each group weighted by its
//! pipelines), and a job's last step closes one more after its update. The checkpoint a window
//! ends at holds the state of pipeline 0's group (pipeline 0's replicas write it): that group
//! is compared with it.
//!
//! A window needs every group's state at its start, and a checkpoint holds one group's: a
//! window starts from the seeded start, or from a checkpoint the cluster rolled back to (every
//! group then resumed from it). When the plan changes, a slot takes its layers from a holder of
//! its zone where one holds them, else from any holder: where one group trained before the
//! change, every group after it holds that group's state (a cluster whose second zone joins
//! after it began); among several, the steps do not record whose state each group took (a
//! zone whose holders all died takes another's). That, and a rollback inside a window (every
//! group then took one group's state), skip the window, with the reason.

use std::collections::BTreeMap;
use std::ops::Range;

use anyhow::{Context as _, bail};
use parcae_api::{StepGroup, StepRecord};
use parcae_model::{Pipeline, PipelineModel};
use parcae_outer::Contribution;

use super::replayer::{Replayer, WindowResult};
use super::windows::{Plan, Window};
use crate::train::reduce::step_sync;

/// Moves the windows of `plan` (over `steps`) that a replay by groups cannot train to its
/// skipped ones, with why.
pub(super) fn keep_replayable(plan: &mut Plan, steps: &[StepRecord]) {
    let first = steps.first().map_or(0, |r| r.step);
    for w in std::mem::take(&mut plan.windows) {
        let records = &steps[(w.steps.start - first) as usize..(w.steps.end - first) as usize];
        match why_not(&w, records) {
            None => plan.windows.push(w),
            Some(why) => {
                plan.skipped.push(format!("steps {:?}: {why}", w.steps));
                plan.not_replayed += w.steps.end - w.steps.start;
            }
        }
    }
}

/// Why window `w` over `records` cannot be replayed group by group; `None` where it can.
fn why_not(w: &Window, records: &[StepRecord]) -> Option<String> {
    if let (Some(cut), Some(r)) = (&w.from, records.first())
        && r.history == cut.history
    {
        return Some(format!(
            "under DiLoCo the checkpoint after step {} holds one group's state (pipeline 0's), \
             not every group's",
            cut.end.step
        ));
    }
    let mut before: Option<&StepRecord> = None;
    for r in records {
        if r.groups.is_empty() {
            return Some(format!(
                "step {}: its groups are not recorded (a pipeline spanned zones, or the node \
                 applied it under a plan it did not hold)",
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
    let mut next = samples.start;
    for s in all {
        if s.start != next || s.end <= s.start {
            bail!(
                "step {}: its groups' shares do not cover its samples {samples:?} once",
                r.step
            );
        }
        next = s.end;
    }
    if next != samples.end {
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
    ) -> anyhow::Result<WindowResult> {
        let spec = &self.job.spec;
        let mut groups: Groups<M> = BTreeMap::new();
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
            for pipe in groups.values_mut() {
                let stage = &mut pipe.stages_mut()[0];
                if !stage.has_outer() {
                    stage.begin_outer()?;
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
                let trained = self.train(pipe, r, share, pipelines as f64 / n)?;
                loss += f64::from(trained) * n / pipelines as f64;
            }
            if sync.closes_job() {
                self.round(&mut groups, &r.groups)?;
            }
            max_loss_diff = max_loss_diff.max((loss - r.loss).abs());
            first_group = r
                .groups
                .iter()
                .find(|g| g.shares.first().is_some_and(|s| s[0] == r.sample_start))
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

    /// A model in `pipe`'s state.
    fn copy_of(&self, pipe: &Pipeline<M>) -> anyhow::Result<Pipeline<M>> {
        let stage = &pipe.stages()[0];
        let state = stage.export_state(stage.layer_range())?;
        let mut copy = Pipeline::new(
            self.job.model.clone(),
            std::slice::from_ref(&stage.layer_range()),
            self.job.spec.seed,
            &self.device,
            self.stage_config.clone(),
        )?;
        copy.stages_mut()[0].import_state(&state, stage.layer_range())?;
        Ok(copy)
    }

    /// A round over `groups` as the step's `layout` holds them: every group's pseudo-gradient,
    /// their mean over the step's replicas, and the outer step on every group.
    fn round(&self, groups: &mut Groups<M>, layout: &[StepGroup]) -> anyhow::Result<()> {
        let pseudo_gradients = layout
            .iter()
            .map(|g| {
                let pipe = groups.get(&g.zone).context("a group without a model")?;
                Ok(pipe.stages()[0].pseudo_gradient()?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let contributions: Vec<Contribution<'_>> = layout
            .iter()
            .zip(&pseudo_gradients)
            .map(|(g, pseudo_gradient)| Contribution {
                samples: g.shares.len() as f64,
                pseudo_gradient,
            })
            .collect();
        let mean = parcae_outer::average(&contributions)?;
        for pipe in groups.values_mut() {
            pipe.stages_mut()[0].outer_step(&mean, &self.job.spec.outer)?;
        }
        Ok(())
    }
}
