//! One job over several zones, each with its own device kind: how fast every `(D, P)` trains
//! on the nodes each zone holds at a moment, laid out as a zone-aware planner lays it, and as a
//! planner blind to zones and types lays it.
//!
//! A zone-aware plan is the fastest of four layouts:
//!
//! * **zone pipelines**: every pipeline inside one zone, the pipelines filled from the fastest
//!   device kind first (or from the fullest zone first, where crossing fewer zones pays more);
//!   the step waits for the slowest pipeline, and each stage's all-reduce crosses every zone
//!   used: one ring at the pace of its slowest link, or by zone where that is no slower
//!   (`traffic::Reduction`);
//! * **mixed pipelines**: every pipeline holds `k_a` stages in zone `a` and `k_b` in `b`, its
//!   layers split unevenly over the kinds by `mixed::arrange_two`, so each stage's replicas
//!   share a zone and its all-reduce never leaves it; only the activations cross zones;
//! * **staggered pipelines**: where equal shares do not fit the two zones' counts but `d p`
//!   of their nodes are there, some of the mixed pipelines hold their junction stage in the
//!   second zone instead of the first (`staggered`), so that one stage's ring crosses the
//!   zones and every other stage's stays inside one;
//! * **packed pipelines**: the nodes zone by zone, fastest kind first, `p` at a time a
//!   pipeline (`blind`), priced as the zone-blind layout is: where links between zones cost
//!   little, no node is left idle for want of a whole pipeline in its zone.
//!
//! The zone-blind planner (Parcae's, run over every zone at once) believes every node is the
//! worst device of the fleet (the slowest layers, the least memory), so it splits the layers
//! for that device and takes nodes in the order they joined. What it really trains is its
//! split on the devices it got, paced by the slowest kind present, with rings and pipelines
//! crossing zones.

use std::collections::BTreeMap;
use std::sync::Arc;

use parcae_pool::{AllReduce, Pool};
use rustc_hash::FxHashMap;

use super::analytic::{self, StageCost};
use super::links::{Link, Links};
use super::mixed::{DeviceCosts, balanced_bounds};
use super::spec::ModelSpec;
use super::split::Splits;
use super::throughput::ThroughputTable;
use super::traffic::{LinkTable, Pipelines, traffic};
use crate::config::ParallelConfig;

/// The zone pipelines a shared rate is memoised by: `(zone, pipelines)` of each group, the
/// slowest zone and the stages (which fix the split and, by the zones, the ring).
pub(crate) type SharedKey = (Vec<(usize, u32)>, usize, u32);

/// The pipelines of one zone: its index and how many of the layout's pipelines it holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZoneGroup {
    pub z: usize,
    pub pipelines: u32,
}

/// Most pools a fleet spans.
pub const MAX_POOLS: usize = 8;

/// Most compositions whose plans are kept; the memo starts over past it.
pub const MAX_COMPOSITIONS: usize = 1024;

/// One pool of the fleet (a zone, or an instance type in a zone): which, and the device kind
/// its nodes run (the fleet's layouts still call it a zone: zone pipelines, zone-blind).
#[derive(Clone, Debug, PartialEq)]
pub struct FleetPool {
    /// The pool (a zone alone where its nodes' type is not told apart).
    pub pool: Pool,
    /// The kind of device every node of the pool runs.
    pub device: DeviceCosts,
}

/// How one configuration is laid over the zones, and what it trains.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The pipelines by shape: the zone of each stage (the fleet's index), and how many.
    pub pipelines: Vec<Pipelines>,
    /// Stage bounds, shared by every pipeline.
    pub bounds: Vec<usize>,
    /// Samples per second.
    pub samples_per_sec: f64,
    /// Egress dollars per sample trained (activations and gradients crossing zones).
    pub egress_usd_per_sample: f64,
    /// Micro-batches each pipeline runs, where they differ (zone pipelines of unequal kinds:
    /// `shares`); `None` when the batch is cut evenly.
    pub micro_batches: Option<Vec<u32>>,
    /// How the stages whose replicas span zones all-reduce.
    pub all_reduce: AllReduce,
}

/// Every configuration's placement on one composition of the fleet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plans {
    /// Samples per second per configuration.
    pub table: Arc<ThroughputTable>,
    /// The placement behind each row of the table (shared: the layouts' memos hold them too).
    pub placements: BTreeMap<ParallelConfig, Arc<Placement>>,
}

/// Why a fleet was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// No pool, or more than [`MAX_POOLS`].
    #[error("a fleet spans 1 to {MAX_POOLS} pools, not {0}")]
    Pools(usize),
    /// Two pools of one name.
    #[error("pool \"{0}\" is named twice")]
    Duplicate(Pool),
    /// A device whose layers are not the job's.
    #[error("pool \"{0}\": its device times {1} layers, the job has {2}")]
    Layers(Pool, usize, usize),
}

/// A pipeline over two zones as [`mixed::arrange_two`] lays it: its zone per stage, its stage
/// bounds and sums, and the links its all-reduce and its activations take.
struct Arranged {
    order: Vec<usize>,
    bounds: Vec<usize>,
    stages: Vec<StageCost>,
    ring: Link,
    boundary: Link,
}

/// A share of a depth's stages over two zones, arranged, with the lines of a coarse bound on
/// its iteration.
struct PairShape {
    /// Stages per zone.
    k: Shares,
    /// Its place among `two_zones::pair_shares`: a tie goes to the lower.
    rank: usize,
    /// Its pipeline.
    arranged: Arc<Arranged>,
    /// `(before, pace)` of its slowest stage and of its last: a stage starts its first
    /// micro-batch no sooner than the stages before it ran that one forward, ends its last no
    /// sooner than they ran it backward, and works `pace` ms a micro-batch in between, so an
    /// iteration of `m` micro-batches takes at least `before + m pace`.
    lines: [(f64, f64); 2],
}

impl PairShape {
    fn new(k: Shares, rank: usize, arranged: Arc<Arranged>) -> Self {
        let (mut before, mut slowest, mut last) = (0.0, (0.0, 0.0), (0.0, 0.0));
        for stage in &arranged.stages {
            let pace = stage.pace_ms();
            if pace > slowest.1 {
                slowest = (before, pace);
            }
            last = (before, pace);
            before += pace;
        }
        Self {
            k,
            rank,
            arranged,
            lines: [slowest, last],
        }
    }

    /// At least the samples per second of `d` pipelines of this shape, each running `m`
    /// micro-batches: the schedule bound's terms (`mixed::samples_per_sec_bound`) without
    /// its hops, all-reduce and step, in O(1).
    fn rate_above(&self, spec: &ModelSpec, d: u32, m: u32) -> f64 {
        let ms = self
            .lines
            .iter()
            .map(|(before, pace)| before + f64::from(m) * pace)
            .fold(0.0, f64::max);
        analytic::rate_of(spec, d, ms)
    }
}

/// The second shape of a staggered layout: the arranged pipeline of the same shares with its
/// junction stage in the second zone.
struct Staggered {
    /// The zone of each stage.
    order: Vec<usize>,
    /// Each stage's sums on its zone's device, at the arranged pipeline's bounds.
    stages: Vec<StageCost>,
    /// The stage whose replicas lie in both zones.
    junction: usize,
}

/// A job on a fleet of zones, with the plans of every composition seen so far. Its memos are
/// keyed by small integers and arrays, looked up a few hundred thousand times a decision, so
/// they hash with FxHash.
#[derive(Clone)]
pub struct Fleet {
    spec: ModelSpec,
    pools: Vec<FleetPool>,
    links: Links,
    /// `links` between the zones, by index.
    table: LinkTable,
    /// Each pool's price of a node-hour, where the plans are laid out for samples per dollar.
    prices: Option<Vec<f64>>,
    /// Whether a ring across zones may all-reduce by zone (else every ring is flat).
    by_zone: bool,
    /// Whether every step's all-reduce stays inside a zone (DiLoCo's inner steps, the zones
    /// meeting only in its rounds): only zone pipelines, each zone's rings on its own link.
    steps_in_zone: bool,
    worst: DeviceCosts,
    /// Forward and backward of the whole model on each zone's device, ms.
    paces: Vec<f64>,
    memo: FxHashMap<Vec<u32>, Arc<Plans>>,
    /// The zone-blind plans by the nodes' zones in join order.
    blind_memo: FxHashMap<Arc<[u8]>, Arc<Plans>>,
    /// A zone-blind pipeline's rate by its zone, `d`, `p` and link (bandwidth and latency bits).
    blind_rates: FxHashMap<(usize, u32, u32, u64, u64), f64>,
    arranged: FxHashMap<Shares, Option<Arc<Arranged>>>,
    pair_shapes: FxHashMap<u32, Arc<[PairShape]>>,
    /// Mixed pipelines by each zone's nodes per pipeline, `d` and `p`: the floor they were
    /// sought above and what was found.
    mixed_found: FxHashMap<MixedKey, (f64, Option<Arc<Placement>>)>,
    zone_placed: FxHashMap<ZoneKey, Option<Arc<Placement>>>,
    staggered: FxHashMap<Shares, Option<Arc<Staggered>>>,
    heads: FxHashMap<(usize, usize), Arc<Splits>>,
    schedules: FxHashMap<(Pipeline, u32), Arc<[f64]>>,
    tails: FxHashMap<usize, Arc<Splits>>,
    local_rates: FxHashMap<LocalKey, f64>,
    local_stages: FxHashMap<(usize, usize, u32), Option<Stages>>,
    shared: FxHashMap<SharedKey, Option<(f64, Vec<u32>)>>,
    split: FxHashMap<(usize, u32), Option<Vec<usize>>>,
    /// Copies of this fleet that lay a composition's depths out in parallel, each with its
    /// own memos (`shards`); made at the first composition, dropped when the plans start over.
    shards: Vec<Fleet>,
    /// The depths this fleet lays out: those whose index in the job's is `k` modulo `n`.
    share: (usize, usize),
}

/// A pipeline whose 1F1B schedule is memoised: a zone pipeline on zone `z`'s device at zone
/// `slowest`'s split of `p` stages (over `z`'s own link), or a pipeline holding `k[z]` stages in
/// zone `z` (over its arranged links), or that pipeline with its junction stage moved to the
/// second zone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pipeline {
    Local { z: usize, slowest: usize, p: u32 },
    Mixed(Shares),
    Staggered(Shares),
}

/// A pipeline's stages in each zone, by the zones' order (zero past the fleet's zones).
type Shares = [usize; MAX_POOLS];

/// Mixed pipelines depend on the composition only through each zone's nodes per pipeline
/// (with `d` and `p`).
type MixedKey = ([u32; MAX_POOLS], u32, u32);

/// A pipeline's stages, shared by the memos that price it.
type Stages = Arc<[StageCost]>;

/// Zone pipelines by the zones that hold them, in the order they were filled (`u8::MAX` past
/// the last), how many each holds, and `p`.
type ZoneKey = ([u8; MAX_POOLS], [u32; MAX_POOLS], u32);

/// A zone pipeline's rate depends on its zone, the zone whose split it takes, its depth, the
/// pipelines and the ring's link (bandwidth and latency bits): not on the rest of the
/// composition.
type LocalKey = (usize, usize, u32, u32, u64, u64);

impl Fleet {
    /// The job `spec` over `pools`, linked by `links`.
    pub fn new(spec: ModelSpec, pools: Vec<FleetPool>, links: Links) -> Result<Self, FleetError> {
        if pools.is_empty() || pools.len() > MAX_POOLS {
            return Err(FleetError::Pools(pools.len()));
        }
        for (i, z) in pools.iter().enumerate() {
            if pools[..i].iter().any(|o| o.pool == z.pool) {
                return Err(FleetError::Duplicate(z.pool.clone()));
            }
            if z.device.layers.len() != spec.layers.len() {
                return Err(FleetError::Layers(
                    z.pool.clone(),
                    z.device.layers.len(),
                    spec.layers.len(),
                ));
            }
        }
        let devices: Vec<&DeviceCosts> = pools.iter().map(|z| &z.device).collect();
        let worst = worst::worst_device(&spec, &devices);
        let paces = pools
            .iter()
            .map(|z| {
                z.device
                    .layers
                    .iter()
                    .map(|l| l.forward_ms + l.backward_ms)
                    .sum()
            })
            .collect();
        let names: Vec<Pool> = pools.iter().map(|z| z.pool.clone()).collect();
        let table = LinkTable::new(&links, &names);
        Ok(Self {
            spec,
            pools,
            links,
            table,
            prices: None,
            by_zone: true,
            steps_in_zone: false,
            worst,
            paces,
            memo: FxHashMap::default(),
            blind_memo: FxHashMap::default(),
            blind_rates: FxHashMap::default(),
            arranged: FxHashMap::default(),
            pair_shapes: FxHashMap::default(),
            mixed_found: FxHashMap::default(),
            zone_placed: FxHashMap::default(),
            staggered: FxHashMap::default(),
            heads: FxHashMap::default(),
            schedules: FxHashMap::default(),
            tails: FxHashMap::default(),
            local_rates: FxHashMap::default(),
            local_stages: FxHashMap::default(),
            shared: FxHashMap::default(),
            split: FxHashMap::default(),
            shards: Vec::new(),
            share: (0, 1),
        })
    }

    /// The fleet with every ring across zones flat where `by_zone` is false (a zone-aware plan's
    /// rings go by zone where that is no slower by default).
    pub fn with_all_reduce_by_zone(self, by_zone: bool) -> Self {
        Self { by_zone, ..self }
    }

    /// The fleet of a job whose steps all-reduce inside each zone where `in_zone` (DiLoCo):
    /// its plans are zone pipelines alone, each zone's rings priced on the zone's own link
    /// (the rounds between zones, once every H steps, are left out of the rate).
    pub fn with_steps_in_zone(self, in_zone: bool) -> Self {
        Self {
            steps_in_zone: in_zone,
            ..self
        }
    }

    /// Whether every step's all-reduce stays inside a zone ([`Self::with_steps_in_zone`]).
    pub fn steps_in_zone(&self) -> bool {
        self.steps_in_zone
    }

    /// The job.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Lays the plans out for samples per dollar at `usd_per_node_hour` (a price per zone, in
    /// the fleet's order), or for samples (`None`); a change starts the plans' memo over.
    pub fn set_prices(&mut self, usd_per_node_hour: Option<&[f64]>) {
        let prices = usd_per_node_hour
            .filter(|usd| usd.len() == self.pools.len())
            .map(<[f64]>::to_vec);
        if prices != self.prices {
            self.prices = prices;
            self.shards.clear();
            self.memo.clear();
            self.blind_memo.clear();
        }
    }

    /// The links between the zones.
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// The pools, in the order compositions count them.
    pub fn pools(&self) -> &[FleetPool] {
        &self.pools
    }

    /// The device a zone-blind planner believes every node is: each layer as slow as on the
    /// slowest kind, the least memory of any kind.
    pub fn worst(&self) -> &DeviceCosts {
        &self.worst
    }

    /// The zone-aware plans on a fleet whose zone `z` holds `counts[z]` nodes (memoised).
    pub fn plans(&mut self, counts: &[u32]) -> Arc<Plans> {
        if let Some(plans) = self.memo.get(counts) {
            return plans.clone();
        }
        // A leader lives for days and the zones' counts wander: keep the memo bounded.
        if self.memo.len() >= MAX_COMPOSITIONS {
            self.memo.clear();
            self.shards.clear();
            self.shared.clear();
            self.mixed_found.clear();
            self.zone_placed.clear();
        }
        // A composition of another fleet has no placement.
        let total: u32 = if counts.len() == self.pools.len() {
            counts.iter().sum()
        } else {
            0
        };
        let plans = self.plans_in_shards(total, counts);
        self.memo.insert(counts.to_vec(), plans.clone());
        plans
    }

    /// Every configuration `(d, p)` of `total` nodes that `place` lays out, as plans.
    fn plans_of(
        &mut self,
        total: u32,
        mut place: impl FnMut(&mut Self, u32, u32) -> Option<Arc<Placement>>,
    ) -> Arc<Plans> {
        let mut placements = BTreeMap::new();
        let (k, n) = self.share;
        for (_, p) in self
            .spec
            .depths
            .clone()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % n == k)
        {
            for d in 1..=total / p.max(1) {
                if !self.spec.admits(d, p) {
                    continue;
                }
                if let Some(placed) = place(self, d, p).filter(|pl| pl.samples_per_sec > 0.0) {
                    placements.insert(ParallelConfig::new(d, p), placed);
                }
            }
        }
        let table =
            ThroughputTable::from_rows(placements.iter().map(|(c, pl)| (*c, pl.samples_per_sec)));
        Arc::new(Plans {
            table: Arc::new(table),
            placements,
        })
    }

    /// The balanced split of a `p`-stage pipeline on zone `z`'s device (memoised).
    fn zone_split(&mut self, z: usize, p: u32) -> Option<Vec<usize>> {
        if let Some(split) = self.split.get(&(z, p)) {
            return split.clone();
        }
        let devices = vec![&self.pools[z].device; p as usize];
        let split = balanced_bounds(&self.spec, &devices);
        self.split.insert((z, p), split.clone());
        split
    }

    /// The best of zone, mixed and staggered pipelines for `(d, p)`: the fastest, or where the
    /// pools are priced the most samples per dollar.
    fn zone_aware(&mut self, counts: &[u32], d: u32, p: u32) -> Option<Arc<Placement>> {
        let rate =
            |placed: &Option<Arc<Placement>>| placed.as_ref().map_or(0.0, |l| l.samples_per_sec);
        let local = self.zone_pipelines(counts, d, p);
        if self.steps_in_zone {
            return local;
        }
        let mixed = self.mixed_pipelines(counts, d, p, rate(&local));
        let floor = rate(&local).max(rate(&mixed));
        let staggered = self.staggered_pipelines(counts, d, p, floor);
        let packed = self.packed_pipelines(counts, d, p);
        self.best_of(
            [local, mixed, staggered, packed].into_iter().flatten(),
            counts,
        )
    }

    /// The placement of `placements` a planner for this fleet's objective takes: the most
    /// samples, or where the pools are priced the most per dollar; the first on a tie.
    fn best_of(
        &self,
        placements: impl Iterator<Item = Arc<Placement>>,
        counts: &[u32],
    ) -> Option<Arc<Placement>> {
        let value = |placed: &Placement| match &self.prices {
            Some(usd) => placed.per_dollar_rate(counts, usd),
            None => placed.samples_per_sec,
        };
        placements
            .fold(None, |best: Option<(f64, Arc<Placement>)>, placed| {
                let v = value(&placed);
                match best {
                    Some((b, _)) if b >= v => best,
                    _ => Some((v, placed)),
                }
            })
            .map(|(_, placed)| placed)
    }

    /// What `build` makes of shares `k`, kept in the map `cache` picks (`None` kept too: a
    /// share that holds no pipeline is asked about again and again).
    fn memoised<V>(
        &mut self,
        k: &Shares,
        cache: fn(&mut Fleet) -> &mut FxHashMap<Shares, Option<Arc<V>>>,
        build: fn(&mut Fleet, &Shares) -> Option<V>,
    ) -> Option<Arc<V>> {
        if let Some(found) = cache(self).get(k) {
            return found.clone();
        }
        let found = build(self, k).map(Arc::new);
        cache(self).insert(*k, found.clone());
        found
    }

    /// A placement with its egress per sample; its rings across zones by zone where `by_zone`
    /// allows it and it is no slower (as its rate was priced).
    fn placement(
        &self,
        pipelines: Vec<Pipelines>,
        bounds: Vec<usize>,
        (samples_per_sec, d): (f64, u32),
        micro_batches: Option<Vec<u32>>,
        by_zone: bool,
    ) -> Placement {
        let micro = micro_batches.as_ref().map_or_else(
            || d * analytic::micro_batches(&self.spec, d),
            |m| m.iter().sum(),
        );
        let samples = f64::from(self.spec.micro_batch.max(1) * micro);
        let by_zone = by_zone && self.by_zone;
        let traffic = traffic(&self.spec, &bounds, &pipelines, &self.table, by_zone);
        let (egress, all_reduce) =
            traffic.map_or((0.0, AllReduce::Ring), |t| (t.egress_usd, t.all_reduce));
        Placement {
            pipelines,
            bounds,
            samples_per_sec,
            egress_usd_per_sample: egress / samples,
            micro_batches,
            all_reduce,
        }
    }

    /// The link between zones `a` and `b`.
    fn link(&self, a: usize, b: usize) -> Link {
        self.table.link(a, b)
    }

    /// Forward and backward of the whole model on zone `z`'s device, ms: the order of speed.
    pub fn pace(&self, z: usize) -> f64 {
        self.paces[z]
    }
}

mod blind;
mod placement;
mod schedules;
mod sharded;
pub mod shares;
mod staggered;
mod two_zones;
mod worst;
mod zone_pipelines;

#[cfg(test)]
mod tests;
