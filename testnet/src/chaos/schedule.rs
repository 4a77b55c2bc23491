//! What a chaos run does and when: the outage, and the faults that recur on a period (pauses,
//! network splits, full disks, slow links), and the skewed clocks, read from the options and
//! named in reports.

use anyhow::{Result, bail};

use super::args::Args;

/// A whole-cluster outage: from `at` for `secs` seconds no node runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outage {
    /// Seconds after the start.
    pub at: f64,
    /// Seconds without nodes.
    pub secs: f64,
}

/// A fault on a fixed period: every `every` s, for `secs` s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recurring {
    /// Seconds between two.
    pub every: f64,
    /// Seconds each lasts.
    pub secs: f64,
}

/// What a chaos run does, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Nodes kept running.
    pub nodes: u32,
    /// Seconds of chaos.
    pub duration: f64,
    /// Seconds between two kills.
    pub kill_every: f64,
    /// Seconds of a planning interval (for the progress bar).
    pub interval_secs: f64,
    /// The whole-cluster outage, if any.
    pub outage: Option<Outage>,
    /// The pauses, if any.
    pub pauses: Option<Recurring>,
    /// The network splits, if any (nodes in namespaces).
    pub partitions: Option<Recurring>,
    /// The full checkpoint disks, if any.
    pub disks_full: Option<Recurring>,
    /// Seconds every third node's wall clock is off, if any.
    pub clock_skew: Option<u64>,
    /// The slow links, if any (nodes in namespaces).
    pub slow_links: Option<Recurring>,
    /// The rate a slow link is cut to, kbit/s.
    pub slow_link_kbit: u32,
}

impl Schedule {
    /// Whether a fault from `t` for `secs` s ends before the run does and stays clear of the
    /// outage (whose kills would take its nodes with them).
    pub(super) fn fits(&self, t: f64, secs: f64) -> bool {
        t + secs < self.duration
            && self
                .outage
                .is_none_or(|o| t + secs <= o.at || t >= o.at + o.secs)
    }

    /// The seconds the recurring `fault` due now (at `t`) lasts, when it fits; its next turn
    /// (`next`) moves on a period either way.
    pub(super) fn turn(&self, fault: Option<Recurring>, next: &mut f64, t: f64) -> Option<f64> {
        let f = fault?;
        *next += f.every;
        self.fits(t, f.secs).then_some(f.secs)
    }
}

/// The fault of `--NAME-every EVERY --NAME-secs SECS`, if asked for: each must end before the
/// next begins, and the first before the run ends.
pub(super) fn recurring(
    name: &str,
    every: Option<u64>,
    secs: u64,
    duration: u64,
) -> Result<Option<Recurring>> {
    let Some(every) = every else {
        return Ok(None);
    };
    if secs >= every || every + secs >= duration {
        bail!(
            "--{name}-secs {secs} must be shorter than --{name}-every {every}, and the first \
             {name} must end before --duration {duration}"
        );
    }
    Ok(Some(Recurring {
        every: every as f64,
        secs: secs as f64,
    }))
}

/// The run's name in reports: `chaos:kill-every=20s`, then the outage, pauses, splits and
/// full disks.
pub(super) fn trace_name(s: &Schedule) -> String {
    let mut name = format!("chaos:kill-every={}s", s.kill_every);
    if let Some(o) = s.outage {
        name += &format!(":outage={}s+{}s", o.at, o.secs);
    }
    if let Some(p) = s.pauses {
        name += &format!(":pause-every={}s+{}s", p.every, p.secs);
    }
    if let Some(p) = s.partitions {
        name += &format!(":partition-every={}s+{}s", p.every, p.secs);
    }
    if let Some(p) = s.disks_full {
        name += &format!(":disk-full-every={}s+{}s", p.every, p.secs);
    }
    if let Some(secs) = s.clock_skew {
        name += &format!(":clock-skew={secs}s");
    }
    if let Some(p) = s.slow_links {
        name += &format!(
            ":slow-link-every={}s+{}s@{}kbit",
            p.every, p.secs, s.slow_link_kbit
        );
    }
    name
}

/// The schedule the options ask for, or why they are inconsistent.
pub(super) fn of(args: &Args) -> Result<Schedule> {
    if args.kill_every >= args.duration {
        bail!(
            "--kill-every {} must be shorter than --duration {}",
            args.kill_every,
            args.duration
        );
    }
    let duration = args.duration as f64;
    let outage = args.outage_at.map(|at| Outage {
        at: at as f64,
        secs: args.outage_secs as f64,
    });
    if let Some(o) = outage
        && o.at + o.secs >= duration
    {
        bail!(
            "the outage (--outage-at {} --outage-secs {}) must end before --duration {}",
            o.at,
            o.secs,
            args.duration
        );
    }
    let pauses = recurring("pause", args.pause_every, args.pause_secs, args.duration)?;
    let partitions = recurring(
        "partition",
        args.partition_every,
        args.partition_secs,
        args.duration,
    )?;
    let disks_full = recurring(
        "disk-full",
        args.disk_full_every,
        args.disk_full_secs,
        args.duration,
    )?;
    let slow_links = recurring(
        "slow-link",
        args.slow_link_every,
        args.slow_link_secs,
        args.duration,
    )?;
    Ok(Schedule {
        nodes: args.nodes,
        duration,
        kill_every: args.kill_every as f64,
        interval_secs: args.node.interval_secs as f64,
        outage,
        pauses,
        partitions,
        disks_full,
        clock_skew: args.clock_skew,
        slow_links,
        slow_link_kbit: args.slow_link_kbit,
    })
}
