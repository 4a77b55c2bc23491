//! Parsing of the three text formats into per-second records.
//!
//! Every format is first turned into a stream of [`Step`]s (one per data line: time, nodes
//! added, nodes removed); [`Records`] then checks the order of the timestamps, keeps the
//! running count and merges steps that fall in the same whole second, as Parcae's `SpotTrace`
//! does (spec 1.1).

use std::collections::HashSet;

use super::error::{TraceError, TraceErrorKind, quoted};
use super::limits::MAX_NODES;

/// The text formats a trace can come in, detected from the first data line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `t_ms,add|remove,name` per line (Parcae's `liveput/traces/p3trace.csv`).
    Events,
    /// `t_ms,count` per line, count = alive nodes after the row (`aws/traces/p3.csv`).
    Counts,
    /// `[t_ms, "add"|"remove"|"migration"|"no-op", {"nodes": [...], ...}]` per line (the
    /// replay traces `aws/traces/<model>/trace_*.txt`).
    Replay,
}

/// All events at one whole second of the trace, merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// Time in whole seconds since the trace start (`t_ms / 1000`).
    pub t_s: u64,
    /// Nodes added at this second.
    pub added: u32,
    /// Nodes removed at this second.
    pub removed: u32,
    /// Alive nodes after all events of this second.
    pub nodes: u32,
}

/// One data line: at `t_ms`, `added` nodes arrived and `removed` left.
struct Step {
    t_ms: u64,
    added: u32,
    removed: u32,
}

/// Parses `text` (named `file` in errors) into merged per-second records, oldest first.
pub(crate) fn records(text: &str, file: &str) -> Result<Vec<Record>, TraceError> {
    let mut lines = data_lines(text).peekable();
    let Some(&(first_no, first)) = lines.peek() else {
        return Err(TraceError::whole(file, TraceErrorKind::Empty));
    };
    let format = detect(first).ok_or_else(|| {
        TraceError::at(
            file,
            first_no,
            TraceErrorKind::UnknownFormat(format!(
                "{} is neither `t_ms,add|remove,name`, `t_ms,count` nor a JSON array",
                quoted(first)
            )),
        )
    })?;
    let mut parser = LineParser::new(format);
    let mut records = Records::default();
    for (no, line) in lines {
        let step = parser
            .parse(line)
            .map_err(|kind| TraceError::at(file, no, kind))?;
        records
            .push(step)
            .map_err(|kind| TraceError::at(file, no, kind))?;
    }
    Ok(records.done)
}

/// The format of `text`, judged by its first data line (`None`: no data or unknown).
pub fn detect_format(text: &str) -> Option<Format> {
    data_lines(text).next().and_then(|(_, line)| detect(line))
}

/// The numbered (1-based), trimmed lines that carry data: not blank, not a `#` comment, and
/// not a CSV header (a first such line starting with a letter, like `t_ms,count`).
fn data_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
        .filter(|(k, (_, l))| *k > 0 || !l.starts_with(|c: char| c.is_ascii_alphabetic()))
        .map(|(_, line)| line)
}

/// The format of a trace whose first data line is `line`, if any.
fn detect(line: &str) -> Option<Format> {
    if line.starts_with('[') {
        return Some(Format::Replay);
    }
    match line.split(',').count() {
        3 => Some(Format::Events),
        2 => Some(Format::Counts),
        _ => None,
    }
}

/// Turns lines of one format into steps, keeping what the format needs to know about the past
/// (alive node names, the last count).
struct LineParser {
    format: Format,
    alive: HashSet<String>,
    count: u32,
}

impl LineParser {
    fn new(format: Format) -> Self {
        Self {
            format,
            alive: HashSet::new(),
            count: 0,
        }
    }

    fn parse(&mut self, line: &str) -> Result<Step, TraceErrorKind> {
        match self.format {
            Format::Events => self.event_line(line),
            Format::Counts => self.count_line(line),
            Format::Replay => self.replay_line(line),
        }
    }

    fn event_line(&mut self, line: &str) -> Result<Step, TraceErrorKind> {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [t, op, name] = fields[..] else {
            return Err(malformed(line, "expected 3 fields `t_ms,add|remove,name`"));
        };
        let t_ms = timestamp(line, t)?;
        if name.is_empty() {
            return Err(malformed(line, "empty node name"));
        }
        match op {
            "add" => self.add(name).map(|()| Step {
                t_ms,
                added: 1,
                removed: 0,
            }),
            "remove" => self.remove(name).map(|()| Step {
                t_ms,
                added: 0,
                removed: 1,
            }),
            _ => Err(TraceErrorKind::UnknownOp {
                op: quoted(op),
                expected: "add or remove",
            }),
        }
    }

    fn count_line(&mut self, line: &str) -> Result<Step, TraceErrorKind> {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [t, count] = fields[..] else {
            return Err(malformed(line, "expected 2 fields `t_ms,count`"));
        };
        let t_ms = timestamp(line, t)?;
        let count: i64 = count
            .parse()
            .map_err(|_| malformed(line, "count is not an integer"))?;
        if count < 0 {
            return Err(TraceErrorKind::NegativeCount(count));
        }
        let count = u32::try_from(count)
            .ok()
            .filter(|&c| c <= MAX_NODES)
            .ok_or(TraceErrorKind::TooManyNodes(count.unsigned_abs()))?;
        let step = Step {
            t_ms,
            added: count.saturating_sub(self.count),
            removed: self.count.saturating_sub(count),
        };
        self.count = count;
        Ok(step)
    }

    fn replay_line(&mut self, line: &str) -> Result<Step, TraceErrorKind> {
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| malformed(line, &format!("invalid JSON: {e}")))?;
        let serde_json::Value::Array(items) = value else {
            return Err(malformed(line, "expected a JSON array `[t_ms, op, {...}]`"));
        };
        let (Some(t), Some(op)) = (items.first(), items.get(1)) else {
            return Err(malformed(line, "expected at least `[t_ms, op]`"));
        };
        let t_ms = t
            .as_u64()
            .ok_or_else(|| malformed(line, "timestamp is not a non-negative integer"))?;
        let op = op
            .as_str()
            .ok_or_else(|| malformed(line, "op is not a string"))?;
        let mut step = Step {
            t_ms,
            added: 0,
            removed: 0,
        };
        match op {
            "add" | "remove" => {
                let names = items
                    .get(2)
                    .and_then(|d| d.get("nodes"))
                    .and_then(|n| n.as_array())
                    .ok_or_else(|| malformed(line, "add/remove without a \"nodes\" array"))?;
                for name in names {
                    let name = name
                        .as_str()
                        .ok_or_else(|| malformed(line, "node name is not a string"))?;
                    if op == "add" {
                        self.add(name)?;
                        step.added += 1;
                    } else {
                        self.remove(name)?;
                        step.removed += 1;
                    }
                }
            }
            "migration" | "no-op" => {}
            _ => {
                return Err(TraceErrorKind::UnknownOp {
                    op: quoted(op),
                    expected: "add, remove, migration or no-op",
                });
            }
        }
        Ok(step)
    }

    fn add(&mut self, name: &str) -> Result<(), TraceErrorKind> {
        if self.alive.len() >= MAX_NODES as usize {
            return Err(TraceErrorKind::TooManyNodes(self.alive.len() as u64 + 1));
        }
        if !self.alive.insert(name.to_owned()) {
            return Err(TraceErrorKind::DuplicateNode(quoted(name)));
        }
        Ok(())
    }

    fn remove(&mut self, name: &str) -> Result<(), TraceErrorKind> {
        if self.alive.is_empty() {
            return Err(TraceErrorKind::CountNegative {
                alive: 0,
                removed: 1,
            });
        }
        if !self.alive.remove(name) {
            return Err(TraceErrorKind::UnknownNode(quoted(name)));
        }
        Ok(())
    }
}

/// Parses a millisecond timestamp field.
fn timestamp(line: &str, field: &str) -> Result<u64, TraceErrorKind> {
    match field.parse::<i64>() {
        Ok(t) if t < 0 => Err(malformed(line, "negative timestamp")),
        Ok(t) => Ok(t.unsigned_abs()),
        Err(_) => Err(malformed(line, "timestamp is not an integer (ms)")),
    }
}

fn malformed(line: &str, reason: &str) -> TraceErrorKind {
    TraceErrorKind::Malformed {
        text: quoted(line),
        reason: reason.to_owned(),
    }
}

/// Accumulates steps into per-second records, checking their order and the running count.
#[derive(Default)]
struct Records {
    done: Vec<Record>,
    prev_ms: Option<u64>,
}

impl Records {
    fn push(&mut self, step: Step) -> Result<(), TraceErrorKind> {
        if let Some(prev_ms) = self.prev_ms
            && step.t_ms < prev_ms
        {
            return Err(TraceErrorKind::Unsorted {
                t_ms: step.t_ms,
                prev_ms,
            });
        }
        self.prev_ms = Some(step.t_ms);
        let t_s = step.t_ms / 1000;
        let alive = self.done.last().map_or(0, |r| r.nodes);
        let nodes = (u64::from(alive) + u64::from(step.added))
            .checked_sub(u64::from(step.removed))
            .ok_or(TraceErrorKind::CountNegative {
                alive: u64::from(alive) + u64::from(step.added),
                removed: u64::from(step.removed),
            })?;
        let nodes = u32::try_from(nodes)
            .ok()
            .filter(|&n| n <= MAX_NODES)
            .ok_or(TraceErrorKind::TooManyNodes(nodes))?;
        match self.done.last_mut() {
            Some(last) if last.t_s == t_s => {
                last.added = churn(last.added, step.added)?;
                last.removed = churn(last.removed, step.removed)?;
                last.nodes = nodes;
            }
            _ => self.done.push(Record {
                t_s,
                added: step.added,
                removed: step.removed,
                nodes,
            }),
        }
        Ok(())
    }
}

/// `a + b` arrivals or departures in one record or interval, bounded like node counts.
pub(crate) fn churn(a: u32, b: u32) -> Result<u32, TraceErrorKind> {
    let sum = u64::from(a) + u64::from(b);
    u32::try_from(sum)
        .ok()
        .filter(|&n| n <= MAX_NODES)
        .ok_or(TraceErrorKind::TooMuchChurn(sum))
}
