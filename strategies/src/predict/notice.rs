//! Folding preemption notices into any forecast.
//!
//! A notice (e.g. a cloud's preemption warning with a deadline) makes a removal certain, so the
//! forecast at its step removes at least the noticed nodes. The base forecast's removal at that
//! step may already stand for the same preemption, so the two are not added: the step removes
//! `max(base, noticed)`, keeps the base arrivals, and every later count moves by the difference.

use super::predictor::{ForecastInput, NoticeAhead, Predictor};
use crate::trace::Interval;

/// Wraps a predictor and makes its forecasts respect the notices of the input.
#[derive(Clone, Debug)]
pub struct NoticeAware<P> {
    inner: P,
}

impl<P> NoticeAware<P> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        Self { inner }
    }

    /// The wrapped predictor.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: Predictor> Predictor for NoticeAware<P> {
    fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
        let base = self.inner.forecast(input);
        let start = input.history.last().map_or(0, |i| i.nodes);
        fold_notices(&base, start, input.notices)
    }
}

/// `predictor`'s forecast after `history` (its first interval the `first`-th recorded), with
/// the upcoming `event` known (its preemptions as notices) and put in the first step: what a
/// planner that sees notices and joins knows when it decides (the simulator's observed
/// forecasts and the node's planner share it).
pub fn observed(
    predictor: &mut dyn Predictor,
    history: &[Interval],
    first: usize,
    event: Interval,
    horizon: usize,
) -> Vec<Interval> {
    let notices = [NoticeAhead {
        offset: 0,
        nodes: event.removed,
    }];
    let input = ForecastInput {
        history,
        first,
        known_next: Some(event.nodes),
        notices: if event.removed > 0 { &notices } else { &[] },
        horizon,
    };
    rebase(event, &predictor.forecast(&input))
}

/// Replaces a forecast's first step by the observed event and carry the later steps' changes
/// over from the observed count.
fn rebase(event: Interval, forecast: &[Interval]) -> Vec<Interval> {
    let mut out = Vec::with_capacity(forecast.len());
    out.push(event);
    let mut nodes = event.nodes;
    for step in forecast.iter().skip(1) {
        let after = (nodes + step.added).saturating_sub(step.removed);
        out.push(Interval {
            nodes: after,
            added: after.saturating_sub(nodes),
            removed: nodes.saturating_sub(after),
        });
        nodes = after;
    }
    out
}

/// `base` (consistent from `start`) with every step removing at least the nodes noticed for
/// it; notices beyond the forecast are ignored, several for one step add up.
pub fn fold_notices(base: &[Interval], start: u32, notices: &[NoticeAhead]) -> Vec<Interval> {
    let mut noticed = vec![0u32; base.len()];
    for n in notices {
        if let Some(slot) = noticed.get_mut(n.offset) {
            *slot = slot.saturating_add(n.nodes);
        }
    }
    let mut prev = start;
    base.iter()
        .zip(noticed)
        .map(|(b, n)| {
            let available = prev.saturating_add(b.added);
            let removed = b.removed.max(n).min(available);
            prev = available - removed;
            Interval {
                nodes: prev,
                added: b.added,
                removed,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(nodes: u32, added: u32, removed: u32) -> Interval {
        Interval {
            nodes,
            added,
            removed,
        }
    }

    #[test]
    fn notices_raise_removals_without_double_counting() {
        let base = [iv(20, 0, 0), iv(18, 0, 2), iv(21, 3, 0), iv(21, 0, 0)];
        let notices = [
            NoticeAhead {
                offset: 1,
                nodes: 1,
            },
            NoticeAhead {
                offset: 2,
                nodes: 2,
            },
            NoticeAhead {
                offset: 3,
                nodes: 1,
            },
            NoticeAhead {
                offset: 3,
                nodes: 1,
            },
            NoticeAhead {
                offset: 9,
                nodes: 5,
            },
        ];
        let got = fold_notices(&base, 20, &notices);
        assert_eq!(
            got,
            vec![iv(20, 0, 0), iv(18, 0, 2), iv(19, 3, 2), iv(17, 0, 2)]
        );
    }

    #[test]
    fn never_removes_more_than_alive() {
        let got = fold_notices(
            &[iv(3, 0, 0), iv(3, 0, 0)],
            3,
            &[NoticeAhead {
                offset: 0,
                nodes: 5,
            }],
        );
        assert_eq!(got, vec![iv(0, 0, 3), iv(0, 0, 0)]);
    }
}
