//! The schedule of the all-reduce by zone (issue 67): a stage's replicas reduce-scatter their
//! gradients in a ring inside each zone, the zones' partial sums of each part meet across the
//! zones in a ring over the zones, and each zone all-gathers the totals inside it. Each replica
//! sends across zones only a share of its own part, where a flat ring over zones sends the
//! whole buffer over every link that leaves a zone.
//!
//! Parts are cut in proportion (`part`), so the part a replica holds after its zone's
//! reduce-scatter overlaps a fixed set of the other zones' replicas' parts whatever the
//! buffer's length: who exchanges with whom is known when the links are opened. The pieces
//! that cross are the buffer cut at every zone's part boundaries (each piece held by one
//! replica of every zone), each split again into one sub-piece per zone for the ring over
//! zones.
//!
//! Summation order, the same on every replica: inside zone `z`, part `i` is summed along the
//! zone's ring (the replicas in rank order) ending at the replica that holds it; across zones,
//! sub-piece `k` of a piece is the zones' sums added along the ring of zones, starting at zone
//! `k + 1` and ending at zone `k`; the total is then copied, never re-added, so every replica
//! ends with the same bytes.

use std::collections::BTreeMap;
use std::ops::Range;

/// Part `i` of `len` values cut into `parts` in proportion: the boundaries fall at
/// `len * k / parts`, so parts differ in size by at most one value.
pub fn part(len: usize, parts: usize, i: usize) -> Range<usize> {
    let at = |k: usize| (len as u128 * k as u128 / parts.max(1) as u128) as usize;
    at(i)..at(i + 1)
}

/// The part a ring's reduce-scatter over `n` members leaves summed at member `local`.
pub fn reduced_part(n: usize, local: usize) -> usize {
    (local + 1) % n
}

/// Whether part `i` of `a` parts and part `j` of `b` parts of one buffer share values for some
/// length (then for every length of at least `a * b`): their fractions of the buffer overlap.
fn overlaps((i, a): (usize, usize), (j, b): (usize, usize)) -> bool {
    i * b < (j + 1) * a && j * a < (i + 1) * b
}

/// Which step of which half of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingStep {
    /// Step `t` of the reduce-scatter: what arrives is added.
    Reduce(usize),
    /// Step `t` of the all-gather: what arrives replaces.
    Gather(usize),
}

impl RingStep {
    /// Every step of a ring of `n` members, in order.
    pub fn all(n: usize) -> impl Iterator<Item = RingStep> {
        let steps = n.saturating_sub(1);
        (0..steps)
            .map(RingStep::Reduce)
            .chain((0..steps).map(RingStep::Gather))
    }

    /// The part member `at` of a ring of `n` sends at this step, and the part it receives.
    pub fn parts(self, n: usize, at: usize) -> (usize, usize) {
        match self {
            RingStep::Reduce(t) => ((at + n - t % n) % n, (at + 2 * n - t % n - 1) % n),
            RingStep::Gather(t) => ((at + 1 + n - t % n) % n, (at + n - t % n) % n),
        }
    }

    /// Whether what arrives is added (else it replaces).
    pub fn adds(self) -> bool {
        matches!(self, RingStep::Reduce(_))
    }
}

/// The replicas of one stage grouped by zone: replica `r` is the stage's replica in pipeline
/// `r`, and the zones are visited in the order of their keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneLayout {
    /// Each zone's replicas, in rank order.
    zones: Vec<Vec<usize>>,
    /// Each replica's zone and its place in it.
    places: Vec<(usize, usize)>,
}

/// One replica's place in a [`ZoneLayout`], and the replicas it exchanges with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneMember {
    /// Its zone, by the layout's order.
    pub zone: usize,
    /// Its place in its zone's ring.
    pub local: usize,
    /// Replicas in its zone.
    pub zone_size: usize,
    /// The previous and next replica of its zone's ring, when the zone holds two or more.
    pub zone_ring: Option<(usize, usize)>,
    /// The replicas of the next zone whose parts overlap its part: it sends to them, in rank
    /// order.
    pub cross_next: Vec<usize>,
    /// The replicas of the previous zone whose parts overlap its part: it receives from them,
    /// in rank order.
    pub cross_prev: Vec<usize>,
}

/// A piece of a replica's part held by one replica of every zone: the range, and its holders
/// in the next and the previous zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The values.
    pub range: Range<usize>,
    /// Its holder in the next zone.
    pub next: usize,
    /// Its holder in the previous zone.
    pub prev: usize,
}

impl ZoneLayout {
    /// The layout of replicas whose zones are `zone_of` (by rank).
    pub fn new<K: Ord>(zone_of: &[K]) -> Self {
        let mut by_key: BTreeMap<&K, Vec<usize>> = BTreeMap::new();
        for (rank, key) in zone_of.iter().enumerate() {
            by_key.entry(key).or_default().push(rank);
        }
        let zones: Vec<Vec<usize>> = by_key.into_values().collect();
        let mut places = vec![(0, 0); zone_of.len()];
        for (z, members) in zones.iter().enumerate() {
            for (local, &rank) in members.iter().enumerate() {
                places[rank] = (z, local);
            }
        }
        Self { zones, places }
    }

    /// How many replicas.
    pub fn replicas(&self) -> usize {
        self.places.len()
    }

    /// How many zones.
    pub fn zones(&self) -> usize {
        self.zones.len()
    }

    /// The zone of replica `rank`, by the layout's order.
    pub fn zone_of(&self, rank: usize) -> Option<usize> {
        self.places.get(rank).map(|p| p.0)
    }

    /// The part of `n_z` parts that the replica at `local` of zone `z` holds summed.
    fn held(&self, z: usize, local: usize) -> (usize, usize) {
        let n = self.zones[z].len();
        (reduced_part(n, local), n)
    }

    /// Replica `rank`'s place and the replicas it exchanges with.
    pub fn member(&self, rank: usize) -> Option<ZoneMember> {
        let &(z, local) = self.places.get(rank)?;
        let zones = self.zones();
        let members = &self.zones[z];
        let n = members.len();
        let mine = self.held(z, local);
        let overlapping = |other: usize| -> Vec<usize> {
            if zones == 1 {
                return Vec::new();
            }
            (0..self.zones[other].len())
                .filter(|&j| overlaps(mine, self.held(other, j)))
                .map(|j| self.zones[other][j])
                .collect()
        };
        Some(ZoneMember {
            zone: z,
            local,
            zone_size: n,
            zone_ring: (n > 1).then(|| (members[(local + n - 1) % n], members[(local + 1) % n])),
            cross_next: overlapping((z + 1) % zones),
            cross_prev: overlapping((z + zones - 1) % zones),
        })
    }

    /// The values of a buffer of `len` that `member` holds summed over its zone after the
    /// zone's reduce-scatter.
    pub fn held_range(&self, member: &ZoneMember, len: usize) -> Range<usize> {
        part(
            len,
            member.zone_size,
            reduced_part(member.zone_size, member.local),
        )
    }

    /// The holder, in zone `z`, of value `at` of a buffer of `len` after the reduce-scatter.
    fn holder(&self, z: usize, len: usize, at: usize) -> usize {
        let n = self.zones[z].len();
        // The last part starting at or before `at` (parts may be empty when len < n).
        let p = (((at as u128 + 1) * n as u128 - 1) / len as u128) as usize;
        self.zones[z][(p + n - 1) % n]
    }

    /// `member`'s part of a buffer of `len` cut at every zone's part boundaries, in order.
    pub fn pieces(&self, member: &ZoneMember, len: usize) -> Vec<Piece> {
        let zones = self.zones();
        let held = self.held_range(member, len);
        if zones < 2 || held.is_empty() {
            return Vec::new();
        }
        let mut cuts = vec![held.start, held.end];
        for members in &self.zones {
            let n = members.len();
            cuts.extend(
                (1..n)
                    .map(|k| part(len, n, k).start)
                    .filter(|c| held.contains(c)),
            );
        }
        cuts.sort_unstable();
        cuts.dedup();
        let (next, prev) = ((member.zone + 1) % zones, (member.zone + zones - 1) % zones);
        cuts.windows(2)
            .map(|w| Piece {
                range: w[0]..w[1],
                next: self.holder(next, len, w[0]),
                prev: self.holder(prev, len, w[0]),
            })
            .collect()
    }

    /// The ranges of `pieces` that `member` sends to replica `to` of the next zone at `step`
    /// of the ring over zones, in order.
    pub fn sends(
        &self,
        member: &ZoneMember,
        pieces: &[Piece],
        step: RingStep,
        to: usize,
    ) -> Vec<Range<usize>> {
        let (send, _) = step.parts(self.zones(), member.zone);
        self.sub_pieces(pieces, send, |p| p.next == to)
    }

    /// The ranges of `pieces` that `member` receives from replica `from` of the previous zone
    /// at `step` of the ring over zones, in order.
    pub fn receives(
        &self,
        member: &ZoneMember,
        pieces: &[Piece],
        step: RingStep,
        from: usize,
    ) -> Vec<Range<usize>> {
        let (_, recv) = step.parts(self.zones(), member.zone);
        self.sub_pieces(pieces, recv, |p| p.prev == from)
    }

    /// Sub-piece `k` of each of `pieces` that `keep` keeps.
    fn sub_pieces(
        &self,
        pieces: &[Piece],
        k: usize,
        keep: impl Fn(&Piece) -> bool,
    ) -> Vec<Range<usize>> {
        let zones = self.zones();
        pieces
            .iter()
            .filter(|p| keep(p))
            .map(|p| {
                let sub = part(p.range.len(), zones, k);
                p.range.start + sub.start..p.range.start + sub.end
            })
            .collect()
    }

    /// What every replica holds after the all-reduce by zone in f32 (the sums, not yet
    /// divided), replica `r` bringing `values[r]`: each zone's reduce-scatter, the pieces' ring
    /// over the zones, each zone's all-gather, every addition in the order the replicas make
    /// it, in one process.
    pub fn sums_in_process(&self, values: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let n = self.replicas();
        let mut held = values.to_vec();
        let len = held.first().map_or(0, Vec::len);
        for ring in &self.zones {
            ring_in_process(
                &mut held,
                ring,
                RingStep::all(ring.len()).filter(|s| s.adds()),
            );
        }
        let members: Vec<ZoneMember> = (0..n).filter_map(|r| self.member(r)).collect();
        let pieces: Vec<Vec<Piece>> = members.iter().map(|m| self.pieces(m, len)).collect();
        for step in RingStep::all(self.zones()) {
            let mut sent: Vec<(usize, Vec<Range<usize>>, Vec<f32>)> = Vec::new();
            for (from, member) in members.iter().enumerate() {
                for &to in &member.cross_next {
                    let xs = self
                        .sends(member, &pieces[from], step, to)
                        .into_iter()
                        .flat_map(|range| held[from][range].to_vec())
                        .collect();
                    let into = self.receives(&members[to], &pieces[to], step, from);
                    sent.push((to, into, xs));
                }
            }
            for (to, into, xs) in sent {
                let mut xs = xs.into_iter();
                for range in into {
                    let count = range.len();
                    fold(&mut held[to][range], xs.by_ref().take(count), step.adds());
                }
            }
        }
        for ring in &self.zones {
            ring_in_process(
                &mut held,
                ring,
                RingStep::all(ring.len()).filter(|s| !s.adds()),
            );
        }
        held
    }
}

/// `steps` of a ring over the replicas `ring` (in ring order) on the buffers `held`, every
/// member sending its part of the step at once, in one process.
pub(super) fn ring_in_process(
    held: &mut [Vec<f32>],
    ring: &[usize],
    steps: impl Iterator<Item = RingStep>,
) {
    let n = ring.len();
    let len = ring.first().map_or(0, |&r| held[r].len());
    for step in steps {
        let sent: Vec<(Range<usize>, Vec<f32>)> = (0..n)
            .map(|at| {
                let range = part(len, n, step.parts(n, at).0);
                (range.clone(), held[ring[at]][range].to_vec())
            })
            .collect();
        for (at, (range, xs)) in sent.into_iter().enumerate() {
            fold(
                &mut held[ring[(at + 1) % n]][range],
                xs.into_iter(),
                step.adds(),
            );
        }
    }
}

/// What arrives at a ring's step folded into `into`: added, or in place of what was there.
pub(super) fn fold(into: &mut [f32], xs: impl Iterator<Item = f32>, adds: bool) {
    for (v, x) in into.iter_mut().zip(xs) {
        if adds {
            *v += x;
        } else {
            *v = x;
        }
    }
}

#[cfg(test)]
mod tests;
