//! How a job synchronises its groups: every step (each stage's all-reduce spans every group),
//! or DiLoCo's rounds of `H` inner steps a group, or whichever the planner finds pays (`auto`);
//! and the outer optimizer's settings. Both come from users (flags, configuration files) and
//! are checked on the way in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::codec::Wire;

/// DiLoCo's inner steps a round where none is said (the paper's `H`).
pub const DEFAULT_INNER_STEPS: u32 = 500;
/// Most inner steps a round: past it a group's drift from the others is no longer a round's.
pub const MAX_INNER_STEPS: u32 = 1_000_000;
/// The paper's outer learning rate.
pub const DEFAULT_OUTER_LR: f32 = 0.7;
/// The paper's outer momentum.
pub const DEFAULT_OUTER_MOMENTUM: f32 = 0.9;
/// Largest outer learning rate accepted (the paper tunes within 0.1 to 1).
pub const MAX_OUTER_LR: f32 = 10.0;

/// How a job synchronises its groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// Every step: one synchronous job over every group.
    #[default]
    Step,
    /// DiLoCo: each group trains on its own for this many inner steps a round.
    Diloco(u32),
    /// Whichever the planner finds pays, and its `H`.
    Auto,
}

/// Why a sync mode or outer settings were refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SyncError {
    /// Not `step`, `auto`, `diloco` or `diloco:H`.
    #[error("sync \"{0}\": expected step, auto, diloco or diloco:H (H inner steps a round)")]
    Unknown(String),
    /// `H` out of range.
    #[error("sync diloco:{0}: inner steps must be 1 to {MAX_INNER_STEPS}")]
    InnerSteps(u64),
    /// The outer learning rate is not a number in `(0, MAX_OUTER_LR]`.
    #[error("outer learning rate {0}: expected above 0 and at most {MAX_OUTER_LR}")]
    Lr(f32),
    /// The outer momentum is not in `[0, 1)`.
    #[error("outer momentum {0}: expected at least 0 and below 1")]
    Momentum(f32),
}

impl SyncMode {
    /// Inner steps a round (`None`: not DiLoCo).
    pub fn inner_steps(self) -> Option<u32> {
        match self {
            SyncMode::Diloco(h) => Some(h),
            SyncMode::Step | SyncMode::Auto => None,
        }
    }
}

impl FromStr for SyncMode {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        match s.split_once(':') {
            None if s == "step" => Ok(SyncMode::Step),
            None if s == "auto" => Ok(SyncMode::Auto),
            None if s == "diloco" => Ok(SyncMode::Diloco(DEFAULT_INNER_STEPS)),
            Some(("diloco", h)) => {
                let h: u64 = h.parse().map_err(|_| SyncError::Unknown(s.to_string()))?;
                u32::try_from(h)
                    .ok()
                    .filter(|h| (1..=MAX_INNER_STEPS).contains(h))
                    .map(SyncMode::Diloco)
                    .ok_or(SyncError::InnerSteps(h))
            }
            _ => Err(SyncError::Unknown(s.chars().take(64).collect())),
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncMode::Step => f.write_str("step"),
            SyncMode::Auto => f.write_str("auto"),
            SyncMode::Diloco(h) => write!(f, "diloco:{h}"),
        }
    }
}

impl Serialize for SyncMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SyncMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The outer optimizer's settings and the pseudo-gradient's wire form.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OuterSettings {
    /// Outer learning rate (Nesterov SGD).
    pub lr: f32,
    /// Outer momentum.
    pub momentum: f32,
    /// How pseudo-gradients travel between groups.
    pub wire: Wire,
}

impl Default for OuterSettings {
    /// The paper's outer optimizer (Nesterov SGD, lr 0.7, momentum 0.9); pseudo-gradients sent
    /// whole (f32), so the outer step is the same one process would take.
    fn default() -> Self {
        Self {
            lr: DEFAULT_OUTER_LR,
            momentum: DEFAULT_OUTER_MOMENTUM,
            wire: Wire::F32,
        }
    }
}

impl OuterSettings {
    /// Refuses settings no outer step should run with.
    pub fn check(&self) -> Result<(), SyncError> {
        if !(self.lr > 0.0 && self.lr <= MAX_OUTER_LR) {
            return Err(SyncError::Lr(self.lr));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(SyncError::Momentum(self.momentum));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_back() {
        for (text, mode) in [
            ("step", SyncMode::Step),
            ("auto", SyncMode::Auto),
            ("diloco", SyncMode::Diloco(DEFAULT_INNER_STEPS)),
            ("diloco:20", SyncMode::Diloco(20)),
            ("diloco:1", SyncMode::Diloco(1)),
        ] {
            assert_eq!(text.parse::<SyncMode>(), Ok(mode), "{text}");
        }
        assert_eq!(SyncMode::Diloco(20).to_string(), "diloco:20");
        assert_eq!(
            "diloco".parse::<SyncMode>().unwrap().to_string(),
            "diloco:500"
        );
        let json = serde_json::to_string(&SyncMode::Diloco(30)).unwrap();
        assert_eq!(json, "\"diloco:30\"");
        assert_eq!(
            serde_json::from_str::<SyncMode>(&json).unwrap(),
            SyncMode::Diloco(30)
        );
    }

    #[test]
    fn bad_modes_say_what_is_wrong() {
        assert_eq!(
            "diloco:0".parse::<SyncMode>(),
            Err(SyncError::InnerSteps(0))
        );
        assert_eq!(
            "diloco:99999999999".parse::<SyncMode>(),
            Err(SyncError::InnerSteps(99_999_999_999))
        );
        for bad in [
            "",
            "Step",
            "diloco:",
            "diloco:-3",
            "diloco:2.5",
            "local:5",
            "step:1",
        ] {
            assert!(
                matches!(bad.parse::<SyncMode>(), Err(SyncError::Unknown(_))),
                "{bad}"
            );
        }
        let long = "x".repeat(10_000);
        let Err(SyncError::Unknown(shown)) = long.parse::<SyncMode>() else {
            panic!("a long mode parsed");
        };
        assert_eq!(shown.len(), 64);
        assert!(serde_json::from_str::<SyncMode>("\"diloco:0\"").is_err());
    }

    #[test]
    fn outer_settings_default_to_the_paper_and_refuse_what_cannot_train() {
        let paper = OuterSettings::default();
        assert_eq!(
            (paper.lr, paper.momentum, paper.wire),
            (0.7, 0.9, Wire::F32)
        );
        assert_eq!(paper.check(), Ok(()));
        let with = |lr, momentum| OuterSettings {
            lr,
            momentum,
            ..paper
        };
        assert_eq!(with(0.0, 0.9).check(), Err(SyncError::Lr(0.0)));
        assert_eq!(with(11.0, 0.9).check(), Err(SyncError::Lr(11.0)));
        assert!(with(f32::NAN, 0.9).check().is_err());
        assert_eq!(with(0.7, 1.0).check(), Err(SyncError::Momentum(1.0)));
        assert_eq!(with(0.7, -0.1).check(), Err(SyncError::Momentum(-0.1)));
        assert!(with(0.7, f32::NAN).check().is_err());
        assert_eq!(with(1.0, 0.0).check(), Ok(()));
        let parsed: OuterSettings = serde_json::from_str(r#"{"lr": 0.5, "wire": "int8"}"#).unwrap();
        assert_eq!(
            (parsed.lr, parsed.momentum, parsed.wire),
            (0.5, 0.9, Wire::Int8)
        );
        assert!(serde_json::from_str::<OuterSettings>(r#"{"learning_rate": 0.5}"#).is_err());
    }
}
