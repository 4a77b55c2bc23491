//! The faults a `chaos` run injected, as its report lists them (`"faults"` in the JSON): what,
//! when (seconds since the replay started) and to which nodes.

use serde::{Deserialize, Serialize};

/// What was done to the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL without notice (a node replaced it).
    Kill,
    /// Every node SIGKILLed at once, new ones started when it ended.
    Outage,
    /// SIGSTOP, then SIGCONT: a VM frozen by its host.
    Pause,
    /// The network split (its `nodes`: those cut off from the others), then healed.
    Partition,
    /// A node's checkpoint disk filled up, then emptied.
    DiskFull,
    /// A node ran with its wall clock off by `skew_secs` for all its life.
    ClockSkew,
    /// A node's link to the others was slowed to `link_kbit` both ways (queue full: dropped).
    Link,
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// When it began.
    pub start_secs: f64,
    /// When it ended (a kill: when it began).
    pub end_secs: f64,
    /// The nodes it hit (`node<k>`).
    pub nodes: Vec<String>,
    /// How far their clocks were off (a clock skew only; negative: behind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_secs: Option<i64>,
    /// The rate its link was slowed to, kbit/s (a slow link only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_kbit: Option<u32>,
}

/// One line: how many faults of each kind, and the seconds of pauses.
pub fn summary(faults: &[Fault]) -> String {
    let count = |kind| faults.iter().filter(|f| f.kind == kind).count();
    let paused: f64 = faults
        .iter()
        .filter(|f| f.kind == FaultKind::Pause)
        .map(|f| f.end_secs - f.start_secs)
        .fold(0.0, |total, secs| total + secs);
    format!(
        "faults: {} kills, {} outages, {} pauses ({paused:.0} s frozen), {} network splits, {} \
         full disks, {} skewed clocks, {} slow links",
        count(FaultKind::Kill),
        count(FaultKind::Outage),
        count(FaultKind::Pause),
        count(FaultKind::Partition),
        count(FaultKind::DiskFull),
        count(FaultKind::ClockSkew),
        count(FaultKind::Link)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pauses_are_zero_seconds_frozen() {
        assert_eq!(
            summary(&[]),
            "faults: 0 kills, 0 outages, 0 pauses (0 s frozen), 0 network splits, 0 full disks, 0 \
             skewed clocks, 0 slow links"
        );
    }

    #[test]
    fn faults_are_counted_by_kind_and_serialised_in_snake_case() {
        let fault = |kind, start_secs, end_secs| Fault {
            kind,
            start_secs,
            end_secs,
            nodes: vec!["node1".into()],
            skew_secs: None,
            link_kbit: None,
        };
        let faults = [
            fault(FaultKind::Kill, 20.0, 20.0),
            fault(FaultKind::Pause, 30.0, 38.5),
            fault(FaultKind::Kill, 40.0, 40.0),
            fault(FaultKind::Pause, 60.0, 68.5),
            fault(FaultKind::Partition, 70.0, 90.0),
            fault(FaultKind::DiskFull, 95.0, 99.0),
            Fault {
                skew_secs: Some(-600),
                ..fault(FaultKind::ClockSkew, 0.0, 120.0)
            },
            Fault {
                link_kbit: Some(1000),
                ..fault(FaultKind::Link, 100.0, 110.0)
            },
        ];
        assert_eq!(
            summary(&faults),
            "faults: 2 kills, 0 outages, 2 pauses (17 s frozen), 1 network splits, 1 full disks, \
             1 skewed clocks, 1 slow links"
        );
        assert_eq!(
            serde_json::to_value(&faults[7]).unwrap(),
            serde_json::json!({"kind": "link", "start_secs": 100.0, "end_secs": 110.0,
                               "nodes": ["node1"], "link_kbit": 1000})
        );
        assert_eq!(
            serde_json::to_value(&faults[6]).unwrap(),
            serde_json::json!({"kind": "clock_skew", "start_secs": 0.0, "end_secs": 120.0,
                               "nodes": ["node1"], "skew_secs": -600})
        );
        assert_eq!(serde_json::to_value(faults[5].kind).unwrap(), "disk_full");
        let v = serde_json::to_value(&faults[1]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind": "pause", "start_secs": 30.0, "end_secs": 38.5,
                               "nodes": ["node1"]})
        );
    }
}
