//! An availability model that learns the zone a job runs in.
//!
//! Parcae's forecasts look a fixed number of intervals ahead and know nothing of the zone beyond
//! that window. Spot zones differ by orders of magnitude: some churn every few minutes, others
//! stay at full availability for days with a rare dip, and some follow the clock (busy hours
//! take machines away, nights give them back). [`ZoneModel`] estimates, online from the
//! replicated availability history:
//!
//! * the probability that the node count changes in an interval, separately while the cluster
//!   is at its capacity (only preemptions can change it) and while it is short of it (arrivals
//!   usually follow), from evidence that decays with a half-life of [`RATE_HALF_LIFE_H`] hours,
//!   under a weak prior of one change an hour;
//! * what the next change may bring: a rise or a fall, with the shares and mean sizes seen in
//!   the regime (below capacity a rise is measured as the share of the deficit it made up);
//! * a time-of-day pattern of the changes and of the net change in nodes, kept only when the
//!   history covers [`MIN_PATTERN_DAYS`] days and a chi-square test over the 24 hours rejects a
//!   flat rate at p = 0.001.
//!
//! Two things are derived from it. [`ZoneModel::terminal`] values the configuration a
//! look-ahead ends in beyond the optimizer's horizon
//! ([`crate::liveput::LiveputOptimizer::decide_with_terminal`]): it keeps running for the
//! expected time until the next change ([`ZoneModel::expected_stay_intervals`]), then what
//! that change costs it is charged, in expectation over [`ZoneModel::next_changes`]. As a
//! [`Predictor`] the model forecasts persistence (the most accurate forecast on real spot traces, see the table in
//! [`crate::predict`]) plus the expected net change of the hours ahead when the zone has a
//! time-of-day pattern.
//!
//! Updates are incremental: each call consumes only the intervals it has not seen, so a
//! multi-day history costs O(1) per interval.

use std::collections::VecDeque;

use super::predictor::{ForecastInput, Predictor};
use crate::liveput::{NextChange, Terminal};
use crate::trace::{Interval, intervals_from_counts};

/// Half-life of the evidence behind the change rates, hours: long enough to see a quiet zone's
/// few dips a day, short enough to follow a zone that turns churning within a day.
pub const RATE_HALF_LIFE_H: f64 = 12.0;
/// Half-life of the evidence behind the time-of-day pattern, hours (a week).
const PATTERN_HALF_LIFE_H: f64 = 7.0 * 24.0;
/// The prior's rate: one change an hour ...
const PRIOR_CHANGES_PER_HOUR: f64 = 1.0;
/// ... worth six minutes of observation, so a few changes outweigh it.
const PRIOR_HOURS: f64 = 0.1;
/// Longest expected stay the model reports, hours.
pub const MAX_STAY_H: f64 = 24.0;
/// Least history before a time-of-day pattern is believed, days.
pub const MIN_PATTERN_DAYS: f64 = 2.0;
/// Chi-square quantile for 23 degrees of freedom at p = 0.001.
const CHI2_23_P001: f64 = 49.73;
/// The capacity is the most nodes seen within this many hours.
const CAPACITY_WINDOW_H: f64 = 24.0;
/// Hours in a day: the buckets of the time-of-day pattern.
const HOURS: usize = 24;

/// Whether the cluster had all the nodes the zone has been giving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// At the capacity seen lately: only a preemption changes the count.
    Full,
    /// Below it: arrivals are expected too.
    Short,
}

/// Decayed evidence of changes: intervals observed, how many of them changed the count, and
/// what the changes did (see [`ZoneModel::next_changes`]).
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    intervals: f64,
    changes: f64,
    /// Changes that raised the count, and the sum of their sizes: in nodes at capacity, as a
    /// share of the deficit below it.
    ups: f64,
    up_size: f64,
    /// Changes that lowered the count, and the sum of the nodes they took.
    downs: f64,
    down_nodes: f64,
}

impl Evidence {
    fn decay(&mut self, factor: f64) {
        for v in [
            &mut self.intervals,
            &mut self.changes,
            &mut self.ups,
            &mut self.up_size,
            &mut self.downs,
            &mut self.down_nodes,
        ] {
            *v *= factor;
        }
    }
}

/// One outcome of the zone's next change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Its probability among the outcomes.
    pub probability: f64,
    /// Nodes alive after it.
    pub nodes: u32,
}

/// The availability model of one zone, learned online (see the module docs).
#[derive(Clone, Debug)]
pub struct ZoneModel {
    interval_secs: f64,
    rate_decay: f64,
    pattern_decay: f64,
    prior_intervals: f64,
    capacity_window: usize,
    /// History intervals consumed so far.
    seen: usize,
    /// The count after the last consumed interval.
    last: Option<u32>,
    /// Candidates for the windowed maximum: (index, count), counts decreasing.
    window: VecDeque<(usize, u32)>,
    full: Evidence,
    short: Evidence,
    /// Per hour of the day: changes, intervals, and net nodes gained.
    hourly: [Evidence; HOURS],
    hourly_net: [f64; HOURS],
    /// Undecayed intervals consumed, for the pattern's minimum history.
    total_intervals: usize,
}

impl ZoneModel {
    /// A model for intervals of `interval_secs` seconds, knowing nothing yet.
    pub fn new(interval_secs: f64) -> Self {
        let interval_secs = if interval_secs.is_finite() && interval_secs > 0.0 {
            interval_secs
        } else {
            60.0
        };
        let per_hour = 3600.0 / interval_secs;
        let half_life = |h: f64| 0.5f64.powf(1.0 / (h * per_hour).max(1.0));
        Self {
            interval_secs,
            rate_decay: half_life(RATE_HALF_LIFE_H),
            pattern_decay: half_life(PATTERN_HALF_LIFE_H),
            prior_intervals: PRIOR_HOURS * per_hour,
            capacity_window: (CAPACITY_WINDOW_H * per_hour).ceil().max(1.0) as usize,
            seen: 0,
            last: None,
            window: VecDeque::new(),
            full: Evidence::default(),
            short: Evidence::default(),
            hourly: [Evidence::default(); HOURS],
            hourly_net: [0.0; HOURS],
            total_intervals: 0,
        }
    }

    /// Consumes the intervals of a whole `history` not seen yet.
    pub fn observe(&mut self, history: &[Interval]) {
        self.observe_from(0, history);
    }

    /// Consumes the intervals not seen yet of a history whose first interval is the `first`-th
    /// recorded (a bounded record that dropped its oldest). A history ending before what was
    /// seen (another job, a restarted log) starts the model afresh; one starting after it (a new
    /// leader's record of a long run) is consumed from its start, placed on the clock by index.
    pub fn observe_from(&mut self, first: usize, history: &[Interval]) {
        let end = first + history.len();
        if end < self.seen {
            *self = Self::new(self.interval_secs);
        }
        if first > self.seen {
            self.last = None;
        }
        let skip = self.seen.saturating_sub(first);
        for (k, iv) in history.iter().enumerate().skip(skip) {
            self.consume(first + k, *iv);
        }
        self.seen = end;
    }

    fn consume(&mut self, index: usize, iv: Interval) {
        if let Some(before) = self.last {
            let changed = f64::from(u8::from(iv.added + iv.removed > 0 || iv.nodes != before));
            self.full.decay(self.rate_decay);
            self.short.decay(self.rate_decay);
            let net = f64::from(iv.nodes) - f64::from(before);
            let capacity = self.capacity();
            let (regime, up_size) = match self.regime(before) {
                Regime::Full => (&mut self.full, net),
                Regime::Short => (&mut self.short, net / f64::from(capacity - before)),
            };
            regime.intervals += 1.0;
            regime.changes += changed;
            if net > 0.0 {
                regime.ups += 1.0;
                regime.up_size += up_size;
            } else if net < 0.0 {
                regime.downs += 1.0;
                regime.down_nodes -= net;
            }
            for (e, net) in self.hourly.iter_mut().zip(&mut self.hourly_net) {
                e.decay(self.pattern_decay);
                *net *= self.pattern_decay;
            }
            let hour = self.hour_of(index);
            self.hourly[hour].intervals += 1.0;
            self.hourly[hour].changes += changed;
            self.hourly_net[hour] += net;
            self.total_intervals += 1;
        }
        while self.window.back().is_some_and(|&(_, n)| n <= iv.nodes) {
            self.window.pop_back();
        }
        self.window.push_back((index, iv.nodes));
        while self
            .window
            .front()
            .is_some_and(|&(i, _)| i + self.capacity_window <= index)
        {
            self.window.pop_front();
        }
        self.last = Some(iv.nodes);
    }

    /// The most nodes seen lately (0 before any history).
    pub fn capacity(&self) -> u32 {
        self.window.front().map_or(0, |&(_, n)| n)
    }

    /// Whether `nodes` is at the capacity seen lately.
    pub fn regime(&self, nodes: u32) -> Regime {
        if nodes >= self.capacity() {
            Regime::Full
        } else {
            Regime::Short
        }
    }

    /// Probability that the count changes in one interval while in `regime`, at no particular
    /// hour (posterior mean under the prior).
    pub fn change_probability(&self, regime: Regime) -> f64 {
        let e = match regime {
            Regime::Full => self.full,
            Regime::Short => self.short,
        };
        let prior_changes = PRIOR_CHANGES_PER_HOUR * PRIOR_HOURS;
        ((e.changes + prior_changes) / (e.intervals + self.prior_intervals)).clamp(1e-9, 1.0)
    }

    /// What the zone's next change may bring from `nodes`: a rise and a fall, with their
    /// probabilities (the shares of rises and falls seen in the regime) and sizes (the mean
    /// seen: at capacity in nodes, below it as a share of the deficit). Until seen otherwise a
    /// full zone loses one node, and a short one is as likely to lose one as to recover
    /// entirely (dips recover).
    pub fn next_changes(&self, nodes: u32) -> [Outcome; 2] {
        let prior = PRIOR_CHANGES_PER_HOUR * PRIOR_HOURS;
        let capacity = self.capacity();
        let (e, up_prior) = match self.regime(nodes) {
            Regime::Full => (self.full, 0.0),
            Regime::Short => (self.short, prior),
        };
        let up_weight = e.ups + up_prior;
        let down_weight = e.downs + prior;
        let mean_up = if up_weight > 0.0 {
            (e.up_size + up_prior) / up_weight
        } else {
            1.0
        };
        let up = match self.regime(nodes) {
            Regime::Full => mean_up,
            Regime::Short => mean_up * f64::from(capacity - nodes),
        };
        let down = (e.down_nodes + prior) / down_weight;
        let total = up_weight + down_weight;
        let rise = nodes.saturating_add(up.round().max(1.0) as u32);
        let rise = match self.regime(nodes) {
            Regime::Full => rise,
            Regime::Short => rise.min(capacity),
        };
        [
            Outcome {
                probability: up_weight / total,
                nodes: rise,
            },
            Outcome {
                probability: down_weight / total,
                nodes: nodes.saturating_sub(down.round().max(1.0) as u32),
            },
        ]
    }

    /// The multiplier of the change rate in each hour of the day, when the history shows a
    /// time-of-day pattern (see the module docs).
    pub fn daily_pattern(&self) -> Option<[f64; HOURS]> {
        let days = self.total_intervals as f64 / (self.per_hour() * HOURS as f64);
        if days < MIN_PATTERN_DAYS {
            return None;
        }
        let intervals: f64 = self.hourly.iter().map(|e| e.intervals).sum();
        let changes: f64 = self.hourly.iter().map(|e| e.changes).sum();
        if intervals <= 0.0 || changes <= 0.0 {
            return None;
        }
        let rate = changes / intervals;
        let chi2: f64 = self
            .hourly
            .iter()
            .filter(|e| e.intervals > 0.0)
            .map(|e| {
                let expected = rate * e.intervals;
                (e.changes - expected).powi(2) / expected
            })
            .sum();
        if chi2 < CHI2_23_P001 {
            return None;
        }
        let mut out = [1.0; HOURS];
        for (m, e) in out.iter_mut().zip(&self.hourly) {
            // Shrunk towards the flat rate by one pseudo-change.
            *m = (e.changes + 1.0) / (rate * e.intervals + 1.0);
        }
        Some(out)
    }

    /// Expected intervals from interval `index` until the node count changes, starting with
    /// `nodes` alive; at most `MAX_STAY_H` hours.
    pub fn expected_stay_intervals(&self, index: usize, nodes: u32) -> f64 {
        let base = self.change_probability(self.regime(nodes));
        let pattern = self.daily_pattern();
        let cap = MAX_STAY_H * self.per_hour();
        let (mut survive, mut stay, mut at) = (1.0, 0.0, index);
        while stay < cap && survive > 1e-6 {
            let hour = self.hour_of(at);
            let next_hour_start = ((self.hour_number(at) + 1) as f64 * self.per_hour()).ceil();
            let run = (next_hour_start as usize).saturating_sub(at).max(1);
            let h = pattern.map_or(base, |m| base * m[hour]).clamp(1e-9, 1.0);
            let keep = (1.0 - h).powf(run as f64);
            stay += survive * (1.0 - keep) / h;
            survive *= keep;
            at += run;
        }
        stay.min(cap)
    }

    /// The look-ahead's terminal value when its forecast ends before interval `index` with
    /// `nodes` alive, for intervals of `interval_ms`.
    pub fn terminal(&self, index: usize, nodes: u32, interval_ms: f64) -> Terminal {
        let stay = self.expected_stay_intervals(index, nodes);
        let then = index.saturating_add(stay.round() as usize);
        let next = self.next_changes(nodes).map(|o| NextChange {
            probability: o.probability,
            nodes: o.nodes,
            stay_ms: self.expected_stay_intervals(then, o.nodes) * interval_ms,
            table: None,
        });
        Terminal {
            stay_ms: stay * interval_ms,
            next: next.to_vec(),
        }
    }

    /// Expected net change of the node count over interval `index` (0 without a pattern).
    pub fn expected_net_change(&self, index: usize) -> f64 {
        if self.daily_pattern().is_none() {
            return 0.0;
        }
        let e = &self.hourly[self.hour_of(index)];
        if e.intervals <= 0.0 {
            return 0.0;
        }
        self.hourly_net[self.hour_of(index)] / e.intervals
    }

    fn per_hour(&self) -> f64 {
        3600.0 / self.interval_secs
    }

    /// Hours since the history started at interval `index`'s start.
    fn hour_number(&self, index: usize) -> usize {
        (index as f64 * self.interval_secs / 3600.0).floor() as usize
    }

    fn hour_of(&self, index: usize) -> usize {
        self.hour_number(index) % HOURS
    }
}

impl Predictor for ZoneModel {
    /// Persistence from the last known count plus the expected net change of the hours ahead
    /// when the zone has a time-of-day pattern, kept within `[0, capacity]`.
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
        self.observe_from(input.first, input.history);
        let start = input
            .history
            .last()
            .map(|i| i.nodes)
            .or(input.known_next)
            .unwrap_or(0);
        let ceiling = self
            .capacity()
            .max(start)
            .max(input.known_next.unwrap_or(0));
        let first = input.first + input.history.len();
        let mut drift = 0.0;
        let counts = (0..input.horizon).map(|k| {
            drift += self.expected_net_change(first + k);
            (f64::from(start) + drift)
                .round()
                .clamp(0.0, f64::from(ceiling)) as u32
        });
        intervals_from_counts(start, counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The intervals of a count series (the first interval is the initial allocation).
    fn from_counts(counts: impl IntoIterator<Item = u32>) -> Vec<Interval> {
        intervals_from_counts(0, counts)
    }

    fn steady(nodes: u32, len: usize) -> Vec<Interval> {
        from_counts(std::iter::repeat_n(nodes, len))
    }

    /// A count that drops by `dip` for `dip_len` intervals every `every` intervals.
    fn dipping(nodes: u32, len: usize, every: usize, dip: u32, dip_len: usize) -> Vec<Interval> {
        from_counts((0..len).map(|k| {
            if k > 0 && k % every < dip_len {
                nodes - dip
            } else {
                nodes
            }
        }))
    }

    #[test]
    fn a_quiet_zone_is_expected_to_stay_and_a_churning_one_to_change() {
        let mut quiet = ZoneModel::new(60.0);
        quiet.observe(&steady(16, 2 * 24 * 60));
        let stay = quiet.expected_stay_intervals(2 * 24 * 60, 16);
        assert!(stay > 12.0 * 60.0, "quiet zone stay {stay}");
        let mut churn = ZoneModel::new(60.0);
        churn.observe(&dipping(16, 6 * 60, 4, 2, 2));
        let stay = churn.expected_stay_intervals(6 * 60, 16);
        assert!(stay < 5.0, "churning zone stay {stay}");
    }

    #[test]
    fn the_prior_speaks_before_any_history() {
        let m = ZoneModel::new(60.0);
        let stay = m.expected_stay_intervals(0, 8);
        assert!((stay - 60.0).abs() < 1.0, "{stay}");
    }

    #[test]
    fn dips_that_recover_make_the_short_regime_brief() {
        let mut m = ZoneModel::new(60.0);
        // A dip of 10 minutes every 4 hours for two days.
        m.observe(&dipping(16, 2 * 24 * 60, 240, 3, 10));
        assert_eq!(m.capacity(), 16);
        let full = m.expected_stay_intervals(2 * 24 * 60, 16);
        let short = m.expected_stay_intervals(2 * 24 * 60, 13);
        assert!(full > 120.0, "{full}");
        assert!(short < 15.0, "{short}");
    }

    #[test]
    fn the_next_change_is_learned() {
        let mut m = ZoneModel::new(60.0);
        let [rise, fall] = m.next_changes(16);
        assert_eq!((rise.probability, fall.probability), (0.0, 1.0));
        assert_eq!(fall.nodes, 15, "before any history: one node goes");
        // Dips of three nodes that come back at once.
        m.observe(&dipping(16, 2 * 24 * 60, 240, 3, 10));
        let [rise, fall] = m.next_changes(16);
        assert_eq!((rise.probability, fall.nodes), (0.0, 13));
        let [rise, fall] = m.next_changes(13);
        assert_eq!(rise.nodes, 16);
        assert!(rise.probability > 0.9, "{rise:?} {fall:?}");
        assert_eq!(m.next_changes(10)[0].nodes, 16);
    }

    #[test]
    fn a_bounded_record_is_consumed_past_its_bound_and_placed_by_index() {
        let h = dipping(16, 3000, 97, 2, 5);
        let bound = 1000;
        let mut whole = ZoneModel::new(60.0);
        let mut bounded = ZoneModel::new(60.0);
        for end in [bound, 2000, 3000] {
            whole.observe(&h[..end]);
            bounded.observe_from(end - bound, &h[end - bound..end]);
        }
        let (a, b) = (
            whole.expected_stay_intervals(3000, 16),
            bounded.expected_stay_intervals(3000, 16),
        );
        assert!((a - b).abs() < 1e-9, "kept consuming: {a} vs {b}");
        // A model that never saw the start (a new leader) places the record by its index.
        let mut late = ZoneModel::new(60.0);
        late.observe_from(2000, &h[2000..3000]);
        let mut whole_late = ZoneModel::new(60.0);
        whole_late.observe(&h[..2000]);
        assert_eq!(late.hour_of(2000), whole_late.hour_of(2000));
        assert_eq!(late.seen, 3000);
    }

    #[test]
    fn incremental_and_whole_history_agree() {
        let h = dipping(16, 3000, 97, 2, 5);
        let mut once = ZoneModel::new(60.0);
        once.observe(&h);
        let mut step = ZoneModel::new(60.0);
        for k in 0..=h.len() {
            step.observe(&h[..k]);
        }
        let a = once.expected_stay_intervals(3000, 16);
        let b = step.expected_stay_intervals(3000, 16);
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        // A shorter history restarts the model.
        step.observe(&h[..10]);
        let mut fresh = ZoneModel::new(60.0);
        fresh.observe(&h[..10]);
        assert_eq!(
            step.expected_stay_intervals(10, 16),
            fresh.expected_stay_intervals(10, 16)
        );
    }

    /// `days` days, each losing 4 nodes at 09:00 and getting them back at 17:00.
    fn office_hours(days: usize) -> Vec<Interval> {
        from_counts((0..days * 24 * 60).map(|k| {
            if (9..17).contains(&((k / 60) % 24)) {
                12
            } else {
                16
            }
        }))
    }

    #[test]
    fn a_daily_pattern_is_found_and_forecast() {
        let h = office_hours(3);
        let mut m = ZoneModel::new(60.0);
        m.observe(&h[..24 * 60]);
        assert!(m.daily_pattern().is_none(), "one day is not a pattern");
        m.observe(&h);
        let pattern = m.daily_pattern().expect("three days of office hours");
        assert!(pattern[9] > 2.0 && pattern[3] < 1.0, "{pattern:?}");
        assert!(m.expected_net_change(3 * 24 * 60 + 9 * 60) < -0.02);
        // At 08:50 of day four the forecast already sees nodes going.
        let at = 3 * 24 * 60 + 8 * 60 + 50;
        let mut tail = h.clone();
        tail.extend(office_hours(4)[3 * 24 * 60..at].iter().copied());
        let f = m.forecast(&ForecastInput {
            history: &tail,
            first: 0,
            known_next: None,
            notices: &[],
            horizon: 30,
        });
        assert_eq!(f[0].nodes, 16);
        assert!(f[29].nodes < 16, "{:?}", f[29]);
        // No pattern: persistence.
        let mut flat = ZoneModel::new(60.0);
        let h = steady(16, 3 * 24 * 60);
        let f = flat.forecast(&ForecastInput {
            history: &h,
            first: 0,
            known_next: None,
            notices: &[],
            horizon: 12,
        });
        assert!(f.iter().all(|s| s.nodes == 16 && s.added + s.removed == 0));
    }
}
