//! What a look-ahead knows beyond its forecast counts: what each step trains where that
//! depends on more than the count (a fleet's zones), and what the configuration it ends in is
//! worth past its horizon.

use std::sync::Arc;

use crate::cost::throughput::ThroughputTable;
use crate::trace::Interval;

/// What the configuration a look-ahead ends in is worth after the horizon (ours; Parcae's
/// objective values nothing there, which is `Terminal::default()`).
///
/// The final configuration is expected to keep running for `stay_ms` (until the zone's next
/// availability change, [`crate::predict::ZoneModel::expected_stay_intervals`]), less any
/// migration still unfinished; then the change brings one of `next`
/// ([`crate::predict::ZoneModel::next_changes`]), and the final configuration is charged, in
/// expectation, what that change costs it against the best configuration for the new count: a
/// migration there, or running on short of it (whichever is cheaper). The first part makes a
/// move that pays back after the horizon worth making in a quiet zone; the second keeps a
/// churning zone from chasing a configuration it must leave again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Terminal {
    /// Expected time the final configuration keeps running after the horizon, ms.
    pub stay_ms: f64,
    /// The outcomes of the change expected after that (none: nothing is charged).
    pub next: Vec<NextChange>,
}

/// One outcome of the availability change expected after a look-ahead's horizon.
#[derive(Clone, Debug, PartialEq)]
pub struct NextChange {
    /// Its probability.
    pub probability: f64,
    /// Nodes alive after it.
    pub nodes: u32,
    /// Expected time until the change after it, ms.
    pub stay_ms: f64,
    /// What each configuration trains after it, where that depends on more than `nodes`
    /// (which zone the change hits); `None`: the table the horizon ends in.
    pub table: Option<Arc<ThroughputTable>>,
}

/// A look-ahead from a forecast of each zone of a fleet, pooled
/// ([`crate::predict::ZoneForecasts`]).
pub struct Lookahead {
    /// The fleet's count, step by step, the upcoming event observed.
    pub future: Vec<Interval>,
    /// What each configuration is planned to train at each step (the composition forecast),
    /// for [`super::LiveputOptimizer::decide_with_tables`].
    pub tables: Vec<Arc<ThroughputTable>>,
    /// The look-ahead's value past its horizon: the first change of any zone.
    pub terminal: Terminal,
}
