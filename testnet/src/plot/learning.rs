//! The plot of learning runs (`parcae-node learn`'s, or testnet runs'): validation loss against
//! samples, a line per run,
//! one colour per synchronisation mode.

use std::path::Path;

use anyhow::Result;
use parcae_api::LearnRun;
use plotters::prelude::*;

use super::{canvas, err, legend, panel};

/// Every run's validation loss against the samples trained, coloured by its mode (each mode
/// labelled once, its seeds in the same colour), the loss axis fitted to the trained points.
pub fn learning(path: &Path, title: &str, runs: &[LearnRun]) -> Result<()> {
    let root = canvas(path, 700)?;
    let points = runs.iter().flat_map(|r| r.curve.iter());
    let x_max = points.clone().map(|p| p.samples).max().unwrap_or(1).max(1) as f64;
    // The untrained model's loss would flatten the rest: the axis starts at the first
    // validation after training began (the lines run off the top to it).
    let trained = points.filter(|p| p.samples > 0);
    let (lo, hi) = trained.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p.val_loss), hi.max(p.val_loss))
    });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    let mut chart = panel(
        &root,
        title,
        60,
        0.0..x_max * 1.02,
        (lo - 0.05 * (hi - lo))..(hi + 0.05 * (hi - lo)),
    )?;
    chart
        .configure_mesh()
        .x_desc("samples trained")
        .y_desc("validation loss")
        .draw()
        .map_err(err)?;
    let mut modes: Vec<&str> = Vec::new();
    for run in runs {
        let k = match modes.iter().position(|m| *m == run.sync) {
            Some(k) => k,
            None => {
                modes.push(&run.sync);
                modes.len() - 1
            }
        };
        let color = Palette99::pick(k).to_rgba();
        let series = chart
            .draw_series(LineSeries::new(
                run.curve.iter().map(|p| (p.samples as f64, p.val_loss)),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if run.seed
            == runs
                .iter()
                .find(|r| r.sync == run.sync)
                .map_or(0, |r| r.seed)
        {
            series
                .label(run.sync.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
        }
    }
    legend(&mut chart)?;
    root.present().map_err(err)?;
    Ok(())
}
