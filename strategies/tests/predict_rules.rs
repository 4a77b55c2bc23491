//! Properties of the predictors: consistency, bounds, determinism, warm-up, notices, names.

use parcae_strategies::predict::{
    self, Bounds, ForecastInput, NoticeAhead, NoticeAware, Predictor, PredictorSpec, RuleConfig,
    RulePredictor, SeriesModel,
};
use parcae_strategies::trace::{Band, Interval, SyntheticSpec, intervals_from_counts};
use proptest::prelude::*;

fn input<'a>(
    history: &'a [Interval],
    notices: &'a [NoticeAhead],
    horizon: usize,
) -> ForecastInput<'a> {
    ForecastInput {
        history,
        first: 0,
        known_next: None,
        notices,
        horizon,
    }
}

/// Consistent intervals for successive counts (arrival or preemption of the difference).
fn from_counts(counts: &[u32]) -> Vec<Interval> {
    intervals_from_counts(0, counts.iter().copied())
}

fn assert_consistent(start: u32, f: &[Interval]) {
    let mut prev = start;
    for (k, iv) in f.iter().enumerate() {
        assert_eq!(iv.nodes + iv.removed, prev + iv.added, "step {k}: {f:?}");
        prev = iv.nodes;
    }
}

#[test]
fn warm_up_uses_the_known_first_count_then_the_last() {
    let mut p = RulePredictor::new(SeriesModel::Arima, Bounds::PARCAE, 0);
    let f = p.forecast(&ForecastInput {
        history: &[],
        first: 0,
        known_next: Some(18),
        notices: &[],
        horizon: 3,
    });
    assert_eq!(
        f,
        vec![
            Interval {
                nodes: 18,
                added: 18,
                removed: 0
            },
            Interval {
                nodes: 18,
                added: 0,
                removed: 0
            },
            Interval {
                nodes: 18,
                added: 0,
                removed: 0
            },
        ]
    );
    // W = 12 for H = 12: with 12 intervals of history Parcae still warms up (c < W).
    let history = from_counts(&[18, 19, 19, 23, 23, 24, 25, 25, 26, 28, 29, 30]);
    let f = p.forecast(&input(&history, &[], 12));
    assert_eq!(
        f,
        vec![
            Interval {
                nodes: 30,
                added: 0,
                removed: 0
            };
            12
        ]
    );
    assert_eq!(p.penalties(), (1.0, 1.0), "no rule runs during the warm-up");
}

#[test]
fn flat_history_predicts_flat() {
    let history = from_counts(&[20; 20]);
    for model in SeriesModel::ALL {
        let mut p = RulePredictor::new(model, Bounds::PARCAE, 0);
        let f = p.forecast(&input(&history, &[], 8));
        assert_eq!(
            f,
            vec![
                Interval {
                    nodes: 20,
                    added: 0,
                    removed: 0
                };
                8
            ],
            "{model:?}"
        );
    }
}

#[test]
fn ramp_is_clamped_and_damped() {
    // A steady climb of 2 per interval: ARIMA extrapolates it, the ±3 bound around step 1 caps
    // it, and the ramp of 14 nodes sets the 0.5 arrival penalty.
    let history = from_counts(&[2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32][..]);
    let history = &history[1..];
    let mut p = RulePredictor::new(
        SeriesModel::Arima,
        Bounds {
            min_nodes: 1,
            max_nodes: 64,
        },
        0,
    );
    let f = p.forecast(&input(history, &[], 8));
    assert_eq!(p.penalties(), (0.5, 1.0));
    // ŷ = 34, 36, 37, 37, ... (step 1 + 3), damped by 0.5: 33, 34, 34.5 -> 34 (ties to even), ...
    let nodes: Vec<u32> = f.iter().map(|i| i.nodes).collect();
    assert_eq!(nodes, vec![33, 34, 34, 34, 34, 34, 34, 34]);
    assert_consistent(32, &f);
    // With the job's bounds of 8 and 32 it cannot grow at all.
    let mut p = RulePredictor::new(SeriesModel::Arima, Bounds::PARCAE, 0);
    let f = p.forecast(&input(history, &[], 8));
    assert!(f.iter().all(|i| i.nodes == 32 && i.added == 0), "{f:?}");
}

#[test]
fn poisson_injection_is_seeded() {
    // The last 8 counts (W for H = 8) clean to a step up to a flat 26 (the dip to 23 is an
    // outlier), so the persistence model predicts a flat line over a history that is not flat,
    // and Parcae injects Poisson preemptions with λ from the window's removals (3 once).
    let history = from_counts(&[22, 22, 22, 22, 22, 22, 22, 22, 22, 26, 26, 23, 26, 26]);
    let run = |seed: u64, poisson: bool| {
        let config = RuleConfig {
            poisson,
            ..RuleConfig::PARCAE
        };
        let mut p = RulePredictor::with_config(SeriesModel::Last, Bounds::PARCAE, seed, config);
        (0..20)
            .flat_map(|_| p.forecast(&input(&history, &[], 8)))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1, true), run(1, true));
    assert_ne!(run(1, true), run(2, true));
    let total_out: u32 = run(1, true).iter().map(|i| i.removed).sum();
    assert!(total_out > 0, "preemptions injected");
    assert!(
        run(1, false)
            .iter()
            .all(|i| i.nodes == 26 && i.removed == 0)
    );
}

#[test]
fn notices_are_folded_into_any_forecast() {
    let t = SyntheticSpec {
        intervals: 40,
        ..SyntheticSpec::new(Band::Hl, 4)
    }
    .generate();
    let history = &t.intervals[..30];
    let last = history[29].nodes;
    let notices = [
        NoticeAhead {
            offset: 0,
            nodes: 3,
        },
        NoticeAhead {
            offset: 2,
            nodes: 1,
        },
    ];
    for model in SeriesModel::ALL {
        let base = RulePredictor::new(model, Bounds::PARCAE, 9).forecast(&input(history, &[], 8));
        let mut aware = NoticeAware::new(RulePredictor::new(model, Bounds::PARCAE, 9));
        let f = aware.forecast(&input(history, &notices, 8));
        assert_consistent(last, &f);
        assert!(f[0].removed >= 3 && f[2].removed >= 1, "{f:?}");
        for (k, (a, b)) in f.iter().zip(&base).enumerate() {
            assert_eq!(a.added, b.added, "step {k}");
            assert!(
                a.nodes <= b.nodes,
                "a noticed preemption never raises a count"
            );
        }
        assert!(f[7].nodes < base[7].nodes || base[7].nodes == 0);
    }
}

#[test]
fn names_select_predictors() {
    for name in PredictorSpec::NAMES {
        let spec: PredictorSpec = name.parse().unwrap();
        assert_eq!(spec.to_string(), name);
        assert!(predict::by_name(name, Bounds::PARCAE, 0).is_ok());
    }
    let spec: PredictorSpec = "es+fresh+reclamp+nopoisson".parse().unwrap();
    assert_eq!(spec.model, SeriesModel::Holt);
    assert!(
        !spec.config.sticky_penalties && spec.config.clamp_after_penalties && !spec.config.poisson
    );
    assert_eq!(spec.to_string(), "es+nopoisson+fresh+reclamp");
    let e = predict::by_name("prophet", Bounds::PARCAE, 0)
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "unknown predictor \"prophet\" (expected arima, es or last, then any of +notices, +nopoisson, +fresh, +reclamp)"
    );
    assert!(predict::by_name("arima+", Bounds::PARCAE, 0).is_err());
}

fn counts() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..40, 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every predictor's forecasts are consistent from the last count, have the horizon's
    /// length, and (before the damping step, i.e. with `+reclamp`) stay within the bounds.
    #[test]
    fn forecasts_are_consistent_and_bounded(
        counts in counts(),
        horizon in 0usize..16,
        min in 0u32..20,
        span in 0u32..30,
        seed in any::<u64>(),
        notices in prop::collection::vec((0usize..20, 0u32..6), 0..4),
        known in prop::option::of(0u32..40),
    ) {
        let history = from_counts(&counts);
        let notices: Vec<NoticeAhead> = notices.into_iter().map(|(offset, nodes)| NoticeAhead { offset, nodes }).collect();
        let bounds = Bounds { min_nodes: min, max_nodes: min + span };
        let last = history.last().map_or(0, |i| i.nodes);
        let warm = history.len() <= predict::history_window(horizon);
        for name in PredictorSpec::NAMES.into_iter().chain(["arima+reclamp", "es+reclamp+fresh", "last+notices+reclamp"]) {
            let mut p = predict::by_name(name, bounds, seed).unwrap();
            let input = ForecastInput { history: &history, first: 0, known_next: known, notices: &notices, horizon };
            let f = p.forecast(&input);
            prop_assert_eq!(f.len(), horizon);
            let mut prev = last;
            for iv in &f {
                prop_assert_eq!(iv.nodes + iv.removed, prev + iv.added, "{} {:?}", name, f);
                prev = iv.nodes;
            }
            if name.contains("reclamp") && !name.contains("notices") && !warm {
                    prop_assert!(f.iter().all(|i| i.nodes >= min && i.nodes <= min + span), "{} {:?}", name, f);
            }
            if !name.contains("notices") && !warm {
                prop_assert!(f.iter().all(|i| i.added == 0 || i.removed == 0), "pure steps: {} {:?}", name, f);
            }
        }
    }
}
