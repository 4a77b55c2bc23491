//! Errors of parsing outside input (profiles, tables).

use thiserror::Error;

/// A problem in an input file, with where it is; displays as one line `file:line: problem`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{source_name}:{line}: {problem}")]
pub struct ParseError {
    /// File (or other source) name.
    pub source_name: String,
    /// 1-based line number, 0 when the problem is not on one line.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

impl ParseError {
    /// An error at `line` of `source`.
    pub fn new(source: &str, line: usize, problem: impl Into<String>) -> Self {
        Self {
            source_name: source.to_string(),
            line,
            problem: problem.into(),
        }
    }
}
