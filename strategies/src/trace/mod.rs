//! Availability traces binned into planning intervals.
//!
//! A trace is the number of alive nodes over time. Three text formats are understood and
//! told apart by their first data line ([`Format`]): Parcae's event traces
//! (`t_ms,add|remove,name`), count traces (`t_ms,count`) and the JSON-lines replay traces
//! (`[t_ms, op, {...}]`). Parsing turns every line into arrivals and departures, merges those of
//! the same whole second and bins them into intervals with Parcae's rule ([`Binning`]).
//! `synthetic:BAND[:SEED]` names a seeded generated trace instead ([`SyntheticSpec`]), the
//! project's embedded default; `synthetic:FAMILY[:SEED]` a seeded multi-day zone ([`ZoneSpec`]:
//! quiet, outage, diurnal, shifting).
//!
//! Inputs are untrusted: sizes are bounded ([`MAX_INPUT_BYTES`], [`MAX_NODES`],
//! [`MAX_INTERVALS`]) and every problem is a [`TraceError`] whose message is one line
//! `file:line: problem`.

mod bin;
mod error;
mod parse;
mod synthetic;
mod zones;

use std::io::Read;
use std::ops::Range;

use serde::{Deserialize, Serialize};

pub use bin::Binning;
pub use error::{TraceError, TraceErrorKind};
pub use parse::{Format, detect_format};
pub use synthetic::{Band, BandStats, SyntheticSpec};
pub use zones::{Family, ZoneSpec};

/// Parcae's interval length (spec 1.1).
pub const DEFAULT_INTERVAL_SECS: u64 = 60;
/// Largest trace file or text accepted (bytes).
pub const MAX_INPUT_BYTES: usize = 64 << 20;
/// Most intervals a trace may have (about two years of one-minute intervals).
pub const MAX_INTERVALS: usize = 1 << 20;
/// Most nodes alive at once.
pub const MAX_NODES: u32 = 1 << 20;
/// Longest interval accepted (one day).
pub const MAX_INTERVAL_SECS: u64 = 86_400;

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

/// Options of [`parse_str_with`] and [`load_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseOptions {
    /// Interval length in seconds (1 to [`MAX_INTERVAL_SECS`]).
    pub interval_secs: u64,
    /// How events are mapped to intervals.
    pub binning: Binning,
}

impl Default for ParseOptions {
    fn default() -> Self {
        Self {
            interval_secs: DEFAULT_INTERVAL_SECS,
            binning: Binning::default(),
        }
    }
}

/// Loads a trace from `spec`: a file path, `synthetic:BAND[:SEED][:nodes=N][:intervals=K]` or
/// `synthetic:FAMILY[:SEED][:nodes=N][:days=D]`.
pub fn load(spec: &str, interval_secs: u64) -> Result<Trace, TraceError> {
    load_with(
        spec,
        &ParseOptions {
            interval_secs,
            ..ParseOptions::default()
        },
    )
}

/// [`load`] with all options.
pub fn load_with(spec: &str, options: &ParseOptions) -> Result<Trace, TraceError> {
    check_interval_secs(spec, options.interval_secs)?;
    if let Some(rest) = spec.strip_prefix("synthetic:") {
        let name = rest.split(':').next().unwrap_or_default();
        let generated = if Family::from_name(name).is_some() {
            ZoneSpec::parse(spec, options.interval_secs).map(|s| s.generate())
        } else {
            SyntheticSpec::parse(spec, options.interval_secs).map(|s| s.generate())
        };
        return generated.map_err(|e| TraceError::whole(spec, TraceErrorKind::BadSynthetic(e)));
    }
    let unreadable =
        |e: std::io::Error| TraceError::whole(spec, TraceErrorKind::Unreadable(e.to_string()));
    let mut bytes = Vec::new();
    std::fs::File::open(spec)
        .and_then(|f| f.take(MAX_INPUT_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(unreadable)?;
    if bytes.len() > MAX_INPUT_BYTES {
        let kind = TraceErrorKind::TooLarge;
        return Err(TraceError::whole(spec, kind));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..valid]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        TraceError::at(spec, line, TraceErrorKind::NotUtf8)
    })?;
    parse_str_with(&text, spec, options)
}

/// Parses a trace in any of the [`Format`]s from `text`, naming it `source` in errors and in
/// the result, with Parcae's binning rule.
pub fn parse_str(text: &str, source: &str, interval_secs: u64) -> Result<Trace, TraceError> {
    parse_str_with(
        text,
        source,
        &ParseOptions {
            interval_secs,
            ..ParseOptions::default()
        },
    )
}

/// [`parse_str`] with all options.
pub fn parse_str_with(
    text: &str,
    source: &str,
    options: &ParseOptions,
) -> Result<Trace, TraceError> {
    check_interval_secs(source, options.interval_secs)?;
    if text.len() > MAX_INPUT_BYTES {
        return Err(TraceError::whole(source, TraceErrorKind::TooLarge));
    }
    let records = parse::records(text, source)?;
    let intervals = bin::bin(&records, options.interval_secs, options.binning)
        .map_err(|kind| TraceError::whole(source, kind))?;
    Ok(Trace {
        source: source.to_owned(),
        interval_secs: options.interval_secs,
        intervals,
    })
}

fn check_interval_secs(source: &str, secs: u64) -> Result<(), TraceError> {
    if (1..=MAX_INTERVAL_SECS).contains(&secs) {
        Ok(())
    } else {
        Err(TraceError::whole(
            source,
            TraceErrorKind::BadIntervalSecs(secs),
        ))
    }
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
