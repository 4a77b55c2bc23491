//! Regional outages: zones that go dark together. Zones in one cloud region share power,
//! network and the region's spot pool, so an outage there takes every zone of the region at
//! once, where the zone families of [`super::zones`] are each seeded apart and independent.
//! `synthetic:FAMILY:SEED:region=R` lays the outages of region `R` over the zone's own
//! trace: every zone naming the same `R` (and interval length) is capped by the same schedule,
//! whatever its family, seed or size, so `region=` turns independent zones into correlated ones.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::interval::{Interval, Trace};

/// Mean hours between regional outages (a region fails more rarely than one of its zones).
const EVERY_H: f64 = 96.0;
/// Hours a region stays dark: uniform in this range.
const DARK_H: (f64, f64) = (1.0, 4.0);
/// Minutes the region takes to go dark, and hours to come back.
const FALL_MIN: f64 = 5.0;
const RECOVER_H: f64 = 1.0;

/// The share of each zone's capacity that region `seed` lets run in each of `len` intervals
/// of `interval_secs`: 1 outside its outages, falling to 0 within minutes, 0 for hours, rising
/// back over an hour. It depends on nothing but its arguments, so zones of a region agree.
pub fn schedule(seed: u64, interval_secs: u64, len: usize) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(48);
    let per_interval_h = interval_secs as f64 / 3600.0;
    let intervals_of = |hours: f64| (hours / per_interval_h).round().max(1.0) as usize;
    let (fall, recover) = (intervals_of(FALL_MIN / 60.0), intervals_of(RECOVER_H));
    let onset = (per_interval_h / EVERY_H).min(1.0);
    let ramp = |i: usize, n: usize| i as f64 / n as f64;
    let mut share = vec![1.0; len];
    let mut k = 1;
    while k < len {
        if !rng.random_bool(onset) {
            k += 1;
            continue;
        }
        let dark = intervals_of(rng.random_range(DARK_H.0..DARK_H.1));
        let shape = (0..fall)
            .map(|i| 1.0 - ramp(i + 1, fall))
            .chain(std::iter::repeat_n(0.0, dark))
            .chain((0..recover).map(|i| ramp(i + 1, recover)));
        for s in shape {
            if k >= len {
                break;
            }
            share[k] = s;
            k += 1;
        }
    }
    share
}

/// `trace` (a zone of `capacity` nodes) under region `seed`'s outages: each interval holds at
/// most its share of the capacity; an interval the cap leaves alone, and whose predecessor it
/// left alone, keeps its own arrivals and preemptions.
pub fn darken(trace: &Trace, capacity: u32, seed: u64) -> Trace {
    let share = schedule(seed, trace.interval_secs, trace.len());
    let mut intervals = Vec::with_capacity(trace.len());
    let (mut before, mut capped_before) = (0, false);
    for (iv, s) in trace.intervals.iter().zip(share) {
        let cap = (s * f64::from(capacity)).floor() as u32;
        let nodes = iv.nodes.min(cap);
        let capped = nodes < iv.nodes;
        intervals.push(if capped || capped_before {
            Interval {
                nodes,
                added: nodes.saturating_sub(before),
                removed: before.saturating_sub(nodes),
            }
        } else {
            *iv
        });
        (before, capped_before) = (nodes, capped);
    }
    Trace {
        source: trace.source.clone(),
        interval_secs: trace.interval_secs,
        intervals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_goes_dark_for_hours_and_comes_back() {
        let share = schedule(7, 60, 14 * 1440);
        assert_eq!(share, schedule(7, 60, 14 * 1440));
        assert_ne!(share, schedule(8, 60, 14 * 1440));
        // A longer run begins as the shorter one.
        assert_eq!(share[..1440], schedule(7, 60, 1440)[..]);
        let dark = share.iter().filter(|&&s| s == 0.0).count();
        let outages = share
            .windows(2)
            .filter(|w| w[0] > 0.0 && w[1] == 0.0)
            .count();
        // About every 4 days, 1-4 h each: 2 to 6 in two weeks.
        assert!((2..=6).contains(&outages), "{outages} outages");
        assert!(
            dark >= outages * 60 && dark <= outages * 240,
            "{dark} dark minutes"
        );
        assert!(share.iter().all(|s| (0.0..=1.0).contains(s)));
        assert_eq!(share[0], 1.0);
    }

    #[test]
    fn darkened_zones_stay_consistent_and_dark_together() {
        let zone = |text: &str| super::super::zones::ZoneSpec::parse(text, 60).unwrap();
        let a = zone("synthetic:quiet:1:region=3").generate();
        let b = zone("synthetic:diurnal:2:nodes=24:region=3").generate();
        let alone = zone("synthetic:quiet:1").generate();
        for t in [&a, &b] {
            let mut prev = 0;
            for iv in &t.intervals {
                assert_eq!(prev + iv.added - iv.removed, iv.nodes);
                prev = iv.nodes;
            }
        }
        let dark = |t: &Trace, k: usize| t.intervals[k].nodes == 0;
        let share = schedule(3, 60, a.len());
        let mut region_dark = 0;
        for (k, s) in share.iter().enumerate() {
            if *s == 0.0 {
                region_dark += 1;
                assert!(dark(&a, k) && dark(&b, k), "interval {k}");
            }
            // Outside the region's outages a zone is its own trace.
            if *s == 1.0 && (k == 0 || share[k - 1] == 1.0) {
                assert_eq!(a.intervals[k], alone.intervals[k], "interval {k}");
            }
        }
        assert!(region_dark > 0);
        assert!(
            a.intervals
                .iter()
                .zip(&alone.intervals)
                .any(|(x, y)| x.nodes < y.nodes)
        );
    }
}
