//! PNG plots of simulations and testnet runs.

use std::path::Path;

use anyhow::{Result, anyhow};
use parcae_strategies::sim::StrategyRun;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// Registers the embedded DejaVu font once, so plots need no system fonts.
fn fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Only fails on malformed font bytes, which the embedded font is not.
        let _ = register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plot: {e:?}")
}

/// Availability with the nodes each strategy uses, pipeline depths, and cumulative samples.
pub fn simulation(
    path: &Path,
    title: &str,
    interval_secs: u64,
    avail: &[u32],
    runs: &[StrategyRun],
) -> Result<()> {
    fonts();
    let root = BitMapBackend::new(path, (1200, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((3, 1));
    let minutes = |i: usize| (i as u64 * interval_secs) as f64 / 60.0;
    let x_max = minutes(avail.len().max(1));
    let palette = |i: usize| Palette99::pick(i).to_rgba();

    let n_max = f64::from(avail.iter().copied().max().unwrap_or(1).max(1)) * 1.1;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption(
            format!("{title}: nodes available and used"),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..n_max)
        .map_err(err)?;
    chart.configure_mesh().y_desc("nodes").draw().map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            avail
                .iter()
                .enumerate()
                .map(|(i, n)| (minutes(i), f64::from(*n))),
            BLACK.stroke_width(2),
        ))
        .map_err(err)?
        .label("available")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLACK));
    for (k, r) in runs.iter().enumerate() {
        let color = palette(k);
        chart
            .draw_series(LineSeries::new(
                r.configs
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (minutes(i), f64::from(c.nodes()))),
                color,
            ))
            .map_err(err)?
            .label(r.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    let p_max = runs
        .iter()
        .flat_map(|r| r.configs.iter().map(|c| c.p))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("pipeline depth P chosen", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..f64::from(p_max) * 1.1)
        .map_err(err)?;
    chart.configure_mesh().y_desc("P").draw().map_err(err)?;
    for (k, r) in runs.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                r.configs
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (minutes(i), f64::from(c.p))),
                palette(k),
            ))
            .map_err(err)?;
    }

    let s_max = runs
        .iter()
        .filter_map(|r| r.cumulative.last().copied())
        .fold(1.0, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&panels[2])
        .caption("cumulative samples", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..s_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("samples")
        .draw()
        .map_err(err)?;
    for (k, r) in runs.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                r.cumulative
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (minutes(i + 1), *s)),
                palette(k),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
