//! A composition's plans laid out on several threads: the job's depths dealt over copies of
//! the fleet (shards), each laying out its depths with memos of its own, and their placements
//! joined. Every placement is a pure function of the fleet and the composition (the memos only
//! keep what was computed), so the plans are the same as one thread's, in less time where the
//! leader has cores to spare.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Fleet, Plans};
use crate::cost::throughput::ThroughputTable;

/// Most threads a composition is laid out on.
const MAX_SHARDS: usize = 8;

impl Fleet {
    /// The zone-aware plans of `total` nodes held as `counts`, laid out by the shards.
    pub(super) fn plans_in_shards(&mut self, total: u32, counts: &[u32]) -> Arc<Plans> {
        if self.shards.is_empty() {
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let n = threads.min(MAX_SHARDS).min(self.spec.depths.len());
            self.shards = match n {
                0 | 1 => Vec::new(),
                _ => (0..n)
                    .map(|k| self.shard(k, n))
                    .collect::<Option<_>>()
                    .unwrap_or_default(),
            };
        }
        if self.shards.is_empty() {
            return self.plans_of(total, |fleet, d, p| fleet.zone_aware(counts, d, p));
        }
        let mut parts: Vec<Arc<Plans>> = Vec::with_capacity(self.shards.len());
        std::thread::scope(|scope| {
            let running: Vec<_> = self
                .shards
                .iter_mut()
                .map(|shard| {
                    scope.spawn(move || {
                        shard.plans_of(total, |fleet, d, p| fleet.zone_aware(counts, d, p))
                    })
                })
                .collect();
            for shard in running {
                match shard.join() {
                    Ok(plans) => parts.push(plans),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
        let placements: BTreeMap<_, _> = parts
            .iter()
            .flat_map(|plans| plans.placements.iter().map(|(c, pl)| (*c, pl.clone())))
            .collect();
        let table =
            ThroughputTable::from_rows(placements.iter().map(|(c, pl)| (*c, pl.samples_per_sec)));
        Arc::new(Plans {
            table: Arc::new(table),
            placements,
        })
    }

    /// A copy of this fleet, memos empty, laying out the depths of index `k` modulo `n`.
    pub(super) fn shard(&self, k: usize, n: usize) -> Option<Fleet> {
        let mut shard =
            Fleet::new(self.spec.clone(), self.pools.clone(), self.links.clone()).ok()?;
        shard.prices = self.prices.clone();
        shard.by_zone = self.by_zone;
        shard.steps_in_zone = self.steps_in_zone;
        shard.share = (k, n);
        Some(shard)
    }
}
