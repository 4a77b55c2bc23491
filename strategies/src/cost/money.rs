//! What training on spot machines costs in money, and what it saves against on-demand ones.
//!
//! Spot machines are billed for every hour they are held, used or not, so the machine-hours of
//! a run are its availability integrated over time, whatever a strategy made of them. The
//! on-demand baseline trains the same samples on on-demand machines of the same kind at the
//! throughput-optimal configuration of the cluster's size (no preemptions, so no restarts and
//! no migrations), paying for the D x P machines that configuration uses for as long as the
//! samples take. Prices are per machine-hour in any one currency.

use serde::{Deserialize, Serialize};

use super::CostModel;

/// Prices of one machine-hour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prices {
    /// Spot.
    pub spot: f64,
    /// On-demand.
    pub on_demand: f64,
}

/// Why prices were refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PriceError {
    /// Only one of the two prices was given.
    #[error("give both --price-spot and --price-on-demand, or neither")]
    Half,
    /// A price is negative, zero (on-demand) or not a number.
    #[error("{which} price {value} must be a finite number above 0")]
    Invalid {
        /// Which price.
        which: &'static str,
        /// The value given.
        value: f64,
    },
}

impl Prices {
    /// The prices from two optional flags: both or neither.
    pub fn from_flags(
        spot: Option<f64>,
        on_demand: Option<f64>,
    ) -> Result<Option<Self>, PriceError> {
        match (spot, on_demand) {
            (None, None) => Ok(None),
            (Some(spot), Some(on_demand)) => {
                for (which, value) in [("spot", spot), ("on-demand", on_demand)] {
                    if !value.is_finite() || value <= 0.0 {
                        return Err(PriceError::Invalid { which, value });
                    }
                }
                Ok(Some(Self { spot, on_demand }))
            }
            _ => Err(PriceError::Half),
        }
    }
}

/// The on-demand baseline: how many machines it rents and how fast they train.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnDemand {
    /// Machines of the throughput-optimal configuration (D x P).
    pub machines: u32,
    /// Its samples per second.
    pub samples_per_sec: f64,
}

impl OnDemand {
    /// The throughput-optimal configuration of `model` on at most `nodes` machines.
    pub fn of(model: &CostModel, nodes: u32) -> Self {
        let best = model.best(nodes);
        Self {
            machines: best.d * best.p,
            samples_per_sec: model.samples_per_sec(best),
        }
    }

    /// What training `samples` costs at `price` per machine-hour.
    pub fn cost_of(&self, samples: f64, price: f64) -> Option<f64> {
        (self.samples_per_sec > 0.0)
            .then(|| samples / self.samples_per_sec / 3600.0 * f64::from(self.machines) * price)
    }
}

/// A run's bill, as every report shows it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bill {
    /// Spot machine-hours held.
    pub machine_hours: f64,
    /// Their cost.
    pub cost: f64,
    /// Cost per million samples trained (none when nothing was trained).
    pub cost_per_million_samples: Option<f64>,
    /// The fraction of the on-demand baseline's cost saved (0.6: 60 % cheaper; negative:
    /// dearer); none when nothing was trained or the baseline trains nothing.
    pub saving_vs_on_demand: Option<f64>,
}

/// Machine-hours of holding `nodes[i]` machines during each interval of `interval_secs`.
pub fn machine_hours(nodes: impl IntoIterator<Item = u32>, interval_secs: f64) -> f64 {
    nodes
        .into_iter()
        .map(|n| f64::from(n) * interval_secs)
        .sum::<f64>()
        / 3600.0
}

/// The bill of `machine_hours` of spot machines that trained `samples`, with the saving
/// against `on_demand` when the baseline is known.
pub fn bill(machine_hours: f64, samples: f64, prices: Prices, on_demand: Option<OnDemand>) -> Bill {
    let cost = machine_hours * prices.spot;
    let trained = samples > 0.0;
    Bill {
        machine_hours,
        cost,
        cost_per_million_samples: trained.then(|| cost / samples * 1e6),
        saving_vs_on_demand: on_demand
            .and_then(|od| od.cost_of(samples, prices.on_demand))
            .filter(|c| trained && *c > 0.0)
            .map(|c| 1.0 - cost / c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICES: Prices = Prices {
        spot: 1.0,
        on_demand: 3.0,
    };

    #[test]
    fn the_bill_follows_from_held_hours_and_the_on_demand_time() {
        let hours = machine_hours([4, 4, 2, 2], 1800.0);
        assert_eq!(hours, 6.0);
        // On demand: 4 machines at 10 samples/s train 72,000 samples in 2 h = 8 machine-hours.
        let od = OnDemand {
            machines: 4,
            samples_per_sec: 10.0,
        };
        let b = bill(hours, 72_000.0, PRICES, Some(od));
        assert_eq!(
            bill(hours, 72_000.0, PRICES, None).saving_vs_on_demand,
            None
        );
        assert_eq!(b.cost, 6.0);
        assert!((b.cost_per_million_samples.unwrap() - 6.0 / 0.072).abs() < 1e-9);
        assert!((b.saving_vs_on_demand.unwrap() - (1.0 - 6.0 / 24.0)).abs() < 1e-12);
    }

    #[test]
    fn nothing_trained_has_no_unit_cost_and_no_saving() {
        let od = OnDemand {
            machines: 4,
            samples_per_sec: 10.0,
        };
        let b = bill(2.0, 0.0, PRICES, Some(od));
        assert_eq!(b.cost, 2.0);
        assert_eq!(b.cost_per_million_samples, None);
        assert_eq!(b.saving_vs_on_demand, None);
    }

    #[test]
    fn the_baseline_is_the_throughput_optimal_configuration() {
        let model = CostModel::builtin("gpt-1.5b").unwrap();
        let od = OnDemand::of(&model, 32);
        let best = model.best(32);
        assert_eq!(od.machines, best.d * best.p);
        assert!(od.machines <= 32);
        assert_eq!(od.samples_per_sec, model.samples_per_sec(best));
    }

    #[test]
    fn prices_come_in_pairs_and_must_be_positive() {
        assert_eq!(Prices::from_flags(None, None), Ok(None));
        assert_eq!(
            Prices::from_flags(Some(0.9), Some(3.06)),
            Ok(Some(Prices {
                spot: 0.9,
                on_demand: 3.06
            }))
        );
        assert_eq!(Prices::from_flags(Some(0.9), None), Err(PriceError::Half));
        assert!(matches!(
            Prices::from_flags(Some(-1.0), Some(3.0)),
            Err(PriceError::Invalid { which: "spot", .. })
        ));
        assert!(matches!(
            Prices::from_flags(Some(1.0), Some(f64::NAN)),
            Err(PriceError::Invalid { .. })
        ));
    }
}
