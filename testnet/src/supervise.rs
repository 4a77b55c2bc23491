//! Child process supervision, shared by the testnet and the multi-process tests: every node
//! process either starts is registered here and is SIGKILLed and reaped on every exit path.
//!
//! Three layers make orphans impossible in practice:
//! * [`Supervisor`] kills and reaps every registered child when dropped, so an error returned
//!   anywhere in a run (or a panic unwinding through it) stops the whole cluster;
//! * the testnet's `Interrupt` turns SIGINT, SIGTERM and SIGHUP into a flag that the run loop
//!   checks, so Ctrl-C unwinds through the same drop; a second signal exits at once;
//! * each child asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), which
//!   covers the testnet or a test binary itself being SIGKILLed.
//!
//! Each child also gets its own process group, so a terminal's Ctrl-C reaches only its parent
//! (which then stops the nodes) rather than racing it with SIGINT notices to every node.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpid, getppid};

/// What to start: program, arguments, extra environment, and the file for stdout and stderr.
pub struct Spawn<'a> {
    /// Executable.
    pub program: &'a Path,
    /// Arguments.
    pub args: &'a [String],
    /// Extra environment variables.
    pub env: &'a [(&'a str, String)],
    /// Log file receiving stdout and stderr (appended to).
    pub log: &'a Path,
}

/// Index of a child in its [`Supervisor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildId(usize);

struct Managed {
    child: Option<Child>,
    started: Instant,
}

/// Registry of running children; kills them all when dropped.
#[derive(Default)]
pub struct Supervisor {
    children: Vec<Managed>,
}

impl Supervisor {
    /// Starts a child in its own process group that dies with its parent.
    pub fn spawn(&mut self, s: &Spawn<'_>) -> std::io::Result<ChildId> {
        let log = File::options().create(true).append(true).open(s.log)?;
        let err = log.try_clone()?;
        let parent = getpid();
        let mut cmd = Command::new(s.program);
        cmd.args(s.args)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        for (k, v) in s.env {
            cmd.env(k, v);
        }
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec, as
        // `pre_exec` requires.
        unsafe {
            cmd.pre_exec(move || {
                set_pdeathsig(Signal::SIGKILL)?;
                // The parent may have died between fork and prctl: then nobody will kill us
                // (an error here makes the child exit before exec).
                if getppid() != parent {
                    return Err(std::io::Error::other("the parent exited"));
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        self.children.push(Managed {
            child: Some(child),
            started: Instant::now(),
        });
        Ok(ChildId(self.children.len() - 1))
    }

    /// Sends `sig` to a running child (and its process group).
    pub fn signal(&self, id: ChildId, sig: Signal) {
        if let Some(child) = self.children.get(id.0).and_then(|m| m.child.as_ref()) {
            // The process group of a child we spawned and have not reaped, so its id cannot
            // have been reused; a group already gone is not an error here.
            let _ = killpg(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// SIGKILLs a child's process group and reaps it; a no-op for an exited child.
    pub fn kill(&mut self, id: ChildId) {
        self.signal(id, Signal::SIGKILL);
        if let Some(mut child) = self.children.get_mut(id.0).and_then(|m| m.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The child's exit status if it has exited (it is then reaped and forgotten).
    pub fn try_exit(&mut self, id: ChildId) -> Option<ExitStatus> {
        let managed = self.children.get_mut(id.0)?;
        let status = managed.child.as_mut()?.try_wait().ok().flatten()?;
        managed.child = None;
        Some(status)
    }

    /// The process id of a running child.
    pub fn pid(&self, id: ChildId) -> Option<u32> {
        Some(self.children.get(id.0)?.child.as_ref()?.id())
    }

    /// Time since the child was started.
    pub fn age(&self, id: ChildId) -> Duration {
        self.children
            .get(id.0)
            .map_or(Duration::ZERO, |m| m.started.elapsed())
    }

    /// Kills and reaps every child.
    pub fn kill_all(&mut self) {
        for i in 0..self.children.len() {
            self.kill(ChildId(i));
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The last `lines` lines of a log file (empty if unreadable) without terminal colour codes,
/// for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    // Logs can be large; only the end matters.
    let start = text.len().saturating_sub(64 * 1024);
    let text = strip_ansi(&String::from_utf8_lossy(&text[start..]));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Removes `ESC [ ... letter` sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_supervisor_kills_and_reaps_children() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let mut sup = Supervisor::default();
        let id = sup
            .spawn(&Spawn {
                program: Path::new("/bin/sleep"),
                args: &["30".to_string()],
                env: &[],
                log: &log,
            })
            .unwrap();
        let pid = sup.children[id.0].child.as_ref().unwrap().id();
        assert!(sup.try_exit(id).is_none(), "still running");
        drop(sup);
        // Reaped: the pid no longer exists (not even as a zombie).
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn exit_status_and_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        let mut sup = Supervisor::default();
        let id = sup
            .spawn(&Spawn {
                program: Path::new("/bin/sh"),
                args: &["-c".into(), "echo one; echo two >&2; exit 3".into()],
                env: &[],
                log: &log,
            })
            .unwrap();
        let status = (0..200)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                sup.try_exit(id)
            })
            .expect("exits");
        assert_eq!(status.code(), Some(3));
        assert!(sup.try_exit(id).is_none(), "reaped once");
        assert_eq!(log_tail(&log, 1), "two");
        assert_eq!(log_tail(&log, 5), "one\ntwo");
        assert_eq!(
            strip_ansi("\u{1b}[2mtime\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x"),
            "time  INFO x"
        );
    }
}
