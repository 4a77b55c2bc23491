//! `--price-spot` and `--price-on-demand`: the money of `simulate`, `run` and `compare`
//! (see `parcae_strategies::cost::money`).

use parcae_strategies::cost::money::{PriceError, Prices};

/// The price flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PriceArgs {
    /// Price of a spot machine-hour: reports show machine-hours, cost and cost per million
    /// samples (with --price-on-demand).
    #[arg(long)]
    pub price_spot: Option<f64>,
    /// Price of an on-demand machine-hour: reports show the saving against training the same
    /// samples on on-demand machines at the throughput-optimal configuration (with
    /// --price-spot).
    #[arg(long)]
    pub price_on_demand: Option<f64>,
}

impl PriceArgs {
    /// Both prices, neither, or an error naming what is wrong.
    pub fn prices(&self) -> Result<Option<Prices>, PriceError> {
        Prices::from_flags(self.price_spot, self.price_on_demand)
    }
}
