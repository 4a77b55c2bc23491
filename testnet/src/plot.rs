//! PNG plots of simulations and testnet runs.

use std::path::Path;

use anyhow::{Result, anyhow};
use parcae_strategies::ParallelConfig;
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

pub mod learning;
pub mod zones;

/// A white PNG 1,200 pixels wide and `height` high at `path`, its fonts registered.
fn canvas(
    path: &Path,
    height: u32,
) -> Result<DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>> {
    fonts();
    let root = BitMapBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
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
    let root = canvas(path, 1000)?;
    let panels = root.split_evenly((3, 1));
    let minutes = |i: usize| (i as u64 * interval_secs) as f64 / 60.0;
    let x_max = minutes(avail.len().max(1));
    let palette = |i: usize| Palette99::pick(i).to_rgba();

    let n_max = f64::from(avail.iter().copied().max().unwrap_or(1).max(1)) * 1.1;
    let mut chart = panel(
        &panels[0],
        &format!("{title}: nodes available and used"),
        50,
        0.0..x_max,
        0.0..n_max,
    )?;
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
    legend(&mut chart)?;

    let p_max = runs
        .iter()
        .flat_map(|r| r.configs.iter().map(|c| c.p))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = count_panel(&panels[1], "pipeline depth P chosen", "P", x_max, p_max)?;
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

    let runs: Vec<&StrategyRun> = runs.iter().collect();
    cumulative(&panels[2], x_max, minutes, &runs)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Each run's cumulative samples, in the palette's order, over `x_max` minutes (`minutes` of an
/// interval's index).
fn cumulative(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    x_max: f64,
    minutes: impl Fn(usize) -> f64,
    runs: &[&StrategyRun],
) -> Result<()> {
    let s_max = runs
        .iter()
        .filter_map(|r| r.cumulative.last().copied())
        .fold(1.0, f64::max)
        * 1.05;
    let mut chart = panel(area, "cumulative samples", 70, 0.0..x_max, 0.0..s_max)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("samples")
        .draw()
        .map_err(err)?;
    for (k, r) in runs.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(
                r.cumulative
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (minutes(i + 1), *s)),
                color,
            ))
            .map_err(err)?
            .label(r.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// A testnet run: nodes (running, asked for by the trace, used by the plan), the
/// configuration beside the simulator's choice for each interval (`simulated`: its
/// configurations and the wall-clock seconds of one interval), and throughput over time, loss
/// over the committed steps, every reconfiguration marked by a vertical line.
pub fn testnet_run(
    path: &Path,
    title: &str,
    obs: &crate::engine::Observed,
    simulated: Option<(&[ParallelConfig], f64)>,
) -> Result<()> {
    let timeline = &obs.monitor.timeline;
    let root = canvas(path, 1300)?;
    let panels = root.split_evenly((4, 1));
    let x_max = timeline.last().map_or(1.0, |s| s.t).max(1.0);
    let marks: Vec<f64> = obs
        .monitor
        .migrations
        .migrations()
        .map(|(_, m)| m.seen_at)
        .collect();
    let mark_style = RGBColor(200, 0, 0).mix(0.6).stroke_width(1);

    let n_max = timeline
        .iter()
        .map(|s| s.running.max(s.target))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = count_panel(
        &panels[0],
        &format!("{title}: nodes (reconfigurations in red)"),
        "nodes",
        x_max,
        n_max,
    )?;
    // Drawn thick to thin so that equal lines stay visible.
    let lines: [NodeSeries; 3] = [
        ("running", BLUE.mix(0.5), 5, |s| f64::from(s.running)),
        ("used (D x P)", GREEN.mix(0.8), 3, |s| {
            s.config.map_or(0.0, |(d, p)| f64::from(d * p))
        }),
        ("trace", BLACK.to_rgba(), 1, |s| f64::from(s.target)),
    ];
    for (name, color, width, value) in lines {
        chart
            .draw_series(LineSeries::new(
                timeline.iter().map(|s| (s.t, value(s))),
                color.stroke_width(width),
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
    }
    draw_marks(&mut chart, &marks, f64::from(n_max) * 1.15, mark_style)?;
    legend(&mut chart)?;

    configurations(&panels[1], obs, simulated, x_max, &marks, mark_style)?;

    let rate = throughput(timeline);
    let r_max = rate.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = panel(
        &panels[2],
        "throughput (committed samples/s)",
        50,
        0.0..x_max,
        0.0..r_max,
    )?;
    chart
        .configure_mesh()
        .y_desc("samples/s")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(rate, BLUE.stroke_width(2)))
        .map_err(err)?;
    draw_marks(&mut chart, &marks, r_max, mark_style)?;

    let losses: Vec<(f64, f64)> = obs
        .final_seq
        .iter()
        .filter(|r| r.loss.is_finite())
        .map(|r| (r.step as f64, r.loss))
        .collect();
    let validation: Vec<(f64, f64)> = obs
        .final_seq
        .iter()
        .filter_map(|r| Some((r.step as f64, r.validation_loss?)))
        .collect();
    let step_max = losses.last().map_or(1.0, |p| p.0).max(1.0);
    let l_max = losses
        .iter()
        .chain(&validation)
        .map(|p| p.1)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    let mut chart = panel(
        &panels[3],
        "loss of the committed steps (grey), its moving average, validation loss (blue)",
        50,
        0.0..step_max,
        0.0..l_max,
    )?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("loss")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            losses.iter().copied(),
            RGBColor(160, 160, 160).stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            moving_average(&losses, (losses.len() / 50).max(1)),
            BLACK.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            validation.iter().copied(),
            BLUE.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(validation.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
        .map_err(err)?;
    let step_marks: Vec<f64> = obs
        .monitor
        .migrations
        .migrations()
        .map(|(_, m)| m.at_step as f64)
        .collect();
    draw_marks(&mut chart, &step_marks, l_max, mark_style)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The panel of data-parallel width D and pipeline depth P the cluster ran (solid) and the
/// simulator chose for each interval of the same trace (dashed, when given).
fn configurations(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    obs: &crate::engine::Observed,
    simulated: Option<(&[ParallelConfig], f64)>,
    x_max: f64,
    marks: &[f64],
    mark_style: ShapeStyle,
) -> Result<()> {
    let timeline = &obs.monitor.timeline;
    let sim = simulated.unwrap_or((&[], 1.0));
    let top = timeline
        .iter()
        .filter_map(|s| s.config.map(|(d, p)| d.max(p)))
        .chain(sim.0.iter().map(|c| c.d.max(c.p)))
        .max()
        .unwrap_or(1)
        .max(1);
    let y_max = f64::from(top) * 1.15;
    let mut chart = panel(
        area,
        "configuration: cluster (solid) and simulator (dashed), D and P",
        50,
        0.0..x_max,
        0.0..y_max,
    )?;
    chart.configure_mesh().y_desc("D, P").draw().map_err(err)?;
    let parts: [ConfigSeries; 2] = [
        ("D", RGBColor(0, 110, 0), |d, _| d),
        ("P", RGBColor(120, 0, 160), |_, p| p),
    ];
    for (name, color, part) in parts {
        chart
            .draw_series(LineSeries::new(
                timeline.iter().map(|s| {
                    let v = s.config.map_or(0, |(d, p)| part(d, p));
                    (s.t, f64::from(v))
                }),
                color.stroke_width(3),
            ))
            .map_err(err)?
            .label(format!("{name} (cluster)"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
        let (configs, interval) = sim;
        let steps = configs.iter().enumerate().flat_map(|(i, c)| {
            let v = f64::from(part(c.d, c.p));
            [(i as f64 * interval, v), ((i + 1) as f64 * interval, v)]
        });
        chart
            .draw_series(DashedLineSeries::new(
                steps,
                8,
                6,
                color.mix(0.6).stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("{name} (simulator)"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color.mix(0.6)));
    }
    draw_marks(&mut chart, marks, y_max, mark_style)?;
    legend(&mut chart)?;
    Ok(())
}

/// A line of the configuration panel: name, colour, the part of `(D, P)` it shows.
type ConfigSeries = (&'static str, RGBColor, fn(u32, u32) -> u32);

/// A line of the nodes panel: name, colour, width, value of a sample.
type NodeSeries = (
    &'static str,
    RGBAColor,
    u32,
    fn(&crate::monitor::Sample) -> f64,
);

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A panel with its caption, axes over `x` and `y`, and `y_label` pixels for the y labels.
fn panel<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    y_label: u32,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<Chart<'a, 'b>> {
    ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(y_label)
        .build_cartesian_2d(x, y)
        .map_err(err)
}

/// A panel of counts (`y_desc`: nodes, `D`, `P`) up to `top`, with room above for the legend.
fn count_panel<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    x_max: f64,
    top: u32,
) -> Result<Chart<'a, 'b>> {
    let mut chart = panel(area, caption, 50, 0.0..x_max, 0.0..f64::from(top) * 1.15)?;
    chart.configure_mesh().y_desc(y_desc).draw().map_err(err)?;
    Ok(chart)
}

/// The legend of a panel's labelled series.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Vertical lines at `xs` from 0 to `top`.
fn draw_marks(chart: &mut Chart<'_, '_>, xs: &[f64], top: f64, style: ShapeStyle) -> Result<()> {
    chart
        .draw_series(
            xs.iter()
                .map(|&x| PathElement::new(vec![(x, 0.0), (x, top)], style)),
        )
        .map_err(err)?;
    Ok(())
}

/// Trailing mean of the last `window` values.
fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            sum += y;
            if i >= window {
                sum -= points[i - window].1;
            }
            (x, sum / (i + 1).min(window) as f64)
        })
        .collect()
}

/// Committed samples per second from the sample cursor, averaged over 5 s windows.
fn throughput(timeline: &[crate::monitor::Sample]) -> Vec<(f64, f64)> {
    const WINDOW_SECS: f64 = 5.0;
    let mut out = Vec::new();
    let mut from = 0;
    for (i, s) in timeline.iter().enumerate() {
        while s.t - timeline[from].t > WINDOW_SECS {
            from += 1;
        }
        let a = &timeline[from];
        if i > from && s.t > a.t {
            let done = s.samples.saturating_sub(a.samples) as f64;
            out.push((s.t, done / (s.t - a.t)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_is_trailing() {
        let p = [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0), (3.0, 7.0)];
        assert_eq!(
            moving_average(&p, 2),
            vec![(0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]
        );
        assert_eq!(moving_average(&p, 1), p.to_vec());
    }

    #[test]
    fn throughput_over_a_window() {
        let s = |t: f64, samples| crate::monitor::Sample {
            t,
            running: 1,
            target: 1,
            epoch: 1,
            config: Some((1, 1)),
            step: 0,
            samples,
            loss: None,
        };
        let rate = throughput(&[s(0.0, 0), s(1.0, 10), s(2.0, 30), s(8.0, 90)]);
        assert_eq!(rate[0], (1.0, 10.0));
        assert_eq!(rate[1], (2.0, 15.0));
        // 8 s is more than 5 s after every earlier sample: no window ends there.
        assert_eq!(rate.len(), 2);
    }
}
