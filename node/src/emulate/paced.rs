//! The pacing decorators: a stage's neighbours and its collective as the emulated hardware
//! would serve them (on a real device, [`StepPacing`] without a clock, they pass straight
//! through). Computation is paced when the driver reports it (`computed`), transfers
//! before they leave, the all-reduce after the real one: the real exchange ends when the last
//! replica arrived, where the emulated ring starts, so each replica then waits the ring's
//! whole time.
//!
//! Every activation and gradient carries its sender's place on the emulated timeline (the
//! last 8 bytes, [`Pacer::stamp`]), and its receiver resumes from there ([`Pacer::received`]):
//! the time the host takes to deliver a message between processes is owed and repaid from
//! the next waits rather than added to every pipeline crossing. The same holds for the other
//! exchanges of a step: the clipping norm's messages along the pipeline are stamped
//! ([`StepPacing::stamped`]), and the emulated ring starts at the latest replica's entry
//! (`Collective::all_reduce_mean_entered`), not when the host's exchange ends.

use std::time::Duration;

use parcae_model::{Collective, ModelError, Neighbours, Op};

use super::costs::EmulatedStage;
use super::pacer::Pacer;
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
        }
    }

    /// `inner` as this step's device reduces.
    pub fn collective<'n, C>(&self, inner: &'n mut C) -> PacedCollective<'n, C>
    where
        'a: 'n,
    {
        PacedCollective {
            inner,
            clock: self.clock,
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
}

impl<'a, N> PacedNeighbours<'a, N> {
    /// Paces `inner` to `stage` through `pacer`.
    pub fn new(inner: &'a mut N, stage: EmulatedStage, pacer: &'a Pacer) -> Self {
        Self {
            inner,
            clock: Some((stage, pacer)),
        }
    }
}

/// Bytes of the emulated timestamp at the end of every paced message.
const STAMP_LEN: usize = 8;

/// `bytes` with the sender's emulated time appended.
fn stamped(mut bytes: Vec<u8>, pacer: &Pacer) -> Vec<u8> {
    bytes.extend_from_slice(&pacer.stamp().to_le_bytes());
    bytes
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
        let inner = &mut *self.inner;
        match self.clock {
            Some((stage, pacer)) => pacer.transfer(stage.to_next, || {
                inner.send_activation(mb, stamped(bytes, pacer))
            }),
            None => inner.send_activation(mb, bytes),
        }
    }

    fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>, Self::Error> {
        let bytes = self.inner.recv_grad(mb)?;
        Ok(received(bytes, self.clock.map(|(_, p)| p))?)
    }

    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error> {
        let inner = &mut *self.inner;
        match self.clock {
            Some((stage, pacer)) => {
                pacer.transfer(stage.to_prev, || inner.send_grad(mb, stamped(bytes, pacer)))
            }
            None => inner.send_grad(mb, bytes),
        }
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

/// `inner` with the reduction taking what the ring all-reduce takes on the emulated link.
pub struct PacedCollective<'a, C> {
    inner: &'a mut C,
    clock: Option<(EmulatedStage, &'a Pacer)>,
}

impl<'a, C> PacedCollective<'a, C> {
    /// Paces `inner` to `stage` through `pacer`.
    pub fn new(inner: &'a mut C, stage: EmulatedStage, pacer: &'a Pacer) -> Self {
        Self {
            inner,
            clock: Some((stage, pacer)),
        }
    }
}

impl<C: Collective> Collective for PacedCollective<'_, C> {
    type Error = C::Error;

    fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), Self::Error> {
        let Some((stage, pacer)) = self.clock else {
            return self.inner.all_reduce_mean(values);
        };
        let latest = self.inner.all_reduce_mean_entered(values, pacer.stamp())?;
        pacer.received(latest);
        pacer.after_sync(stage.all_reduce);
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
            state: ms(0),
        }
    }

    #[test]
    fn a_forward_then_its_activation_take_the_emulated_times() {
        let overrun = Arc::new(Overrun::default());
        let pacer = Pacer::new(overrun.clone());
        let mut inner = Clocked::default();
        let started = Instant::now();
        {
            let mut paced = PacedNeighbours::new(&mut inner, stage(), &pacer);
            paced
                .computed(Op::Forward(0), Duration::from_millis(1))
                .unwrap();
            paced.send_activation(0, vec![1]).unwrap();
        }
        let (mb, at) = inner.sent[0];
        assert_eq!(mb, 0);
        // 30 ms of forward (1 of them real, reported as already spent) and 20 ms of link.
        assert!(at.duration_since(started) >= Duration::from_millis(49));
        let s = overrun.snapshot();
        assert!((s.busy_secs - 0.050).abs() < 1e-9, "{s:?}");
        // A slow backward is an overrun, not hidden.
        PacedNeighbours::new(&mut inner, stage(), &pacer)
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
        PacedCollective::new(&mut EnteredAt(entered), stage(), &pacer)
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
    fn the_collective_reduces_then_waits_out_the_ring() {
        let pacer = Pacer::new(Arc::new(Overrun::default()));
        let mut inner = Clocked::default();
        let mut values = [2.0f32, 4.0];
        let started = Instant::now();
        PacedCollective::new(&mut inner, stage(), &pacer)
            .all_reduce_mean(&mut values)
            .unwrap();
        assert_eq!(values, [1.0, 2.0]);
        assert!(started.elapsed() >= Duration::from_millis(25));
    }
}
