use super::*;
use crate::config::ParallelConfig;
use crate::cost::builtin::builtin;
use crate::cost::fleet::FleetPool;
use crate::cost::links::{Link, Links};
use crate::cost::mixed::DeviceCosts;

const SECS: f64 = 60.0;

fn fleet() -> Fleet {
    let spec = builtin("gpt-1.5b").unwrap().0;
    let v100 = DeviceCosts::profiled(&spec, "v100", 15.5 * 1024.0);
    let zone = |name: &str| FleetPool {
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

/// DiLoCo over two pools trained alone at `a` and `b`, each holding eight nodes throughout.
fn over_two(fleet: &Fleet, a: &[f64], b: &[f64], rounds: Rounds) -> DilocoRun {
    let (a, b) = (alone(a), alone(b));
    let held = vec![vec![8, 8]; a.cumulative.len()];
    let every = [&a, &b];
    diloco(fleet, &every, &held, Groups::Fixed(&[0, 1], rounds), SECS)
}

/// `--sync auto` over two pools trained alone at `a` and `b`, holding `held[k]` nodes.
fn auto(
    fleet: &Fleet,
    a: &[f64],
    b: &[f64],
    held: &[Vec<u32>],
    usd_per_node_hour: Option<&[f64]>,
) -> DilocoRun {
    let (a, b) = (alone(a), alone(b));
    let every = [&a, &b];
    let groups = Groups::Auto {
        wire: Wire::F32,
        usd_per_node_hour,
    };
    diloco(fleet, &every, held, groups, SECS)
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
    let exchange = bytes / 2.0 / 8.0 * 8.0 / (link.gbit_per_s * 1e9) + 2.0 * link.latency_ms / 1e3;
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

#[test]
fn auto_takes_in_a_pool_once_it_holds_nodes_and_bills_it_from_then_on() {
    let fleet = fleet();
    let mut late = vec![0.0; 20];
    late.extend([32.0; 20]);
    let held: Vec<Vec<u32>> = (0..40)
        .map(|k| vec![8, if k < 20 { 0 } else { 8 }])
        .collect();
    let run = auto(&fleet, &[32.0; 40], &late, &held, None);
    let report = run.rounds.clone();
    assert_eq!(run.run.name, "auto");
    assert_eq!(report.regroupings, 1, "{report:?}");
    assert_eq!(report.pools, ["us-east-1b", "us-east-1a"]);
    // Each pool billed its eight nodes while in the rounds: the first 40 intervals, the
    // second from the 20th on.
    let hours = |intervals: f64| intervals * 8.0 * SECS / 3600.0;
    assert!(
        (run.node_hours[0] - hours(40.0)).abs() < 1e-9,
        "{:?}",
        run.node_hours
    );
    assert!(
        (run.node_hours[1] - hours(20.0)).abs() < 1e-9,
        "{:?}",
        run.node_hours
    );
    // The joiner fetched the model (f32) across once, besides the rounds' exchanges.
    let (bytes, _) = model_bytes_and_link(&fleet);
    let exchanged = f64::from(report.rounds) * 2.0 * bytes;
    assert!(report.cross_zone_bytes >= bytes, "{report:?}");
    assert!(
        report.cross_zone_bytes <= exchanged + bytes + 1.0,
        "{report:?}"
    );
    // Everything either pool trained alone while in the rounds, less the fetch and exchanges.
    let most = 32.0 * SECS * 60.0;
    assert!(
        run.run.samples <= most && run.run.samples > 0.9 * most,
        "{}",
        run.run.samples
    );
}

#[test]
fn auto_for_dollars_lets_go_of_a_pool_whose_record_buys_too_little() {
    let fleet = fleet();
    let held = vec![vec![8, 8]; 40];
    // Alike by their plans, but the first realises a quarter of what the second does.
    let run = auto(&fleet, &[8.0; 40], &[32.0; 40], &held, Some(&[1.0, 1.0]));
    let report = run.rounds.clone();
    assert_eq!(report.regroupings, 1, "{report:?}");
    // Chosen out at the first choice that reads a record (interval 10): billed until then.
    let hours = |intervals: f64| intervals * 8.0 * SECS / 3600.0;
    assert!(
        (run.node_hours[0] - hours(10.0)).abs() < 1e-9,
        "{:?}",
        run.node_hours
    );
    assert!(
        (run.node_hours[1] - hours(40.0)).abs() < 1e-9,
        "{:?}",
        run.node_hours
    );
    let per_dollar = run.run.samples / run.node_hours.iter().sum::<f64>();
    let second_alone = 32.0 * SECS * 40.0 / hours(40.0);
    assert!(
        per_dollar > 0.8 * second_alone,
        "{per_dollar} vs {second_alone}"
    );
    // Both planned alike, so both trained in rounds at first.
    assert_eq!(report.pools.len(), 2);
}
