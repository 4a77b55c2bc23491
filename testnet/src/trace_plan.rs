//! Which trace a session replays and how (`--trace`, `--window`, `--intervals`, `--nodes-max`),
//! and the trace fitted to the testnet: nodes per replayed interval.

use anyhow::{Result, bail};
use parcae_strategies::trace;

use crate::replay;

/// The embedded default trace: the high-availability, high-preemption band, with a seed whose
/// first 15 intervals at 6 nodes have two preemptions and two arrivals
/// (6 6 5 4 4 5 5 5 5 5 6 6 6 6 6).
pub const DEFAULT_TRACE: &str = "synthetic:hh:15";

/// Which trace is replayed, and how.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// Trace file (event, count or replay format) or `synthetic:BAND[:SEED]`, BAND in hh, hl,
    /// lh, ll.
    #[arg(long, default_value = DEFAULT_TRACE)]
    pub trace: String,
    /// Length of one interval of the trace itself, seconds (Parcae's traces: 60).
    #[arg(long, default_value_t = 60)]
    pub trace_interval_secs: u64,
    /// Intervals to replay (default: 15, 150 s at the default --interval-secs; with --window,
    /// the whole window).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub intervals: Option<u64>,
    /// Replay only the window START_H-END_H of the trace, in hours (e.g. 5.5-6.5, as
    /// `simulate --start-hour --end-hour`; Parcae's rule for interval boundaries).
    #[arg(long, value_parser = parse_window)]
    pub window: Option<Window>,
    /// Most nodes running at once; larger traces are scaled down to this.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes_max: u32,
}

/// Intervals replayed without --intervals or --window.
const DEFAULT_INTERVALS: u64 = 15;

/// A window of a trace, in hours.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// First hour.
    pub start_h: f64,
    /// End hour.
    pub end_h: f64,
}

/// Parses `START_H-END_H` (e.g. `5.5-6.5`): both finite, `0 <= START_H < END_H`.
fn parse_window(text: &str) -> Result<Window, String> {
    let bad = || format!("{text:?}: expected START_H-END_H in hours, e.g. 5.5-6.5");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let hour = |s: &str| s.trim().parse::<f64>().ok().filter(|h| h.is_finite());
    let (start_h, end_h) = (hour(a).ok_or_else(bad)?, hour(b).ok_or_else(bad)?);
    if !(0.0 <= start_h && start_h < end_h) {
        return Err(format!(
            "{text:?}: the window must start at 0 h or later and end after it"
        ));
    }
    Ok(Window { start_h, end_h })
}

/// A trace fitted to the testnet.
pub struct Planned {
    /// Source name for reports.
    pub source: String,
    /// Nodes per interval.
    pub counts: Vec<u32>,
}

/// Loads the trace and fits it to `nodes_max`. Synthetic traces are generated for a cluster
/// of `nodes_max` (their event sizes scale with it) unless the spec names its size.
pub fn plan_trace(args: &TraceArgs) -> Result<Planned> {
    let spec = if args.trace.starts_with("synthetic:") && !args.trace.contains("nodes=") {
        format!("{}:nodes={}", args.trace, args.nodes_max)
    } else {
        args.trace.clone()
    };
    let trace = trace::load(&spec, args.trace_interval_secs)?;
    let (range, source) = match args.window {
        Some(w) => (
            trace.window(w.start_h, w.end_h)?,
            format!("{} [{}-{} h]", trace.source, w.start_h, w.end_h),
        ),
        None => (0..trace.len(), trace.source.clone()),
    };
    let wanted = match (args.intervals, args.window) {
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) => DEFAULT_INTERVALS,
    };
    let counts = replay::plan(
        &trace,
        range,
        usize::try_from(wanted).unwrap_or(usize::MAX),
        args.nodes_max,
    );
    if counts.is_empty() {
        bail!("{source} has no interval to replay");
    }
    if args.intervals.is_some_and(|n| (counts.len() as u64) < n) {
        eprintln!(
            "note: {source} has {} intervals; replaying all of them",
            counts.len()
        );
    }
    Ok(Planned { source, counts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_hours_and_bad_ones_are_named() {
        assert_eq!(
            parse_window("5.5-6.5"),
            Ok(Window {
                start_h: 5.5,
                end_h: 6.5
            })
        );
        assert_eq!(parse_window(" 10 - 11 ").unwrap().end_h, 11.0);
        for bad in ["6.5-5.5", "1-1", "x-2", "3", "-1-2", "1-inf"] {
            let e = parse_window(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_window_of_a_trace_file_is_replayed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("counts.csv");
        // Hour k has k + 1 nodes (counts format: `t_ms,count`).
        let rows: String = (0..10u64)
            .map(|k| format!("{},{}\n", k * 3_600_000, k + 1))
            .collect();
        std::fs::write(&path, rows).unwrap();
        let args = |window, intervals| TraceArgs {
            trace: path.display().to_string(),
            trace_interval_secs: 3600,
            intervals,
            window,
            nodes_max: 64,
        };
        let w = Some(Window {
            start_h: 2.5,
            end_h: 5.0,
        });
        let p = plan_trace(&args(w, None)).unwrap();
        assert_eq!(p.counts, vec![3, 4, 5]);
        assert!(p.source.ends_with("[2.5-5 h]"), "{}", p.source);
        assert_eq!(plan_trace(&args(w, Some(2))).unwrap().counts, vec![3, 4]);
        assert_eq!(plan_trace(&args(None, None)).unwrap().counts.len(), 10);
        let past = Some(Window {
            start_h: 20.0,
            end_h: 21.0,
        });
        assert!(plan_trace(&args(past, None)).is_err());
    }
}
