//! `parcae-pool`: a pool, the fleet's unit — one instance type in one cloud zone
//! (`us-east-1a/p3.2xlarge`), or a zone whose nodes did not say their type (`us-east-1a`).
//! Each pool has its own availability trace, device, price and forecast; links join zones, so
//! two pools of one zone talk over the zone's own link.
//!
//! This crate holds the one parser and the one validation rule of pool, zone and instance type
//! names that the node's configuration, the replicated membership record, the planner and the
//! testnet all apply, so a name one accepts is a name every other reads the same way. A name
//! comes from outside (configuration, flags, cloud metadata, peers): [`Pool::from_str`] and
//! [`check_zone`] / [`check_instance_type`] say what is wrong with one, never panic.
//!
//! [`AllReduce`], how a stage's replicas spread over zones average their gradients, is here
//! too: the planner chooses it and the replicated plan carries it.
//!
//! [`Pool::from_str`]: std::str::FromStr::from_str

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod all_reduce;
pub use all_reduce::AllReduce;

/// Longest zone name (AWS's are ~15 characters: `us-east-1a`, `use1-az4`).
pub const MAX_ZONE_NAME: usize = 64;

/// Longest instance type name (AWS's, GCE's and Azure's are under 30 characters:
/// `p3.2xlarge`, `a2-highgpu-1g`, `Standard_NC6s_v3`).
pub const MAX_TYPE_NAME: usize = 64;

/// Longest pool name: a zone, `/`, an instance type.
pub const MAX_POOL_NAME: usize = MAX_ZONE_NAME + 1 + MAX_TYPE_NAME;

/// Why a name is not a zone, an instance type or a pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Not a zone name.
    #[error("zone {0:?} must be 1 to {MAX_ZONE_NAME} characters of a-z, 0-9, '-', '_' or '.'")]
    Zone(String),
    /// Not an instance type name.
    #[error(
        "instance type {0:?} must be 1 to {MAX_TYPE_NAME} characters of A-Z, a-z, 0-9, '-', '_' or '.'"
    )]
    InstanceType(String),
}

/// One instance type in one zone, or a zone alone (its nodes' type unknown).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pool {
    zone: String,
    instance_type: Option<String>,
}

impl Pool {
    /// The pool of `instance_type` in `zone` (the zone alone where `instance_type` is `None`).
    pub fn new(zone: &str, instance_type: Option<&str>) -> Result<Self, PoolError> {
        check_zone(zone)?;
        if let Some(kind) = instance_type {
            check_instance_type(kind)?;
        }
        Ok(Self {
            zone: zone.to_owned(),
            instance_type: instance_type.map(str::to_owned),
        })
    }

    /// The pool of a node that said it runs in `zone` on `instance_type`, either empty where it
    /// did not know: `None` without a zone; the zone alone without a type.
    pub fn of_node(zone: &str, instance_type: &str) -> Result<Option<Self>, PoolError> {
        if zone.is_empty() {
            return Ok(None);
        }
        let kind = (!instance_type.is_empty()).then_some(instance_type);
        Self::new(zone, kind).map(Some)
    }

    /// The zone.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The instance type, where known.
    pub fn instance_type(&self) -> Option<&str> {
        self.instance_type.as_deref()
    }

    /// Whether the two pools are in one zone (their traffic stays inside it).
    pub fn shares_zone(&self, other: &Pool) -> bool {
        self.zone == other.zone
    }
}

impl FromStr for Pool {
    type Err = PoolError;

    /// `ZONE` or `ZONE/TYPE`.
    fn from_str(name: &str) -> Result<Self, PoolError> {
        match name.split_once('/') {
            None => Self::new(name, None),
            Some((zone, kind)) => Self::new(zone, Some(kind)),
        }
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so that widths and alignment (`{:<16}`) apply to the whole name.
        match &self.instance_type {
            None => f.pad(&self.zone),
            Some(kind) => f.pad(&format!("{}/{kind}", self.zone)),
        }
    }
}

impl TryFrom<String> for Pool {
    type Error = PoolError;

    fn try_from(name: String) -> Result<Self, PoolError> {
        name.parse()
    }
}

impl From<Pool> for String {
    fn from(pool: Pool) -> String {
        pool.to_string()
    }
}

/// Whether `zone` is 1 to [`MAX_ZONE_NAME`] characters of `a-z`, `0-9`, `-`, `_` or `.` (the
/// form of every cloud's zone names; no `/`, which joins a zone to its instance type).
pub fn check_zone(zone: &str) -> Result<(), PoolError> {
    let ok = (1..=MAX_ZONE_NAME).contains(&zone.len())
        && zone
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(&c));
    ok.then_some(()).ok_or_else(|| PoolError::Zone(zone.into()))
}

/// Whether `kind` is 1 to [`MAX_TYPE_NAME`] characters of `A-Z`, `a-z`, `0-9`, `-`, `_` or `.`.
pub fn check_instance_type(kind: &str) -> Result<(), PoolError> {
    let ok = (1..=MAX_TYPE_NAME).contains(&kind.len())
        && kind
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    ok.then_some(())
        .ok_or_else(|| PoolError::InstanceType(kind.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_every_cloud_parse_and_print_back() {
        for name in [
            "us-east-1a",
            "use1-az4",
            "us-central1-a",
            "eastus-1",
            "us-east-1a/p3.2xlarge",
            "us-central1-a/a2-highgpu-1g",
            "eastus-1/Standard_NC6s_v3",
        ] {
            let pool: Pool = name.parse().unwrap();
            assert_eq!(pool.to_string(), name);
        }
        let pool: Pool = "us-east-1a/p3.2xlarge".parse().unwrap();
        assert_eq!(pool.zone(), "us-east-1a");
        assert_eq!(pool.instance_type(), Some("p3.2xlarge"));
        let zone: Pool = "us-east-1a".parse().unwrap();
        assert_eq!(zone.instance_type(), None);
        assert!(zone.shares_zone(&pool));
        assert_eq!(format!("{pool:<24}|"), "us-east-1a/p3.2xlarge   |");
        assert!(!zone.shares_zone(&"us-east-1b".parse().unwrap()));
    }

    #[test]
    fn a_bad_name_is_refused_and_named() {
        let long_zone = "z".repeat(MAX_ZONE_NAME + 1);
        let long_type = format!("a/{}", "t".repeat(MAX_TYPE_NAME + 1));
        for (bad, zone_wrong) in [
            ("", true),
            ("US-East-1a", true),
            ("us east", true),
            ("a/b/c", false),
            ("a/", false),
            ("/p3", true),
            ("a/p3 large", false),
            (long_zone.as_str(), true),
            (long_type.as_str(), false),
        ] {
            let err = bad.parse::<Pool>().unwrap_err();
            assert_eq!(
                matches!(err, PoolError::Zone(_)),
                zone_wrong,
                "{bad:?}: {err}"
            );
            assert!(err.to_string().contains("must be 1 to 64"), "{err}");
        }
        let longest = format!(
            "{}/{}",
            "z".repeat(MAX_ZONE_NAME),
            "t".repeat(MAX_TYPE_NAME)
        );
        assert_eq!(
            longest.parse::<Pool>().unwrap().to_string().len(),
            MAX_POOL_NAME
        );
    }

    #[test]
    fn a_node_s_record_gives_its_pool() {
        assert_eq!(Pool::of_node("", "p3.2xlarge"), Ok(None));
        assert_eq!(
            Pool::of_node("us-east-1a", ""),
            Ok(Some("us-east-1a".parse().unwrap()))
        );
        assert_eq!(
            Pool::of_node("us-east-1a", "p3.2xlarge"),
            Ok(Some("us-east-1a/p3.2xlarge".parse().unwrap()))
        );
        assert!(Pool::of_node("us/east", "p3").is_err());
    }

    #[test]
    fn pools_travel_as_their_names_and_are_checked_on_the_way_in() {
        let pool: Pool = "us-east-1a/p3.2xlarge".parse().unwrap();
        let json = serde_json::to_string(&pool).unwrap();
        assert_eq!(json, "\"us-east-1a/p3.2xlarge\"");
        assert_eq!(serde_json::from_str::<Pool>(&json).unwrap(), pool);
        assert!(serde_json::from_str::<Pool>("\"Us-East/x\"").is_err());
    }
}
