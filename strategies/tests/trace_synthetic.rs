//! The synthetic availability bands: deterministic, consistent and shaped like spec 6.5.

use parcae_strategies::trace::{self, Band, Interval, SyntheticSpec};

const SEEDS: u64 = 40;

/// Mean over seeds of (mean N, min N, max N, preempted nodes, preemption events, added nodes,
/// arrival events) of one-hour traces of `band` with `capacity` nodes.
fn band_means(band: Band, capacity: u32) -> [f64; 7] {
    let mut acc = [0.0; 7];
    for seed in 0..SEEDS {
        let t = SyntheticSpec {
            capacity,
            ..SyntheticSpec::new(band, seed)
        }
        .generate();
        let w = &t.intervals;
        let n = |f: fn(&Interval) -> u32| w.iter().map(|i| f64::from(f(i))).sum::<f64>();
        let count = |f: fn(&Interval) -> bool| w.iter().filter(|i| f(i)).count() as f64;
        let row = [
            n(|i| i.nodes) / w.len() as f64,
            f64::from(w.iter().map(|i| i.nodes).min().unwrap()),
            f64::from(w.iter().map(|i| i.nodes).max().unwrap()),
            n(|i| i.removed),
            count(|i| i.removed > 0),
            n(|i| i.added) - f64::from(w[0].added),
            count(|i| i.added > 0) - 1.0,
        ];
        for (a, r) in acc.iter_mut().zip(row) {
            *a += r / SEEDS as f64;
        }
    }
    acc
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    for band in Band::ALL {
        let a = trace::load(&format!("synthetic:{band}:7"), 60).unwrap();
        let b = trace::load(&format!("synthetic:{band}:7"), 60).unwrap();
        let c = trace::load(&format!("synthetic:{band}:8"), 60).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.source, format!("synthetic:{band}:7"));
        if band != Band::Ll {
            assert_ne!(a.intervals, c.intervals, "{band}");
        }
    }
    assert_eq!(
        trace::load("synthetic:hh", 60).unwrap().source,
        "synthetic:hh:0"
    );
}

#[test]
fn traces_are_consistent_and_never_mix_events() {
    for band in Band::ALL {
        for (capacity, intervals) in [(32, 60), (8, 200), (512, 30), (1, 10)] {
            let t = SyntheticSpec {
                capacity,
                intervals,
                ..SyntheticSpec::new(band, 3)
            }
            .generate();
            assert_eq!(t.len(), intervals);
            assert_eq!(t.intervals[0].added, t.intervals[0].nodes);
            for (k, iv) in t.intervals.iter().enumerate() {
                assert_eq!(iv.nodes_before(), t.nodes_before(k), "{band} {k}");
                assert!(iv.added == 0 || iv.removed == 0, "{band} {k}");
                assert!(iv.nodes >= 1 && iv.nodes <= capacity, "{band} {k}");
            }
        }
    }
    let t = trace::load("synthetic:lh:5:nodes=8:intervals=120", 30).unwrap();
    assert_eq!(
        (t.len(), t.interval_secs, t.max_nodes() <= 8),
        (120, 30, true)
    );
    assert_eq!(t.source, "synthetic:lh:5:nodes=8:intervals=120");
}

#[test]
fn band_statistics_resemble_the_spec_table() {
    for band in Band::ALL {
        let s = band.stats();
        let m = band_means(band, 32);
        println!(
            "{band}: mean {:.1} min {:.1} max {:.1} preempted {:.1} ({:.1}) added {:.1} ({:.1})",
            m[0], m[1], m[2], m[3], m[4], m[5], m[6]
        );
        assert!((m[0] - s.mean).abs() <= 3.0, "{band} mean {}", m[0]);
        assert!(
            m[1] >= f64::from(s.min) && m[2] <= f64::from(s.max) + 1e-9,
            "{band}"
        );
        assert!(
            (m[3] - s.preempted_nodes).abs() <= 0.4 * s.preempted_nodes + 1.0,
            "{band} preempted {}",
            m[3]
        );
        assert!(
            (m[4] - s.preemption_events).abs() <= 0.4 * s.preemption_events + 1.0,
            "{band} events {}",
            m[4]
        );
        assert!(
            (m[5] - s.arrived_nodes).abs() <= 0.4 * s.arrived_nodes + 1.0,
            "{band} added {}",
            m[5]
        );
        assert!(
            (m[6] - s.arrival_events).abs() <= 0.4 * s.arrival_events + 1.0,
            "{band} arrivals {}",
            m[6]
        );
    }
    let [hh, hl, lh, ll] = Band::ALL.map(|b| band_means(b, 32));
    assert!(
        hh[3] > hl[3] && lh[3] > ll[3],
        "high preemption bands preempt more"
    );
    assert!(
        hh[0] > lh[0] && hl[0] > ll[0],
        "high availability bands have more nodes"
    );
}

#[test]
fn smaller_clusters_scale_the_counts() {
    for band in Band::ALL {
        let big = band_means(band, 32);
        let small = band_means(band, 8);
        println!(
            "{band} x8: mean {:.2} preempted {:.2} added {:.2}",
            small[0], small[3], small[5]
        );
        assert!(
            (small[0] - big[0] / 4.0).abs() <= 1.0,
            "{band} mean {}",
            small[0]
        );
        assert!(
            small[3] <= big[3] / 4.0 + 1.5,
            "{band} preempted {}",
            small[3]
        );
        assert!(small[2] <= 8.0 + 1e-9);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any band, size, length and interval length gives a consistent trace within capacity.
    #[test]
    fn any_parameters_give_a_consistent_trace(
        band in 0usize..4,
        seed in proptest::prelude::any::<u64>(),
        capacity in 1u32..2000,
        intervals in 1usize..400,
        interval_secs in 1u64..=86_400,
    ) {
        let spec = SyntheticSpec { band: Band::ALL[band], seed, capacity, intervals, interval_secs };
        let t = spec.generate();
        proptest::prop_assert_eq!(t.len(), intervals);
        let mut prev = 0;
        for iv in &t.intervals {
            proptest::prop_assert_eq!(iv.nodes + iv.removed, prev + iv.added);
            proptest::prop_assert!(iv.nodes >= 1 && iv.nodes <= capacity);
            proptest::prop_assert!(iv.added == 0 || iv.removed == 0);
            prev = iv.nodes;
        }
        proptest::prop_assert_eq!(trace::load(&spec.name(), interval_secs).unwrap(), t);
    }
}
