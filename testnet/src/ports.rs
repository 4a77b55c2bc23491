//! Loopback ports for node processes that a harness starts.
//!
//! A port that the OS picks with `bind(0)` comes from the ephemeral range, which the running
//! nodes' outgoing connections draw their source ports from too: between the harness
//! reserving it and the child binding it, a node can take it and the child fails with
//! "address in use". Ports handed out here come from below the ephemeral range, each once per
//! process, starting at an offset hashed from the process id so that concurrent harnesses do
//! not walk the same sequence (two started together have neighbouring ids, and offsets that
//! were the ids themselves made their sequences overlap from the second port on).

use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};

/// Lowest port handed out.
const FLOOR: u16 = 10_000;
/// Ephemeral range start assumed where the kernel does not say (Linux's default).
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;

/// A free TCP port on 127.0.0.1 that no outgoing connection will take: bindable now, never
/// handed out before by this process. Falls back to an OS-chosen port when the whole range
/// below the ephemeral ports is taken.
pub fn reserve_loopback_port() -> std::io::Result<u16> {
    static NEXT: OnceLock<Mutex<u16>> = OnceLock::new();
    let (low, high) = reserved_range();
    let span = high - low;
    let start = low + start_offset(std::process::id(), span);
    let mut next = NEXT
        .get_or_init(|| Mutex::new(start))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    for _ in 0..span {
        let port = *next;
        *next = if port + 1 >= high { low } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where in a range of `span` ports the harness of process `pid` starts: Fibonacci hashing
/// spreads neighbouring ids across the whole range.
fn start_offset(pid: u32, span: u16) -> u16 {
    let hashed = u64::from(pid).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (hashed % u64::from(span.max(1))) as u16
}

/// `[low, high)`: the ports below the kernel's ephemeral range.
fn reserved_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW);
    if ephemeral_low > FLOOR + 1_000 {
        (FLOOR, ephemeral_low)
    } else {
        (
            ephemeral_low.saturating_sub(1_000).max(1_024),
            ephemeral_low.max(2_048),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harnesses_with_neighbouring_process_ids_start_far_apart() {
        let span = 22_768;
        for pid in [1u32, 6_166, 40_000, 4_194_303] {
            let a = i32::from(start_offset(pid, span));
            let b = i32::from(start_offset(pid + 1, span));
            assert!(a < i32::from(span) && b < i32::from(span));
            // A 64-node run takes 128 ports: the two sequences (which wrap) must not meet.
            let apart = (a - b).abs().min(i32::from(span) - (a - b).abs());
            assert!(apart > 256, "pid {pid}: {a} and {b}");
        }
    }

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let (_, high) = reserved_range();
        let ports: Vec<u16> = (0..50).map(|_| reserve_loopback_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|&p| p < high), "{ports:?} below {high}");
        for p in ports {
            TcpListener::bind(("127.0.0.1", p)).expect("still free");
        }
    }
}
