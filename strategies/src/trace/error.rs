//! Trace errors: one line each, naming the file, the line and the problem.

use std::fmt;

/// What is wrong with a trace (the location is in [`TraceError`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TraceErrorKind {
    /// The file could not be opened or read.
    #[error("cannot read: {0}")]
    Unreadable(String),
    /// The input exceeds [`super::limits::MAX_INPUT_BYTES`].
    #[error("input larger than the limit of {max} bytes", max = super::limits::MAX_INPUT_BYTES)]
    TooLarge,
    /// The input is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// No events at all (only blank lines, comments or a header).
    #[error("empty trace (no events)")]
    Empty,
    /// The first data line matches none of the known formats.
    #[error("unknown trace format: {0}")]
    UnknownFormat(String),
    /// A line that does not follow the format detected from the first data line.
    #[error("malformed line {text}: {reason}")]
    Malformed {
        /// The offending line, quoted, escaped and shortened.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A timestamp smaller than the one before it.
    #[error("timestamps not sorted ({t_ms} after {prev_ms})")]
    Unsorted {
        /// The timestamp of this line (ms).
        t_ms: u64,
        /// The larger timestamp of an earlier line (ms).
        prev_ms: u64,
    },
    /// A count trace row with a count below zero.
    #[error("negative count {0}")]
    NegativeCount(i64),
    /// An event whose operation the format does not know.
    #[error("unknown op {op} (expected {expected})")]
    UnknownOp {
        /// The operation, quoted and escaped.
        op: String,
        /// The operations this format knows.
        expected: &'static str,
    },
    /// A remove of a node that is not alive.
    #[error("remove of unknown node {0}")]
    UnknownNode(String),
    /// An add of a node that is already alive.
    #[error("add of node {0} which is already alive")]
    DuplicateNode(String),
    /// More nodes removed than are alive.
    #[error("node count would go negative ({alive} alive, {removed} removed)")]
    CountNegative {
        /// Nodes alive before the event.
        alive: u64,
        /// Nodes the event removes.
        removed: u64,
    },
    /// More alive nodes than [`super::limits::MAX_NODES`].
    #[error("{0} nodes alive, above the limit of {max}", max = super::limits::MAX_NODES)]
    TooManyNodes(u64),
    /// More arrivals or departures in one record or interval than [`super::limits::MAX_NODES`].
    #[error("{0} nodes added or removed at once, above the limit of {max}", max = super::limits::MAX_NODES)]
    TooMuchChurn(u64),
    /// The binned trace would have more than [`super::limits::MAX_INTERVALS`] intervals.
    #[error("trace spans more than {max} intervals", max = super::limits::MAX_INTERVALS)]
    TooLong,
    /// An interval length of 0 s or above one day.
    #[error("invalid interval length {0} s (expected 1 to 86400)")]
    BadIntervalSecs(u64),
    /// A `synthetic:` spec that does not parse.
    #[error("invalid synthetic trace spec: {0}")]
    BadSynthetic(String),
    /// A window whose hours are not finite, negative or reversed.
    #[error("invalid window {start} h to {end} h")]
    BadWindow {
        /// Start hour as given.
        start: f64,
        /// End hour as given.
        end: f64,
    },
}

/// A trace error with its location: `file:line: problem` (or `file: problem`), on one line.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct TraceError {
    /// The file (or trace spec) the problem is in, as given by the caller.
    pub file: String,
    /// 1-based line number, when the problem is on one line.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: TraceErrorKind,
}

impl TraceError {
    /// An error located at `line` (1-based) of `file`.
    pub fn at(file: &str, line: usize, kind: TraceErrorKind) -> Self {
        Self {
            file: file.to_owned(),
            line: Some(line),
            kind,
        }
    }

    /// An error about `file` as a whole.
    pub fn whole(file: &str, kind: TraceErrorKind) -> Self {
        Self {
            file: file.to_owned(),
            line: None,
            kind,
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = one_line(&self.file, 200);
        match self.line {
            Some(line) => write!(f, "{file}:{line}: {}", self.kind),
            None => write!(f, "{file}: {}", self.kind),
        }
    }
}

/// `s` shortened to `max` characters with control characters escaped, so that an error
/// message built from untrusted text stays on one line and a sane length.
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` quoted for an error message: escaped, shortened, in double quotes.
pub(crate) fn quoted(s: &str) -> String {
    format!("\"{}\"", one_line(s, 80).replace('"', "\\\""))
}
