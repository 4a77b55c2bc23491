use super::*;
use parcae_pool::Pool;

use crate::cost::builtin::builtin;
use crate::cost::links::{Link, Links};

fn pools(names: &[&str]) -> Vec<Pool> {
    names.iter().map(|name| name.parse().unwrap()).collect()
}

fn gpt() -> ModelSpec {
    builtin("gpt-1.5b").unwrap().0
}

/// The traffic of the plan whose pipeline `i` runs stage `s` in the pool named `rows[i][s]`.
fn priced(spec: &ModelSpec, bounds: &[usize], rows: &[&[&str]], links: &Links) -> Option<Traffic> {
    let mut names: Vec<&str> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    names.sort_unstable();
    names.dedup();
    let pipelines: Vec<Pipelines> = rows
        .iter()
        .map(|r| Pipelines {
            pools: r.iter().map(|n| names.binary_search(n).unwrap()).collect(),
            count: 1,
        })
        .collect();
    traffic(
        spec,
        bounds,
        &pipelines,
        &LinkTable::new(links, &pools(&names)),
        false,
    )
}

#[test]
fn one_zone_sends_nothing_across_and_pays_nothing() {
    let spec = gpt();
    let bounds = spec.partition(4);
    let t = priced(&spec, &bounds, &[&["a"; 4], &["a"; 4]], &Links::default()).unwrap();
    assert_eq!((t.cross_zone_bytes, t.egress_usd), (0.0, 0.0));
    assert_eq!(t.allreduce_ms.len(), 4);
    assert!(t.allreduce_ms.iter().all(|&ms| ms > 0.0));
}

#[test]
fn pipelines_in_two_zones_pay_for_their_rings_and_a_split_pipeline_for_its_boundary() {
    let spec = gpt();
    let bounds = spec.partition(4);
    let links = Links::default();
    let params: f64 = spec.layers.iter().map(|l| l.params).sum();
    let one = priced(&spec, &bounds, &[&["a"; 4], &["a"; 4]], &links).unwrap();
    let two = priced(&spec, &bounds, &[&["a"; 4], &["b"; 4]], &links).unwrap();
    // Two replicas: each sends its whole gradient once, and both ring edges cross.
    let ring_bytes = 2.0 * params * GRADIENT_BYTES_PER_PARAM;
    assert!((two.cross_zone_bytes - ring_bytes).abs() < 1.0, "{two:?}");
    assert!((two.egress_usd - ring_bytes / 1e9 * 0.02).abs() < 1e-9);
    for (a, b) in two.allreduce_ms.iter().zip(&one.allreduce_ms) {
        assert!(a > b, "{two:?} {one:?}");
    }
    // One pipeline whose second half is in another zone: 128 micro-batches cross once each
    // way at the boundary between stages 1 and 2.
    let split = priced(&spec, &bounds, &[&["a", "a", "b", "b"]], &links).unwrap();
    let crossing = 2.0 * 128.0 * spec.boundary_bytes;
    assert!((split.cross_zone_bytes - crossing).abs() < 1.0, "{split:?}");
    assert!(split.slowest_boundary_ms > one.slowest_boundary_ms);
    assert_eq!(split.allreduce_ms, vec![0.0; 4]);
}

#[test]
fn a_plan_that_does_not_match_its_stages_is_refused() {
    let spec = gpt();
    let bounds = spec.partition(4);
    let links = Links::default();
    let table = LinkTable::new(&links, &pools(&["a"]));
    assert!(traffic(&spec, &bounds, &[], &table, false).is_none());
    assert!(priced(&spec, &bounds, &[&["a"; 3]], &links).is_none());
    assert!(priced(&spec, &[], &[&["a"; 4]], &links).is_none());
    assert!(priced(&spec, &[0, 2, 1000], &[&["a"; 2]], &links).is_none());
    let outside = Pipelines {
        pools: vec![0, 0, 1, 0],
        count: 1,
    };
    assert!(
        traffic(&spec, &bounds, &[outside], &table, false).is_none(),
        "a pool the table does not join"
    );
}

#[test]
fn pools_of_one_zone_share_its_link_and_pools_of_two_zones_cross() {
    let mut links = Links::default();
    links.set("a/b=2,3,0.05").unwrap();
    let spec = gpt();
    let bounds = spec.partition(4);
    // Two types in one zone: a ring and a pipeline over both pools cross nothing.
    let mixed: [&[&str]; 2] = [&["a/x", "a/x", "a/y", "a/y"], &["a/y", "a/y", "a/x", "a/x"]];
    let t = priced(&spec, &bounds, &mixed, &links).unwrap();
    assert_eq!((t.cross_zone_bytes, t.egress_usd), (0.0, 0.0));
    let across = priced(&spec, &bounds, &[&["a/x"; 4], &["b/x"; 4]], &links).unwrap();
    assert!(across.egress_usd > 0.0);
}

#[test]
fn a_ring_over_three_zones_crosses_three_boundaries_whatever_order_its_members_come_in() {
    let spec = gpt();
    let bounds = spec.partition(1);
    let links = Links::default();
    let params: f64 = spec.layers.iter().map(|l| l.params).sum();
    let bytes = params * GRADIENT_BYTES_PER_PARAM;
    // Six replicas, two in each of three zones, listed interleaved: the ring visits the zones
    // in the order of their names, so only three of its six edges leave a zone.
    let rows: [&[&str]; 6] = [&["c"], &["a"], &["b"], &["a"], &["c"], &["b"]];
    let t = priced(&spec, &bounds, &rows, &links).unwrap();
    let sent = bytes * 2.0 * 5.0 / 6.0;
    assert!((t.cross_zone_bytes - 3.0 * sent).abs() < 1.0, "{t:?}");
    // Paced by the slowest link it takes (across zones), over 2 (w - 1) steps.
    let across = links.across;
    let want = across.transfer_ms(sent) + across.latency_ms * 9.0;
    assert!((t.allreduce_ms[0] - want).abs() < 1e-9, "{t:?}");
    // Pools are joined by their own pair where one is set.
    let mut slow = links.clone();
    slow.set("a/c=1,7,0.5").unwrap();
    let t = priced(&spec, &bounds, &rows, &slow).unwrap();
    let pair = slow.between("a", "c");
    assert!((t.allreduce_ms[0] - (pair.transfer_ms(sent) + 7.0 * 9.0)).abs() < 1e-9);
    let egress = 2.0 * sent / 1e9 * 0.02 + sent / 1e9 * 0.5;
    assert!((t.egress_usd - egress).abs() < 1e-9, "{t:?}");
}

#[test]
fn pipelines_of_one_shape_counted_once_cost_what_they_cost_listed_one_by_one() {
    let spec = gpt();
    let bounds = spec.partition(4);
    let mut links = Links::default();
    links.set("a/c=1,7,0.5").unwrap();
    let table = LinkTable::new(&links, &pools(&["a", "b", "c"]));
    let shapes = [
        Pipelines {
            pools: vec![0, 0, 1, 1],
            count: 3,
        },
        Pipelines {
            pools: vec![2, 2, 2, 0],
            count: 2,
        },
    ];
    let one_by_one: Vec<Pipelines> = shapes
        .iter()
        .flat_map(|s| {
            std::iter::repeat_n(
                Pipelines {
                    count: 1,
                    ..s.clone()
                },
                s.count as usize,
            )
        })
        .collect();
    let grouped = traffic(&spec, &bounds, &shapes, &table, false).unwrap();
    let listed = traffic(&spec, &bounds, &one_by_one, &table, false).unwrap();
    assert_eq!(grouped.allreduce_ms, listed.allreduce_ms);
    assert_eq!(grouped.slowest_boundary_ms, listed.slowest_boundary_ms);
    assert!((grouped.cross_zone_bytes - listed.cross_zone_bytes).abs() < 1e-3);
    assert!((grouped.egress_usd - listed.egress_usd).abs() < 1e-12);
    assert!(grouped.egress_usd > 0.0);
}

/// The links of the tests below: 100 Gb/s inside a zone, 10 across, at 0.02 $/GB.
fn two_speeds() -> Links {
    let mut links = Links::default();
    links.within = Link {
        gbit_per_s: 100.0,
        latency_ms: 0.0,
        usd_per_gb: 0.0,
    };
    links.set("a/b=10,0,0.02").unwrap();
    links.set("a/c=10,0,0.02").unwrap();
    links.set("b/c=10,0,0.02").unwrap();
    links
}

#[test]
fn by_zone_sends_each_zone_s_shards_once_around_the_zones() {
    let table = LinkTable::new(&two_speeds(), &pools(&["a", "b"]));
    let gb = 1e9;
    // Four replicas in each zone: inside, 2 * 3/4 of the buffer at 100 Gb/s; across, each
    // replica's quarter, 2 * 1/2 of it at 10.
    let by_zone = table.reduction(&[4, 4], true);
    assert_eq!(by_zone.kind, AllReduce::ByZone);
    let ms = 1.5 * gb * 8.0 / 100e9 * 1e3 + 0.25 * gb * 8.0 / 10e9 * 1e3;
    assert!(
        (by_zone.ms(gb) - ms).abs() < 1e-6,
        "{} vs {ms}",
        by_zone.ms(gb)
    );
    // The flat ring sends 2 * 7/8 of it over each of its two crossings, at 10 Gb/s.
    let flat = table.reduction(&[4, 4], false);
    assert_eq!(flat.kind, AllReduce::Ring);
    assert!((flat.ms(gb) - 1.75 * gb * 8.0 / 10e9 * 1e3).abs() < 1e-6);
    let across = |r: &Reduction| r.crossings(gb).iter().map(|c| c.2).sum::<f64>();
    assert!(
        (across(&by_zone) - 2.0 * gb).abs() < 1.0,
        "one buffer each way"
    );
    assert!((across(&flat) - 3.5 * gb).abs() < 1.0);
    // Three zones of two: each zone sends 2 * 2/3 of the buffer to the next.
    let table = LinkTable::new(&two_speeds(), &pools(&["a", "b", "c"]));
    let three = table.reduction(&[2, 2, 2], true);
    assert_eq!(three.kind, AllReduce::ByZone);
    assert!((across(&three) - 3.0 * 4.0 / 3.0 * gb).abs() < 1.0);
    assert_eq!(three.crossings(gb).len(), 3);
}

#[test]
fn by_zone_is_chosen_only_where_it_is_no_slower() {
    // One link everywhere: three replicas in a and one in b reduce faster in one ring (2 * 3/4
    // of the buffer) than by zone (2 * 2/3 inside, then the lone replica's whole buffer).
    let mut same = Links::default();
    same.set("a/b=100,0,0.02").unwrap();
    same.within = Link {
        usd_per_gb: 0.0,
        ..same.between("a", "b")
    };
    let table = LinkTable::new(&same, &pools(&["a", "b"]));
    assert_eq!(table.reduction(&[3, 1], true).kind, AllReduce::Ring);
    // Across ten times slower, by zone pays.
    let table = LinkTable::new(&two_speeds(), &pools(&["a", "b"]));
    assert_eq!(table.reduction(&[3, 1], true).kind, AllReduce::ByZone);
    // Inside one zone, and for a zone-blind planner, there is one ring.
    let table = LinkTable::new(&two_speeds(), &pools(&["a/x", "a/y"]));
    assert_eq!(table.reduction(&[2, 2], true).kind, AllReduce::Ring);
    let table = LinkTable::new(&two_speeds(), &pools(&["a", "b"]));
    assert_eq!(table.reduction(&[2, 2], false).kind, AllReduce::Ring);
}

#[test]
fn a_plan_s_rings_across_zones_go_by_zone_where_allowed() {
    let spec = gpt();
    let bounds = spec.partition(2);
    let links = two_speeds();
    let rows: [&[&str]; 4] = [&["a", "a"], &["a", "a"], &["b", "b"], &["b", "b"]];
    let flat = priced(&spec, &bounds, &rows, &links).unwrap();
    let names = ["a", "b"];
    let pipelines: Vec<Pipelines> = (0..2)
        .map(|z| Pipelines {
            pools: vec![z; 2],
            count: 2,
        })
        .collect();
    let table = LinkTable::new(&links, &pools(&names));
    let zoned = traffic(&spec, &bounds, &pipelines, &table, true).unwrap();
    assert_eq!(
        (flat.all_reduce, zoned.all_reduce),
        (AllReduce::Ring, AllReduce::ByZone)
    );
    // Two replicas a zone: 2 * 3/4 of each stage's gradients over two crossings, against one
    // buffer each way.
    let ratio = zoned.cross_zone_bytes / flat.cross_zone_bytes;
    assert!((ratio - 2.0 / 3.0).abs() < 1e-9, "{ratio}");
    assert!(zoned.egress_usd < flat.egress_usd);
    for (z, f) in zoned.allreduce_ms.iter().zip(&flat.allreduce_ms) {
        assert!(z < f, "{z} vs {f}");
    }
}
