//! A node process killed with SIGKILL restarts from its directory with its log and state intact.
//!
//! A test binary of its own: a child spawned while another test thread reopens a raft-engine
//! directory briefly holds a copy of every descriptor the parent has open (between fork and exec),
//! the engine's exclusive `LOCK` included, so a simulated crash-and-restart in the same process
//! failed to lock its directory now and then ("Resource temporarily unavailable").

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const PROBE: &str = env!("CARGO_BIN_EXE_consensus-probe");

struct Recovered {
    samples: u64,
    last: i64,
    contiguous: bool,
}

fn parse_recovered(line: &str) -> Recovered {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_owned()
    };
    Recovered {
        samples: field("samples").parse().unwrap(),
        last: field("last").parse().unwrap(),
        contiguous: field("contiguous") == "true",
    }
}

/// Runs the probe, SIGKILLs it after `kill_after` acknowledged commands; returns the recovery
/// line and the last acknowledged interval.
fn run_and_kill(dir: &Path, kill_after: usize) -> (Recovered, i64) {
    let mut child = Command::new(PROBE)
        .arg(dir)
        .arg("1000000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let recovered = parse_recovered(&lines.next().unwrap().unwrap());
    let mut last_acked = recovered.last;
    for _ in 0..kill_after {
        let line = lines.next().unwrap().unwrap();
        last_acked = line.strip_prefix("acked ").unwrap().parse().unwrap();
    }
    // std's Child::kill sends SIGKILL on Unix: no destructor, no flush, no clean shutdown.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    (recovered, last_acked)
}

#[test]
fn sigkilled_process_recovers_log_and_state() {
    let dir = tempfile::tempdir().unwrap();
    let (first, acked1) = run_and_kill(dir.path(), 150);
    assert_eq!((first.samples, first.last), (0, -1));
    let (second, acked2) = run_and_kill(dir.path(), 100);
    assert!(second.contiguous);
    assert!(
        second.last >= acked1,
        "acked {acked1} but recovered up to {}",
        second.last
    );
    assert_eq!(second.samples as i64, second.last + 1);
    let out = Command::new(PROBE)
        .arg(dir.path())
        .arg("0")
        .output()
        .unwrap();
    assert!(out.status.success());
    let third = parse_recovered(String::from_utf8_lossy(&out.stdout).lines().next().unwrap());
    assert!(third.contiguous);
    assert!(
        third.last >= acked2,
        "acked {acked2} but recovered up to {}",
        third.last
    );
}
