use super::*;
use crate::cost::traffic::LinkTable;

#[test]
fn a_zone_pair_is_within_across_or_set_either_way_round() {
    let mut links = Links::default();
    assert_eq!(links.between("a", "a"), links.within);
    assert_eq!(links.between("a", "b"), links.across);
    links.set("b/a=2.5,3,0.09").unwrap();
    let set = Link {
        gbit_per_s: 2.5,
        latency_ms: 3.0,
        usd_per_gb: 0.09,
    };
    assert_eq!(links.between("a", "b"), set);
    assert_eq!(links.between("b", "a"), set);
    assert_eq!(links.between("a", "c"), links.across);
    links.set("c/c=1,1,0").unwrap();
    assert_eq!(links.between("c", "c").gbit_per_s, 1.0);
    assert_eq!(links.between("a", "a"), links.within);
}

#[test]
fn zones_of_two_regions_are_joined_by_the_link_across_regions() {
    let mut links = Links::default();
    assert_eq!(links.between("us-east-1a", "us-east-1b"), links.across);
    assert_eq!(
        links.between("us-east-1a", "us-west-2a"),
        links.across_regions
    );
    assert_eq!(
        links.between("us-east-1a", "us-central1-a"),
        links.across_regions
    );
    assert_eq!(
        links.between("us-east-1a", "b"),
        links.across,
        "an unknown region"
    );
    assert!(links.across_regions.gbit_per_s < links.across.gbit_per_s);
    assert!(links.across_regions.latency_ms > links.across.latency_ms);
    links.set("us-west-2a/us-east-1a=1,40,0.09").unwrap();
    assert_eq!(links.between("us-east-1a", "us-west-2a").usd_per_gb, 0.09);
    assert_eq!(
        links.between("us-east-1a", "us-west-2b"),
        links.across_regions
    );
}

#[test]
fn a_transfer_is_its_latency_and_its_bytes_at_the_rate() {
    let link = Link {
        gbit_per_s: 8.0,
        latency_ms: 2.0,
        usd_per_gb: 0.0,
    };
    assert!((link.transfer_ms(1e9) - 1002.0).abs() < 1e-9);
    assert_eq!(link.transfer_ms(-5.0), 2.0);
}

#[test]
fn bad_links_are_refused_by_name() {
    let mut links = Links::default();
    let error = |text: &str, links: &mut Links| links.set(text).unwrap_err().to_string();
    for text in ["a/b", "a=1,1,1", "a/b=1,1", "a/b=1,1,1,1", "a/b=x,1,1"] {
        assert!(
            error(text, &mut links).contains("expected ZONE/ZONE"),
            "{text}"
        );
    }
    assert!(error("A/b=1,1,1", &mut links).contains("zone \"A\""));
    assert!(error("/b=1,1,1", &mut links).contains("zone \"\""));
    let long = format!("{}/b=1,1,1", "z".repeat(MAX_ZONE_NAME + 1));
    assert!(error(&long, &mut links).contains("1 to 64 characters"));
    assert!(error("a/b=0,1,1", &mut links).contains("Gb/s 0 must be a finite number above 0"));
    assert!(error("a/b=1,-1,1", &mut links).contains("latency (ms) -1"));
    assert!(error("a/b=1,1,NaN", &mut links).contains("price ($/GB) NaN"));
    assert!(error("a/b=inf,1,1", &mut links).contains("Gb/s inf"));
    assert_eq!(links, Links::default());
    for i in 0..MAX_PAIRS {
        links.set(&format!("z{i}/y=1,1,1")).unwrap();
    }
    links.set("z0/y=2,1,1").unwrap();
    assert_eq!(links.set("x/y=1,1,1"), Err(LinkError::TooMany));
}

#[test]
fn a_pool_is_priced_as_itself_else_as_its_zone() {
    let prices = |name: &str| match name {
        "a" => Some(1.0),
        "a/g5" => Some(2.0),
        _ => None,
    };
    let pool = |name: &str| name.parse::<Pool>().unwrap();
    assert_eq!(pool_price(&pool("a/g5"), prices), Some(2.0));
    assert_eq!(pool_price(&pool("a/p3"), prices), Some(1.0));
    assert_eq!(pool_price(&pool("a"), prices), Some(1.0));
    assert_eq!(pool_price(&pool("b/p3"), prices), None);
}

#[test]
fn pools_of_one_zone_share_its_link() {
    let mut links = Links::default();
    links.set("a/b=2,3,0.05").unwrap();
    let pools: Vec<Pool> = ["a/p3.2xlarge", "a/g5.xlarge", "a", "b/g5.xlarge"]
        .iter()
        .map(|name| name.parse().unwrap())
        .collect();
    let table = LinkTable::new(&links, &pools);
    assert_eq!(table.link(0, 1), links.within);
    assert_eq!(table.link(0, 2), links.within);
    assert_eq!(table.link(3, 0).usd_per_gb, 0.05);
}
