//! What a fleet's pipelines train: the rate of `d` copies of a pipeline over its links, and
//! its 1F1B schedule, memoised by the pipeline and the micro-batches each copy runs.

use std::sync::Arc;

use super::{Fleet, Pipeline};
use crate::cost::analytic::{self, StageCost};
use crate::cost::links::Link;
use crate::cost::mixed::{self, DeviceCosts};
use crate::cost::transfer::TransferModel;

impl Fleet {
    /// Samples per second of `d` pipelines over `devices` split at `bounds`, all-reducing over
    /// `ring` and sending activations over `boundary`.
    pub(super) fn rate(
        &self,
        devices: &[&DeviceCosts],
        bounds: &[usize],
        d: u32,
        ring: Link,
        boundary: Link,
    ) -> Option<f64> {
        let transfer = transfer_over(boundary);
        mixed::samples_per_sec(&self.spec, devices, bounds, d, ring.mib_per_ms(), &transfer)
    }

    /// Samples per second of `d` copies of `pipeline` over `stages`, all-reducing over `ring`
    /// and sending activations over `boundary`, its 1F1B schedule memoised by the pipeline and
    /// the micro-batches each copy runs: the schedule is most of the pricing, and `d` of one
    /// micro-batch count (every `d` past the global batch's micro-batches, for one) share it.
    pub(super) fn scheduled_rate(
        &mut self,
        pipeline: Pipeline,
        stages: &[StageCost],
        d: u32,
        ring: Link,
        boundary: Link,
    ) -> f64 {
        let ends = self.schedule(pipeline, stages, boundary, d);
        mixed::rate_after(&self.spec, stages, &ends, d, ring.mib_per_ms())
    }

    /// When each of `pipeline`'s `stages` ends its part of the 1F1B schedule that each of `d`
    /// copies runs, activations over `boundary` (memoised by the pipeline and its micro-batches).
    pub(super) fn schedule(
        &mut self,
        pipeline: Pipeline,
        stages: &[StageCost],
        boundary: Link,
        d: u32,
    ) -> Arc<[f64]> {
        let m = analytic::micro_batches(&self.spec, d);
        self.schedule_of(pipeline, stages, boundary, m)
    }

    /// [`Self::schedule`] of `m` micro-batches.
    pub(super) fn schedule_of(
        &mut self,
        pipeline: Pipeline,
        stages: &[StageCost],
        boundary: Link,
        m: u32,
    ) -> Arc<[f64]> {
        let spec = &self.spec;
        self.schedules
            .entry((pipeline, m))
            .or_insert_with(|| {
                analytic::schedule_ends(spec, &transfer_over(boundary), stages, m).into()
            })
            .clone()
    }
}

/// Activations and gradients between stages over `link`.
pub(super) fn transfer_over(link: Link) -> TransferModel {
    TransferModel::Linear {
        latency_ms: link.latency_ms,
        bytes_per_sec: link.gbit_per_s * 1e9 / 8.0,
    }
}
