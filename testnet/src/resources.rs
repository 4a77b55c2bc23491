//! What the node processes and the testnet itself cost the machine: resident memory and CPU
//! time, read from `/proc` at every poll, so that a run at scale reports its footprint (RSS per
//! node, in total, and the testnet's own).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Clock ticks per second of `/proc/<pid>/stat` (Linux reports CPU times in USER_HZ, 100 on
/// every architecture, whatever the kernel's own tick rate).
const USER_HZ: f64 = 100.0;

/// The resident set size in KiB from the text of `/proc/<pid>/status` (`VmRSS:   1234 kB`).
pub fn rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User plus system CPU ticks from the text of `/proc/<pid>/stat`: fields 14 and 15, counted
/// after the parenthesised command name (which may itself hold spaces and parentheses).
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    // The fields after the name start at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// One reading of one node process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Its pid.
    pub pid: u32,
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// CPU ticks so far.
    pub ticks: u64,
}

/// Readings over a run.
#[derive(Debug, Default)]
pub struct ResourceLedger {
    peak_total_kib: u64,
    peak_node_kib: u64,
    node_sum_kib: u64,
    node_readings: u64,
    testnet_peak_kib: u64,
    /// The latest tick count of every process seen (a killed one keeps its last).
    ticks: BTreeMap<u32, u64>,
}

/// The run report's `"resources"` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceReport {
    /// Most resident memory of all nodes at once, MiB.
    pub nodes_peak_total_mib: f64,
    /// Most resident memory of one node, MiB.
    pub node_peak_mib: f64,
    /// Mean resident memory of a node over every reading, MiB.
    pub node_mean_mib: f64,
    /// CPU time of every node process, seconds.
    pub nodes_cpu_secs: f64,
    /// Most resident memory of the testnet process itself, MiB.
    pub testnet_peak_mib: f64,
}

impl ResourceLedger {
    /// Reads the processes `pids` and this process from `/proc`; a process that is gone is
    /// skipped.
    pub fn observe(&mut self, pids: &[u32]) {
        let read = |pid: u32| -> Option<Reading> {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some(Reading {
                pid,
                rss_kib: rss_kib(&status)?,
                ticks: cpu_ticks(&stat)?,
            })
        };
        let readings: Vec<Reading> = pids.iter().filter_map(|&p| read(p)).collect();
        let own = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| rss_kib(&s));
        self.record(&readings, own);
    }

    /// Adds one poll's readings of the nodes and of the testnet's own memory.
    pub fn record(&mut self, nodes: &[Reading], testnet_kib: Option<u64>) {
        let total: u64 = nodes.iter().map(|r| r.rss_kib).sum();
        self.peak_total_kib = self.peak_total_kib.max(total);
        for r in nodes {
            self.peak_node_kib = self.peak_node_kib.max(r.rss_kib);
            self.node_sum_kib += r.rss_kib;
            self.node_readings += 1;
            self.ticks.insert(r.pid, r.ticks);
        }
        if let Some(own) = testnet_kib {
            self.testnet_peak_kib = self.testnet_peak_kib.max(own);
        }
    }

    /// The totals (`None` before any reading).
    pub fn report(&self) -> Option<ResourceReport> {
        if self.node_readings == 0 {
            return None;
        }
        let mib = |kib: u64| kib as f64 / 1024.0;
        Some(ResourceReport {
            nodes_peak_total_mib: mib(self.peak_total_kib),
            node_peak_mib: mib(self.peak_node_kib),
            node_mean_mib: mib(self.node_sum_kib) / self.node_readings as f64,
            nodes_cpu_secs: self.ticks.values().sum::<u64>() as f64 / USER_HZ,
            testnet_peak_mib: mib(self.testnet_peak_kib),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_parsed() {
        let status = "Name:\tparcae-node\nVmPeak:\t  900 kB\nVmRSS:\t  123456 kB\nThreads:\t9\n";
        assert_eq!(rss_kib(status), Some(123_456));
        assert_eq!(rss_kib("Name:\tx\n"), None);
        // A command name with a space and a parenthesis does not shift the fields.
        let stat = "4242 (parcae (node) x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("4242 (x) S 1 2"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(cpu_ticks(&own).is_some());
    }

    #[test]
    fn peaks_means_and_cpu_of_killed_nodes_add_up() {
        let mut ledger = ResourceLedger::default();
        assert_eq!(ledger.report(), None);
        let r = |pid, mib: u64, ticks| Reading {
            pid,
            rss_kib: mib * 1024,
            ticks,
        };
        ledger.record(&[r(1, 100, 50), r(2, 300, 100)], Some(64 * 1024));
        // Node 2 was killed; node 1 grew.
        ledger.record(&[r(1, 200, 150)], Some(32 * 1024));
        let rep = ledger.report().unwrap();
        assert_eq!(rep.nodes_peak_total_mib, 400.0);
        assert_eq!(rep.node_peak_mib, 300.0);
        assert_eq!(rep.node_mean_mib, 200.0);
        assert_eq!(rep.nodes_cpu_secs, 2.5);
        assert_eq!(rep.testnet_peak_mib, 64.0);
    }
}
