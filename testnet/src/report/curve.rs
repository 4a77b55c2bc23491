//! A run's learning curve: each validation of the final history against the samples trained
//! before it.

use parcae_api::{StepRecord, ValPoint};

/// Each validation of `seq` against the samples trained before its step.
pub(super) fn val_curve(seq: &[StepRecord]) -> Vec<ValPoint> {
    let mut trained = 0;
    let mut curve = Vec::new();
    for r in seq {
        if let Some(val_loss) = r.validation_loss {
            curve.push(ValPoint {
                samples: trained,
                val_loss,
            });
        }
        trained += r.samples;
    }
    curve
}
