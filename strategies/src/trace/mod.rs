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
mod interval;
mod limits;
mod parse;
mod region;
mod synthetic;
mod zones;

use std::io::Read;

pub use bin::Binning;
pub use error::{TraceError, TraceErrorKind};
pub use interval::{Interval, Trace, intervals_from_counts};
pub use limits::{
    DEFAULT_INTERVAL_SECS, MAX_INPUT_BYTES, MAX_INTERVAL_SECS, MAX_INTERVALS, MAX_NODES,
};
pub use parse::{Format, detect_format};
pub use synthetic::{Band, BandStats, SyntheticSpec};
pub use zones::{Family, ZoneSpec};

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
