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
use crate::cost::money::machine_hours;
pub use crate::cost::rounds::Rounds;
use crate::cost::rounds::{
    INNER_STEPS, PoolValue, SyncChoice, choose, choose_from, exchange, fetch, planned_values,
    pseudo_gradient_bytes,
};

/// Intervals between two choices of `--sync auto`: a pool that joins fetches the whole model,
/// so the groups are not redrawn at every wobble of a count.
pub const RECHOOSE_INTERVALS: usize = 10;

/// Intervals of a pool's own record `--sync auto` values it by (an hour of one-minute
/// intervals): long enough to hold its churn, short enough to follow its time of day.
pub const HISTORY_INTERVALS: usize = 60;

/// Intervals of record below which `--sync auto` values a pool by its plan instead.
pub const HISTORY_MIN: usize = 10;

/// How the pools synchronise besides the synchronous strategies: DiLoCo's rounds as given, or
/// as `--sync auto` chooses them with the pseudo-gradients in `Wire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outer {
    /// `diloco:H` over every pool.
    Rounds(Rounds),
    /// The pools and `H` chosen as the run goes ([`Groups::Auto`]).
    Auto(Wire),
}

/// Who takes part in the rounds.
#[derive(Clone, Copy, Debug)]
pub enum Groups<'a> {
    /// These pools throughout, rounds as given.
    Fixed(&'a [usize], Rounds),
    /// Chosen every [`RECHOOSE_INTERVALS`] intervals (`cost::rounds::choose_from`), each pool
    /// valued by what it trained alone and what its held nodes cost over its last
    /// [`HISTORY_INTERVALS`] (its churn and its time of day in it, as the planner's record
    /// shows them), by its plan before [`HISTORY_MIN`]; for samples per dollar where priced.
    Auto {
        /// The pseudo-gradients' wire form.
        wire: Wire,
        /// Each pool's price of a node-hour, planning for samples per dollar.
        usd_per_node_hour: Option<&'a [f64]>,
    },
}

/// What DiLoCo's rounds did besides training.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundsReport {
    /// Inner steps of a round (the last choice's).
    pub inner_steps: u32,
    /// The pools that took part in a round.
    pub pools: Vec<String>,
    /// Rounds closed.
    pub rounds: u32,
    /// Bytes of pseudo-gradients (and of the model to pools that joined) that crossed zones.
    pub cross_zone_bytes: f64,
    /// Seconds every group spent in exchanges.
    pub exchange_secs: f64,
    /// Times the pools in the rounds changed after the first choice.
    #[serde(default)]
    pub regroupings: u32,
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
    /// Seconds it still spends fetching the model after joining.
    fetching_secs: f64,
    /// Chosen out: it trains no more and leaves when the round closes.
    leaving: bool,
}

/// What DiLoCo trained over the pools, what it billed and what its rounds cost.
#[derive(Clone, Debug, PartialEq)]
pub struct DilocoRun {
    /// The run, one row of samples for every group together.
    pub run: StrategyRun,
    /// Node-hours billed in each pool of the fleet: its held nodes while it was in the rounds.
    pub node_hours: Vec<f64>,
    /// Egress dollars of the pseudo-gradients and of the model sent to pools that joined.
    pub egress_usd: f64,
    /// The rounds.
    pub rounds: RoundsReport,
}

/// DiLoCo over the pools of `fleet` that `groups` names, pool `g` trained as `every[g]` and
/// holding `held[k][g]` nodes in interval `k` (of `interval_secs`): the run it trains, billed
/// for the pools in the rounds while they are, and what its rounds cost.
pub fn diloco(
    fleet: &Fleet,
    every: &[&StrategyRun],
    held: &[Vec<u32>],
    groups: Groups<'_>,
    interval_secs: f64,
) -> DilocoRun {
    let intervals = every
        .iter()
        .map(|a| a.cumulative.len())
        .min()
        .unwrap_or(0)
        .min(held.len());
    let (wire, name) = match groups {
        Groups::Fixed(_, r) => (r.wire, format!("diloco:{}", r.inner_steps)),
        Groups::Auto { wire, .. } => (wire, "auto".to_string()),
    };
    let mut state = RoundState {
        members: Vec::new(),
        pause_secs: 0.0,
        report: RoundsReport::default(),
        egress_usd: 0.0,
    };
    let exchange = Exchange {
        fleet,
        bytes: pseudo_gradient_bytes(fleet, wire),
        model_bytes: pseudo_gradient_bytes(fleet, Wire::F32),
    };
    let mut node_secs = vec![0.0; fleet.pools().len()];
    let mut cumulative = Vec::with_capacity(intervals);
    let mut samples = 0.0;
    for k in 0..intervals {
        let choice = choice_at(groups, fleet, every, held, (k, interval_secs));
        if let Some(choice) = choice {
            state.regroup(&choice, &held[k], &exchange, k > 0);
        }
        let rates: Vec<f64> = state
            .members
            .iter_mut()
            .map(|m| member_rate(m, every, k, interval_secs))
            .collect();
        for m in state.members.iter().filter(|m| !m.leaving) {
            node_secs[m.pool] += f64::from(held[k][m.pool]) * interval_secs;
        }
        let per_group =
            f64::from(state.report.inner_steps.max(1)) * f64::from(fleet.spec().global_batch);
        samples += state.interval(&rates, interval_secs, per_group, &exchange);
        cumulative.push(samples);
    }
    let ran: Vec<&StrategyRun> = every
        .iter()
        .enumerate()
        .filter(|(pool, _)| node_secs[*pool] > 0.0)
        .map(|(_, a)| *a)
        .collect();
    let mut kinds = MigrationCounts::default();
    for r in &ran {
        kinds.add(&r.kinds);
    }
    state.report.pools = (0..fleet.pools().len())
        .filter(|&g| node_secs[g] > 0.0)
        .map(|g| fleet.pools()[g].pool.to_string())
        .collect();
    let run = StrategyRun {
        name,
        samples,
        migrations: ran.iter().map(|r| r.migrations).sum(),
        kinds,
        migration_secs: ran.iter().map(|r| r.migration_secs).sum(),
        // Each group runs its own configuration: no one configuration is the run's.
        configs: Vec::new(),
        cumulative,
        charged_secs: Vec::new(),
    };
    DilocoRun {
        run,
        node_hours: node_secs.iter().map(|s| s / 3600.0).collect(),
        egress_usd: state.egress_usd,
        rounds: state.report,
    }
}

/// The pools `groups` puts in the rounds at interval `k` (of `secs`), where it chooses anew:
/// the fixed pools at the start, `--sync auto`'s choice every [`RECHOOSE_INTERVALS`].
fn choice_at(
    groups: Groups<'_>,
    fleet: &Fleet,
    every: &[&StrategyRun],
    held: &[Vec<u32>],
    (k, secs): (usize, f64),
) -> Option<SyncChoice> {
    match groups {
        Groups::Fixed(pools, rounds) => (k == 0).then(|| SyncChoice {
            groups: pools.to_vec(),
            rounds: Some(rounds),
        }),
        Groups::Auto {
            wire,
            usd_per_node_hour,
        } => (k % RECHOOSE_INTERVALS == 0)
            .then(|| auto_choice(fleet, every, held, k, usd_per_node_hour, wire, secs)),
    }
}

/// What member `m` trains a second in interval `k`: its pool's rate alone, none once chosen
/// out, less the share of the interval it still spends fetching the model; its nodes noted.
fn member_rate(m: &mut Member, every: &[&StrategyRun], k: usize, secs: f64) -> f64 {
    let Some(alone) = every.get(m.pool) else {
        return 0.0;
    };
    if let Some(c) = alone.configs.get(k).filter(|c| c.d * c.p > 0) {
        m.nodes = c.d * c.p;
    }
    if m.leaving {
        return 0.0;
    }
    let before = k.checked_sub(1).map_or(0.0, |j| alone.cumulative[j]);
    let rate = (alone.cumulative[k] - before).max(0.0) / secs;
    let fetching = m.fetching_secs.min(secs);
    m.fetching_secs -= fetching;
    rate * (1.0 - fetching / secs)
}

/// `--sync auto`'s choice at interval `k`: each pool its plan can train on valued by its
/// record over the last [`HISTORY_INTERVALS`] (samples its alone run trained, its held nodes'
/// bill), or by its plan before [`HISTORY_MIN`] intervals of record or where the record
/// trained nothing.
fn auto_choice(
    fleet: &Fleet,
    every: &[&StrategyRun],
    held: &[Vec<u32>],
    k: usize,
    usd_per_node_hour: Option<&[f64]>,
    wire: Wire,
    secs: f64,
) -> SyncChoice {
    let now = &held[k];
    if k < HISTORY_MIN {
        return choose(fleet, now, usd_per_node_hour, wire);
    }
    let from = k.saturating_sub(HISTORY_INTERVALS);
    let span = (k - from) as f64 * secs;
    let planned = planned_values(fleet, now, usd_per_node_hour);
    let values = planned
        .into_iter()
        .map(|plan| {
            let (pool, alone) = (plan.pool, &every[plan.pool].cumulative);
            let at = |j: Option<usize>| j.map_or(0.0, |j| alone[j]);
            let trained = at(Some(k - 1)) - at(from.checked_sub(1));
            if trained <= 0.0 {
                // Nodes it did not have in the record: its plan is all there is to go by.
                return plan;
            }
            let hours = machine_hours(held[from..k].iter().map(|c| c[pool]), secs);
            let price = usd_per_node_hour
                .and_then(|p| p.get(pool).copied())
                .unwrap_or(0.0);
            PoolValue {
                samples_per_sec: trained / span,
                usd_per_sec: hours * price / span,
                ..plan
            }
        })
        .collect();
    choose_from(fleet, values, usd_per_node_hour.is_some(), wire)
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
    /// Takes `choice`'s pools into the rounds (holding `held` nodes): a pool chosen out trains
    /// no more and leaves at the round's close with what it trained; a pool that joins while
    /// the others train (`under_way`) first fetches the outer weights (the model in f32) from
    /// one of them, its bytes and egress booked, its time lost to its training.
    fn regroup(
        &mut self,
        choice: &SyncChoice,
        held: &[u32],
        exchange_of: &Exchange<'_>,
        under_way: bool,
    ) {
        let before: Vec<usize> = self.active();
        for m in &mut self.members {
            m.leaving = !choice.groups.contains(&m.pool);
        }
        self.members.retain(|m| !m.leaving || m.trained > 0.0);
        for &pool in &choice.groups {
            if self.members.iter().any(|m| m.pool == pool) {
                continue;
            }
            let nodes = held.get(pool).copied().unwrap_or(0).max(1);
            let mut member = Member {
                pool,
                nodes,
                ..Member::default()
            };
            if let Some(from) = self
                .members
                .iter()
                .find(|m| !m.leaving)
                .filter(|_| under_way)
            {
                let cost = fetch(
                    exchange_of.fleet,
                    exchange_of.model_bytes,
                    (from.pool, from.nodes),
                    (pool, nodes),
                );
                self.report.cross_zone_bytes += cost.cross_zone_bytes;
                self.egress_usd += cost.egress_usd;
                member.fetching_secs = cost.secs;
            }
            self.members.push(member);
        }
        self.members.sort_by_key(|m| m.pool);
        if under_way && self.active() != before {
            self.report.regroupings += 1;
        }
        // One group alone exchanges nothing: its rounds keep the last length (the fewest
        // inner steps before any).
        self.report.inner_steps = match choice.rounds {
            Some(rounds) => rounds.inner_steps,
            None if self.report.inner_steps == 0 => INNER_STEPS[0],
            None => self.report.inner_steps,
        };
    }

    /// The pools training in the rounds.
    fn active(&self) -> Vec<usize> {
        self.members
            .iter()
            .filter(|m| !m.leaving)
            .map(|m| m.pool)
            .collect()
    }

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
        self.members.retain(|m| !m.leaving);
    }
}

/// What a round's exchange is priced on: the fleet's links, one group's bytes, and the model's
/// in f32 (what a pool that joins fetches).
struct Exchange<'a> {
    fleet: &'a Fleet,
    bytes: f64,
    model_bytes: f64,
}

#[cfg(test)]
mod tests;
