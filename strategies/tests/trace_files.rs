//! The trace parsers against Parcae's shipped traces (`../shared/traces/parcae`).

use std::path::Path;

use parcae_strategies::trace::{self, Binning, Interval, ParseOptions, Trace};

const PARCAE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces/parcae");

/// The path of a shipped trace, or `None` (with a message) when `../shared` is absent.
fn shared(rel: &str) -> Option<String> {
    let path = format!("{PARCAE}/{rel}");
    if Path::new(&path).exists() {
        Some(path)
    } else {
        println!("skipped: {path} not found");
        None
    }
}

fn p3() -> Option<Trace> {
    shared("liveput/traces/p3trace.csv").map(|p| trace::load(&p, 60).expect("p3trace parses"))
}

/// Per-window statistics: (N start, mean N, min, max, preempted, preemption events, added,
/// arrival events).
fn stats(w: &[Interval]) -> (u32, f64, u32, u32, u32, usize, u32, usize) {
    let mean = w.iter().map(|i| f64::from(i.nodes)).sum::<f64>() / w.len() as f64;
    (
        w[0].nodes,
        mean,
        w.iter().map(|i| i.nodes).min().unwrap(),
        w.iter().map(|i| i.nodes).max().unwrap(),
        w.iter().map(|i| i.removed).sum(),
        w.iter().filter(|i| i.removed > 0).count(),
        w.iter().map(|i| i.added).sum(),
        w.iter().filter(|i| i.added > 0).count(),
    )
}

#[test]
fn p3_event_trace_bins_like_parcae() {
    let Some(t) = p3() else { return };
    assert_eq!(t.len(), 683);
    assert_eq!(t.interval_secs, 60);
    assert_eq!(
        &t.intervals[..4],
        &[
            Interval {
                nodes: 18,
                added: 18,
                removed: 0
            },
            Interval {
                nodes: 19,
                added: 1,
                removed: 0
            },
            Interval {
                nodes: 19,
                added: 0,
                removed: 0
            },
            Interval {
                nodes: 23,
                added: 4,
                removed: 0
            },
        ]
    );
    assert_eq!(
        t.intervals[682],
        Interval {
            nodes: 10,
            added: 0,
            removed: 1
        }
    );
    assert_eq!(
        t.intervals[508],
        Interval {
            nodes: 11,
            added: 0,
            removed: 1
        }
    );
    assert_eq!(t.intervals.iter().map(|i| i.added).sum::<u32>(), 177);
    assert_eq!(t.intervals.iter().map(|i| i.removed).sum::<u32>(), 167);
    assert_eq!(t.max_nodes(), 32);
    // Consistency and "never an add and a remove in the same minute" (spec 6.1).
    for (k, iv) in t.intervals.iter().enumerate() {
        assert_eq!(iv.nodes_before(), t.nodes_before(k), "interval {k}");
        assert!(iv.added == 0 || iv.removed == 0, "interval {k}");
    }
}

#[test]
fn p3_windows_match_the_spec_table() {
    let Some(t) = p3() else { return };
    // spec 6.5: (window hours, interval range, N start, mean, min, max, preempted (events), added (events))
    let cases = [
        ((5.5, 6.5), 330..390, (32, 27.48, 20, 32, 19, 9, 16, 7)),
        ((1.5, 2.5), 90..150, (27, 29.63, 23, 32, 11, 6, 8, 5)),
        ((8.0, 9.0), 480..540, (18, 16.82, 11, 24, 18, 8, 17, 12)),
        ((10.0, 11.0), 600..660, (18, 14.63, 14, 18, 4, 3, 0, 0)),
    ];
    for ((a, b), range, want) in cases {
        let got = t.window(a, b).unwrap();
        assert_eq!(got, range);
        let s = stats(&t.intervals[got]);
        assert_eq!(
            (s.0, s.2, s.3, s.4, s.5, s.6, s.7),
            (want.0, want.2, want.3, want.4, want.5, want.6, want.7)
        );
        assert!((s.1 - want.1).abs() < 0.01, "mean {} vs {}", s.1, want.1);
    }
    assert_eq!(t.window(0.0, 100.0).unwrap(), 0..683);
    assert_eq!(t.window(11.0, 12.0).unwrap(), 660..683);
    assert_eq!(t.window(0.5, 0.51).unwrap(), 30..31);
    assert!(t.window(2.0, 1.0).is_err());
    assert!(t.window(f64::NAN, 1.0).is_err());
    assert_eq!(t.history(3), &t.intervals[..3]);
    assert_eq!(t.future(680, 12).len(), 3);
    assert_eq!(t.nodes_before(0), 0);
}

#[test]
fn count_trace_equals_event_trace() {
    let (Some(t), Some(counts)) = (p3(), shared("aws/traces/p3.csv")) else {
        return;
    };
    let c = trace::load(&counts, 60).unwrap();
    assert_eq!(c.intervals, t.intervals);
    assert_eq!(c.source, counts);
}

#[test]
fn replay_traces_equal_their_p3_windows() {
    let Some(t) = p3() else { return };
    for model in ["bert", "gpt-1.5b", "vgg19"] {
        for (tag, range) in [
            ("hh_55_65", 330..390),
            ("hl_15_25", 90..150),
            ("lh_80_90", 480..540),
            ("ll_10_11", 600..660),
        ] {
            let Some(path) = shared(&format!("aws/traces/{model}/trace_{tag}.txt")) else {
                return;
            };
            let r = trace::load(&path, 60).unwrap();
            assert_eq!(r.len(), 60, "{path}");
            let want: Vec<u32> = t.intervals[range.clone()].iter().map(|i| i.nodes).collect();
            let got: Vec<u32> = r.intervals.iter().map(|i| i.nodes).collect();
            assert_eq!(got, want, "{path}");
            // Interval 0 is rewritten to "add everything" by Parcae's trace_gen (spec 6.5).
            assert_eq!(r.intervals[0].added, want[0]);
            assert_eq!(
                &r.intervals[1..],
                &t.intervals[range.start + 1..range.end],
                "{path}"
            );
        }
    }
}

#[test]
fn fake_trace_and_coarser_grid() {
    let Some(path) = shared("liveput/traces/fake.csv") else {
        return;
    };
    let t = trace::load(&path, 60).unwrap();
    let nodes: Vec<u32> = t.intervals.iter().map(|i| i.nodes).collect();
    assert_eq!(nodes, [8, 6, 4, 6, 8, 6]);
    // Parcae's rule keeps one interval per event even for longer intervals; the grid rule bins.
    let records = trace::load_with(
        &path,
        &ParseOptions {
            interval_secs: 120,
            binning: Binning::Records,
        },
    )
    .unwrap();
    assert_eq!(records.len(), 6);
    let grid = trace::load_with(
        &path,
        &ParseOptions {
            interval_secs: 120,
            binning: Binning::Grid,
        },
    )
    .unwrap();
    assert_eq!(
        grid.intervals,
        [
            Interval {
                nodes: 6,
                added: 8,
                removed: 2
            },
            Interval {
                nodes: 6,
                added: 2,
                removed: 2
            },
            Interval {
                nodes: 6,
                added: 2,
                removed: 2
            },
        ]
    );
}

/// The `interval` column `[N_prev, in, out]` of a `liveput_res` JSON as binned intervals.
fn result_intervals(path: &str) -> Vec<Interval> {
    let text = std::fs::read_to_string(path).unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    rows.iter()
        .map(|r| {
            let v: Vec<u32> = r["interval"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            Interval {
                nodes: v[0] + v[1] - v[2],
                added: v[1],
                removed: v[2],
            }
        })
        .collect()
}

#[test]
fn result_jsons_use_p3_and_its_variant_without_interval_508() {
    let Some(t) = p3() else { return };
    let Some(gpt) = shared("aws/traces/liveput_res/gpt-1.5b_p3_gbs128_mbs1.json") else {
        return;
    };
    assert_eq!(result_intervals(&gpt), t.intervals);
    let Some(resnet) = shared("aws/traces/liveput_res/resnet152_gbs2048_mbs32.json") else {
        return;
    };
    let variant = t.without_event(508).unwrap();
    assert_eq!(result_intervals(&resnet), variant.intervals);
    assert_eq!(
        variant.intervals[508],
        Interval {
            nodes: 12,
            added: 0,
            removed: 0
        }
    );
    assert!(variant.source.ends_with("p3trace.csv-without-508"));
    assert_eq!(t.without_event(683), None);
    // Undoing the initial allocation would make later counts negative.
    assert_eq!(t.without_event(0), None);
}

#[test]
fn formats_are_detected_from_the_first_data_line() {
    use trace::{Format, detect_format};
    assert_eq!(
        detect_format("# comment\nt_ms,op,node\n0,add,a\n"),
        Some(Format::Events)
    );
    assert_eq!(detect_format("\n0,3\n"), Some(Format::Counts));
    assert_eq!(detect_format("[0, \"no-op\", {}]"), Some(Format::Replay));
    assert_eq!(detect_format("0 1 2"), None);
    assert_eq!(detect_format(""), None);
}
