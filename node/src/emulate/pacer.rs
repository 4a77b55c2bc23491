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

/// How long to sleep for a wait of `wait` that follows `gap` of host time outside paced work
/// since the node's last paced wait, when it owed `lag` then: the new lag and the sleep.
///
/// A sleep wakes late by the time its thread waits for a core (milliseconds where many nodes
/// share two: 32 emulated nodes at a time scale of 5 overslept by 45 % of what they asked for),
/// and the host spends time between paced operations that the emulated device does not (it
/// hands a message to its link, prepares the next micro-batch, waits for a core, while a GPU
/// runs its queued kernels back to back). An emulated device that lost that time on every
/// operation would run slower than the profile says (5-7 % a step at 32 nodes on two cores).
/// So it is owed and paid from the next waits, as a frame limiter paces to deadlines rather
/// than durations. The device's idle periods end in a receipt ([`Pacer::received`]: a
/// neighbour's message, the ring's latest entry, a commit) or a reconfiguration
/// ([`Pacer::after_reconfiguration`]), which settle what is owed.
pub fn catch_up(lag: Duration, gap: Duration, wait: Duration) -> (Duration, Duration) {
    let lag = lag + gap;
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

/// Where on the emulated timeline a message arrives that leaves at `leaves` over a link that
/// takes `link` to carry it and is still carrying an earlier one until `free` (nanoseconds on
/// the wall clock, as [`Pacer::stamp`]).
///
/// The link, not the sender's device, carries it: a stage hands its activation to the link and
/// goes on computing, as the cost model's 1F1B schedule has it (a crossing delays only its
/// receiver) and as this node's links do (a writer task per link). A link carries one message
/// at a time, so one sent while the last is still crossing waits for it.
pub fn arrival(leaves: u64, free: u64, link: Duration) -> u64 {
    leaves.max(free).saturating_add(nanos(link))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
        total.fetch_add(nanos(d), Ordering::Relaxed);
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

    /// Sleeps `wait` for work that began at `began`, less the lateness owed ([`catch_up`]),
    /// and owes what this sleep wakes late.
    fn wait(&self, began: Instant, wait: Duration) {
        let sleep = {
            let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
            let gap = clock
                .last_end
                .map_or(Duration::ZERO, |end| began.saturating_duration_since(end));
            let (lag, sleep) = catch_up(clock.lag, gap, wait);
            clock.lag = self.carried(lag);
            sleep
        };
        let asleep = Instant::now();
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }
        let woke = Instant::now();
        let late = woke.saturating_duration_since(asleep).saturating_sub(sleep);
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.lag = self.carried(clock.lag + late);
        clock.last_end = Some(woke);
    }

    /// What of `lag` is carried on: beyond [`MAX_LAG`] the host has fallen behind the emulated
    /// device for good, and the excess is an overrun.
    fn carried(&self, lag: Duration) -> Duration {
        self.record(lag.saturating_sub(MAX_LAG));
        lag.min(MAX_LAG)
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
    /// The node idled until the plan came, so it owes nothing from before it.
    pub fn after_reconfiguration(&self, real: Duration, emulated: Duration) {
        Overrun::add(&self.overrun.busy_ns, emulated);
        let began = Instant::now()
            .checked_sub(real)
            .unwrap_or_else(Instant::now);
        self.idle_until(began);
        let rest = match pace(real, emulated) {
            Pace::Wait(rest) => rest,
            Pace::Overrun(_) => Duration::ZERO,
        };
        self.wait(began, rest);
    }

    /// Where this node stands on the emulated timeline, as a stamp for a message it sends:
    /// the wall clock less the lateness it owes.
    pub fn stamp(&self) -> u64 {
        let lag = self.clock.lock().unwrap_or_else(|e| e.into_inner()).lag;
        wall_nanos().saturating_sub(nanos(lag))
    }

    /// A message whose emulated arrival is `stamp` ([`Pacer::stamp`], [`arrival`]) has just
    /// been received: the node resumes where the emulated hardware would. One already there
    /// is owed from ([`lag_on_receipt`]); one still on the emulated link is waited for, as its
    /// receiver idles on the emulated cluster (never longer than [`MAX_LAG`]: a stamp further
    /// ahead comes from another host's clock, not the link).
    pub fn received(&self, stamp: u64) {
        let now = wall_nanos();
        if stamp > now {
            let early = Duration::from_nanos(stamp - now).min(MAX_LAG);
            // Idle until the message arrives: nothing owed, and the time since the last paced
            // work was idle too, not host time to repay from this wait.
            let asked = Instant::now();
            self.idle_until(asked);
            self.wait(asked, early);
            return;
        }
        let late = Duration::from_nanos(now - stamp);
        let now = Instant::now();
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let gap = clock
            .last_end
            .map_or(Duration::ZERO, |end| now.saturating_duration_since(end));
        clock.lag = lag_on_receipt(clock.lag, gap, late);
        clock.last_end = Some(now);
    }

    /// The node enters a plan, or retries a step in the plan it is in, without emulated work
    /// to pace: it idled until now, so it owes nothing from before (a wait for a step that
    /// timed out, or the measuring before the first plan, is not host time to repay).
    pub fn idled(&self) {
        self.idle_until(Instant::now());
    }

    /// The device idled until `at`: nothing owed, and the next gap counts from there.
    fn idle_until(&self, at: Instant) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.lag = Duration::ZERO;
        clock.last_end = Some(at);
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
    fn lateness_and_host_time_between_operations_are_caught_up() {
        let ms = Duration::from_millis;
        // Woke 3 ms late: the next 10 ms wait sleeps 7.
        assert_eq!(catch_up(ms(3), ms(0), ms(10)), (ms(0), ms(7)));
        // More owed than the wait: no sleep, the rest owed on.
        assert_eq!(catch_up(ms(15), ms(0), ms(10)), (ms(5), ms(0)));
        // 2 ms of host time before the work began is owed too (it used to be taken for idle
        // time on the device, and lost: 3 ms owed on instead of 7).
        assert_eq!(catch_up(ms(15), ms(2), ms(10)), (ms(7), ms(0)));
        assert_eq!(catch_up(ms(0), ms(4), ms(10)), (ms(0), ms(6)));
        assert_eq!(catch_up(ms(0), ms(0), ms(0)), (ms(0), ms(0)));
    }

    #[test]
    fn work_in_a_row_with_host_time_between_takes_its_emulated_time() {
        let pacer = Pacer::default();
        let started = Instant::now();
        for _ in 0..20 {
            // 4 ms of host time, then work that takes 10 ms on the emulated device.
            std::thread::sleep(Duration::from_millis(4));
            pacer.after(Duration::ZERO, Duration::from_millis(10));
        }
        // 200 ms of device time; the host's 80 ms were repaid from the waits (they used to
        // be added: 280 ms and more).
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_millis(260), "{took:?}");
    }

    #[test]
    fn lateness_past_what_a_pacer_carries_is_an_overrun() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        pacer.after(Duration::ZERO, Duration::ZERO);
        std::thread::sleep(MAX_LAG + Duration::from_millis(200));
        pacer.after(Duration::ZERO, Duration::from_millis(10));
        let s = overrun.snapshot();
        assert!(s.count >= 1, "{s:?}");
        assert!(s.overrun_secs >= 0.19 && s.overrun_secs < 1.0, "{s:?}");
        assert_eq!(pacer.clock.lock().unwrap().lag, MAX_LAG);
        // A reconfiguration starts from idle: nothing owed from before it.
        pacer.after_reconfiguration(Duration::ZERO, Duration::ZERO);
        assert!(pacer.clock.lock().unwrap().lag < Duration::from_millis(100));
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
        // A message still 50 ms out on the emulated link is waited for, and what was owed
        // is gone (the node idled until it came): only the sleep's own lateness is owed.
        let asked = Instant::now();
        pacer.received(wall_nanos() + 50_000_000);
        let waited = asked.elapsed();
        assert!(waited >= Duration::from_millis(49), "{waited:?}");
        let owed = pacer.clock.lock().unwrap().lag;
        assert!(
            owed <= waited.saturating_sub(Duration::from_millis(45)),
            "{owed:?}"
        );
        // A stamp far ahead is another host's clock, not the link: waited no longer than the
        // most a pacer carries.
        let asked = Instant::now();
        pacer.received(wall_nanos() + 60_000_000_000);
        assert!(asked.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_message_still_on_the_link_is_waited_for_whatever_idled_before() {
        let pacer = Pacer::default();
        pacer.after(Duration::ZERO, Duration::ZERO);
        // The node idled 100 ms for the message, which the host delivered 50 ms before its
        // emulated arrival: it waits the 50 ms (the idle time used to be repaid from them).
        std::thread::sleep(Duration::from_millis(100));
        let asked = Instant::now();
        pacer.received(wall_nanos() + 50_000_000);
        let waited = asked.elapsed();
        assert!(waited >= Duration::from_millis(49), "{waited:?}");
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
    fn a_message_arrives_a_link_time_after_it_leaves_or_after_the_one_before_it() {
        let ms = |n: u64| n * 1_000_000;
        let link = Duration::from_millis(20);
        assert_eq!(arrival(ms(100), ms(0), link), ms(120));
        // The link carries the last message until 130 ms: this one follows it.
        assert_eq!(arrival(ms(100), ms(130), link), ms(150));
        assert_eq!(arrival(u64::MAX, 0, link), u64::MAX);
    }
}
