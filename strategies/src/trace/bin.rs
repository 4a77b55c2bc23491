//! Binning of per-second records into fixed-length planning intervals.

use super::error::TraceErrorKind;
use super::interval::Interval;
use super::limits::MAX_INTERVALS;
use super::parse::{Record, churn};

/// How records are mapped to intervals.
///
/// Both rules give the same intervals when every event time is a multiple of the interval
/// length (true of all of Parcae's traces); they differ only for events off that grid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Binning {
    /// Parcae's `SpotTrace` rule (spec 1.1), the default so that results match the artifact:
    /// every record (distinct second) is an interval of its own, and empty intervals are
    /// inserted every `interval_secs` while the gap to the next record is longer than that.
    /// The first interval starts at the first event.
    #[default]
    Records,
    /// Wall-clock grid from time 0: interval `k` covers `[k·T, (k+1)·T)` and holds every
    /// event in it (arrivals and departures may then share an interval).
    Grid,
}

/// Bins `records` (sorted by time, non-empty) into intervals of `interval_secs` seconds.
pub(crate) fn bin(
    records: &[Record],
    interval_secs: u64,
    binning: Binning,
) -> Result<Vec<Interval>, TraceErrorKind> {
    match binning {
        Binning::Records => by_records(records, interval_secs),
        Binning::Grid => by_grid(records, interval_secs),
    }
}

fn by_records(records: &[Record], interval_secs: u64) -> Result<Vec<Interval>, TraceErrorKind> {
    let mut out: Vec<Interval> = Vec::with_capacity(records.len());
    let mut last: Option<(u64, u32)> = None;
    for r in records {
        if let Some((mut last_ts, nodes)) = last {
            while last_ts + interval_secs < r.t_s {
                last_ts += interval_secs;
                push(
                    &mut out,
                    Interval {
                        nodes,
                        added: 0,
                        removed: 0,
                    },
                )?;
            }
        }
        push(
            &mut out,
            Interval {
                nodes: r.nodes,
                added: r.added,
                removed: r.removed,
            },
        )?;
        last = Some((r.t_s, r.nodes));
    }
    Ok(out)
}

fn by_grid(records: &[Record], interval_secs: u64) -> Result<Vec<Interval>, TraceErrorKind> {
    let mut out: Vec<Interval> = Vec::new();
    for r in records {
        let k = usize::try_from(r.t_s / interval_secs).map_err(|_| TraceErrorKind::TooLong)?;
        if k >= MAX_INTERVALS {
            return Err(TraceErrorKind::TooLong);
        }
        while out.len() <= k {
            let nodes = out.last().map_or(0, |i| i.nodes);
            out.push(Interval {
                nodes,
                added: 0,
                removed: 0,
            });
        }
        let cur = &mut out[k];
        cur.added = churn(cur.added, r.added)?;
        cur.removed = churn(cur.removed, r.removed)?;
        cur.nodes = r.nodes;
    }
    Ok(out)
}

fn push(out: &mut Vec<Interval>, interval: Interval) -> Result<(), TraceErrorKind> {
    if out.len() >= MAX_INTERVALS {
        return Err(TraceErrorKind::TooLong);
    }
    out.push(interval);
    Ok(())
}
