//! The pacing decorators: a stage's neighbours and its collective as the emulated hardware
//! would serve them (on a real device, [`StepPacing`] without a clock, they pass straight
//! through). Computation is paced when the driver reports it (`computed`), transfers by
//! their receiver, the all-reduce after the real one: the real exchange ends when the last
//! replica arrived, where the emulated ring starts, so each replica then waits the ring's
//! whole time.
//!
//! Every activation and gradient carries its emulated arrival (the last 8 bytes: its
//! sender's place on the emulated timeline, [`Pacer::stamp`], plus the link's time,
//! [`arrival`]), and its receiver resumes from there ([`Pacer::received`]): the sender goes on
//! computing while the link carries it, and the time the host takes to deliver a message
//! between processes is owed and repaid from the next waits rather than added to every
//! pipeline crossing. The same holds for the other
//! exchanges of a step: the clipping norm's messages along the pipeline are stamped
//! ([`StepPacing::stamped`]), and the emulated ring starts at the latest replica's entry
//! (`Collective::all_reduce_mean_entered`), not when the host's exchange ends.

use std::time::Duration;

use parcae_model::{Collective, ModelError, Neighbours, Op};

use super::costs::EmulatedStage;
use super::pacer::{Pacer, arrival};
use super::pacing::StepPacing;

impl<'a> StepPacing<'a> {
    /// `inner` as this step's device serves it.
    pub fn neighbours<'n, N>(&self, inner: &'n mut N) -> PacedNeighbours<'n, N>
    where
        'a: 'n,
    {
        PacedNeighbours {
            inner,
            clock: self.clock,
            free: LinksFree::default(),
        }
    }

    /// `inner` as this step's device takes `reduction`.
    pub fn collective<'n, C>(
        &self,
        inner: &'n mut C,
        reduction: Reduction,
    ) -> PacedCollective<'n, C>
    where
        'a: 'n,
    {
        let takes = |stage: EmulatedStage| match reduction {
            Reduction::Gradients => stage.all_reduce,
            Reduction::Round => stage.round,
        };
        PacedCollective {
            inner,
            clock: self.clock.map(|(stage, pacer)| (takes(stage), pacer)),
        }
    }

    /// The reduction of a stage without replicas: the first stage of several still reduces the
    /// tied embedding with the last stage on the emulated hardware (its `all_reduce`; nothing
    /// for any other stage), which this node's model, untied, does not exchange.
    pub fn reduced_alone(&self) {
        if let Some((stage, pacer)) = self.clock
            && !stage.all_reduce.is_zero()
        {
            pacer.after_sync(stage.all_reduce);
        }
    }

    /// This node's place on the emulated timeline now (`None` on a real device).
    pub fn stamp(&self) -> Option<u64> {
        self.clock.map(|(_, pacer)| pacer.stamp())
    }

    /// `bytes` to send to a neighbour outside the 1F1B schedule, stamped on an emulated device.
    pub fn stamped(&self, bytes: Vec<u8>) -> Vec<u8> {
        match self.clock {
            Some((_, pacer)) => stamped(bytes, pacer),
            None => bytes,
        }
    }

    /// `bytes` received from a neighbour outside the 1F1B schedule, unstamped and the receipt
    /// reported on an emulated device.
    pub fn unstamped(&self, bytes: Vec<u8>) -> Result<Vec<u8>, ModelError> {
        match self.clock {
            Some((_, pacer)) => unstamped(bytes, pacer),
            None => Ok(bytes),
        }
    }
}

/// `inner` with every operation taking what it takes on the emulated hardware.
pub struct PacedNeighbours<'a, N> {
    inner: &'a mut N,
    clock: Option<(EmulatedStage, &'a Pacer)>,
    free: LinksFree,
}

/// Until when each emulated link to a neighbour carries what was last sent on it (wall-clock
/// nanoseconds, as [`Pacer::stamp`]).
#[derive(Debug, Default, Clone, Copy)]
struct LinksFree {
    next: u64,
    prev: u64,
}

impl<'a, N> PacedNeighbours<'a, N> {
    /// Paces `inner` to `stage` through `pacer`.
    pub fn new(inner: &'a mut N, stage: EmulatedStage, pacer: &'a Pacer) -> Self {
        Self {
            inner,
            clock: Some((stage, pacer)),
            free: LinksFree::default(),
        }
    }
}

/// Bytes of the emulated timestamp at the end of every paced message.
const STAMP_LEN: usize = 8;

/// `bytes` with the sender's emulated time appended.
fn stamped(bytes: Vec<u8>, pacer: &Pacer) -> Vec<u8> {
    stamped_at(bytes, pacer.stamp())
}

/// `bytes` with their emulated arrival `at` appended.
fn stamped_at(mut bytes: Vec<u8>, at: u64) -> Vec<u8> {
    bytes.extend_from_slice(&at.to_le_bytes());
    bytes
}

/// `bytes` sent now by `pacer`'s node over a link that takes `link` and carries earlier
/// messages until `free`, stamped with their emulated arrival (which then holds the link).
fn sent_over(bytes: Vec<u8>, pacer: &Pacer, link: Duration, free: &mut u64) -> Vec<u8> {
    *free = arrival(pacer.stamp(), *free, link);
    stamped_at(bytes, *free)
}

/// A received message without its stamp, the receipt reported to `pacer`.
fn unstamped(mut bytes: Vec<u8>, pacer: &Pacer) -> Result<Vec<u8>, ModelError> {
    let Some(at) = bytes.len().checked_sub(STAMP_LEN) else {
        return Err(ModelError::Truncated {
            what: "emulated timestamp of a neighbour's message (is every node emulated?)",
            needed: STAMP_LEN,
            available: bytes.len(),
        });
    };
    let mut stamp = [0u8; STAMP_LEN];
    stamp.copy_from_slice(&bytes[at..]);
    bytes.truncate(at);
    pacer.received(u64::from_le_bytes(stamp));
    Ok(bytes)
}

/// A received message without its stamp, when it crossed a paced link.
fn received(bytes: Option<Vec<u8>>, pacer: Option<&Pacer>) -> Result<Option<Vec<u8>>, ModelError> {
    match (bytes, pacer) {
        (Some(bytes), Some(pacer)) => Ok(Some(unstamped(bytes, pacer)?)),
        (bytes, _) => Ok(bytes),
    }
}

impl<N: Neighbours> Neighbours for PacedNeighbours<'_, N> {
    type Error = N::Error;

    fn recv_activation(&mut self, mb: usize) -> Result<Option<Vec<u8>>, Self::Error> {
        let bytes = self.inner.recv_activation(mb)?;
        Ok(received(bytes, self.clock.map(|(_, p)| p))?)
    }

    fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error> {
        let bytes = match self.clock {
            Some((stage, pacer)) => sent_over(bytes, pacer, stage.to_next, &mut self.free.next),
            None => bytes,
        };
        self.inner.send_activation(mb, bytes)
    }

    fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>, Self::Error> {
        let bytes = self.inner.recv_grad(mb)?;
        Ok(received(bytes, self.clock.map(|(_, p)| p))?)
    }

    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error> {
        let bytes = match self.clock {
            Some((stage, pacer)) => sent_over(bytes, pacer, stage.to_prev, &mut self.free.prev),
            None => bytes,
        };
        self.inner.send_grad(mb, bytes)
    }

    fn computed(&mut self, op: Op, real: Duration) -> Result<(), Self::Error> {
        if let Some((stage, pacer)) = self.clock {
            let emulated = match op {
                Op::Forward(_) | Op::Evaluate(_) => stage.forward,
                Op::Backward(_) => stage.backward,
            };
            pacer.after(real, emulated);
        }
        self.inner.computed(op, real)
    }
}

/// Which all-reduce of a step is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// The gradients' ([`EmulatedStage::all_reduce`]).
    Gradients,
    /// A DiLoCo round's pseudo-gradients, by zone in the wire form ([`EmulatedStage::round`]).
    Round,
}

/// `inner` with the reduction taking what its all-reduce takes on the emulated links.
pub struct PacedCollective<'a, C> {
    inner: &'a mut C,
    clock: Option<(Duration, &'a Pacer)>,
}

impl<'a, C> PacedCollective<'a, C> {
    /// Paces `inner` through `pacer` to an all-reduce that `takes` on the emulated links.
    pub fn new(inner: &'a mut C, takes: Duration, pacer: &'a Pacer) -> Self {
        Self {
            inner,
            clock: Some((takes, pacer)),
        }
    }
}

impl<C: Collective> Collective for PacedCollective<'_, C> {
    type Error = C::Error;

    fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), Self::Error> {
        let Some((takes, pacer)) = self.clock else {
            return self.inner.all_reduce_mean(values);
        };
        let latest = self.inner.all_reduce_mean_entered(values, pacer.stamp())?;
        pacer.received(latest);
        pacer.after_sync(takes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulate::Overrun;
    use crate::emulate::pacer::wall_nanos;
    use parcae_model::ModelError;
    use std::sync::Arc;
    use std::time::Instant;

    /// Records when each message left, and hands the messages sent back as received ones.
    #[derive(Default)]
    struct Clocked {
        sent: Vec<(usize, Instant)>,
        wire: Vec<Vec<u8>>,
    }

    impl Neighbours for Clocked {
        type Error = ModelError;
        fn recv_activation(&mut self, _: usize) -> Result<Option<Vec<u8>>, ModelError> {
            Ok(self.wire.pop())
        }
        fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), ModelError> {
            self.sent.push((mb, Instant::now()));
            self.wire.push(bytes);
            Ok(())
        }
        fn recv_grad(&mut self, _: usize) -> Result<Option<Vec<u8>>, ModelError> {
            Ok(self.wire.pop())
        }
        fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), ModelError> {
            self.sent.push((mb, Instant::now()));
            self.wire.push(bytes);
            Ok(())
        }
    }

    impl Collective for Clocked {
        type Error = ModelError;
        fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), ModelError> {
            values.iter_mut().for_each(|v| *v /= 2.0);
            Ok(())
        }
    }

    fn stage() -> EmulatedStage {
        let ms = Duration::from_millis;
        EmulatedStage {
            forward: ms(30),
            backward: ms(40),
            optimizer: ms(0),
            to_next: ms(20),
            to_prev: ms(20),
            all_reduce: ms(25),
            round: ms(0),
            state: ms(0),
        }
    }

    #[test]
    fn a_forward_holds_its_sender_and_the_activation_only_its_receiver() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        let mut inner = Clocked::default();
        let link = Duration::from_millis(500);
        let slow_link = EmulatedStage {
            to_next: link,
            ..stage()
        };
        let started = Instant::now();
        let mut paced = PacedNeighbours::new(&mut inner, slow_link, &pacer);
        paced
            .computed(Op::Forward(0), Duration::from_millis(1))
            .unwrap();
        paced.send_activation(0, vec![1]).unwrap();
        paced.send_activation(1, vec![2]).unwrap();
        // 30 ms of forward (1 of them real, reported as already spent); the link carries the
        // activations while the sender goes on (it used to wait the link's 500 ms first).
        let sent = started.elapsed();
        assert!(sent >= Duration::from_millis(29), "{sent:?}");
        assert!(sent < Duration::from_millis(400), "{sent:?}");
        let s = overrun.snapshot();
        assert!((s.busy_secs - 0.030).abs() < 1e-9, "{s:?}");
        // The link carries one at a time: the second arrives a link's time after the first.
        let arrival = |bytes: &Vec<u8>| {
            u64::from_le_bytes(bytes[bytes.len() - STAMP_LEN..].try_into().unwrap())
        };
        let (first, second) = (arrival(&inner.wire[0]), arrival(&inner.wire[1]));
        assert_eq!(second - first, link.as_nanos() as u64);
        // Its receiver, asking at once, waits for the emulated arrival.
        inner.wire.truncate(1);
        let mut paced = PacedNeighbours::new(&mut inner, slow_link, &pacer);
        assert_eq!(paced.recv_activation(0).unwrap(), Some(vec![1]));
        assert!(started.elapsed() >= Duration::from_millis(529));
        // A slow backward is an overrun, not hidden.
        paced
            .computed(Op::Backward(0), Duration::from_millis(45))
            .unwrap();
        let s = overrun.snapshot();
        assert!(s.overrun_secs >= 0.005, "{s:?}");
    }

    #[test]
    fn a_message_crosses_with_its_stamp_and_arrives_as_it_was_sent() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let mut inner = Clocked::default();
        let mut paced = PacedNeighbours::new(&mut inner, stage(), &pacer);
        paced.send_grad(3, vec![7, 8, 9]).unwrap();
        assert_eq!(paced.recv_grad(3).unwrap(), Some(vec![7, 8, 9]));
        assert_eq!(paced.recv_grad(3).unwrap(), None);
        // An unpaced neighbour's message has no stamp: a clear refusal, not a wrong decode.
        inner.wire.push(vec![1, 2]);
        let err = PacedNeighbours::new(&mut inner, stage(), &pacer)
            .recv_activation(0)
            .unwrap_err();
        assert!(err.to_string().contains("is every node emulated"), "{err}");
    }

    /// A ring whose latest replica entered at a given place on the emulated timeline.
    struct EnteredAt(u64);

    impl Collective for EnteredAt {
        type Error = ModelError;
        fn all_reduce_mean(&mut self, _: &mut [f32]) -> Result<(), ModelError> {
            Ok(())
        }
        fn all_reduce_mean_entered(&mut self, _: &mut [f32], _: u64) -> Result<u64, ModelError> {
            Ok(self.0)
        }
    }

    #[test]
    fn the_ring_starts_at_the_latest_entry_and_what_the_host_added_is_owed() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        pacer.after(Duration::ZERO, Duration::ZERO);
        // Every replica entered 100 ms ago and the host's exchange took until now: the 25 ms
        // ring ended 75 ms ago on the emulated cluster, so nothing is waited and 75 ms is owed
        // to the next waits (waiting out the ring from now would lose 100 ms a step).
        let entered = wall_nanos() - 100_000_000;
        std::thread::sleep(Duration::from_millis(100));
        PacedCollective::new(&mut EnteredAt(entered), stage().all_reduce, &pacer)
            .all_reduce_mean(&mut [1.0])
            .unwrap();
        let owed = Duration::from_nanos(wall_nanos().saturating_sub(pacer.stamp()));
        assert!(owed >= Duration::from_millis(60), "{owed:?}");
    }

    #[test]
    fn a_message_outside_the_schedule_is_stamped_only_on_an_emulated_device() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let clock = Some((stage(), &pacer));
        let emulated = StepPacing { clock };
        let sent = emulated.stamped(vec![4, 2]);
        assert_eq!(sent.len(), 2 + STAMP_LEN);
        assert_eq!(emulated.unstamped(sent).unwrap(), vec![4, 2]);
        let real = StepPacing::default();
        assert_eq!(real.stamped(vec![4, 2]), vec![4, 2]);
        assert_eq!(real.unstamped(vec![4, 2]).unwrap(), vec![4, 2]);
        assert_eq!(real.stamp(), None);
    }

    #[test]
    fn a_stage_without_replicas_waits_only_for_what_its_emulated_model_ties() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let started = Instant::now();
        StepPacing {
            clock: Some((stage(), &pacer)),
        }
        .reduced_alone();
        assert!(started.elapsed() >= Duration::from_millis(25));
        // A real device, and an emulated stage that ties nothing, wait for nothing.
        let untied = EmulatedStage {
            all_reduce: Duration::ZERO,
            ..stage()
        };
        let started = Instant::now();
        StepPacing::default().reduced_alone();
        StepPacing {
            clock: Some((untied, &pacer)),
        }
        .reduced_alone();
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn the_collective_reduces_then_waits_out_the_ring() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let mut inner = Clocked::default();
        let mut values = [2.0f32, 4.0];
        let started = Instant::now();
        PacedCollective::new(&mut inner, stage().all_reduce, &pacer)
            .all_reduce_mean(&mut values)
            .unwrap();
        assert_eq!(values, [1.0, 2.0]);
        assert!(started.elapsed() >= Duration::from_millis(25));
    }

    #[test]
    fn a_round_waits_out_its_own_exchange_and_a_real_device_none() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let slow_round = EmulatedStage {
            round: Duration::from_millis(300),
            ..stage()
        };
        let emulated = StepPacing {
            clock: Some((slow_round, &pacer)),
        };
        let mut inner = Clocked::default();
        let mut values = [2.0f32, 4.0];
        let started = Instant::now();
        emulated
            .collective(&mut inner, Reduction::Round)
            .all_reduce_mean(&mut values)
            .unwrap();
        assert_eq!(values, [1.0, 2.0]);
        assert!(started.elapsed() >= Duration::from_millis(300));
        let started = Instant::now();
        StepPacing::default()
            .collective(&mut inner, Reduction::Round)
            .all_reduce_mean(&mut values)
            .unwrap();
        assert_eq!(values, [0.5, 1.0]);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
