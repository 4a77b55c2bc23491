//! Training throughput of each parallel configuration (spec 2.1).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ParallelConfig;
use crate::error::ParseError;

/// Samples per second of every configuration a job can run; missing ones run at 0.
///
/// Filled from a profile table (the paper's measurements, or a user's) or by the analytic
/// pipeline model from per-layer costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThroughputTable {
    rows: BTreeMap<ParallelConfig, f64>,
}

/// Columns of a profile CSV, as in `throughput_profiles.csv`.
const HEADER: [&str; 7] = [
    "model",
    "train_batch_size",
    "micro_batch_size",
    "dp",
    "pp",
    "iter_time_ms",
    "throughput_samples_per_s",
];

/// A parsed profile file: the model it names and its table.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Model name of the rows.
    pub model: String,
    /// Global batch of the rows.
    pub global_batch: u32,
    /// Micro-batch of the rows.
    pub micro_batch: u32,
    /// The throughputs.
    pub table: ThroughputTable,
}

impl ThroughputTable {
    /// A table from `(config, samples/s)` pairs.
    pub fn from_rows(rows: impl IntoIterator<Item = (ParallelConfig, f64)>) -> Self {
        Self {
            rows: rows.into_iter().collect(),
        }
    }

    /// Samples per second of `c` (0 when not profiled or infeasible).
    pub fn samples_per_sec(&self, c: ParallelConfig) -> f64 {
        self.rows.get(&c).copied().unwrap_or(0.0)
    }

    /// Configurations with a positive throughput, in `(d, p)` order.
    pub fn configs(&self) -> impl Iterator<Item = (ParallelConfig, f64)> + '_ {
        self.rows
            .iter()
            .filter(|(_, t)| **t > 0.0)
            .map(|(c, t)| (*c, *t))
    }

    /// The throughput-optimal configuration on `nodes` nodes: the first maximum in
    /// `(d, p)` order, as Parcae's `best_strategy`.
    pub fn best(&self, nodes: u32) -> ParallelConfig {
        let mut best = (ParallelConfig::IDLE, 0.0);
        for (c, t) in self.configs() {
            if c.nodes() <= nodes && t > best.1 {
                best = (c, t);
            }
        }
        best.0
    }
}

impl Profile {
    /// Parse a profile CSV (header line as `throughput_profiles.csv`); `source` names the file
    /// in errors. Only rows of the first model named are kept.
    pub fn parse(text: &str, source: &str) -> Result<Self, ParseError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let (_, header) = lines
            .next()
            .ok_or_else(|| ParseError::new(source, 0, "empty profile"))?;
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        if cols != HEADER {
            return Err(ParseError::new(
                source,
                1,
                format!("expected header `{}`", HEADER.join(",")),
            ));
        }
        let mut profile: Option<Profile> = None;
        for (i, line) in lines {
            let lineno = i + 1;
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() != HEADER.len() {
                return Err(ParseError::new(
                    source,
                    lineno,
                    format!("expected {} fields, found {}", HEADER.len(), f.len()),
                ));
            }
            let int = |k: usize| -> Result<u32, ParseError> {
                f[k].parse::<u32>().map_err(|_| {
                    ParseError::new(
                        source,
                        lineno,
                        format!("{} `{}` is not a count", HEADER[k], f[k]),
                    )
                })
            };
            let real = |k: usize| -> Result<f64, ParseError> {
                match f[k].parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                    _ => Err(ParseError::new(
                        source,
                        lineno,
                        format!("{} `{}` is not a non-negative number", HEADER[k], f[k]),
                    )),
                }
            };
            let (gbs, mbs, d, p) = (int(1)?, int(2)?, int(3)?, int(4)?);
            let (_iter_ms, tput) = (real(5)?, real(6)?);
            if d == 0 || p == 0 {
                return Err(ParseError::new(
                    source,
                    lineno,
                    "dp and pp must be positive",
                ));
            }
            let entry = profile.get_or_insert_with(|| Profile {
                model: f[0].to_string(),
                global_batch: gbs,
                micro_batch: mbs,
                table: ThroughputTable::default(),
            });
            if entry.model == f[0] {
                entry.table.rows.insert(ParallelConfig::new(d, p), tput);
            }
        }
        profile.ok_or_else(|| ParseError::new(source, 0, "profile has no rows"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_bad_rows_with_line_numbers() {
        let ok = format!("{}\ngpt,128,1,4,8,2944.7,43.4\n", HEADER.join(","));
        let p = Profile::parse(&ok, "x.csv").unwrap();
        assert_eq!(p.table.samples_per_sec(ParallelConfig::new(4, 8)), 43.4);
        let bad = format!("{}\ngpt,128,1,4,8,2944.7,-1\n", HEADER.join(","));
        let e = Profile::parse(&bad, "x.csv").unwrap_err().to_string();
        assert!(e.starts_with("x.csv:2:"), "{e}");
        assert!(Profile::parse("", "y.csv").is_err());
    }
}
