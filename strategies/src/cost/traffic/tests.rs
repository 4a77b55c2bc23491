use super::*;
use crate::cost::builtin::builtin;

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
    assert!(traffic(&spec, &bounds, &[], &table).is_none());
    assert!(priced(&spec, &bounds, &[&["a"; 3]], &links).is_none());
    assert!(priced(&spec, &[], &[&["a"; 4]], &links).is_none());
    assert!(priced(&spec, &[0, 2, 1000], &[&["a"; 2]], &links).is_none());
    let outside = Pipelines {
        pools: vec![0, 0, 1, 0],
        count: 1,
    };
    assert!(
        traffic(&spec, &bounds, &[outside], &table).is_none(),
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
    let grouped = traffic(&spec, &bounds, &shapes, &table).unwrap();
    let listed = traffic(&spec, &bounds, &one_by_one, &table).unwrap();
    assert_eq!(grouped.allreduce_ms, listed.allreduce_ms);
    assert_eq!(grouped.slowest_boundary_ms, listed.slowest_boundary_ms);
    assert!((grouped.cross_zone_bytes - listed.cross_zone_bytes).abs() < 1e-3);
    assert!((grouped.egress_usd - listed.egress_usd).abs() < 1e-12);
    assert!(grouped.egress_usd > 0.0);
}
