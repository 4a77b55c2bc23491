//! The leader's whole decision timed: [`decide`] with the node's default strategy (`liveput`)
//! on a cluster of `nodes` workers spread evenly over `pools` pools of different speeds, every
//! member having reported every layer and the cluster a history of availability. Cold is the
//! first decision of a fresh planner (each pool composition's tables laid out, the zone
//! models made); memoised is the same decision again on what the first one kept. Run by
//! `parcae-node bench-planner` and the criterion bench `planner`.

use std::collections::BTreeMap;
use std::time::Instant;

use parcae_consensus::state::{Capabilities, Job, LayerCost, PeerInfo, PoolCount};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_strategies::cost::objective::ObjectiveKind;
use serde::Serialize;

use super::costs::{CPU_MEMORY_MB, JobShape, MeasuredCache};
use super::decide::decide;
use super::strategy::liveput::Liveput;
use super::zones::FleetCache;

/// Most nodes and pools the bench builds (a cluster past the consensus' bounds is not planned).
pub const MAX_NODES: u32 = 4096;
/// Most pools.
pub const MAX_POOLS: u32 = 16;
/// Layers of the benched model (gpt-1.5b's 48 blocks).
const LAYERS: u32 = 48;
/// The look-ahead and interval of the node's defaults (`[planner]`).
const LOOKAHEAD: usize = 8;
const INTERVAL_SECS: f64 = 60.0;
/// Intervals of availability history the forecasts learn from.
const HISTORY: u64 = 12;

/// One member of a synthetic cluster: its zone, instance type and speed (1 the base).
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Zone name.
    pub zone: String,
    /// Instance type (empty: none said).
    pub instance_type: String,
    /// Relative speed: layer times are the base's divided by it.
    pub speed: f64,
}

/// What [`time_decision`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannerTiming {
    /// Workers planned over.
    pub nodes: u32,
    /// Pools they are in.
    pub pools: u32,
    /// The first decision of a fresh planner, ms (median of `repeats`).
    pub cold_ms: f64,
    /// The same decision again on the planner's caches, ms (median of `repeats`).
    pub memoised_ms: f64,
    /// The configuration the decision chose, `[d, p]` (`None`: no plan).
    pub chosen: Option<[u32; 2]>,
    /// Decisions timed for each median.
    pub repeats: u32,
}

/// A control state training one job with `members` joined in order, each reporting
/// `layers` layers at its speed, and `history` intervals of every member available.
pub fn cluster(members: &[Member], layers: u32, history: u64) -> anyhow::Result<ControlState> {
    let job = Job {
        settings: [("seed".to_string(), "3".to_string())].into(),
    };
    let mut state = ControlState::default();
    state.apply(&Command::DefineJob { job: job.clone() })?;
    let mut zones: BTreeMap<&str, u32> = BTreeMap::new();
    for (i, member) in (1u32..).zip(members) {
        let node = member_id(i);
        let peer = PeerInfo {
            peer_id: i.to_be_bytes().to_vec(),
            data_addr: Some(format!("127.0.0.1:{}", 7000 + i)),
            job: Some(job.digest()),
            caps: Capabilities {
                zone: member.zone.clone(),
                instance_type: member.instance_type.clone(),
                ..Capabilities::default()
            },
            ..PeerInfo::default()
        };
        state.apply(&Command::Join { node, peer })?;
        let cost = LayerCost {
            forward_s: 0.010 / member.speed,
            backward_s: 0.020 / member.speed,
            optimizer_s: 0.001 / member.speed,
            params: 1_000_000,
            output_bytes: 65_536,
        };
        state.apply(&Command::CostReport {
            node,
            step: 0,
            layers: (0..layers).map(|l| (l, cost)).collect(),
            bandwidth: Vec::new(),
            reconfiguration_s: None,
            allreduce_bytes_per_sec: None,
            boundary_link: None,
        })?;
        *zones.entry(member.zone.as_str()).or_default() += 1;
    }
    let named = members.iter().all(|m| !m.zone.is_empty());
    let by_zone: Vec<PoolCount> = zones
        .into_iter()
        .filter(|_| named)
        .map(|(pool, nodes)| PoolCount {
            pool: pool.to_string(),
            nodes,
        })
        .collect();
    for interval in 0..history {
        state.apply(&Command::AvailabilityTick {
            interval,
            count: members.len() as u32,
            pools: by_zone.clone(),
        })?;
    }
    Ok(state)
}

/// The id of the `i`th member [`cluster`] joins (from 1).
pub fn member_id(i: u32) -> NodeId {
    NodeId::from_peer_bytes(&i.to_be_bytes())
}

/// `nodes` members dealt over `pools` pools in join order, pool `k` named `zone-k/type-k`
/// with a speed of 1, 1.5, 0.75 or 2 in turn.
pub fn members(nodes: u32, pools: u32) -> Vec<Member> {
    const SPEEDS: [f64; 4] = [1.0, 1.5, 0.75, 2.0];
    (0..nodes)
        .map(|i| {
            let k = i % pools.max(1);
            Member {
                zone: format!("zone-{k}"),
                instance_type: format!("type-{k}"),
                speed: SPEEDS[k as usize % SPEEDS.len()],
            }
        })
        .collect()
}

/// The shape of the benched job: gpt-1.5b's batch of 512 in micro-batches of 4, up to `nodes`.
fn shape(nodes: u32) -> JobShape {
    JobShape {
        global_batch: 512,
        micro_batch: 4,
        max_nodes: nodes,
        restart_ms: 20_000.0,
        memory_mb: CPU_MEMORY_MB,
        min_depth: 1,
        profile: None,
        steps_in_zone: false,
    }
}

/// A benched cluster: its state and job, and the instant of the decision.
pub struct Bench {
    state: ControlState,
    shape: JobShape,
    now_ms: u64,
}

/// What a planner keeps between decisions: its strategy's models, the cost model and the
/// pools' tables.
pub struct PlannerCaches {
    strategy: Liveput,
    costs: MeasuredCache,
    fleets: FleetCache,
}

impl Bench {
    /// `nodes` workers in `pools` pools ([`members`]), each having reported every layer, with
    /// [`HISTORY`] intervals of availability.
    pub fn new(nodes: u32, pools: u32) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1..=MAX_NODES).contains(&nodes),
            "--nodes {nodes}: expected 1 to {MAX_NODES}"
        );
        anyhow::ensure!(
            (1..=MAX_POOLS.min(nodes)).contains(&pools),
            "--pools {pools}: expected 1 to {MAX_POOLS}, and at most one a node"
        );
        Ok(Self {
            state: cluster(&members(nodes, pools), LAYERS, HISTORY)?,
            shape: shape(nodes),
            now_ms: 1_000 * INTERVAL_SECS as u64 * (HISTORY + 1),
        })
    }

    /// A fresh planner's caches (empty).
    pub fn fresh(&self) -> PlannerCaches {
        PlannerCaches {
            strategy: Liveput::new(LOOKAHEAD, INTERVAL_SECS),
            costs: MeasuredCache::default(),
            fleets: FleetCache::new(ObjectiveKind::default(), BTreeMap::new(), 1.0),
        }
    }

    /// The leader's decision at an interval's end with `caches`: the configuration of the
    /// plan it proposes, `[d, p]`.
    pub fn decide(&self, caches: &mut PlannerCaches) -> Option<[u32; 2]> {
        let d = decide(
            &self.state,
            &mut caches.strategy,
            &self.shape,
            &mut caches.costs,
            &mut caches.fleets,
            true,
            self.now_ms,
        );
        d.plan.map(|p| [p.data_parallel, p.pipeline_stages])
    }
}

/// Times the decision on `nodes` workers in `pools` pools, `repeats` times each way.
pub fn time_decision(nodes: u32, pools: u32, repeats: u32) -> anyhow::Result<PlannerTiming> {
    anyhow::ensure!(
        (1..=1000).contains(&repeats),
        "--repeats {repeats}: expected 1 to 1000"
    );
    let bench = Bench::new(nodes, pools)?;
    let (mut cold, mut memoised) = (Vec::new(), Vec::new());
    let mut chosen = None;
    for _ in 0..repeats {
        let mut caches = bench.fresh();
        let started = Instant::now();
        let first = bench.decide(&mut caches);
        cold.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let again = bench.decide(&mut caches);
        memoised.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            first == again,
            "the memoised decision ({again:?}) differs from the cold one ({first:?})"
        );
        chosen = first;
    }
    Ok(PlannerTiming {
        nodes,
        pools,
        cold_ms: median(cold),
        memoised_ms: median(memoised),
        chosen,
        repeats,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_dealt_over_the_pools_in_join_order() {
        let m = members(5, 2);
        let zones: Vec<&str> = m.iter().map(|m| m.zone.as_str()).collect();
        assert_eq!(zones, ["zone-0", "zone-1", "zone-0", "zone-1", "zone-0"]);
        assert_eq!((m[0].speed, m[1].speed), (1.0, 1.5));
        assert_eq!(m[1].instance_type, "type-1");
    }

    #[test]
    fn a_decision_is_made_and_timed_over_pools() {
        let t = time_decision(16, 2, 1).unwrap();
        let [d, p] = t.chosen.expect("a plan for 16 measured workers");
        assert!(d * p <= 16 && d * p >= 8, "{d} x {p}");
        assert!(t.cold_ms > 0.0 && t.memoised_ms > 0.0);
        assert!(time_decision(0, 1, 1).is_err());
        assert!(time_decision(4, 5, 1).is_err());
    }
}
