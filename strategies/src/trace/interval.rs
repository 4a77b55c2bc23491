//! A binned trace: its planning intervals, each with the count of alive nodes and the event at
//! its start.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::error::{TraceError, TraceErrorKind};

/// One planning interval: the node count after the event at its start, and that event.
///
/// `nodes` is what configurations chosen for this interval run on; `added` and `removed` are
/// the arrivals and preemptions at the interval's start, so the count before it is
/// `nodes - added + removed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    /// Alive nodes during the interval (after its event).
    pub nodes: u32,
    /// Nodes that arrived at the interval's start.
    pub added: u32,
    /// Nodes preempted at the interval's start.
    pub removed: u32,
}

impl Interval {
    /// Alive nodes just before this interval's event (saturating for inconsistent input).
    pub fn nodes_before(&self) -> u32 {
        self.nodes
            .saturating_sub(self.added)
            .saturating_add(self.removed)
    }
}

/// Consistent intervals for successive node counts, starting from `before` nodes: each
/// interval's event is the arrival or preemption of the difference.
pub fn intervals_from_counts(before: u32, counts: impl IntoIterator<Item = u32>) -> Vec<Interval> {
    let mut prev = before;
    counts
        .into_iter()
        .map(|n| {
            let iv = Interval {
                nodes: n,
                added: n.saturating_sub(prev),
                removed: prev.saturating_sub(n),
            };
            prev = n;
            iv
        })
        .collect()
}

/// A whole availability trace, binned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Where the trace came from (a path or `synthetic:BAND:SEED`), for reports.
    pub source: String,
    /// Length of one interval in seconds.
    pub interval_secs: u64,
    /// The intervals, oldest first.
    pub intervals: Vec<Interval>,
}

impl Trace {
    /// Number of intervals.
    pub fn len(&self) -> usize {
        self.intervals.len()
    }

    /// Whether the trace has no intervals (never true for a parsed or generated trace).
    pub fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }

    /// Duration covered, in hours.
    pub fn hours(&self) -> f64 {
        (self.intervals.len() as u64 * self.interval_secs) as f64 / 3600.0
    }

    /// Most nodes alive in any interval.
    pub fn max_nodes(&self) -> u32 {
        self.intervals.iter().map(|i| i.nodes).max().unwrap_or(0)
    }

    /// The intervals of the window `[start_hour, end_hour)` with Parcae's rule (spec 1.1):
    /// start = ⌊start·3600/T⌋, end = ⌈end·3600/T⌉, both cut to the trace. A simulator
    /// iterates `intervals[range]` and gives a predictor [`Trace::history`] of each index, so
    /// the real past before the window is visible, as in Parcae.
    pub fn window(&self, start_hour: f64, end_hour: f64) -> Result<Range<usize>, TraceError> {
        if !(start_hour.is_finite()
            && end_hour.is_finite()
            && 0.0 <= start_hour
            && start_hour <= end_hour)
        {
            return Err(TraceError::whole(
                &self.source,
                TraceErrorKind::BadWindow {
                    start: start_hour,
                    end: end_hour,
                },
            ));
        }
        let t = self.interval_secs as f64;
        let index = |x: f64| {
            if x >= self.len() as f64 {
                self.len()
            } else {
                x as usize
            }
        };
        let start = index((start_hour * 3600.0 / t).floor());
        let end = index((end_hour * 3600.0 / t).ceil());
        Ok(start..end)
    }

    /// The completed intervals before interval `i` (what a predictor may see at its start).
    pub fn history(&self, i: usize) -> &[Interval] {
        &self.intervals[..i.min(self.len())]
    }

    /// Interval `i` as a job sees it: in its `first` interval every node arrives.
    pub fn seen_at(&self, i: usize, first: bool) -> Interval {
        let real = self.intervals[i];
        if first {
            Interval {
                nodes: real.nodes,
                added: real.nodes,
                removed: 0,
            }
        } else {
            real
        }
    }

    /// The true intervals `i..i+horizon`, cut at the trace end (the oracle's forecast).
    pub fn future(&self, i: usize, horizon: usize) -> &[Interval] {
        let start = i.min(self.len());
        &self.intervals[start..start.saturating_add(horizon).min(self.len())]
    }

    /// The trace with the event of interval `k` undone and every later count shifted
    /// accordingly, named `SOURCE-without-K`. Parcae's gpt-6.7b and resnet152 results use p3
    /// without the preemption at interval 508 (spec 6.4). `None` if `k` is out of range or a
    /// later count would drop below zero.
    pub fn without_event(&self, k: usize) -> Option<Trace> {
        let event = *self.intervals.get(k)?;
        let mut intervals = self.intervals.clone();
        intervals[k].added = 0;
        intervals[k].removed = 0;
        for iv in &mut intervals[k..] {
            iv.nodes = iv
                .nodes
                .checked_add(event.removed)?
                .checked_sub(event.added)?;
        }
        Some(Trace {
            source: format!("{}-without-{k}", self.source),
            intervals,
            interval_secs: self.interval_secs,
        })
    }

    /// Alive nodes before interval `i`'s event: `intervals[i-1].nodes`, 0 before the first.
    pub fn nodes_before(&self, i: usize) -> u32 {
        i.checked_sub(1)
            .and_then(|k| self.intervals.get(k))
            .map_or(0, |iv| iv.nodes)
    }
}
