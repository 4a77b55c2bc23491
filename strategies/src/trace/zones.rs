//! Seeded multi-day spot zones: the shapes that decide whether a planner is worth running for a
//! week.
//!
//! Real availability traces of p3.2xlarge-class machines over one to two weeks show long hours
//! at full availability, occasional dips that recover within the hour, whole-zone outages to
//! zero for hours, and zones that follow the clock. The one-hour bands of
//! [`super::SyntheticSpec`] have none of that, so a planner tuned on them can lose to a naive
//! restart-on-change system in a quiet zone. Each [`Family`] here is one such shape, built from
//! the bands' step model ([`Mood`]: at most one event per interval, event sizes of the p3 trace,
//! rates tilted towards a level) with the level and the rates changing over days:
//!
//! | family | what it is |
//! |---|---|
//! | `quiet` | full availability for hours, a dip of a few nodes every ~7 h that recovers in ~30 min |
//! | `outage` | `quiet`, plus whole-zone outages (~every 3 days): every node gone within minutes, 1-6 h at zero, a recovery over the next hour |
//! | `diurnal` | busy hours (9 h a day from a seeded start hour) pull the zone down to ~60 % with churn; nights are quiet and full |
//! | `shifting` | quiet spells of 12-48 h alternating with churning ones of 3-12 h (the hh band's rates) |
//!
//! `synthetic:FAMILY[:SEED][:nodes=N][:days=D][:region=R]` names one: 16 nodes and 14 days of
//! the given interval length by default. Zones are independent unless they name one region
//! (`region=R`): then [`super::region`]'s outages take them all down together.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::interval::{Interval, Trace};
use super::limits::MAX_INTERVALS;
use super::region::darken;
use super::synthetic::{Mood, SpecParts, parse_nodes, spec_name};

/// A multi-day zone shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Long stable hours at full availability, rare short dips.
    Quiet,
    /// Quiet, with whole-zone outages to zero for hours.
    Outage,
    /// A busy part of every day with churn and low availability; quiet nights.
    Diurnal,
    /// Quiet spells and churning spells alternating.
    Shifting,
}

impl Family {
    /// Every family, in the order of their names.
    pub const ALL: [Family; 4] = [
        Family::Quiet,
        Family::Outage,
        Family::Diurnal,
        Family::Shifting,
    ];

    /// The family called `name` in trace specs.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family's name in trace specs.
    pub fn name(self) -> &'static str {
        match self {
            Family::Quiet => "quiet",
            Family::Outage => "outage",
            Family::Diurnal => "diurnal",
            Family::Shifting => "shifting",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A mood as fractions of the capacity: (mean, lowest, preemptions/h, arrivals/h).
type MoodShape = (f64, f64, f64, f64);

/// Full, with a dip every ~7 h that the pull back to capacity closes in about half an hour.
const QUIET: MoodShape = (1.0, 0.75, 0.15, 1.5);
/// The hh band (spec 6.5): 27.5 of 32 on average, down to 20, 9 preemptions and 7 arrivals an hour.
const CHURN: MoodShape = (27.5 / 32.0, 20.0 / 32.0, 9.0, 7.0);
/// Busy hours: pulled to 60 % with lh-like churn.
const BUSY: MoodShape = (0.6, 0.35, 4.0, 3.0);
/// Mean hours between whole-zone outages.
const OUTAGE_EVERY_H: f64 = 72.0;
/// Hours a zone stays at zero: uniform in this range.
const DARK_H: (f64, f64) = (1.0, 6.0);
/// Length of the busy part of a `diurnal` day, hours.
const BUSY_HOURS: u32 = 9;
/// Quiet and churning spells of `shifting`, hours: uniform in these ranges.
const QUIET_SPELL_H: (f64, f64) = (12.0, 48.0);
const CHURN_SPELL_H: (f64, f64) = (3.0, 12.0);

/// Everything that determines a multi-day zone trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZoneSpec {
    /// The shape.
    pub family: Family,
    /// Seed of the ChaCha generator: same spec, same trace.
    pub seed: u64,
    /// Nodes of the zone at full availability.
    pub capacity: u32,
    /// Length in days.
    pub days: f64,
    /// Interval length in seconds.
    pub interval_secs: u64,
    /// The region whose outages the zone shares with every zone naming it.
    pub region: Option<u64>,
}

impl ZoneSpec {
    /// Default capacity: 16 machines, as in the held-out week-long traces.
    pub const DEFAULT_CAPACITY: u32 = 16;
    /// Default length, days.
    pub const DEFAULT_DAYS: f64 = 14.0;

    /// `family` with `seed` and the defaults.
    pub fn new(family: Family, seed: u64, interval_secs: u64) -> Self {
        Self {
            family,
            seed,
            capacity: Self::DEFAULT_CAPACITY,
            days: Self::DEFAULT_DAYS,
            interval_secs,
            region: None,
        }
    }

    /// Parses `synthetic:FAMILY[:SEED][:nodes=N][:days=D][:region=R]` (seed defaults to 0).
    pub fn parse(spec: &str, interval_secs: u64) -> Result<Self, String> {
        let form = "synthetic:FAMILY[:SEED][:nodes=N][:days=D][:region=R]";
        let parts = SpecParts::parse(spec, form, |name| {
            Family::from_name(name).ok_or_else(|| format!("unknown zone family {name:?}"))
        })?;
        let mut out = Self::new(parts.kind, parts.seed, interval_secs);
        for (key, v) in parts.parameters {
            match key {
                "nodes" => out.capacity = parse_nodes(v)?,
                "days" => {
                    let days = v
                        .parse::<f64>()
                        .ok()
                        .filter(|d| d.is_finite() && *d > 0.0)
                        .ok_or_else(|| format!("days {v:?} is not a positive number"))?;
                    out.days = days;
                    if out.intervals_unchecked() > MAX_INTERVALS as f64 {
                        return Err(format!("{days} days exceed {MAX_INTERVALS} intervals"));
                    }
                }
                "region" => {
                    let region = v
                        .parse::<u64>()
                        .map_err(|_| format!("region {v:?} is not a whole number"))?;
                    out.region = Some(region);
                }
                _ => return Err(format!("unknown parameter {key:?}")),
            }
        }
        Ok(out)
    }

    fn intervals_unchecked(&self) -> f64 {
        (self.days * 86_400.0 / self.interval_secs as f64).ceil()
    }

    /// Number of intervals.
    pub fn intervals(&self) -> usize {
        (self.intervals_unchecked() as usize).clamp(1, MAX_INTERVALS)
    }

    /// The canonical name (`synthetic:quiet:3`, plus non-default parameters).
    pub fn name(&self) -> String {
        spec_name(
            self.family,
            self.seed,
            [
                (self.capacity != Self::DEFAULT_CAPACITY)
                    .then(|| format!("nodes={}", self.capacity)),
                (self.days != Self::DEFAULT_DAYS).then(|| format!("days={}", self.days)),
                self.region.map(|r| format!("region={r}")),
            ],
        )
    }

    /// Generates the trace: the first interval is the initial allocation of the full zone.
    pub fn generate(&self) -> Trace {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(16 + self.family as u64);
        let mut zone = Zone::new(self, &mut rng);
        let mut intervals = Vec::with_capacity(self.intervals());
        let mut nodes = self.capacity;
        intervals.push(Interval {
            nodes,
            added: nodes,
            removed: 0,
        });
        for k in 1..self.intervals() {
            let event = zone.step(&mut rng, k, nodes);
            nodes = event.nodes;
            intervals.push(event);
        }
        let own = Trace {
            source: self.name(),
            interval_secs: self.interval_secs,
            intervals,
        };
        match self.region {
            Some(region) => darken(&own, self.capacity, region),
            None => own,
        }
    }
}

/// Where an outage stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outage {
    /// No outage.
    None,
    /// Nodes are being taken, a large share per interval.
    Falling,
    /// At zero until this interval.
    Dark(usize),
    /// Coming back.
    Recovering,
}

/// The generator's state between intervals.
struct Zone {
    family: Family,
    capacity: u32,
    per_interval_h: f64,
    scale: f64,
    busy_from_hour: u32,
    outage: Outage,
    churning: bool,
    spell_ends: usize,
}

impl Zone {
    fn new(spec: &ZoneSpec, rng: &mut ChaCha8Rng) -> Self {
        let per_interval_h = spec.interval_secs as f64 / 3600.0;
        let mut zone = Self {
            family: spec.family,
            capacity: spec.capacity,
            per_interval_h,
            scale: f64::from(spec.capacity) / 32.0,
            busy_from_hour: rng.random_range(6..12),
            outage: Outage::None,
            churning: false,
            spell_ends: 0,
        };
        zone.spell_ends = zone.spell_length(rng, QUIET_SPELL_H);
        zone
    }

    fn intervals_of(&self, hours: f64) -> usize {
        (hours / self.per_interval_h).round().max(1.0) as usize
    }

    fn spell_length(&self, rng: &mut ChaCha8Rng, (lo, hi): (f64, f64)) -> usize {
        self.intervals_of(rng.random_range(lo..hi))
    }

    fn mood(&self, (mean, lowest, pe, ae): MoodShape) -> Mood {
        let cap = f64::from(self.capacity);
        let lo = ((lowest * cap).round() as u32).min(self.capacity);
        Mood {
            mean: mean * cap,
            lo,
            hi: self.capacity,
            preemptions_per_hour: pe,
            arrivals_per_hour: ae,
        }
    }

    /// The event of interval `k`, the zone holding `nodes` before it.
    fn step(&mut self, rng: &mut ChaCha8Rng, k: usize, nodes: u32) -> Interval {
        match self.family {
            Family::Quiet => self
                .mood(QUIET)
                .step(rng, nodes, self.per_interval_h, self.scale),
            Family::Outage => self.outage_step(rng, k, nodes),
            Family::Diurnal => {
                let hour = ((k as f64 * self.per_interval_h) as u64 % 24) as u32;
                let busy = (hour + 24 - self.busy_from_hour) % 24 < BUSY_HOURS;
                let shape = if busy { BUSY } else { QUIET };
                self.mood(shape)
                    .step(rng, nodes, self.per_interval_h, self.scale)
            }
            Family::Shifting => {
                if k >= self.spell_ends {
                    self.churning = !self.churning;
                    let range = if self.churning {
                        CHURN_SPELL_H
                    } else {
                        QUIET_SPELL_H
                    };
                    self.spell_ends = k + self.spell_length(rng, range);
                }
                let shape = if self.churning { CHURN } else { QUIET };
                self.mood(shape)
                    .step(rng, nodes, self.per_interval_h, self.scale)
            }
        }
    }

    fn outage_step(&mut self, rng: &mut ChaCha8Rng, k: usize, nodes: u32) -> Interval {
        let change = |added: u32, removed: u32| Interval {
            nodes: nodes + added - removed,
            added,
            removed,
        };
        match self.outage {
            Outage::None => {
                let p = (self.per_interval_h / OUTAGE_EVERY_H).min(1.0);
                if nodes > 0 && rng.random_bool(p) {
                    self.outage = Outage::Falling;
                    return self.outage_step(rng, k, nodes);
                }
                self.mood(QUIET)
                    .step(rng, nodes, self.per_interval_h, self.scale)
            }
            Outage::Falling => {
                let share = rng.random_range(0.3..0.7);
                let removed = ((f64::from(self.capacity) * share).ceil() as u32).min(nodes);
                if removed == nodes {
                    let (lo, hi) = DARK_H;
                    self.outage = Outage::Dark(k + 1 + self.intervals_of(rng.random_range(lo..hi)));
                }
                change(0, removed)
            }
            Outage::Dark(until) => {
                if k >= until {
                    self.outage = Outage::Recovering;
                    return self.outage_step(rng, k, nodes);
                }
                change(0, 0)
            }
            Outage::Recovering => {
                // About an hour back to full, a few nodes at a time.
                let steps = self.intervals_of(1.0) as f64;
                let p = (4.0 / steps).min(1.0);
                if !rng.random_bool(p) {
                    return change(0, 0);
                }
                let quarter = (self.capacity / 4).max(1);
                let added = rng.random_range(1..=quarter).min(self.capacity - nodes);
                if nodes + added >= self.capacity {
                    self.outage = Outage::None;
                }
                change(added, 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(family: Family, seed: u64) -> ZoneSpec {
        ZoneSpec::new(family, seed, 60)
    }

    #[test]
    fn names_round_trip_and_bad_specs_are_refused() {
        let s = ZoneSpec::parse("synthetic:outage:5:nodes=8:days=3", 60).unwrap();
        assert_eq!(
            (s.family, s.seed, s.capacity, s.days),
            (Family::Outage, 5, 8, 3.0)
        );
        assert_eq!(s.name(), "synthetic:outage:5:nodes=8:days=3");
        assert_eq!(s.intervals(), 3 * 1440);
        let r = ZoneSpec::parse("synthetic:quiet:2:region=9", 60).unwrap();
        assert_eq!(
            (r.region, r.name().as_str()),
            (Some(9), "synthetic:quiet:2:region=9")
        );
        assert_eq!(
            ZoneSpec::parse("synthetic:quiet", 60).unwrap().name(),
            "synthetic:quiet:0"
        );
        for bad in [
            "synthetic:calm",
            "synthetic:quiet:x",
            "synthetic:quiet:1:days=0",
            "synthetic:quiet:1:days=1e9",
            "synthetic:quiet:1:nodes=0",
            "synthetic:quiet:1:speed=2",
            "synthetic:quiet:1:region=-1",
            "synthetic:quiet:1:region=east",
        ] {
            assert!(ZoneSpec::parse(bad, 60).is_err(), "{bad}");
        }
    }

    #[test]
    fn traces_are_consistent_and_deterministic() {
        for family in Family::ALL {
            for seed in 0..3 {
                let t = spec(family, seed).generate();
                assert_eq!(t.len(), 14 * 1440);
                assert_eq!(t, spec(family, seed).generate());
                let mut prev = 0;
                for iv in &t.intervals {
                    assert_eq!(prev + iv.added - iv.removed, iv.nodes, "{family} {seed}");
                    assert!(iv.nodes <= 16);
                    prev = iv.nodes;
                }
            }
        }
    }

    fn share_at_full(t: &Trace) -> f64 {
        t.intervals.iter().filter(|i| i.nodes == 16).count() as f64 / t.len() as f64
    }

    #[test]
    fn the_families_have_their_shapes() {
        for seed in 0..5 {
            let quiet = spec(Family::Quiet, seed).generate();
            let changes = quiet
                .intervals
                .iter()
                .filter(|i| i.added + i.removed > 0)
                .count();
            assert!(share_at_full(&quiet) > 0.85, "quiet {seed}");
            assert!(
                (20..300).contains(&changes),
                "quiet {seed}: {changes} changes"
            );

            let outage = spec(Family::Outage, seed).generate();
            let dark = outage.intervals.iter().filter(|i| i.nodes == 0).count();
            assert!(dark >= 60, "outage {seed}: {dark} intervals at zero");
            assert!(share_at_full(&outage) > 0.7, "outage {seed}");

            // Diurnal: the busy hours average far below the quiet ones.
            let diurnal = spec(Family::Diurnal, seed).generate();
            let mut by_hour = [0.0f64; 24];
            for (k, iv) in diurnal.intervals.iter().enumerate() {
                by_hour[(k / 60) % 24] += f64::from(iv.nodes) / 14.0 / 60.0;
            }
            let (lo, hi) = by_hour
                .iter()
                .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(hi - lo > 3.0, "diurnal {seed}: {by_hour:?}");

            let shifting = spec(Family::Shifting, seed).generate();
            let changes = shifting
                .intervals
                .iter()
                .filter(|i| i.added + i.removed > 0)
                .count();
            assert!(changes > 2 * 300, "shifting {seed}: {changes}");
        }
    }
}
