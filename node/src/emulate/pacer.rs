//! Waiting out the remainder of an emulated duration, and counting what could not be waited
//! out: when real work outlasts its emulated time (the machine is too slow for the requested
//! time scale), the excess is an overrun, reported in `/status`, `/metrics` and the testnet's
//! run report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to do after real work that took `real` when the emulated hardware takes `emulated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Wait this long: the real work was faster.
    Wait(Duration),
    /// The real work was this much slower than the emulated hardware.
    Overrun(Duration),
}

/// The decision: wait the remainder, or count the excess (exactly on time is a zero wait).
pub fn pace(real: Duration, emulated: Duration) -> Pace {
    match emulated.checked_sub(real) {
        Some(rest) => Pace::Wait(rest),
        None => Pace::Overrun(real - emulated),
    }
}

/// The most lateness a pacer carries forward to catch up on.
pub const MAX_LAG: Duration = Duration::from_secs(1);

/// How long to sleep for a wait of `wait` that follows `gap` of unpaced time, when earlier
/// sleeps woke `lag` late: the new lag and the sleep.
///
/// A sleep wakes late by the time its thread waits for a core (milliseconds where many nodes
/// share two: 32 emulated nodes at a time scale of 5 overslept by 45 % of what they asked for),
/// and an emulated device that lost that time on every operation would run half as fast as
/// the profile says. So lateness is owed and paid from the next waits, as a frame limiter
/// paces to deadlines rather than durations. Time the node spends outside paced waits and
/// work (waiting for a neighbour's activation, for the all-reduce, for a commit) absorbs it
/// first: on the emulated hardware the device idles then too, and repaying lateness an idle
/// period already covered would make the next operation faster than the device.
pub fn catch_up(lag: Duration, gap: Duration, wait: Duration) -> (Duration, Duration) {
    let lag = lag.saturating_sub(gap);
    let paid = lag.min(wait);
    (lag - paid, wait - paid)
}

/// What a node owes after receiving a message whose emulated arrival was `late` ago, when it
/// owed `lag` at the end of its last paced wait or receipt, `gap` ago.
///
/// On the emulated hardware the receiver resumes at the later of its own emulated time and
/// the message's arrival, so it owes the time since whichever came last: what it owed plus
/// the time since (the message was already there, and the host spent that time on something
/// the device does not do), or the time since the message arrived (the host's delivery
/// latency: milliseconds per pipeline crossing where 32 nodes share two cores, which a GPU's
/// link does not add). Owing it makes the next waits shorter, as [`catch_up`] does for a
/// late sleep; a node whose real work leaves no slack to repay it overruns instead.
pub fn lag_on_receipt(lag: Duration, gap: Duration, late: Duration) -> Duration {
    (lag + gap).min(late).min(MAX_LAG)
}

/// The wall clock as nanoseconds since the Unix epoch: the one clock that the nodes of a host
/// share (and hosts share as well as they are synchronised).
pub(crate) fn wall_nanos() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
}

/// A pacer's lateness and when its last wait ended.
#[derive(Debug, Default)]
struct Clock {
    lag: Duration,
    last_end: Option<Instant>,
}

/// Overruns so far, shared by the pacers of a node and read by its status and metrics.
#[derive(Debug, Default)]
pub struct Overrun {
    count: AtomicU64,
    overrun_ns: AtomicU64,
    busy_ns: AtomicU64,
}

/// A consistent-enough reading of [`Overrun`] for a report.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OverrunSnapshot {
    /// Pieces of work that outlasted their emulated time.
    pub count: u64,
    /// Their excess, seconds.
    pub overrun_secs: f64,
    /// Emulated busy time paced so far, seconds.
    pub busy_secs: f64,
}

impl OverrunSnapshot {
    /// Overrun as a fraction of the emulated busy time (0 before any work).
    pub fn fraction(&self) -> f64 {
        if self.busy_secs > 0.0 {
            self.overrun_secs / self.busy_secs
        } else {
            0.0
        }
    }
}

impl Overrun {
    /// The totals so far.
    pub fn snapshot(&self) -> OverrunSnapshot {
        let secs = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed)).as_secs_f64();
        OverrunSnapshot {
            count: self.count.load(Ordering::Relaxed),
            overrun_secs: secs(&self.overrun_ns),
            busy_secs: secs(&self.busy_ns),
        }
    }

    fn add(total: &AtomicU64, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        total.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Paces work to emulated durations and counts overruns into a shared [`Overrun`].
///
/// Waits are paced to deadlines: a sleep that wakes late is caught up on the next ones
/// ([`catch_up`]).
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    overrun: Arc<Overrun>,
    clock: Arc<Mutex<Clock>>,
}

impl Pacer {
    /// A pacer counting into `overrun`.
    pub fn new(overrun: Arc<Overrun>) -> Self {
        Self {
            overrun,
            clock: Arc::default(),
        }
    }

    /// Real work that took `real` is done; waits until `emulated` has passed since it began,
    /// or counts the overrun.
    pub fn after(&self, real: Duration, emulated: Duration) {
        Overrun::add(&self.overrun.busy_ns, emulated);
        let began = Instant::now()
            .checked_sub(real)
            .unwrap_or_else(Instant::now);
        match pace(real, emulated) {
            Pace::Wait(rest) => self.wait(began, rest),
            Pace::Overrun(excess) => {
                self.record(excess);
                self.wait(began, Duration::ZERO);
            }
        }
    }

    /// Sleeps `wait` for work or a transfer that began at `began`, less the lateness owed
    /// ([`catch_up`]), and owes what this sleep wakes late.
    fn wait(&self, began: Instant, wait: Duration) {
        let sleep = {
            let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
            let gap = clock
                .last_end
                .map_or(Duration::ZERO, |end| began.saturating_duration_since(end));
            let (lag, sleep) = catch_up(clock.lag, gap, wait);
            clock.lag = lag;
            sleep
        };
        let asleep = Instant::now();
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }
        let woke = Instant::now();
        let late = woke.saturating_duration_since(asleep).saturating_sub(sleep);
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.lag = (clock.lag + late).min(MAX_LAG);
        clock.last_end = Some(woke);
    }

    /// After an exchange with peers, which on the emulated cluster starts when the last of them
    /// arrives: its emulated time, from where the node resumed once the real exchange ended
    /// (the receipt of the latest entry, [`Pacer::received`], owes what the host added).
    /// Waiting is not work, so it is never an overrun.
    pub fn after_sync(&self, emulated: Duration) {
        Overrun::add(&self.overrun.busy_ns, emulated);
        self.wait(Instant::now(), emulated);
    }

    /// After a reconfiguration that took `real`, much of it waiting for peers that
    /// reconfigure too: waits until `emulated` has passed since it began. A longer real one
    /// is not counted as an overrun, for the same reason as in [`Pacer::after_sync`].
    pub fn after_reconfiguration(&self, real: Duration, emulated: Duration) {
        Overrun::add(&self.overrun.busy_ns, emulated);
        let began = Instant::now()
            .checked_sub(real)
            .unwrap_or_else(Instant::now);
        let rest = match pace(real, emulated) {
            Pace::Wait(rest) => rest,
            Pace::Overrun(_) => Duration::ZERO,
        };
        self.wait(began, rest);
    }

    /// Emulates a transfer that takes `emulated` on the emulated link, then does the real one
    /// (`send`): what arrives is never earlier than the emulated link allows. The real
    /// transfer's own time cannot be hidden behind the wait before it, so it counts as
    /// overrun.
    pub fn transfer<T, E>(
        &self,
        emulated: Duration,
        send: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        Overrun::add(&self.overrun.busy_ns, emulated);
        self.wait(Instant::now(), emulated);
        let started = Instant::now();
        let out = send();
        self.record(started.elapsed());
        out
    }

    /// Where this node stands on the emulated timeline, as a stamp for a message it sends:
    /// the wall clock less the lateness it owes.
    pub fn stamp(&self) -> u64 {
        let lag = self.clock.lock().unwrap_or_else(|e| e.into_inner()).lag;
        wall_nanos().saturating_sub(u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A message [`Pacer::stamp`]ed `stamp` by its sender has just been received: the node
    /// resumes where the emulated hardware would ([`lag_on_receipt`]). A stamp from the future
    /// (another host's clock ahead of this one) counts as on time.
    pub fn received(&self, stamp: u64) {
        let late = Duration::from_nanos(wall_nanos().saturating_sub(stamp));
        let now = Instant::now();
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let gap = clock
            .last_end
            .map_or(Duration::ZERO, |end| now.saturating_duration_since(end));
        clock.lag = lag_on_receipt(clock.lag, gap, late);
        clock.last_end = Some(now);
    }

    fn record(&self, excess: Duration) {
        if excess.is_zero() {
            return;
        }
        self.overrun.count.fetch_add(1, Ordering::Relaxed);
        Overrun::add(&self.overrun.overrun_ns, excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_remainder_is_waited_and_the_excess_counted() {
        let ms = Duration::from_millis;
        assert_eq!(pace(ms(3), ms(10)), Pace::Wait(ms(7)));
        assert_eq!(pace(ms(10), ms(10)), Pace::Wait(Duration::ZERO));
        assert_eq!(pace(ms(12), ms(10)), Pace::Overrun(ms(2)));
    }

    #[test]
    fn lateness_is_caught_up_unless_idle_time_absorbed_it() {
        let ms = Duration::from_millis;
        // Woke 3 ms late: the next 10 ms wait sleeps 7.
        assert_eq!(catch_up(ms(3), ms(0), ms(10)), (ms(0), ms(7)));
        // More owed than the wait: no sleep, the rest owed on.
        assert_eq!(catch_up(ms(15), ms(0), ms(10)), (ms(5), ms(0)));
        // Two of the 15 ms went by waiting for a neighbour.
        assert_eq!(catch_up(ms(15), ms(2), ms(10)), (ms(3), ms(0)));
        // An idle gap longer than the lateness absorbs it all.
        assert_eq!(catch_up(ms(5), ms(40), ms(10)), (ms(0), ms(10)));
        assert_eq!(catch_up(ms(0), ms(0), ms(0)), (ms(0), ms(0)));
    }

    #[test]
    fn a_receiver_owes_the_time_since_the_later_of_its_own_clock_and_the_arrival() {
        let ms = Duration::from_millis;
        // Waited for a message that the host delivered 6 ms after its emulated arrival.
        assert_eq!(lag_on_receipt(ms(0), ms(40), ms(6)), ms(6));
        // The message was there before the node asked: it owes its lag and the time since.
        assert_eq!(lag_on_receipt(ms(3), ms(2), ms(500)), ms(5));
        // Delivered exactly on time: whatever it owed was idle time on the device.
        assert_eq!(lag_on_receipt(ms(30), ms(40), ms(0)), ms(0));
        // Never more than the most a pacer carries.
        assert_eq!(lag_on_receipt(ms(0), ms(5_000), ms(4_000)), MAX_LAG);
    }

    #[test]
    fn a_stamp_is_the_wall_clock_less_the_lag_and_a_late_receipt_is_owed() {
        let pacer = Pacer::default();
        let before = wall_nanos();
        let stamp = pacer.stamp();
        assert!(stamp >= before && stamp <= wall_nanos());
        // A message whose emulated arrival was 200 ms ago, received by a node that owed
        // nothing and had just finished a wait: owes the 200 ms (less than the gap it waited).
        pacer.wait(Instant::now(), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(300));
        pacer.received(wall_nanos() - 200_000_000);
        let owed = pacer.clock.lock().unwrap().lag;
        assert!(owed >= Duration::from_millis(200) && owed < Duration::from_millis(300));
        // Its own stamps are that much behind the wall clock now.
        let behind = wall_nanos() - pacer.stamp();
        assert!(behind >= 199_000_000, "{behind}");
        // A stamp from the future is on time: nothing owed.
        pacer.received(wall_nanos() + 1_000_000_000);
        assert_eq!(pacer.clock.lock().unwrap().lag, Duration::ZERO);
    }

    #[test]
    fn paced_work_in_a_row_takes_its_emulated_time_and_never_less() {
        let pacer = Pacer::default();
        let started = Instant::now();
        for _ in 0..40 {
            pacer.after(Duration::ZERO, Duration::from_millis(2));
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(80), "{took:?}");
    }

    #[test]
    fn a_pacer_waits_out_fast_work_and_reports_slow_work() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        let started = Instant::now();
        pacer.after(Duration::from_millis(5), Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(25));
        assert_eq!(overrun.snapshot().count, 0);
        pacer.after(Duration::from_millis(50), Duration::from_millis(20));
        let s = overrun.snapshot();
        assert_eq!(s.count, 1);
        assert!((s.overrun_secs - 0.030).abs() < 1e-9);
        assert!((s.busy_secs - 0.050).abs() < 1e-9);
        assert!((s.fraction() - 0.6).abs() < 1e-9);
    }

    #[test]
    fn waiting_for_peers_is_paced_but_never_an_overrun() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        let started = Instant::now();
        pacer.after_sync(Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(20));
        pacer.after_reconfiguration(Duration::from_millis(90), Duration::from_millis(10));
        let s = overrun.snapshot();
        assert_eq!((s.count, s.overrun_secs), (0, 0.0));
        assert!((s.busy_secs - 0.030).abs() < 1e-9);
    }

    #[test]
    fn a_transfer_arrives_no_earlier_than_the_emulated_link() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        let started = Instant::now();
        let sent: Result<Duration, ()> =
            pacer.transfer(Duration::from_millis(20), || Ok(started.elapsed()));
        assert!(sent.unwrap() >= Duration::from_millis(20));
        assert!((overrun.snapshot().busy_secs - 0.020).abs() < 1e-9);
    }
}
