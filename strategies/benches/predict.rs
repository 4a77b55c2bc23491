//! Cost of one forecast (H = 12, W = 12) per predictor, and of parsing and binning the p3 trace.
//!
//! The simulator calls the predictor once per interval and strategy, so a forecast must stay
//! far below the liveput decision's 1 ms budget.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use parcae_strategies::predict::{self, Bounds, ForecastInput};
use parcae_strategies::trace::{self, Band, SyntheticSpec};

const P3: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/traces/parcae/liveput/traces/p3trace.csv"
);

fn forecasts(c: &mut Criterion) {
    let t = SyntheticSpec {
        intervals: 240,
        ..SyntheticSpec::new(Band::Lh, 1)
    }
    .generate();
    for name in ["arima", "es", "last", "arima+notices"] {
        let mut p = predict::by_name(name, Bounds::PARCAE, 0).unwrap();
        let mut i = 20;
        c.bench_function(&format!("forecast {name} H=12"), |b| {
            b.iter(|| {
                i = if i + 1 >= t.len() { 20 } else { i + 1 };
                let input = ForecastInput {
                    history: &t.intervals[..i],
                    first: 0,
                    known_next: None,
                    notices: &[],
                    horizon: 12,
                };
                black_box(p.forecast(black_box(&input)))
            })
        });
    }
}

fn parsing(c: &mut Criterion) {
    let Ok(text) = std::fs::read_to_string(P3) else {
        println!("skipped parse bench: {P3} not found");
        return;
    };
    c.bench_function("parse+bin p3trace.csv", |b| {
        b.iter(|| trace::parse_str(black_box(&text), "p3", 60).unwrap())
    });
    c.bench_function("synthetic hh 683 intervals", |b| {
        b.iter(|| {
            SyntheticSpec {
                intervals: 683,
                ..SyntheticSpec::new(Band::Hh, black_box(3))
            }
            .generate()
        })
    });
}

criterion_group!(benches, forecasts, parsing);
criterion_main!(benches);
