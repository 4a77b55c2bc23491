//! Links between zones, and what a placed plan sends over them: time and egress dollars.
//!
//! Within a zone traffic is fast and free; between zones it is slower and billed per GB in
//! each direction. The defaults are AWS's, the cloud of Parcae's trace: inside a cluster
//! placement group one flow gets 10 Gb/s (Parcae's profiled links), outside one it is held to
//! 5 Gb/s; a round trip between zones of a region is about a millisecond; data between zones
//! of a region costs $0.01 per GB out of one and $0.01 per GB into the other (the EC2 price
//! list, "Data Transfer within the same AWS Region"), within a zone nothing. Between zones of
//! two regions ([`super::region`]: read from the zones' names) a flow is held to 2 Gb/s by a
//! round trip of ~60 ms across the US (us-east-1 to us-west-2), and data costs $0.02 per GB out
//! of the sending region and nothing into the other (the EC2 price list, "Data Transfer OUT From
//! Amazon EC2 To ... another AWS Region", US regions; $0.08-0.09 out of Asia Pacific and South
//! America: set the pair). Every figure is overridable per zone pair
//! (`ZONE/ZONE=GBIT,MS,USD_PER_GB`).
//!
//! A fleet's unit is a [`Pool`], one instance type in one zone (`ZONE/TYPE`, e.g.
//! `us-east-1a/p3.2xlarge`) or a zone alone: its own trace, device and price. Links join
//! zones, so two pools of one zone talk over the zone's own link, free.

use std::collections::BTreeMap;

use parcae_pool::{MAX_ZONE_NAME, Pool, check_zone};

use super::region::regions_apart;

/// Bytes of one gradient value in the all-reduce (Parcae's fp16 gradients).
pub const GRADIENT_BYTES_PER_PARAM: f64 = 2.0;

/// Most zone pairs a configuration may set.
pub const MAX_PAIRS: usize = 256;

/// One link as the cost model prices it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Sustained rate of one flow, Gb/s.
    pub gbit_per_s: f64,
    /// One-way latency of one transfer, ms.
    pub latency_ms: f64,
    /// Dollars per GB moved over it, both directions' charges together.
    pub usd_per_gb: f64,
}

impl Link {
    /// Time to send `bytes` over the link, ms.
    pub fn transfer_ms(&self, bytes: f64) -> f64 {
        self.latency_ms + bytes.max(0.0) * 8.0 / (self.gbit_per_s * 1e9) * 1000.0
    }

    /// The all-reduce rate of a ring over it, MiB per ms.
    pub fn mib_per_ms(&self) -> f64 {
        self.gbit_per_s * 1e9 / 8.0 / (1024.0 * 1024.0) / 1000.0
    }
}

/// Why a zone pair's link was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinkError {
    /// Not `ZONE/ZONE=GBIT,MS,USD_PER_GB`.
    #[error(
        "link {0:?}: expected ZONE/ZONE=GBIT,MS,USD_PER_GB (e.g. us-east-1a/us-east-1b=5,1,0.02)"
    )]
    Format(String),
    /// A zone name that is empty, too long or has characters other than `a-z0-9-_.`.
    #[error(
        "link {text:?}: zone {zone:?} must be 1 to {MAX_ZONE_NAME} characters of a-z, 0-9, '-', '_' or '.'"
    )]
    Zone {
        /// The text given.
        text: String,
        /// The zone named.
        zone: String,
    },
    /// A figure that is not a finite number in its range.
    #[error("link {text:?}: {field} {value} must be a finite number {range}")]
    Figure {
        /// The text given.
        text: String,
        /// Which figure.
        field: &'static str,
        /// The value read.
        value: f64,
        /// What it must be.
        range: &'static str,
    },
    /// More pairs than [`MAX_PAIRS`].
    #[error("at most {MAX_PAIRS} zone pairs may be set")]
    TooMany,
}

/// The links between every pair of zones: one within a zone, one across, and the pairs set
/// apart.
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    /// Between two nodes of one zone.
    pub within: Link,
    /// Between two zones of one region (or of unknown regions) no pair entry names.
    pub across: Link,
    /// Between zones of two regions no pair entry names.
    pub across_regions: Link,
    pairs: BTreeMap<(String, String), Link>,
}

impl Default for Links {
    /// AWS's links (the module's documentation gives the sources).
    fn default() -> Self {
        Self {
            within: Link {
                gbit_per_s: 10.0,
                latency_ms: 0.05,
                usd_per_gb: 0.0,
            },
            across: Link {
                gbit_per_s: 5.0,
                latency_ms: 0.5,
                usd_per_gb: 0.02,
            },
            across_regions: Link {
                gbit_per_s: 2.0,
                latency_ms: 30.0,
                usd_per_gb: 0.02,
            },
            pairs: BTreeMap::new(),
        }
    }
}

impl Links {
    /// The link between zones `a` and `b` (a pool's is its zone's), either way round: as set
    /// for the pair, else within a zone, across zones of a region, or across regions.
    pub fn between(&self, a: &str, b: &str) -> Link {
        let (x, y) = ordered(a, b);
        // A scan, not a keyed lookup: the planner asks this for every placement it prices, and
        // a key of owned names would allocate each time; there are a few pairs at most.
        let set = self
            .pairs
            .iter()
            .find(|((p, q), _)| p == x && q == y)
            .map(|(_, link)| *link);
        match set {
            Some(link) => link,
            None if a == b => self.within,
            None if regions_apart(a, b) => self.across_regions,
            None => self.across,
        }
    }

    /// Sets every pair `other` sets (over this one's where both set a pair).
    pub fn set_pairs_of(&mut self, other: &Links) -> Result<(), LinkError> {
        for (pair, link) in &other.pairs {
            if !self.pairs.contains_key(pair) && self.pairs.len() >= MAX_PAIRS {
                return Err(LinkError::TooMany);
            }
            self.pairs.insert(pair.clone(), *link);
        }
        Ok(())
    }

    /// Sets the link of one pair from `ZONE/ZONE=GBIT,MS,USD_PER_GB` (the same zone twice sets
    /// that zone's own link).
    pub fn set(&mut self, text: &str) -> Result<(), LinkError> {
        let (a, b, link) = parse_pair(text)?;
        let key = ordered(&a, &b);
        let key = (key.0.to_owned(), key.1.to_owned());
        if !self.pairs.contains_key(&key) && self.pairs.len() >= MAX_PAIRS {
            return Err(LinkError::TooMany);
        }
        self.pairs.insert(key, link);
        Ok(())
    }
}

/// The price of `pool` from `price_of` (by name): its own, else its zone's.
pub fn pool_price(pool: &Pool, price_of: impl Fn(&str) -> Option<f64>) -> Option<f64> {
    price_of(&pool.to_string()).or_else(|| price_of(pool.zone()))
}

fn ordered<'a>(a: &'a str, b: &'a str) -> (&'a str, &'a str) {
    if a <= b { (a, b) } else { (b, a) }
}

fn parse_pair(text: &str) -> Result<(String, String, Link), LinkError> {
    let format = || LinkError::Format(text.into());
    let (zones, figures) = text.split_once('=').ok_or_else(format)?;
    let (a, b) = zones.split_once('/').ok_or_else(format)?;
    for zone in [a, b] {
        if check_zone(zone).is_err() {
            return Err(LinkError::Zone {
                text: text.into(),
                zone: zone.into(),
            });
        }
    }
    let values: Vec<&str> = figures.split(',').collect();
    let [gbit, ms, usd] = values[..] else {
        return Err(format());
    };
    let figure = |field, value: &str, range, ok: fn(f64) -> bool| {
        let v: f64 = value.trim().parse().map_err(|_| format())?;
        if v.is_finite() && ok(v) {
            Ok(v)
        } else {
            Err(LinkError::Figure {
                text: text.into(),
                field,
                value: v,
                range,
            })
        }
    };
    let link = Link {
        gbit_per_s: figure("Gb/s", gbit, "above 0", |v| v > 0.0)?,
        latency_ms: figure("latency (ms)", ms, ">= 0", |v| v >= 0.0)?,
        usd_per_gb: figure("price ($/GB)", usd, ">= 0", |v| v >= 0.0)?,
    };
    Ok((a.into(), b.into(), link))
}

#[cfg(test)]
mod tests;
