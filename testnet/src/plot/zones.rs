//! The plot of `simulate --zones`: where the nodes are and where the zone-aware plan puts its
//! stages.

use std::path::Path;

use anyhow::Result;
use parcae_strategies::sim::StrategyRun;
use plotters::prelude::*;

use super::{canvas, count_panel, cumulative, err, legend};

/// One zone's line in the plot: its name, the nodes it holds and the nodes the plan uses in
/// it, per interval.
pub struct ZoneLine<'a> {
    pub name: &'a str,
    pub held: Vec<u32>,
    pub used: Vec<u32>,
}

/// Each zone's nodes (held solid, used by `runs[0]` dashed), `runs[0]`'s and `runs[1]`'s
/// `(D, P)`, and every run's cumulative samples.
pub fn fleet_simulation(
    path: &Path,
    title: &str,
    interval_secs: u64,
    zones: &[ZoneLine],
    runs: &[&StrategyRun],
) -> Result<()> {
    let root = canvas(path, 1000)?;
    let panels = root.split_evenly((3, 1));
    let minutes = |i: usize| (i as u64 * interval_secs) as f64 / 60.0;
    let intervals = zones.first().map_or(0, |z| z.held.len());
    let x_max = minutes(intervals.max(1));
    let steps = |values: &[u32]| -> Vec<(f64, f64)> {
        values
            .iter()
            .enumerate()
            .flat_map(|(i, v)| [(minutes(i), f64::from(*v)), (minutes(i + 1), f64::from(*v))])
            .collect()
    };

    let n_max = zones
        .iter()
        .flat_map(|z| z.held.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1);
    let ours = runs.first().map_or("", |r| r.name.as_str());
    let mut chart = count_panel(
        &panels[0],
        &format!("{title}: nodes held per zone (solid), used by {ours} (dashed)"),
        "nodes",
        x_max,
        n_max,
    )?;
    for (k, zone) in zones.iter().enumerate() {
        let color = Palette99::pick(k + 4).to_rgba();
        chart
            .draw_series(LineSeries::new(steps(&zone.held), color.stroke_width(2)))
            .map_err(err)?
            .label(zone.name.to_string())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
        chart
            .draw_series(DashedLineSeries::new(
                steps(&zone.used),
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(err)?;
    }
    legend(&mut chart)?;

    let top = runs
        .iter()
        .take(2)
        .flat_map(|r| r.configs.iter().map(|c| c.d.max(c.p)))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = count_panel(
        &panels[1],
        "configuration chosen: D and P, solid for the first strategy, dashed for the second",
        "D, P",
        x_max,
        top,
    )?;
    for (k, run) in runs.iter().take(2).enumerate() {
        let d: Vec<u32> = run.configs.iter().map(|c| c.d).collect();
        let p: Vec<u32> = run.configs.iter().map(|c| c.p).collect();
        for (name, values, color) in [
            ("D", d, RGBColor(0, 110, 0)),
            ("P", p, RGBColor(120, 0, 160)),
        ] {
            let style = color.mix(1.0 - 0.4 * k as f64).stroke_width(2);
            let series = if k == 0 {
                chart.draw_series(LineSeries::new(steps(&values), style))
            } else {
                chart.draw_series(DashedLineSeries::new(steps(&values), 8, 6, style))
            };
            series
                .map_err(err)?
                .label(format!("{name} ({})", run.name))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], style));
        }
    }
    legend(&mut chart)?;

    cumulative(&panels[2], x_max, minutes, runs)?;
    root.present().map_err(err)?;
    Ok(())
}
