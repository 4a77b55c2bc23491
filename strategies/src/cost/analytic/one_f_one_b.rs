//! The 1F1B schedule of one pipeline: when each stage ends its part of an iteration, by
//! rounds, settled cycles jumped.

use super::stage_cost::StageCost;

/// Per-stage finish time of a 1F1B schedule of `m` micro-batches; `comm` is the transfer time
/// of one boundary activation or gradient between neighbouring stages.
///
/// Stage `s` of `p` runs `w = min(p - s, m)` forwards, then in round `j` backward `j` and, while
/// it has forwards left, forward `w + j`. Each op starts once its stage is free and its input
/// has arrived, so round `j` follows from round `j - 1` alone: the backwards from the last stage
/// to the first (each waits for the next stage's backward of its micro-batch), then the
/// forwards (each waits for the previous stage's forward of round `j - 1`). While every stage
/// still runs a forward, a round is one max-plus map of the stages' forward ends. Such a map
/// settles into a cycle: after a transient, the ends every `c` rounds are the ends `c` rounds
/// before shifted by one constant (uneven stages send a wave down the pipeline, `c` about `p`),
/// and since the map commutes with a shift, every later cycle repeats it. So once a cycle
/// shows, the schedule jumps whole cycles to the last full rounds and simulates only those and
/// the drain: `O(p (transient + c + p))` ops instead of `O(p m)`, a planner simulating
/// thousands of schedules a decision.
pub(super) fn one_f_one_b(stages: &[StageCost], m: usize, comm: f64) -> Vec<f64> {
    let p = stages.len();
    // When each stage's last op ended; that op is its latest forward after every full round.
    let mut free = vec![0.0f64; p];
    if m == 0 {
        return free;
    }
    let mut fwd = warm_up(stages, m, comm);
    free.copy_from_slice(&fwd);
    let full = m.saturating_sub(p);
    let mut past = Cycles::new(p, if full > 0 { 2 * p } else { 0 });
    let mut j = 0;
    while j < m {
        let mut next_backward = 0.0;
        for s in (0..p).rev() {
            let ready = if s + 1 == p {
                fwd[s]
            } else {
                next_backward + comm
            };
            free[s] = free[s].max(ready) + stages[s].backward_ms;
            next_backward = free[s];
        }
        for s in (0..p).rev() {
            if (p - s).min(m) + j >= m {
                continue;
            }
            let ready = if s == 0 { 0.0 } else { fwd[s - 1] + comm };
            free[s] = free[s].max(ready) + stages[s].forward_ms;
            fwd[s] = free[s];
        }
        if j < full
            && let Some((period, shift)) = past.settled(j, &fwd)
        {
            let cycles = (full - 1 - j) / period;
            for (f, e) in fwd.iter_mut().zip(free.iter_mut()) {
                *f += cycles as f64 * shift;
                *e = *f;
            }
            j += cycles * period;
            past = Cycles::new(p, 0);
        }
        j += 1;
    }
    free
}

/// The stages' forward ends after the last full rounds of a 1F1B schedule, to find its cycle.
struct Cycles {
    p: usize,
    /// Longest cycle looked for (0: none).
    longest: usize,
    /// Round `r`'s ends at `(r % (longest + 1)) * p`.
    ends: Vec<f64>,
}

impl Cycles {
    fn new(p: usize, longest: usize) -> Self {
        Self {
            p,
            longest,
            ends: vec![0.0; if longest > 0 { (longest + 1) * p } else { 0 }],
        }
    }

    /// Keeps round `r`'s ends `now`; the shortest cycle `c` and its shift where they are round
    /// `r - c`'s shifted by one constant (to a billionth of their magnitude: a max-plus map
    /// never widens a gap, so each jumped cycle is off by no more than that).
    fn settled(&mut self, r: usize, now: &[f64]) -> Option<(usize, f64)> {
        if self.longest == 0 {
            return None;
        }
        let (p, slots) = (self.p, self.longest + 1);
        self.ends[(r % slots) * p..][..p].copy_from_slice(now);
        (1..=r.min(self.longest)).find_map(|c| {
            let then = &self.ends[((r - c) % slots) * p..][..p];
            let shift = now[0] - then[0];
            now.iter()
                .zip(then)
                .all(|(a, b)| ((a - b) - shift).abs() <= 1e-9 * a.abs().max(1.0))
                .then_some((c, shift))
        })
    }
}

/// The ends of each stage's warm-up forwards (`min(p - s, m)` of them), the last of each.
fn warm_up(stages: &[StageCost], m: usize, comm: f64) -> Vec<f64> {
    let p = stages.len();
    let (mut previous, mut current) = (Vec::with_capacity(p), Vec::with_capacity(p));
    let mut last = Vec::with_capacity(p);
    for (s, stage) in stages.iter().enumerate() {
        current.clear();
        let mut end = 0.0f64;
        for i in 0..(p - s).min(m) {
            // The first stage's inputs are there from the start (it has no stage before it).
            let ready = previous.get(i).map_or(0.0, |f: &f64| f + comm);
            end = end.max(ready) + stage.forward_ms;
            current.push(end);
        }
        last.push(end);
        std::mem::swap(&mut previous, &mut current);
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stage_is_sum_of_micro_batches() {
        let st = [StageCost {
            forward_ms: 1.0,
            backward_ms: 2.0,
            ..Default::default()
        }];
        assert_eq!(one_f_one_b(&st, 4, 0.0), vec![12.0]);
    }

    #[test]
    fn pipeline_bubble_matches_closed_form() {
        let st = vec![
            StageCost {
                forward_ms: 1.0,
                backward_ms: 2.0,
                ..Default::default()
            };
            4
        ];
        let ends = one_f_one_b(&st, 8, 0.0);
        // (m + p - 1) * (f + b) for uniform stages without communication.
        assert!((ends[0] - 11.0 * 3.0).abs() < 1e-9, "{ends:?}");
    }

    /// 1F1B simulated op by op in time order, as the planner once did: the oracle for the
    /// schedule by rounds.
    fn simulated_op_by_op(stages: &[StageCost], m: usize, comm: f64) -> Vec<f64> {
        let p = stages.len();
        let (mut fwd, mut bwd) = (vec![f64::NAN; p * m], vec![f64::NAN; p * m]);
        let (mut free, mut next) = (vec![0.0f64; p], vec![0usize; p]);
        let op = |s: usize, k: usize| {
            let warm = (p - s).min(m);
            let t = k.checked_sub(warm);
            match t {
                None => (true, k),
                Some(t) if t < 2 * (m - warm) && t % 2 == 1 => (true, warm + t / 2),
                Some(t) if t < 2 * (m - warm) => (false, t / 2),
                Some(t) => (false, t - (m - warm)),
            }
        };
        let mut progressed = true;
        while progressed {
            progressed = false;
            for s in 0..p {
                while next[s] < 2 * m {
                    let (forward, i) = op(s, next[s]);
                    let ready = match (forward, s) {
                        (true, 0) => 0.0,
                        (true, _) => fwd[(s - 1) * m + i] + comm,
                        (false, _) if s + 1 == p => fwd[s * m + i],
                        (false, _) => bwd[(s + 1) * m + i] + comm,
                    };
                    if ready.is_nan() {
                        break;
                    }
                    let c = &stages[s];
                    free[s] =
                        free[s].max(ready) + if forward { c.forward_ms } else { c.backward_ms };
                    if forward {
                        fwd[s * m + i] = free[s];
                    } else {
                        bwd[s * m + i] = free[s];
                    }
                    next[s] += 1;
                    progressed = true;
                }
            }
        }
        free
    }

    #[test]
    fn a_schedule_that_settles_jumps_to_the_drain_and_ends_where_every_op_run_ends() {
        let st: Vec<StageCost> = [(1.0, 2.0), (3.0, 1.0), (0.5, 4.0)]
            .map(|(forward_ms, backward_ms)| StageCost {
                forward_ms,
                backward_ms,
                ..Default::default()
            })
            .to_vec();
        for m in [1, 2, 3, 4, 7, 64, 1000] {
            assert_eq!(
                one_f_one_b(&st, m, 0.25),
                simulated_op_by_op(&st, m, 0.25),
                "m {m}"
            );
        }
        // 48 layers over five stages send a wave down the pipeline: a cycle of five rounds.
        let wave: Vec<StageCost> = [10.0, 10.0, 10.0, 9.0, 9.0]
            .map(|layers| StageCost {
                forward_ms: 0.3 * layers,
                backward_ms: 0.6 * layers,
                ..Default::default()
            })
            .to_vec();
        for m in [5, 6, 30, 128, 129, 1001] {
            let (rounds, oracle) = (
                one_f_one_b(&wave, m, 2.0),
                simulated_op_by_op(&wave, m, 2.0),
            );
            for (r, o) in rounds.iter().zip(&oracle) {
                assert!((r - o).abs() <= 1e-9 * o, "m {m}: {rounds:?} vs {oracle:?}");
            }
        }
    }

    proptest::proptest! {
        /// Rounds, with the jump over settled ones, end every stage where simulating each op
        /// in time order does.
        #[test]
        fn rounds_end_where_every_op_run_ends(
            stages in proptest::collection::vec((0.1f64..20.0, 0.1f64..40.0), 1..24),
            m in 1usize..200,
            comm in 0.0f64..10.0,
        ) {
            let stages: Vec<StageCost> = stages
                .iter()
                .map(|&(forward_ms, backward_ms)| StageCost { forward_ms, backward_ms, ..Default::default() })
                .collect();
            let (rounds, oracle) = (one_f_one_b(&stages, m, comm), simulated_op_by_op(&stages, m, comm));
            for (r, o) in rounds.iter().zip(&oracle) {
                proptest::prop_assert!((r - o).abs() <= 1e-6 * o.max(1.0), "{rounds:?} vs {oracle:?}");
            }
        }
    }
}
