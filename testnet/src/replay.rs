//! Trace replay: interval `k` of the trace becomes the wall-clock window
//! `[k * interval_secs, (k + 1) * interval_secs)` of the run.
//!
//! The trace's node counts are fitted to `nodes_max` ([`plan`]). Before each boundary `t_k`
//! the replay compares the nodes that are up with the count of interval `k`:
//! * `grace` seconds before `t_k`, surplus nodes get their preemption notice (deadline `t_k`;
//!   the engine SIGKILLs any that are still there at `t_k`), like a spot provider's warning;
//! * at `t_k`, missing nodes are started and bootstrap to a live node, like arrivals.
//!
//! Comparing with the nodes actually up (rather than replaying the trace's deltas) keeps the
//! cluster on the trace even when a node dies on its own. Which nodes leave is a seeded choice
//! among all but the founder, which stays so that the run always has a node to bootstrap
//! through and a continuous raft history to read.

use std::ops::Range;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::engine::{Ctx, Scenario, ZoneStart};
use crate::predicted::zones::ReplayedZone;
use parcae_strategies::trace::Trace;
use parcae_testnet::error::TestnetError;

/// The node counts to replay: the first `intervals` of the trace's intervals `window`, scaled
/// down by `nodes_max / peak` when the peak exceeds `nodes_max` (rounded, at least 1 node).
pub fn plan(trace: &Trace, window: Range<usize>, intervals: usize, nodes_max: u32) -> Vec<u32> {
    let window = trace.intervals.get(window).unwrap_or_default();
    let window = &window[..intervals.min(window.len())];
    let peak = window.iter().map(|i| i.nodes).max().unwrap_or(0);
    window
        .iter()
        .map(|i| {
            let n = if peak > nodes_max {
                (f64::from(i.nodes) * f64::from(nodes_max) / f64::from(peak)).round() as u32
            } else {
                i.nodes
            };
            n.clamp(1, nodes_max.max(1))
        })
        .collect()
}

/// What happens next.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// Notify surplus nodes for interval `k`.
    Notice(usize),
    /// Start missing nodes for interval `k`.
    Arrive(usize),
    /// SIGKILL the leader without notice.
    KillLeader,
}

/// The replay of a planned trace.
pub struct Replay {
    /// Nodes of every interval, all zones together.
    counts: Vec<u32>,
    /// A run over zones: each zone's name and nodes of every interval (empty: no zones).
    zones: Vec<(String, Vec<u32>)>,
    /// Each zone's emulated device speed.
    speeds: Vec<f64>,
    interval_secs: f64,
    steps: Vec<(f64, Step)>,
    next: usize,
    rng: ChaCha8Rng,
    keeps_every_checkpoint: bool,
    ends_with_the_job: bool,
}

impl Replay {
    /// A replay of `counts` with intervals of `interval_secs` and notices `grace_secs` ahead.
    pub fn new(counts: Vec<u32>, interval_secs: f64, grace_secs: f64, seed: u64) -> Self {
        let mut steps = Vec::with_capacity(2 * counts.len());
        for k in 1..counts.len() {
            let t_k = k as f64 * interval_secs;
            let notice = (t_k - grace_secs).max((k - 1) as f64 * interval_secs);
            steps.push((notice, Step::Notice(k)));
            steps.push((t_k, Step::Arrive(k)));
        }
        steps.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self {
            counts,
            zones: Vec::new(),
            speeds: Vec::new(),
            interval_secs,
            steps,
            next: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            keeps_every_checkpoint: false,
            ends_with_the_job: false,
        }
    }

    /// A replay over zones: zone `z` named `zones[z].0` replays the counts `zones[z].1` (cut to
    /// the shortest), its nodes started in it on a device `speeds[z]` times the profiled one
    /// (1 where not given) and its surplus preempted among its own.
    pub fn zoned(
        zones: Vec<(String, Vec<u32>)>,
        speeds: Vec<f64>,
        interval_secs: f64,
        grace_secs: f64,
        seed: u64,
    ) -> Self {
        let len = zones.iter().map(|(_, c)| c.len()).min().unwrap_or(0);
        let counts = (0..len)
            .map(|k| zones.iter().map(|(_, c)| c[k]).sum())
            .collect();
        Self {
            zones,
            speeds,
            ..Self::new(counts, interval_secs, grace_secs, seed)
        }
    }

    /// Nodes of every interval, all zones together.
    pub fn counts(&self) -> &[u32] {
        &self.counts
    }

    /// Each zone of a run over zones with its device's speed and its nodes per interval (empty:
    /// no zones).
    pub fn replayed_zones(&self) -> Vec<ReplayedZone<'_>> {
        self.zones
            .iter()
            .enumerate()
            .map(|(z, (name, counts))| ReplayedZone {
                name,
                speed: self.speeds.get(z).copied().unwrap_or(1.0),
                counts,
            })
            .collect()
    }

    /// Each zone's index (`None`: no zones), the nodes it wants in interval `k` and those of
    /// it that are up.
    fn groups(
        &self,
        cluster: &crate::cluster::Cluster,
        k: usize,
    ) -> Vec<(Option<usize>, usize, Vec<usize>)> {
        if self.zones.is_empty() {
            return vec![(None, self.counts[k] as usize, cluster.up())];
        }
        self.zones
            .iter()
            .enumerate()
            .map(|(z, (_, counts))| (Some(z), counts[k] as usize, cluster.up_in(z)))
            .collect()
    }

    /// Also SIGKILLs the cluster's leader, without notice, `at` seconds into the replay (the
    /// trace's next arrival replaces it).
    pub fn kill_leader_at(mut self, at: f64) -> Self {
        self.schedule(at, Step::KillLeader);
        self
    }

    /// The same replay, its job's store keeping every checkpoint (for the replay check).
    pub fn keeping_every_checkpoint(mut self) -> Self {
        self.keeps_every_checkpoint = true;
        self
    }

    /// The same replay, ending once every node finished the job (a job with a step limit).
    pub fn ending_with_the_job(mut self) -> Self {
        self.ends_with_the_job = true;
        self
    }

    /// Adds `step` at `at` among the steps still to come, in time order.
    fn schedule(&mut self, at: f64, step: Step) {
        let k = self.next + self.steps[self.next..].partition_point(|s| s.0 <= at);
        self.steps.insert(k, (at, step));
    }

    /// The seeded choice of `n` nodes to preempt among `candidates`.
    fn victims(&mut self, mut candidates: Vec<usize>, n: usize) -> Vec<usize> {
        candidates.shuffle(&mut self.rng);
        candidates.truncate(n);
        candidates
    }
}

impl Scenario for Replay {
    fn initial_nodes(&self) -> usize {
        self.counts.first().copied().unwrap_or(1) as usize
    }

    fn keeps_every_checkpoint(&self) -> bool {
        self.keeps_every_checkpoint
    }

    fn ends_with_the_job(&self) -> bool {
        self.ends_with_the_job
    }

    fn zones(&self) -> Vec<ZoneStart> {
        self.zones
            .iter()
            .enumerate()
            .map(|(z, (name, counts))| ZoneStart {
                name: name.clone(),
                speed: self.speeds.get(z).copied().unwrap_or(1.0),
                initial: counts.first().copied().unwrap_or(0) as usize,
            })
            .collect()
    }

    fn duration_secs(&self) -> f64 {
        self.counts.len() as f64 * self.interval_secs
    }

    fn next_action(&self) -> Option<f64> {
        self.steps.get(self.next).map(|s| s.0)
    }

    fn act(&mut self, ctx: &mut Ctx<'_>) -> Result<(), TestnetError> {
        let Some(&(_, step)) = self.steps.get(self.next) else {
            return Ok(());
        };
        self.next += 1;
        match step {
            Step::Notice(k) => {
                for (_, want, up) in self.groups(ctx.cluster, k) {
                    if up.len() > want {
                        let surplus = up.len() - want;
                        let candidates: Vec<usize> = up.into_iter().filter(|&i| i != 0).collect();
                        let deadline = k as f64 * self.interval_secs;
                        for i in self.victims(candidates, surplus) {
                            ctx.notify(i, deadline);
                        }
                    }
                }
            }
            Step::Arrive(k) => {
                for (zone, want, up) in self.groups(ctx.cluster, k) {
                    ctx.start_nodes(want.saturating_sub(up.len()), zone)?;
                }
            }
            Step::KillLeader => {
                if !ctx.kill_leader() {
                    // No node leads this instant (an election): try again shortly.
                    self.schedule(ctx.now() + 0.5, Step::KillLeader);
                }
            }
        }
        Ok(())
    }

    fn target(&self, t: f64) -> u32 {
        let k = (t / self.interval_secs) as usize;
        self.counts
            .get(k.min(self.counts.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    }

    fn interval_at(&self, t: f64) -> (u64, u64) {
        let len = self.counts.len() as u64;
        (((t / self.interval_secs) as u64).min(len), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_strategies::trace::Interval;

    fn trace(counts: &[u32]) -> Trace {
        Trace {
            source: "t".into(),
            interval_secs: 60,
            intervals: counts
                .iter()
                .map(|&nodes| Interval {
                    nodes,
                    added: 0,
                    removed: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn plan_scales_to_the_cap_and_keeps_one_node() {
        assert_eq!(plan(&trace(&[32, 24, 16, 0]), 0..4, 4, 6), vec![6, 5, 3, 1]);
        assert_eq!(plan(&trace(&[4, 5, 3]), 0..3, 10, 6), vec![4, 5, 3]);
        assert_eq!(plan(&trace(&[4, 5, 3]), 0..3, 2, 6), vec![4, 5]);
        // A window, scaled by its own peak.
        assert_eq!(plan(&trace(&[32, 12, 24, 6]), 1..4, 10, 6), vec![3, 6, 2]);
        assert_eq!(plan(&trace(&[4, 5, 3]), 3..3, 10, 6), Vec::<u32>::new());
    }

    #[test]
    fn zones_replay_together_each_from_its_own_first_count() {
        let r = Replay::zoned(
            vec![("a".into(), vec![2, 1, 3]), ("b".into(), vec![1, 2, 2, 5])],
            vec![1.0, 1.5],
            10.0,
            3.0,
            1,
        );
        assert_eq!(r.counts(), &[3, 3, 5], "summed, cut to the shortest zone");
        let start = |name: &str, speed, initial| ZoneStart {
            name: name.into(),
            speed,
            initial,
        };
        assert_eq!(r.zones(), vec![start("a", 1.0, 2), start("b", 1.5, 1)]);
        assert_eq!(r.initial_nodes(), 3);
        assert_eq!(r.duration_secs(), 30.0);
        assert!(Replay::new(vec![3], 10.0, 3.0, 1).zones().is_empty());
    }

    #[test]
    fn schedule_has_a_notice_grace_before_each_boundary() {
        let r = Replay::new(vec![3, 2, 4], 10.0, 3.0, 1);
        assert_eq!(
            r.steps,
            vec![
                (7.0, Step::Notice(1)),
                (10.0, Step::Arrive(1)),
                (17.0, Step::Notice(2)),
                (20.0, Step::Arrive(2)),
            ]
        );
        assert_eq!(r.initial_nodes(), 3);
        assert_eq!(r.duration_secs(), 30.0);
        assert_eq!(r.target(9.9), 3);
        assert_eq!(r.target(10.0), 2);
        assert_eq!(r.target(99.0), 4);
        assert_eq!(r.interval_at(25.0), (2, 3));
        // A grace longer than an interval is cut at the previous boundary.
        let r = Replay::new(vec![3, 2], 2.0, 5.0, 1);
        assert_eq!(r.steps[0], (0.0, Step::Notice(1)));
    }

    #[test]
    fn the_leader_kill_is_scheduled_in_order() {
        let r = Replay::new(vec![3, 2, 4], 10.0, 3.0, 1).kill_leader_at(15.0);
        let kinds: Vec<(f64, Step)> = r.steps.clone();
        assert_eq!(kinds[2], (15.0, Step::KillLeader));
        assert_eq!(kinds[3], (17.0, Step::Notice(2)));
        assert_eq!(kinds.len(), 5);
    }

    #[test]
    fn victims_are_seeded() {
        let mut a = Replay::new(vec![1], 1.0, 0.0, 9);
        let mut b = Replay::new(vec![1], 1.0, 0.0, 9);
        let pick = a.victims(vec![1, 2, 3, 4, 5], 2);
        assert_eq!(pick.len(), 2);
        assert_eq!(pick, b.victims(vec![1, 2, 3, 4, 5], 2));
        assert!(pick.iter().all(|i| (1..=5).contains(i)));
    }
}
