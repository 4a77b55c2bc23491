//! Seeded synthetic spot availability in the four bands of Parcae's replay windows.
//!
//! Model (per interval, spec 6.5 as calibration): at most one event, either a preemption or an
//! arrival, never both. Their base rates are the band's events per hour; they are tilted
//! towards the band's mean availability (more preemptions above it, more arrivals below it),
//! and event sizes are drawn from the size distributions of the whole p3 trace (spec 6.1),
//! scaled by `capacity / 32` with stochastic rounding (so small clusters see proportionally
//! fewer nodes move, not more), then truncated to stay in the band's `[min, max]` range.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::interval::{Interval, Trace};
use super::limits::{DEFAULT_INTERVAL_SECS, MAX_INTERVALS, MAX_NODES};

/// Capacity (requested nodes) of the trace the band statistics were measured on.
const REFERENCE_CAPACITY: f64 = 32.0;

/// Strength of the pull towards the band's mean availability: the rate of the event that moves
/// towards the mean is multiplied by up to `1 + TILT`.
const TILT: f64 = 3.0;

/// Preemption sizes of the p3 trace (spec 6.1): (size, how many minutes had it).
const PREEMPTION_SIZES: [(u32, u32); 6] = [(1, 39), (2, 13), (3, 15), (4, 7), (5, 1), (6, 4)];

/// Arrival sizes of the p3 trace after the initial allocation (spec 6.1).
const ARRIVAL_SIZES: [(u32, u32); 8] = [
    (1, 49),
    (2, 15),
    (3, 8),
    (4, 6),
    (5, 1),
    (6, 2),
    (7, 1),
    (8, 1),
];

/// An availability band: first letter availability, second preemption rate (h = high, l = low).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Band {
    /// High availability, high preemption rate (p3 trace 5.5-6.5 h).
    Hh,
    /// High availability, low preemption rate (p3 trace 1.5-2.5 h).
    Hl,
    /// Low availability, high preemption rate (p3 trace 8-9 h).
    Lh,
    /// Low availability, low preemption rate (p3 trace 10-11 h).
    Ll,
}

/// A band's window statistics for 32 requested nodes over one hour (spec 6.5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandStats {
    /// Nodes alive at the window start.
    pub start: u32,
    /// Mean nodes alive.
    pub mean: f64,
    /// Fewest nodes alive.
    pub min: u32,
    /// Most nodes alive.
    pub max: u32,
    /// Preemption events per hour.
    pub preemption_events: f64,
    /// Nodes preempted per hour.
    pub preempted_nodes: f64,
    /// Arrival events per hour.
    pub arrival_events: f64,
    /// Nodes arrived per hour.
    pub arrived_nodes: f64,
}

impl Band {
    /// All bands, in the order of their names.
    pub const ALL: [Band; 4] = [Band::Hh, Band::Hl, Band::Lh, Band::Ll];

    /// The band's short name (`hh`, `hl`, `lh`, `ll`).
    pub fn name(self) -> &'static str {
        match self {
            Band::Hh => "hh",
            Band::Hl => "hl",
            Band::Lh => "lh",
            Band::Ll => "ll",
        }
    }

    /// The statistics the generator is modelled on (spec 6.5, 32 nodes, one hour).
    pub fn stats(self) -> BandStats {
        let s = |start, mean, min, max, pe, pn, ae, an| BandStats {
            start,
            mean,
            min,
            max,
            preemption_events: pe,
            preempted_nodes: pn,
            arrival_events: ae,
            arrived_nodes: an,
        };
        match self {
            Band::Hh => s(32, 27.5, 20, 32, 9.0, 19.0, 7.0, 16.0),
            Band::Hl => s(27, 29.6, 23, 32, 6.0, 11.0, 5.0, 8.0),
            Band::Lh => s(18, 16.8, 11, 24, 8.0, 18.0, 12.0, 17.0),
            Band::Ll => s(18, 14.6, 14, 18, 3.0, 4.0, 0.0, 0.0),
        }
    }
}

impl fmt::Display for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Band {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Band::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown band {s:?} (expected hh, hl, lh or ll, or a multi-day zone: quiet, outage, diurnal or shifting)"
                )
            })
    }
}

/// Everything that determines a synthetic trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticSpec {
    /// The availability band.
    pub band: Band,
    /// Seed of the ChaCha generator: same spec, same trace.
    pub seed: u64,
    /// Requested (maximum) nodes; band levels and event sizes scale with `capacity / 32`.
    pub capacity: u32,
    /// Number of intervals.
    pub intervals: usize,
    /// Interval length in seconds (event rates are per hour, so they scale with it).
    pub interval_secs: u64,
}

impl SyntheticSpec {
    /// Default length: one hour of one-minute intervals, like Parcae's replay windows.
    pub const DEFAULT_INTERVALS: usize = 60;
    /// Default capacity: Parcae's 32 requested instances.
    pub const DEFAULT_CAPACITY: u32 = 32;

    /// Band `band` with `seed` and the defaults (32 nodes, 60 intervals of 60 s).
    pub fn new(band: Band, seed: u64) -> Self {
        Self {
            band,
            seed,
            capacity: Self::DEFAULT_CAPACITY,
            intervals: Self::DEFAULT_INTERVALS,
            interval_secs: DEFAULT_INTERVAL_SECS,
        }
    }

    /// Parses `synthetic:BAND[:SEED][:nodes=N][:intervals=K]` (seed defaults to 0).
    pub fn parse(spec: &str, interval_secs: u64) -> Result<Self, String> {
        let parts = SpecParts::parse(
            spec,
            "synthetic:BAND[:SEED][:nodes=N][:intervals=K]",
            str::parse::<Band>,
        )?;
        let mut out = Self {
            interval_secs,
            ..Self::new(parts.kind, parts.seed)
        };
        for (key, v) in parts.parameters {
            match key {
                "nodes" => out.capacity = parse_nodes(v)?,
                "intervals" => {
                    out.intervals = usize::try_from(parse_count(v, "intervals")?)
                        .ok()
                        .filter(|n| (1..=MAX_INTERVALS).contains(n))
                        .ok_or_else(|| format!("intervals must be 1 to {MAX_INTERVALS}"))?;
                }
                _ => return Err(format!("unknown parameter {key:?}")),
            }
        }
        Ok(out)
    }

    /// The canonical name of this spec (`synthetic:hh:7`, plus non-default parameters).
    pub fn name(&self) -> String {
        spec_name(
            self.band,
            self.seed,
            [
                (self.capacity != Self::DEFAULT_CAPACITY)
                    .then(|| format!("nodes={}", self.capacity)),
                (self.intervals != Self::DEFAULT_INTERVALS)
                    .then(|| format!("intervals={}", self.intervals)),
            ],
        )
    }

    /// Generates the trace. The first interval is the initial allocation (`added` = its
    /// nodes, as in Parcae's traces); every later one has at most one event.
    pub fn generate(&self) -> Trace {
        let stats = self.band.stats();
        let scale = f64::from(self.capacity) / REFERENCE_CAPACITY;
        let level = |n: u32| ((f64::from(n) * scale).round() as u32).clamp(1, self.capacity);
        let (lo, hi) = (level(stats.min), level(stats.max));
        let start = level(stats.start).clamp(lo, hi);
        let mean = stats.mean * scale;
        let per_interval = self.interval_secs as f64 / 3600.0;

        let mood = Mood {
            mean,
            lo,
            hi,
            preemptions_per_hour: stats.preemption_events,
            arrivals_per_hour: stats.arrival_events,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.band as u64);
        let mut intervals = Vec::with_capacity(self.intervals);
        let mut nodes = start;
        intervals.push(Interval {
            nodes,
            added: nodes,
            removed: 0,
        });
        while intervals.len() < self.intervals {
            let event = mood.step(&mut rng, nodes, per_interval, scale);
            nodes = event.nodes;
            intervals.push(event);
        }
        Trace {
            source: self.name(),
            interval_secs: self.interval_secs,
            intervals,
        }
    }
}

/// The pieces of a synthetic trace spec, `synthetic:KIND[:SEED][:KEY=VALUE]...`.
pub(super) struct SpecParts<'a, K> {
    /// The kind (a band or a zone family).
    pub kind: K,
    /// The seed, 0 when not given.
    pub seed: u64,
    /// `KEY=VALUE` parameters in the order given.
    pub parameters: Vec<(&'a str, &'a str)>,
}

impl<'a, K> SpecParts<'a, K> {
    /// Splits `spec`, reading its kind with `kind` first; `grammar` names the form in errors.
    pub fn parse(
        spec: &'a str,
        grammar: &str,
        kind: impl FnOnce(&str) -> Result<K, String>,
    ) -> Result<Self, String> {
        let rest = spec
            .strip_prefix("synthetic:")
            .ok_or_else(|| format!("expected {grammar}"))?;
        let mut pieces = rest.split(':');
        let kind = kind(pieces.next().unwrap_or_default())?;
        let mut out = Self {
            kind,
            seed: 0,
            parameters: Vec::new(),
        };
        for (i, piece) in pieces.enumerate() {
            match piece.split_once('=') {
                Some(kv) => out.parameters.push(kv),
                None if i == 0 => out.seed = parse_count(piece, "seed")?,
                None => return Err(format!("unexpected {piece:?}")),
            }
        }
        Ok(out)
    }
}

/// A non-negative integer parameter called `what`.
pub(super) fn parse_count(v: &str, what: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .map_err(|_| format!("{what} {v:?} is not a non-negative integer"))
}

/// The `nodes` parameter: 1 to [`MAX_NODES`].
pub(super) fn parse_nodes(v: &str) -> Result<u32, String> {
    u32::try_from(parse_count(v, "nodes")?)
        .ok()
        .filter(|n| (1..=MAX_NODES).contains(n))
        .ok_or_else(|| format!("nodes must be 1 to {MAX_NODES}"))
}

/// `synthetic:KIND:SEED` followed by `:PARAMETER` for each parameter given.
pub(super) fn spec_name(
    kind: impl fmt::Display,
    seed: u64,
    parameters: impl IntoIterator<Item = Option<String>>,
) -> String {
    let mut name = format!("synthetic:{kind}:{seed}");
    for p in parameters.into_iter().flatten() {
        name += ":";
        name += &p;
    }
    name
}

/// How a zone behaves for a while: the level it is pulled towards, its range, and its base
/// event rates. One step has at most one event: a preemption or an arrival, their rates tilted
/// towards `mean` (more preemptions above it, more arrivals below it), sizes drawn from the p3
/// trace's and scaled, truncated to `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Mood {
    /// Level the count is pulled towards.
    pub mean: f64,
    /// Fewest nodes.
    pub lo: u32,
    /// Most nodes.
    pub hi: u32,
    /// Preemption events per hour at the mean.
    pub preemptions_per_hour: f64,
    /// Arrival events per hour at the mean.
    pub arrivals_per_hour: f64,
}

impl Mood {
    /// One interval from `nodes` (intervals of `per_interval` hours, sizes times `scale`).
    pub fn step(
        &self,
        rng: &mut ChaCha8Rng,
        nodes: u32,
        per_interval: f64,
        scale: f64,
    ) -> Interval {
        let spread = f64::from(self.hi.saturating_sub(self.lo)).max(1.0);
        let pull = ((f64::from(nodes) - self.mean) / spread).clamp(-1.0, 1.0);
        let mut p_out = self.preemptions_per_hour * per_interval * (1.0 + TILT * pull).max(0.0);
        let mut p_in = self.arrivals_per_hour * per_interval * (1.0 - TILT * pull).max(0.0);
        if p_out + p_in > 1.0 {
            let total = p_out + p_in;
            p_out /= total;
            p_in /= total;
        }
        let u: f64 = rng.random();
        let mut event = Interval {
            nodes,
            added: 0,
            removed: 0,
        };
        if u < p_out {
            event.removed =
                scaled_size(rng, &PREEMPTION_SIZES, scale).min(nodes.saturating_sub(self.lo));
        } else if u < p_out + p_in {
            event.added =
                scaled_size(rng, &ARRIVAL_SIZES, scale).min(self.hi.saturating_sub(nodes));
        }
        event.nodes = nodes + event.added - event.removed;
        event
    }
}

/// An event size drawn from `sizes` (size, weight), times `scale`, stochastically rounded.
fn scaled_size(rng: &mut ChaCha8Rng, sizes: &[(u32, u32)], scale: f64) -> u32 {
    let total: u32 = sizes.iter().map(|&(_, w)| w).sum();
    let mut pick = rng.random_range(0..total);
    let mut size = 0;
    for &(s, w) in sizes {
        if pick < w {
            size = s;
            break;
        }
        pick -= w;
    }
    let real = f64::from(size) * scale;
    let whole = real.floor();
    let up = rng.random_bool((real - whole).clamp(0.0, 1.0));
    whole as u32 + u32::from(up)
}
