//! The outer step of a round: each group's pseudo-gradient (the round's outer weights minus
//! the weights its inner steps reached), their average weighted by the samples each group
//! trained, summed in one fixed order so that every group computes the same bits, and
//! DiLoCo's outer Nesterov SGD applied to the outer weights.

use crate::sync::OuterSettings;

/// Why an outer step could not be taken.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OuterError {
    /// Buffers of different lengths (weights, pseudo-gradients, the momentum).
    #[error("outer step over {expected} parameters given a buffer of {got}")]
    Length { expected: usize, got: usize },
    /// A contribution's weight that is not a positive finite number.
    #[error("contribution {index} weighs {weight}: expected a positive number of samples")]
    Weight { index: usize, weight: f64 },
    /// A round with nothing to average.
    #[error("no contribution to average")]
    Empty,
}

/// One group's part in a round: its pseudo-gradient and the samples it trained for it.
#[derive(Clone, Copy, Debug)]
pub struct Contribution<'a> {
    /// Samples the group trained this round (a group that stopped early weighs less).
    pub samples: f64,
    /// Its pseudo-gradient, the outer weights minus its own.
    pub pseudo_gradient: &'a [f32],
}

/// The pseudo-gradient of a group whose inner steps reached `inner` from the round's `outer`
/// weights: `outer - inner` (a descent direction, as a gradient is).
pub fn pseudo_gradient(outer: &[f32], inner: &[f32]) -> Result<Vec<f32>, OuterError> {
    same_length(outer.len(), inner.len())?;
    Ok(outer.iter().zip(inner).map(|(o, i)| o - i).collect())
}

/// The contributions' average weighted by their samples, summed in f64 in their order (the
/// groups' committed order): every group averaging the same contributions gets the same bits.
pub fn average(contributions: &[Contribution<'_>]) -> Result<Vec<f32>, OuterError> {
    let first = contributions.first().ok_or(OuterError::Empty)?;
    let len = first.pseudo_gradient.len();
    let mut sum = vec![0.0f64; len];
    let mut total = 0.0f64;
    for (index, c) in contributions.iter().enumerate() {
        if !(c.samples.is_finite() && c.samples > 0.0) {
            return Err(OuterError::Weight {
                index,
                weight: c.samples,
            });
        }
        same_length(len, c.pseudo_gradient.len())?;
        for (s, &g) in sum.iter_mut().zip(c.pseudo_gradient) {
            *s += c.samples * f64::from(g);
        }
        total += c.samples;
    }
    Ok(sum.into_iter().map(|s| (s / total) as f32).collect())
}

/// DiLoCo's outer optimizer: SGD with Nesterov momentum (PyTorch's `SGD(nesterov=True)`)
/// over the pseudo-gradient, `v = mu v + g`, `w -= lr (g + mu v)`. Its momentum is state a
/// round carries to the next, checkpointed with the outer weights.
#[derive(Clone, Debug, PartialEq)]
pub struct NesterovSgd {
    lr: f32,
    momentum: f32,
    velocity: Vec<f32>,
}

impl NesterovSgd {
    /// A fresh optimizer over `params` parameters (no momentum yet).
    pub fn new(settings: &OuterSettings, params: usize) -> Self {
        Self::with_velocity(settings, vec![0.0; params])
    }

    /// An optimizer resuming with the momentum `velocity` (from a checkpoint).
    pub fn with_velocity(settings: &OuterSettings, velocity: Vec<f32>) -> Self {
        Self {
            lr: settings.lr,
            momentum: settings.momentum,
            velocity,
        }
    }

    /// The momentum, to checkpoint.
    pub fn velocity(&self) -> &[f32] {
        &self.velocity
    }

    /// One outer step of `weights` along the averaged pseudo-gradient `gradient`.
    pub fn step(&mut self, weights: &mut [f32], gradient: &[f32]) -> Result<(), OuterError> {
        same_length(self.velocity.len(), weights.len())?;
        same_length(self.velocity.len(), gradient.len())?;
        let (lr, mu) = (self.lr, self.momentum);
        for ((w, v), &g) in weights.iter_mut().zip(&mut self.velocity).zip(gradient) {
            *v = mu * *v + g;
            *w -= lr * (g + mu * *v);
        }
        Ok(())
    }
}

fn same_length(expected: usize, got: usize) -> Result<(), OuterError> {
    if expected == got {
        Ok(())
    } else {
        Err(OuterError::Length { expected, got })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6)
    }

    #[test]
    fn two_nesterov_steps_match_the_hand_computed_ones() {
        let mut outer = NesterovSgd::new(&OuterSettings::default(), 2);
        let mut w = [1.0f32, -2.0];
        // v = [0.5, 0.25]; w -= 0.7 ([0.5, 0.25] + 0.9 v) = 0.7 [0.95, 0.475].
        outer.step(&mut w, &[0.5, 0.25]).unwrap();
        assert!(close(&w, &[0.335, -2.3325]), "{w:?}");
        assert!(close(outer.velocity(), &[0.5, 0.25]));
        // v = 0.9 [0.5, 0.25] + [0.1, -0.2] = [0.55, 0.025]; w -= 0.7 [0.595, -0.1775].
        outer.step(&mut w, &[0.1, -0.2]).unwrap();
        assert!(close(&w, &[-0.0815, -2.20825]), "{w:?}");
        assert!(close(outer.velocity(), &[0.55, 0.025]));
    }

    #[test]
    fn without_momentum_at_rate_one_the_outer_weights_become_the_groups_average() {
        let settings = OuterSettings {
            lr: 1.0,
            momentum: 0.0,
            ..OuterSettings::default()
        };
        let outer_w = [1.0f32, 2.0, 3.0];
        let (a, b) = ([0.5f32, 2.5, 3.0], [1.5f32, 1.0, 2.0]);
        let (ga, gb) = (
            pseudo_gradient(&outer_w, &a).unwrap(),
            pseudo_gradient(&outer_w, &b).unwrap(),
        );
        // Group a trained three times b's samples.
        let mean = average(&[
            Contribution {
                samples: 300.0,
                pseudo_gradient: &ga,
            },
            Contribution {
                samples: 100.0,
                pseudo_gradient: &gb,
            },
        ])
        .unwrap();
        let mut w = outer_w;
        NesterovSgd::new(&settings, 3).step(&mut w, &mean).unwrap();
        assert!(close(&w, &[0.75, 2.125, 2.75]), "{w:?}");
    }

    #[test]
    fn the_average_is_the_same_bits_whoever_computes_it_and_refuses_bad_input() {
        let g: Vec<Vec<f32>> = (0..3)
            .map(|k| {
                (0..50)
                    .map(|i| ((i * 7 + k * 13) % 11) as f32 * 0.013 - 0.05)
                    .collect()
            })
            .collect();
        let of = |g: &[Vec<f32>]| {
            let c: Vec<Contribution<'_>> = g
                .iter()
                .zip([64.0, 32.0, 96.0])
                .map(|(g, samples)| Contribution {
                    samples,
                    pseudo_gradient: g,
                })
                .collect();
            average(&c).unwrap()
        };
        assert_eq!(
            of(&g).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            of(&g.clone())
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        );
        assert_eq!(average(&[]), Err(OuterError::Empty));
        let short = [0.0f32; 2];
        assert_eq!(
            average(&[
                Contribution {
                    samples: 1.0,
                    pseudo_gradient: &g[0]
                },
                Contribution {
                    samples: 1.0,
                    pseudo_gradient: &short
                },
            ]),
            Err(OuterError::Length {
                expected: 50,
                got: 2
            })
        );
        for weight in [0.0, -3.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                average(&[Contribution {
                    samples: weight,
                    pseudo_gradient: &g[0]
                }]),
                Err(OuterError::Weight { index: 0, .. })
            ));
        }
        assert_eq!(
            pseudo_gradient(&[1.0], &[1.0, 2.0]),
            Err(OuterError::Length {
                expected: 1,
                got: 2
            })
        );
        let mut outer = NesterovSgd::new(&OuterSettings::default(), 2);
        assert_eq!(
            outer.step(&mut [0.0; 3], &[0.0; 2]),
            Err(OuterError::Length {
                expected: 2,
                got: 3
            })
        );
        assert_eq!(outer.velocity(), [0.0, 0.0]);
    }

    #[test]
    fn a_resumed_optimizer_continues_where_the_checkpoint_left_it() {
        let settings = OuterSettings::default();
        let mut whole = NesterovSgd::new(&settings, 2);
        let (mut w1, mut w2) = ([0.3f32, 0.4], [0.3f32, 0.4]);
        whole.step(&mut w1, &[0.2, -0.1]).unwrap();
        whole.step(&mut w1, &[0.05, 0.3]).unwrap();
        let mut first = NesterovSgd::new(&settings, 2);
        first.step(&mut w2, &[0.2, -0.1]).unwrap();
        let mut resumed = NesterovSgd::with_velocity(&settings, first.velocity().to_vec());
        resumed.step(&mut w2, &[0.05, 0.3]).unwrap();
        assert_eq!(w1, w2);
        assert_eq!(whole, resumed);
    }
}
