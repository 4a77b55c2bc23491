//! Forecast accuracy on a trace: mean L1 error of the predicted node count per step.

use super::predictor::{ForecastInput, NoticeAhead, Predictor};
use crate::trace::Interval;

/// Mean absolute error of the predicted count, by forecast step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepErrors {
    /// `per_step[k]`: mean |predicted - true| nodes, `k + 1` intervals ahead.
    pub per_step: Vec<f64>,
    /// Number of forecasts averaged.
    pub forecasts: usize,
}

impl StepErrors {
    /// Mean over all steps.
    pub fn mean(&self) -> f64 {
        self.per_step.iter().sum::<f64>() / self.per_step.len().max(1) as f64
    }
}

/// Runs `predictor` as a simulator would, at every `stride`-th interval whose next `horizon`
/// intervals are all in the trace (the history is everything before it, the first interval's
/// count is known at the start), and averages the L1 error of each forecast step. Parcae's
/// own check (`prediction_unit_test`) used `stride = 10`. The true preemptions of the next
/// `notice_steps` intervals are passed as notices (1 models notices shorter than an interval,
/// like the 25 s ones of Parcae's replay, which reach the planner only for the upcoming one).
pub fn mean_l1_per_step(
    predictor: &mut dyn Predictor,
    intervals: &[Interval],
    horizon: usize,
    stride: usize,
    notice_steps: usize,
) -> StepErrors {
    let mut per_step = vec![0.0; horizon];
    let mut forecasts = 0;
    if horizon == 0 || intervals.len() < horizon {
        return StepErrors {
            per_step,
            forecasts,
        };
    }
    for i in (0..=intervals.len() - horizon).step_by(stride.max(1)) {
        let notices: Vec<NoticeAhead> = intervals[i..]
            .iter()
            .take(notice_steps)
            .enumerate()
            .filter(|(_, iv)| iv.removed > 0)
            .map(|(offset, iv)| NoticeAhead {
                offset,
                nodes: iv.removed,
            })
            .collect();
        let input = ForecastInput {
            history: &intervals[..i],
            first: 0,
            known_next: (i == 0).then(|| intervals[0].nodes),
            notices: &notices,
            horizon,
        };
        let forecast = predictor.forecast(&input);
        for ((err, f), truth) in per_step.iter_mut().zip(&forecast).zip(&intervals[i..]) {
            *err += f64::from(f.nodes.abs_diff(truth.nodes));
        }
        forecasts += 1;
    }
    for err in &mut per_step {
        *err /= forecasts as f64;
    }
    StepErrors {
        per_step,
        forecasts,
    }
}
