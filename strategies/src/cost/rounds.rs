//! DiLoCo's rounds between pools, priced and chosen (issue 68): what a round's exchange of
//! pseudo-gradients costs (a ring over the groups in the pools' order, each sending
//! `2 (G - 1) / G` of the model in the wire form, spread over its nodes, at the ring's slowest
//! link, each step's latency added, egress billed where it leaves a zone), and, for `--sync
//! auto`, which pools join the rounds and how many inner steps a round takes, from each pool's
//! planned rate alone, its price and the links: a pure function of one composition.
//!
//! Under samples per dollar the rounds may give up [`DOLLAR_SLACK`] of the best pool's samples
//! per dollar for the samples the others add (the pools joining in order of their own samples
//! per dollar, while the group's, its exchange's wait and egress counted, stays within the
//! slack); for samples every pool joins. `H` is the fewest inner steps of
//! [`INNER_STEPS`] whose exchange takes at most [`EXCHANGE_SHARE`] of a round's time (and, for
//! dollars, whose egress adds at most [`EGRESS_SHARE`] to its bill). Fewer than two pools:
//! synchronous steps.

use parcae_outer::Wire;
use serde::{Deserialize, Serialize};

use super::fleet::Fleet;
use super::links::Link;
use super::traffic::share;

/// Bytes in a GB, as links are priced.
const GB: f64 = 1e9;

/// The inner steps a round may take, fewest first (DiLoCo's paper: 500; its follow-ups 30-100).
pub const INNER_STEPS: [u32; 5] = [20, 50, 100, 200, 500];

/// Samples per dollar the rounds may give up against the best pool alone.
pub const DOLLAR_SLACK: f64 = 0.1;

/// Most of a round's time its exchange may take.
pub const EXCHANGE_SHARE: f64 = 0.05;

/// Most of a round's node bill its exchange's egress may add, planned for dollars: every
/// share of it is a share of the samples per dollar the slack can spend on more pools.
pub const EGRESS_SHARE: f64 = 0.01;

/// How DiLoCo's rounds run: `H` and the pseudo-gradient's wire form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rounds {
    /// Inner steps a group takes a round.
    pub inner_steps: u32,
    /// How pseudo-gradients cross between groups.
    pub wire: Wire,
}

/// What one round's exchange costs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeCost {
    /// Seconds every group waits for it.
    pub secs: f64,
    /// Bytes that leave a zone.
    pub cross_zone_bytes: f64,
    /// Their egress, dollars.
    pub egress_usd: f64,
}

/// Bytes of one value in the `wire` form (`int8`'s scale shared by its block).
pub fn bytes_per_value(wire: Wire) -> f64 {
    match wire {
        Wire::F32 => 4.0,
        Wire::Bf16 => 2.0,
        Wire::Int8 => 1.0 + 4.0 / parcae_outer::codec::INT8_BLOCK as f64,
    }
}

/// One group's pseudo-gradient on the wire, bytes.
pub fn pseudo_gradient_bytes(fleet: &Fleet, wire: Wire) -> f64 {
    fleet.spec().layers.iter().map(|l| l.params).sum::<f64>() * bytes_per_value(wire)
}

/// The exchange of `bytes` a group among `groups` (pool index and the nodes sharing its
/// sending): a ring over them in the pools' order.
pub fn exchange(fleet: &Fleet, bytes: f64, groups: &[(usize, u32)]) -> ExchangeCost {
    let g = groups.len();
    if g < 2 {
        return ExchangeCost::default();
    }
    let pools = fleet.pools();
    let mut ring = groups.to_vec();
    ring.sort_by(|a, b| pools[a.0].pool.cmp(&pools[b.0].pool));
    let sent = share(g as u32) * bytes;
    let mut cost = ExchangeCost::default();
    let mut slowest: Option<Link> = None;
    for (i, &(a, _)) in ring.iter().enumerate() {
        let b = ring[(i + 1) % g].0;
        let link = fleet
            .links()
            .between(pools[a].pool.zone(), pools[b].pool.zone());
        if !pools[a].pool.shares_zone(&pools[b].pool) {
            cost.cross_zone_bytes += sent;
            cost.egress_usd += sent / GB * link.usd_per_gb;
        }
        slowest = Some(match slowest {
            Some(s) if s.gbit_per_s <= link.gbit_per_s => s,
            _ => link,
        });
    }
    let fewest = ring.iter().map(|&(_, n)| n).min().unwrap_or(1).max(1);
    cost.secs = slowest.map_or(0.0, |link| {
        let steps = 2.0 * (g as f64 - 1.0);
        sent / f64::from(fewest) * 8.0 / (link.gbit_per_s * 1e9) + steps * link.latency_ms / 1e3
    });
    cost
}

/// A one-way copy of `bytes` from pool `from` to pool `to` (each a pool index and the nodes
/// sharing the transfer): a pool that joins the rounds fetching the outer weights.
pub fn fetch(fleet: &Fleet, bytes: f64, from: (usize, u32), to: (usize, u32)) -> ExchangeCost {
    let pools = fleet.pools();
    let (a, b) = (&pools[from.0].pool, &pools[to.0].pool);
    let link = fleet.links().between(a.zone(), b.zone());
    let crossing = !a.shares_zone(b);
    let nodes = from.1.min(to.1).max(1);
    ExchangeCost {
        secs: bytes / f64::from(nodes) * 8.0 / (link.gbit_per_s * 1e9) + link.latency_ms / 1e3,
        cross_zone_bytes: if crossing { bytes } else { 0.0 },
        egress_usd: if crossing {
            bytes / GB * link.usd_per_gb
        } else {
            0.0
        },
    }
}

/// What `--sync auto` chose: the pools of the rounds and how they run (`None`: synchronous
/// steps over the fleet).
#[derive(Clone, Debug, PartialEq)]
pub struct SyncChoice {
    /// Pools in the rounds, by index.
    pub groups: Vec<usize>,
    /// The rounds, where two pools or more join.
    pub rounds: Option<Rounds>,
}

/// One pool as the choice weighs it: what it trains alone, on how many nodes, what it bills.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolValue {
    /// The pool, by index.
    pub pool: usize,
    /// Samples a second it trains alone.
    pub samples_per_sec: f64,
    /// Its nodes, that share its sending.
    pub nodes: u32,
    /// What its held nodes cost a second, dollars (0 unpriced).
    pub usd_per_sec: f64,
}

/// Each pool of `fleet` with `counts[g]` nodes valued by its plan: its best configuration's
/// rate at its nodes, every held node billed at `usd_per_node_hour` (none unpriced). Pools that
/// can train nothing are left out.
pub fn planned_values(
    fleet: &Fleet,
    counts: &[u32],
    usd_per_node_hour: Option<&[f64]>,
) -> Vec<PoolValue> {
    fleet
        .pools()
        .iter()
        .enumerate()
        .filter_map(|(pool, zone)| {
            let held = *counts.get(pool)?;
            let table = fleet.uniform_table(&zone.device, held);
            let best = table.best(held);
            let samples_per_sec = table.samples_per_sec(best);
            let price = usd_per_node_hour
                .and_then(|p| p.get(pool).copied())
                .unwrap_or(0.0);
            (samples_per_sec > 0.0).then_some(PoolValue {
                pool,
                samples_per_sec,
                nodes: best.nodes(),
                usd_per_sec: f64::from(held) * price / 3600.0,
            })
        })
        .collect()
}

/// Which pools of `fleet`, holding `counts[g]` nodes, join DiLoCo's rounds and with what `H`,
/// the pseudo-gradients sent as `wire`; `usd_per_node_hour` where the plan is for samples per
/// dollar. Each pool valued by its plan ([`planned_values`]).
pub fn choose(
    fleet: &Fleet,
    counts: &[u32],
    usd_per_node_hour: Option<&[f64]>,
    wire: Wire,
) -> SyncChoice {
    let values = planned_values(fleet, counts, usd_per_node_hour);
    choose_from(fleet, values, usd_per_node_hour.is_some(), wire)
}

/// [`choose`] from the pools' `values` however they were found; `priced` where the plan is
/// for samples per dollar.
pub fn choose_from(
    fleet: &Fleet,
    mut pools: Vec<PoolValue>,
    priced: bool,
    wire: Wire,
) -> SyncChoice {
    pools.retain(|p| p.samples_per_sec > 0.0);
    let bytes = pseudo_gradient_bytes(fleet, wire);
    let groups: Vec<PoolValue> = if priced {
        let alone = |p: &PoolValue| per_dollar(p.samples_per_sec, p.usd_per_sec);
        pools.sort_by(|a, b| alone(b).total_cmp(&alone(a)));
        let floor = pools.first().map_or(0.0, alone) * (1.0 - DOLLAR_SLACK);
        let mut chosen: Vec<PoolValue> = Vec::new();
        for pool in pools {
            chosen.push(pool);
            if chosen.len() > 1 && rounds_of(fleet, &chosen, priced, bytes).per_dollar < floor {
                chosen.pop();
                break;
            }
        }
        chosen
    } else {
        pools
    };
    let mut indices: Vec<usize> = groups.iter().map(|a| a.pool).collect();
    indices.sort_unstable();
    let rounds = (groups.len() >= 2).then(|| Rounds {
        inner_steps: rounds_of(fleet, &groups, priced, bytes).inner_steps,
        wire,
    });
    SyncChoice {
        groups: indices,
        rounds,
    }
}

/// Samples per dollar of `rate` samples a second billed `usd` a second (unpriced: unbounded).
fn per_dollar(rate: f64, usd: f64) -> f64 {
    if usd > 0.0 { rate / usd } else { f64::INFINITY }
}

/// How rounds of `groups` run: their inner steps and what they buy a dollar.
struct GroupRounds {
    inner_steps: u32,
    /// Samples per dollar of the groups' nodes and of their exchanges' egress.
    per_dollar: f64,
}

/// The fewest inner steps of [`INNER_STEPS`] whose exchange of `bytes` a group takes at most
/// [`EXCHANGE_SHARE`] of a round's time (and its egress, `priced`, at most [`EGRESS_SHARE`] of
/// its node bill), and the samples per
/// dollar the groups buy with that exchange's egress.
fn rounds_of(fleet: &Fleet, groups: &[PoolValue], priced: bool, bytes: f64) -> GroupRounds {
    let members: Vec<(usize, u32)> = groups.iter().map(|a| (a.pool, a.nodes)).collect();
    let cost = exchange(fleet, bytes, &members);
    let rate: f64 = groups.iter().map(|a| a.samples_per_sec).sum();
    let bill_per_sec: f64 = groups.iter().map(|a| a.usd_per_sec).sum();
    let batch = f64::from(fleet.spec().global_batch);
    let round_secs = |h: u32| groups.len() as f64 * f64::from(h) * batch / rate;
    let fits = |h: u32| {
        let paid = !priced || cost.egress_usd <= EGRESS_SHARE * bill_per_sec * round_secs(h);
        cost.secs <= EXCHANGE_SHARE * round_secs(h) && paid
    };
    let inner_steps = INNER_STEPS
        .into_iter()
        .find(|&h| fits(h))
        .unwrap_or(INNER_STEPS[INNER_STEPS.len() - 1]);
    let secs = round_secs(inner_steps);
    GroupRounds {
        inner_steps,
        per_dollar: per_dollar(
            rate * secs / (secs + cost.secs),
            bill_per_sec + cost.egress_usd / secs,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::builtin::builtin;
    use crate::cost::fleet::FleetPool;
    use crate::cost::links::Links;
    use crate::cost::mixed::DeviceCosts;

    /// V100s in `us-east-1a`, 1.5x as fast in `us-east-1b`, 0.8x in `us-west-2a` (another
    /// region), and V100s of a second type in `us-east-1a`.
    fn fleet(links: Links) -> Fleet {
        let spec = builtin("gpt-1.5b").unwrap().0;
        let v100 = DeviceCosts::profiled(&spec, "v100", 15.5 * 1024.0);
        let zone = |name: &str, device: DeviceCosts| FleetPool {
            pool: name.parse().unwrap(),
            device,
        };
        let pools = vec![
            zone("us-east-1a", v100.clone()),
            zone("us-east-1b", v100.derived("fast", 1.5, 24.0 * 1024.0)),
            zone("us-west-2a", v100.derived("slow", 0.8, 15.5 * 1024.0)),
            zone("us-east-1a/p3.8xlarge", v100.clone()),
        ];
        Fleet::new(spec, pools, links).unwrap()
    }

    const PRICES: [f64; 4] = [0.918, 1.2, 0.7, 0.918];

    #[test]
    fn planned_for_samples_every_pool_with_nodes_joins_and_one_pool_steps() {
        let fleet = fleet(Links::default());
        let all = choose(&fleet, &[16, 16, 16, 0], None, Wire::F32);
        assert_eq!(all.groups, [0, 1, 2]);
        let rounds = all.rounds.unwrap();
        assert!(INNER_STEPS.contains(&rounds.inner_steps));
        let one = choose(&fleet, &[0, 16, 0, 0], None, Wire::F32);
        assert_eq!((one.groups, one.rounds), (vec![1], None));
        let none = choose(&fleet, &[0, 0, 0, 0], None, Wire::F32);
        assert_eq!((none.groups, none.rounds), (vec![], None));
    }

    #[test]
    fn planned_for_dollars_pools_join_while_their_samples_per_dollar_stay_within_the_slack() {
        let fleet = fleet(Links::default());
        let counts = [16, 16, 16, 0];
        // Each pool's samples per dollar alone, from its own table at its nodes.
        let value = |pool: usize, usd: f64| {
            let table = fleet.uniform_table(&fleet.pools()[pool].device, counts[pool]);
            table.samples_per_sec(table.best(counts[pool])) / (16.0 * usd)
        };
        let rate = |pool: usize| value(pool, 1.0) * 16.0;
        let values: Vec<f64> = (0..3).map(|p| value(p, PRICES[p])).collect();
        // The 1.5x pool is the best per dollar; the V100s the worst.
        assert!(values[1] > values[2] && values[2] > values[0], "{values:?}");
        // Within the slack, the exchanges' wait and egress aside (small on these links).
        let within = |pools: &[usize]| {
            let rate: f64 = pools.iter().map(|&p| rate(p)).sum();
            let usd: f64 = pools.iter().map(|&p| 16.0 * PRICES[p]).sum();
            rate / usd >= values[1] * (1.0 - DOLLAR_SLACK)
        };
        let expected: Vec<usize> = if !within(&[1, 2]) {
            vec![1]
        } else if within(&[0, 1, 2]) {
            vec![0, 1, 2]
        } else {
            vec![1, 2]
        };
        let chosen = choose(&fleet, &counts, Some(&PRICES), Wire::F32);
        assert_eq!(chosen.groups, expected, "{values:?}");
        // Priced so that the V100s fall outside the slack: the other two train in rounds.
        let dear_v100s = [1.5, 1.2, 0.7, 1.5];
        let chosen = choose(&fleet, &counts, Some(&dear_v100s), Wire::F32);
        assert_eq!(chosen.groups, [1, 2]);
        assert!(chosen.rounds.is_some());
        // And dear 0.8x nodes too: the best pool alone steps.
        let dear = [1.5, 1.2, 1.4, 1.5];
        let alone = choose(&fleet, &counts, Some(&dear), Wire::F32);
        assert_eq!((alone.groups, alone.rounds), (vec![1], None));
    }

    #[test]
    fn slower_links_and_wider_values_take_more_inner_steps_a_round() {
        let counts = [16, 16, 16, 0];
        let h = |links: Links, wire| {
            choose(&fleet(links), &counts, None, wire)
                .rounds
                .unwrap()
                .inner_steps
        };
        let default = h(Links::default(), Wire::F32);
        let mut slow = Links::default();
        slow.set("us-east-1a/us-west-2a=0.05,80,0.09").unwrap();
        slow.set("us-east-1b/us-west-2a=0.05,80,0.09").unwrap();
        slow.set("us-east-1a/us-east-1b=0.05,80,0.09").unwrap();
        assert!(h(slow.clone(), Wire::F32) > default, "{default}");
        assert!(h(slow.clone(), Wire::Int8) <= h(slow, Wire::F32));
    }

    #[test]
    fn an_exchange_bills_only_what_leaves_a_zone() {
        let fleet = fleet(Links::default());
        let bytes = 1e9;
        // Two pools of one zone: no egress; its free link inside the zone.
        let inside = exchange(&fleet, bytes, &[(0, 4), (3, 4)]);
        assert_eq!((inside.cross_zone_bytes, inside.egress_usd), (0.0, 0.0));
        // Three pools over two zones: the ring crosses twice, each group sending 4/3 GB.
        let across = exchange(&fleet, bytes, &[(0, 4), (1, 4), (3, 4)]);
        let sent = 2.0 * 4.0 / 3.0 * bytes;
        assert!((across.cross_zone_bytes - sent).abs() < 1.0, "{across:?}");
        let link = fleet.links().between("us-east-1a", "us-east-1b");
        assert!((across.egress_usd - sent / 1e9 * link.usd_per_gb).abs() < 1e-9);
        // Each node sends its quarter of the 4/3 GB at the slowest link of the ring.
        let secs = 4.0 / 3.0 * bytes / 4.0 * 8.0 / (link.gbit_per_s * 1e9);
        assert!(
            across.secs >= secs && across.secs < secs + 1.0,
            "{across:?}"
        );
        assert_eq!(exchange(&fleet, bytes, &[(1, 4)]), ExchangeCost::default());
    }
}
