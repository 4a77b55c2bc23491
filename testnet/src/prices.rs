//! `--price-spot` and `--price-on-demand`: the money of `simulate`, `run` and `compare`
//! (see `parcae_strategies::cost::money`), and the spot prices of a job over zones.

use anyhow::{Context, Result, bail};
use parcae_pool::Pool;
use parcae_strategies::cost::links::pool_price;
use parcae_strategies::cost::money::Prices;

/// The price flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PriceArgs {
    /// Price of a spot machine-hour, USD: one price for every machine (reports show
    /// machine-hours, cost and cost per million samples, with --price-on-demand), or with
    /// --zones one per zone or pool, `ZONE=USD` or `ZONE/TYPE=USD` (comma-separated; a pool
    /// without an entry of its own takes its zone's, and a bare USD prices every one no entry
    /// names).
    #[arg(long, alias = "zone-price", value_delimiter = ',')]
    pub price_spot: Vec<String>,
    /// Price of an on-demand machine-hour: reports show the saving against training the same
    /// samples on on-demand machines at the throughput-optimal configuration (with
    /// --price-spot).
    #[arg(long)]
    pub price_on_demand: Option<f64>,
}

impl PriceArgs {
    /// Both prices of one machine kind, neither, or an error naming what is wrong.
    pub fn prices(&self) -> Result<Option<Prices>> {
        Ok(Prices::from_flags(
            uniform_spot(&self.price_spot)?,
            self.price_on_demand,
        )?)
    }
}

/// The one spot price of every machine in `entries` (`--price-spot`'s bare `USD`), if given.
pub fn uniform_spot(entries: &[String]) -> Result<Option<f64>> {
    let mut bare = entries.iter().filter(|e| !e.contains('='));
    let Some(first) = bare.next() else {
        return Ok(None);
    };
    if let Some(second) = bare.next() {
        bail!("--price-spot {first:?} and {second:?}: one price for every machine, not two");
    }
    parse_usd(first, first).map(Some)
}

/// Each pool's spot price per node-hour from `--price-spot` `entries`, in the order of
/// `pools`: every one priced, or none. An entry names a pool (`ZONE/TYPE`), whose price it
/// is, or a zone, whose price it is and that of each of its pools no entry prices; a bare
/// price prices the rest.
pub fn zone_prices(entries: &[String], pools: &[Pool]) -> Result<Option<Vec<f64>>> {
    if entries.is_empty() {
        return Ok(None);
    }
    let mut named: Vec<(String, f64)> = Vec::new();
    for entry in entries.iter().filter(|e| e.contains('=')) {
        let (name, usd) = parse_price(entry)?;
        if !pools
            .iter()
            .any(|p| p.to_string() == name || p.zone() == name)
        {
            bail!("--price-spot {entry:?}: no zone or pool {name:?} in --zones");
        }
        named.push((name, usd));
    }
    let rest = uniform_spot(entries)?;
    let price = |of: &str| named.iter().find(|(n, _)| n == of).map(|(_, usd)| *usd);
    pools
        .iter()
        .map(|p| {
            pool_price(p, price)
                .or(rest)
                .with_context(|| format!("--price-spot: \"{p}\" has no price"))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The pools named `names` (each `ZONE` or `ZONE/TYPE`, as `--zones` gave them).
pub fn pools_named(names: &[&str]) -> Result<Vec<Pool>> {
    names
        .iter()
        .map(|n| n.parse().map_err(|e| anyhow::anyhow!("pool {n:?}: {e}")))
        .collect()
}

/// One `--price-spot` entry that names its zone or pool, `ZONE[/TYPE]=USD`.
pub fn parse_price(entry: &str) -> Result<(String, f64)> {
    let (name, usd) = entry.split_once('=').with_context(|| {
        format!("--price-spot {entry:?}: expected ZONE[/TYPE]=USD_PER_NODE_HOUR")
    })?;
    Ok((name.to_string(), parse_usd(entry, usd)?))
}

/// The price `usd` of `--price-spot` entry `entry`: USD per node-hour, 0 to 1e6.
fn parse_usd(entry: &str, usd: &str) -> Result<f64> {
    usd.parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0 && *v <= 1e6)
        .with_context(|| {
            format!("--price-spot {entry:?}: the price must be a number from 0 to 1e6")
        })
}

/// Whether `entries` price zones or pools by name (`ZONE[/TYPE]=USD`).
pub fn names_zones(entries: &[String]) -> bool {
    entries.iter().any(|e| e.contains('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(names: &[&str]) -> Vec<Pool> {
        names.iter().map(|name| name.parse().unwrap()).collect()
    }

    fn entries(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn every_zone_is_priced_or_none() {
        let specs = pools(&["a", "b"]);
        let both = zone_prices(&["a=0.9".into(), "b=1.2".into()], &specs).unwrap();
        assert_eq!(both, Some(vec![0.9, 1.2]));
        assert_eq!(zone_prices(&[], &specs).unwrap(), None);
        let err = zone_prices(&["a=0.9".into()], &specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"b\" has no price"), "{err}");
        let err = zone_prices(&["c=1".into()], &specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no zone or pool \"c\""), "{err}");
        let err = zone_prices(&["a=-1".into()], &specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("from 0 to 1e6"), "{err}");
    }

    #[test]
    fn a_pool_takes_its_own_price_else_its_zone_s() {
        let specs = pools(&["a/p3.2xlarge", "a/g5.xlarge", "b/p3.2xlarge"]);
        let named = entries(&["a=0.9", "a/g5.xlarge=0.5", "b/p3.2xlarge=1.2"]);
        let prices = zone_prices(&named, &specs).unwrap();
        assert_eq!(prices, Some(vec![0.9, 0.5, 1.2]));
        let err = zone_prices(&["a=0.9".into()], &specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"b/p3.2xlarge\" has no price"), "{err}");
        let err = zone_prices(&["b/g5.xlarge=1".into()], &specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no zone or pool \"b/g5.xlarge\""), "{err}");
        let rest = zone_prices(&entries(&["a=0.9", "2"]), &specs).unwrap();
        assert_eq!(rest, Some(vec![0.9, 0.9, 2.0]));
    }

    #[test]
    fn one_bare_price_is_every_machine_s_and_named_ones_are_zones() {
        assert_eq!(uniform_spot(&entries(&["0.918"])).unwrap(), Some(0.918));
        assert_eq!(uniform_spot(&entries(&["a=1", "0.5"])).unwrap(), Some(0.5));
        assert_eq!(uniform_spot(&entries(&["a=1"])).unwrap(), None);
        assert!(names_zones(&entries(&["a=1", "0.5"])));
        assert!(!names_zones(&entries(&["0.5"])));
        let err = uniform_spot(&entries(&["1", "2"])).unwrap_err().to_string();
        assert!(err.contains("not two"), "{err}");
        let err = uniform_spot(&entries(&["cheap"])).unwrap_err().to_string();
        assert!(err.contains("from 0 to 1e6"), "{err}");
        let args = PriceArgs {
            price_spot: entries(&["0.918"]),
            price_on_demand: Some(3.06),
        };
        let prices = args.prices().unwrap().unwrap();
        assert_eq!((prices.spot, prices.on_demand), (0.918, 3.06));
    }
}
