//! DiLoCo between the fleet's pools, simulated (issue 68): each pool is a group that trains on
//! its own nodes as `liveput-zone` plans one pool alone (its own forecast, migrations and
//! restarts: the very runs `single-zone-best` picks from). A round is paced by the fleet, not
//! by its slowest group: it is due once the groups together have trained `H` inner steps of
//! the job's batch for every group training, each group contributing what it trained (a
//! faster group more inner steps, a group that lost its nodes mid-round what it had; its
//! pseudo-gradient weighted by its samples), so no group waits for another. Then the groups
//! that trained exchange their pseudo-gradients once, a ring over them in the pools' order
//! (each sends `2 (G - 1) / G` of the model's bytes in the wire form, spread over its nodes,
//! each node over its own link), and every group waits for the exchange before the next
//! round. A round of one group exchanges nothing.
//!
//! What this does not model is learning: DiLoCo's samples are worth less than synchronous ones
//! (the loss at equal samples), which the testnet measures.

use parcae_outer::Wire;
use serde::{Deserialize, Serialize};

use super::{MigrationCounts, StrategyRun};
use crate::cost::fleet::Fleet;
pub use crate::cost::rounds::Rounds;
use crate::cost::rounds::{exchange, pseudo_gradient_bytes};

/// How the pools synchronise besides the synchronous strategies: DiLoCo's rounds as given, or
/// as `--sync auto` chooses them (`cost::rounds::choose`) with the pseudo-gradients in `Wire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outer {
    /// `diloco:H` over every pool.
    Rounds(Rounds),
    /// The pools and `H` chosen from the cost model at the run's first interval.
    Auto(Wire),
}

/// What DiLoCo's rounds did besides training.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundsReport {
    /// Inner steps of a round.
    pub inner_steps: u32,
    /// The pools in the rounds.
    pub pools: Vec<String>,
    /// Rounds closed.
    pub rounds: u32,
    /// Bytes of pseudo-gradients that crossed zones.
    pub cross_zone_bytes: f64,
    /// Seconds every group spent in exchanges.
    pub exchange_secs: f64,
}

/// One group in a round.
#[derive(Clone, Copy, Debug, Default)]
struct Member {
    /// Its pool.
    pool: usize,
    /// Samples trained this round.
    trained: f64,
    /// Its nodes when it last trained, that share its sending.
    nodes: u32,
}

/// One pool trained alone: its run and the node-hours it billed.
#[derive(Clone, Copy, Debug)]
pub struct Alone<'a> {
    /// The run.
    pub run: &'a StrategyRun,
    /// Node-hours billed in its pool.
    pub node_hours: f64,
}

/// What DiLoCo trained over the pools, what it billed and what its rounds cost.
#[derive(Clone, Debug, PartialEq)]
pub struct DilocoRun {
    /// The run, one row of samples for every group together.
    pub run: StrategyRun,
    /// Node-hours billed in each pool of the fleet (none outside the rounds).
    pub node_hours: Vec<f64>,
    /// Egress dollars of the pseudo-gradients.
    pub egress_usd: f64,
    /// The rounds.
    pub rounds: RoundsReport,
}

/// DiLoCo over the pools `groups` of `fleet`, pool `g` trained as `every[g]` (intervals of
/// `interval_secs`): the run it trains, billed for those pools alone, and what its rounds cost.
pub fn diloco(
    fleet: &Fleet,
    every: &[Alone<'_>],
    groups: &[usize],
    interval_secs: f64,
    rounds: Rounds,
) -> DilocoRun {
    let alone: Vec<&StrategyRun> = groups
        .iter()
        .filter_map(|&g| every.get(g))
        .map(|a| a.run)
        .collect();
    let intervals = alone.iter().map(|r| r.cumulative.len()).min().unwrap_or(0);
    let spec = fleet.spec();
    let per_group = f64::from(rounds.inner_steps.max(1)) * f64::from(spec.global_batch);
    let mut state = RoundState {
        members: groups
            .iter()
            .map(|&pool| Member {
                pool,
                ..Member::default()
            })
            .collect(),
        pause_secs: 0.0,
        report: RoundsReport {
            inner_steps: rounds.inner_steps,
            pools: groups
                .iter()
                .map(|&g| fleet.zones()[g].pool.to_string())
                .collect(),
            ..RoundsReport::default()
        },
        egress_usd: 0.0,
    };
    let exchange = Exchange {
        fleet,
        bytes: pseudo_gradient_bytes(fleet, rounds.wire),
    };
    let mut cumulative = Vec::with_capacity(intervals);
    let mut samples = 0.0;
    for k in 0..intervals {
        let rates: Vec<f64> = alone
            .iter()
            .map(|r| {
                let before = k.checked_sub(1).map_or(0.0, |j| r.cumulative[j]);
                (r.cumulative[k] - before).max(0.0) / interval_secs
            })
            .collect();
        for (m, r) in state.members.iter_mut().zip(&alone) {
            if let Some(c) = r.configs.get(k).filter(|c| c.d * c.p > 0) {
                m.nodes = c.d * c.p;
            }
        }
        samples += state.interval(&rates, interval_secs, per_group, &exchange);
        cumulative.push(samples);
    }
    let mut kinds = MigrationCounts::default();
    for r in &alone {
        kinds.add(&r.kinds);
    }
    let mut node_hours = vec![0.0; fleet.zones().len()];
    for &g in groups {
        if let (Some(hours), Some(a)) = (node_hours.get_mut(g), every.get(g)) {
            *hours = a.node_hours;
        }
    }
    let run = StrategyRun {
        name: format!("diloco:{}", rounds.inner_steps),
        samples,
        migrations: alone.iter().map(|r| r.migrations).sum(),
        kinds,
        migration_secs: alone.iter().map(|r| r.migration_secs).sum(),
        // Each group runs its own configuration: no one configuration is the run's.
        configs: Vec::new(),
        cumulative,
        charged_secs: Vec::new(),
    };
    DilocoRun {
        run,
        node_hours,
        egress_usd: state.egress_usd,
        rounds: state.report,
    }
}

/// The rounds in progress across intervals.
struct RoundState {
    members: Vec<Member>,
    /// Seconds of the exchange still to wait.
    pause_secs: f64,
    report: RoundsReport,
    egress_usd: f64,
}

impl RoundState {
    /// One interval of `secs` in which group `g` trains `rates[g]` samples a second, a round
    /// due at `per_group` samples for each group training: the samples trained.
    fn interval(
        &mut self,
        rates: &[f64],
        secs: f64,
        per_group: f64,
        exchange: &Exchange<'_>,
    ) -> f64 {
        let training = rates.iter().filter(|&&r| r > 0.0).count();
        let (fleet_rate, target) = (rates.iter().sum::<f64>(), per_group * training as f64);
        let (mut t, mut trained) = (0.0, 0.0);
        while t < secs {
            if self.pause_secs > 0.0 {
                let wait = self.pause_secs.min(secs - t);
                self.pause_secs -= wait;
                self.report.exchange_secs += wait;
                t += wait;
                continue;
            }
            if training == 0 {
                break;
            }
            let left = target - self.members.iter().map(|m| m.trained).sum::<f64>();
            // What rounding leaves of a round all but done closes it too.
            if left <= 1e-9 * target {
                self.close(exchange);
                continue;
            }
            let dt = (left / fleet_rate).min(secs - t);
            for (m, rate) in self.members.iter_mut().zip(rates) {
                m.trained += rate * dt;
            }
            trained += fleet_rate * dt;
            t += dt;
        }
        trained
    }

    /// Closes the round: the groups that trained exchange, and the next round begins.
    fn close(&mut self, exchange_of: &Exchange<'_>) {
        let contributors: Vec<(usize, u32)> = self
            .members
            .iter()
            .filter(|m| m.trained > 0.0)
            .map(|m| (m.pool, m.nodes))
            .collect();
        self.report.rounds += 1;
        let cost = exchange(exchange_of.fleet, exchange_of.bytes, &contributors);
        self.pause_secs = cost.secs;
        self.report.cross_zone_bytes += cost.cross_zone_bytes;
        self.egress_usd += cost.egress_usd;
        for m in &mut self.members {
            m.trained = 0.0;
        }
    }
}

/// What a round's exchange is priced on: the fleet's links and one group's bytes.
struct Exchange<'a> {
    fleet: &'a Fleet,
    bytes: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ParallelConfig;
    use crate::cost::builtin::builtin;
    use crate::cost::fleet::Zone;
    use crate::cost::links::{Link, Links};
    use crate::cost::mixed::DeviceCosts;

    const SECS: f64 = 60.0;

    fn fleet() -> Fleet {
        let spec = builtin("gpt-1.5b").unwrap().0;
        let v100 = DeviceCosts::profiled(&spec, "v100", 15.5 * 1024.0);
        let zone = |name: &str| Zone {
            pool: name.parse().unwrap(),
            device: v100.clone(),
        };
        Fleet::new(
            spec,
            vec![zone("us-east-1b"), zone("us-east-1a")],
            Links::default(),
        )
        .unwrap()
    }

    /// A pool trained alone at `rate[k]` samples a second in interval `k`, on one 1 x 8
    /// pipeline (none where the rate is 0).
    fn alone(rates: &[f64]) -> StrategyRun {
        let mut cumulative = Vec::new();
        let mut samples = 0.0;
        for r in rates {
            samples += r * SECS;
            cumulative.push(samples);
        }
        StrategyRun {
            name: "single-zone-best".into(),
            samples,
            migrations: 1,
            kinds: MigrationCounts::default(),
            migration_secs: 10.0,
            configs: rates
                .iter()
                .map(|&r| ParallelConfig::new(u32::from(r > 0.0), 8))
                .collect(),
            cumulative,
            charged_secs: Vec::new(),
        }
    }

    /// DiLoCo over two pools trained alone at `a` and `b`, each billed eight nodes throughout.
    fn over_two(fleet: &Fleet, a: &[f64], b: &[f64], rounds: Rounds) -> DilocoRun {
        let (a, b) = (alone(a), alone(b));
        let hours = |r: &StrategyRun| 8.0 * SECS * r.cumulative.len() as f64 / 3600.0;
        let every = [
            Alone {
                run: &a,
                node_hours: hours(&a),
            },
            Alone {
                run: &b,
                node_hours: hours(&b),
            },
        ];
        diloco(fleet, &every, &[0, 1], SECS, rounds)
    }

    const H10: Rounds = Rounds {
        inner_steps: 10,
        wire: Wire::F32,
    };

    /// One group's pseudo-gradient in f32, and the link between the two pools.
    fn model_bytes_and_link(fleet: &Fleet) -> (f64, Link) {
        let params: f64 = fleet.spec().layers.iter().map(|l| l.params).sum();
        (
            params * 4.0,
            fleet.links().between("us-east-1a", "us-east-1b"),
        )
    }

    #[test]
    fn equal_groups_exchange_once_a_round_and_lose_only_the_exchange() {
        let fleet = fleet();
        let (bytes, link) = model_bytes_and_link(&fleet);
        let run = over_two(&fleet, &[32.0; 30], &[32.0; 30], H10);
        let report = run.rounds.clone();
        // A round is 10 steps of the job's batch a group at 32 samples a second, then the
        // exchange (each group sends the whole model once, eight nodes sharing it).
        let round = 10.0 * f64::from(fleet.spec().global_batch) / 32.0;
        let exchange = bytes / 8.0 * 8.0 / (link.gbit_per_s * 1e9) + 2.0 * link.latency_ms / 1e3;
        let rounds = f64::from(report.rounds);
        assert_eq!(report.rounds, (1800.0 / (round + exchange)).floor() as u32);
        // Every whole round's exchange waited, and no more than the last one's besides.
        assert!(report.exchange_secs >= rounds * exchange - exchange - 1e-9);
        assert!(report.exchange_secs <= rounds * exchange + 1e-9);
        assert_eq!(
            report.cross_zone_bytes,
            f64::from(report.rounds) * 2.0 * bytes
        );
        assert!((run.egress_usd - report.cross_zone_bytes / 1e9 * link.usd_per_gb).abs() < 1e-6);
        let whole = 2.0 * 32.0 * 1800.0;
        assert!(
            (run.run.samples - (whole - 2.0 * 32.0 * report.exchange_secs)).abs() < 1e-6,
            "{}",
            run.run.samples
        );
        assert_eq!(run.run.cumulative.len(), 30);
        assert_eq!(run.run.name, "diloco:10");
        assert_eq!((run.run.migrations, run.run.migration_secs), (2, 20.0));
        assert_eq!(run.node_hours, [4.0, 4.0]);
    }

    #[test]
    fn a_faster_group_trains_more_inner_steps_nobody_waits_and_bf16_halves_the_bytes() {
        let fleet = fleet();
        let (bytes, link) = model_bytes_and_link(&fleet);
        let rounds = Rounds {
            wire: Wire::Bf16,
            ..H10
        };
        let run = over_two(&fleet, &[32.0; 30], &[16.0; 30], rounds);
        let report = run.rounds.clone();
        // A round is due at 20 steps' samples between the two, 48 samples a second: the fast
        // group trains two thirds of it.
        let round = 20.0 * f64::from(fleet.spec().global_batch) / 48.0;
        let exchange =
            bytes / 2.0 / 8.0 * 8.0 / (link.gbit_per_s * 1e9) + 2.0 * link.latency_ms / 1e3;
        assert_eq!(report.rounds, (1800.0 / (round + exchange)).floor() as u32);
        assert_eq!(
            report.cross_zone_bytes,
            f64::from(report.rounds) * 2.0 * bytes / 2.0
        );
        let whole = 48.0 * 1800.0;
        assert!(
            (run.run.samples - (whole - 48.0 * report.exchange_secs)).abs() < 1e-6,
            "{}",
            run.run.samples
        );
    }

    #[test]
    fn a_group_without_nodes_drops_out_and_the_others_never_wait_for_it() {
        let fleet = fleet();
        let mut gone = vec![32.0; 5];
        gone.extend([0.0; 25]);
        let run = over_two(&fleet, &[32.0; 30], &gone, H10);
        let report = run.rounds.clone();
        // Both trained their 300 s but for the exchanges; then the first trains alone,
        // exchanging nothing.
        let (bytes, link) = model_bytes_and_link(&fleet);
        let exchange = bytes / 8.0 * 8.0 / (link.gbit_per_s * 1e9) + 2.0 * link.latency_ms / 1e3;
        let most = 32.0 * 1800.0 + 32.0 * 300.0;
        assert!(run.run.samples <= most, "{}", run.run.samples);
        assert!(
            run.run.samples >= most - 64.0 * (300.0 / 40.0 + 1.0) * exchange,
            "{}",
            run.run.samples
        );
        // Rounds of both while both trained (300 s), each exchanging; alone, none crosses.
        let round = 10.0 * f64::from(fleet.spec().global_batch) / 32.0;
        let both = (300.0 / round).floor();
        assert!(
            (report.cross_zone_bytes / (2.0 * bytes) - both).abs() <= 1.0,
            "{report:?}"
        );
        assert!(
            f64::from(report.rounds) >= 1800.0 / round - 2.0,
            "{report:?}"
        );
    }
}
