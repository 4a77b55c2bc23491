//! What travels on data-plane connections: the request that opens a connection, the answers to
//! state queries, and the header of every message of a training round (pipeline and ring
//! links alike).
//!
//! Every decoder is bounded and returns a typed error; a peer that breaks the protocol costs
//! the current step (it is retried under the next view), never the process.

use parcae_consensus::codec;
use parcae_consensus::state::{Digest32, StageSlot};
use serde::{Deserialize, Serialize};

use super::DataplaneError;

/// Largest encoded request or reply (they carry control data, never tensors).
pub const MAX_CONTROL: usize = 64 * 1024;

/// Which pipeline link a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkKind {
    /// From stage `s` to stage `s + 1` of the same pipeline: activations go forward on it,
    /// gradients come back, and the clipping norm travels both ways.
    Pipeline,
    /// From replica `d` to replica `d + 1` of the same stage: the gradient all-reduce ring.
    Ring,
    /// From a replica to the next of the same stage in its zone: the ring inside a zone of
    /// the all-reduce by zone.
    ZoneRing,
    /// From a replica to one of the next zone's replicas of the same stage whose part of the
    /// all-reduce by zone overlaps its own.
    AcrossZones,
}

/// The first message on every data-plane connection; says what the connection is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// A link of the plan of `epoch`, opened by the node at `from`.
    Link {
        /// Plan epoch; links of other epochs are refused.
        epoch: u64,
        /// Pipeline or ring link.
        kind: LinkKind,
        /// The opener's slot.
        from: StageSlot,
    },
    /// What stage state does this node hold? With `awaiting`, the answer waits (at most the
    /// server's timeout) until the node holds state of that `(history, step)` or a later one: a
    /// member about to enter the same plan publishes its state a moment later, and the asker
    /// hears of it then instead of asking again and again.
    Query {
        /// The `(history, step)` to wait for, if any.
        awaiting: Option<(u64, u64)>,
    },
    /// Send the held state of layers `start..end` after `step` steps, one layer per message.
    Fetch {
        /// The training history the state must belong to (a rollback starts a new one).
        history: u64,
        /// Optimizer steps the state must have taken.
        step: u64,
        /// First layer.
        start: u32,
        /// One past the last layer.
        end: u32,
    },
    /// Send the stored checkpoint of layers `start..end` taken after `steps` steps.
    FetchCheckpoint {
        /// Steps taken by the checkpointed state.
        steps: u64,
        /// First layer.
        start: u32,
        /// One past the last layer.
        end: u32,
    },
    /// Store the checkpoint that follows in the next message.
    PutCheckpoint {
        /// Steps taken by the state.
        steps: u64,
        /// First layer.
        start: u32,
        /// One past the last layer.
        end: u32,
        /// SHA-256 of the state bytes.
        digest: Digest32,
    },
}

/// State a node can serve: layers `start..end` after `step` optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldInfo {
    /// The training history the state belongs to.
    pub history: u64,
    /// Optimizer steps taken.
    pub step: u64,
    /// First layer.
    pub start: u32,
    /// One past the last layer.
    pub end: u32,
}

/// Answer to a request other than `Link`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Answer to `Query`.
    Held(Option<HeldInfo>),
    /// The requested state follows, `layers` messages (one per layer).
    Sending {
        /// Messages that follow.
        layers: u32,
    },
    /// The request cannot be served.
    Refused(String),
    /// A checkpoint was stored.
    Stored,
}

/// Encodes a request or reply.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, DataplaneError> {
    codec::encode::<_, MAX_CONTROL>(value).map_err(|e| DataplaneError::Protocol(e.to_string()))
}

/// Decodes a request or reply.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, DataplaneError> {
    codec::decode::<_, MAX_CONTROL>(bytes).map_err(|e| DataplaneError::Protocol(e.to_string()))
}

/// Kind of a message inside a training round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgKind {
    /// Activation of a micro-batch (forward, towards the last stage).
    Activation = 1,
    /// Gradient of a micro-batch (backward, towards the first stage).
    Grad = 2,
    /// Partial sum of squared gradient norms and the stages' digests so far (forward).
    NormUp = 3,
    /// The global squared norm (backward).
    NormDown = 4,
    /// A chunk of the gradient all-reduce ring.
    AllReduce = 5,
}

impl MsgKind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Activation,
            2 => Self::Grad,
            3 => Self::NormUp,
            4 => Self::NormDown,
            5 => Self::AllReduce,
            _ => return None,
        })
    }
}

/// One training round: the step of a plan epoch. Every message of a round carries it, so a
/// message of another epoch or step is refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Plan epoch.
    pub epoch: u64,
    /// Training step.
    pub step: u64,
}

/// The header of every message of a round, on pipeline and ring links alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind.
    pub kind: MsgKind,
    /// The round.
    pub round: Round,
    /// Micro-batch of activations and gradients, chunk sequence of the all-reduce, 0 for norms.
    pub seq: u32,
}

/// Encoded size of a [`Header`].
pub const HEADER_LEN: usize = 1 + 8 + 8 + 4;

impl Header {
    /// Appends the header to `out`; the payload follows it.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.extend_from_slice(&self.round.epoch.to_le_bytes());
        out.extend_from_slice(&self.round.step.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    /// Prefixes `payload` with the header.
    pub fn frame(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        self.encode_into(&mut out);
        out.extend_from_slice(payload);
        out
    }

    /// Checks that `bytes` carry exactly this header and returns the payload. A message of
    /// another epoch is [`DataplaneError::Stale`] (its sender follows another plan); any other
    /// mismatch is a protocol error naming what was expected and what came.
    pub fn expect<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8], DataplaneError> {
        if bytes.len() < HEADER_LEN {
            return Err(DataplaneError::Protocol(format!(
                "message of {} bytes is shorter than its header",
                bytes.len()
            )));
        }
        let kind = MsgKind::from_byte(bytes[0]);
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&bytes[r]);
            u64::from_le_bytes(b)
        };
        let (epoch, step, seq) = (word(1..9), word(9..17), word(17..21) as u32);
        if epoch != self.round.epoch {
            return Err(DataplaneError::Stale(format!(
                "message of epoch {epoch} during epoch {}",
                self.round.epoch
            )));
        }
        if kind != Some(self.kind) || step != self.round.step || seq != self.seq {
            return Err(DataplaneError::Protocol(format!(
                "expected {:?} of step {} number {}, got kind {} step {step} number {seq}",
                self.kind, self.round.step, self.seq, bytes[0]
            )));
        }
        Ok(&bytes[HEADER_LEN..])
    }
}

/// What a `NormUp` carries to stage `s`: the running sum of squared norms of stages `0..s`,
/// their state digests (all or none), and on a step that opened a DiLoCo round their outer
/// weights' digests (all of them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NormUp {
    /// Sum of the squared gradient norms so far.
    pub partial: f64,
    /// The stages' state digests, or none.
    pub digests: Vec<Digest32>,
    /// The stages' outer weights' digests after the round the step opened, or none.
    pub outer: Vec<Digest32>,
}

impl NormUp {
    /// The payload: the sum, the state digests, then the outer digests.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 32 * (self.digests.len() + self.outer.len()));
        out.extend_from_slice(&self.partial.to_le_bytes());
        for d in self.digests.iter().chain(&self.outer) {
            out.extend_from_slice(d);
        }
        out
    }

    /// Parses a payload from the `stages` stages before the receiver; `round`: the step
    /// opened a round, so their outer digests end it (the receiver knows which steps do).
    pub fn parse(bytes: &[u8], stages: usize, round: bool) -> Result<Self, DataplaneError> {
        let outer_len = if round { 32 * stages } else { 0 };
        let rest = bytes.len().checked_sub(outer_len).unwrap_or(usize::MAX);
        if rest != 8 && rest != 8 + 32 * stages {
            return Err(DataplaneError::Protocol(format!(
                "norm message of {} bytes, expected {} or {} for {stages} stages{}",
                bytes.len(),
                8 + outer_len,
                8 + 32 * stages + outer_len,
                if round {
                    " and their outer digests"
                } else {
                    ""
                }
            )));
        }
        let digests = |b: &[u8]| {
            b.chunks_exact(32)
                .map(|c| {
                    let mut d = [0u8; 32];
                    d.copy_from_slice(c);
                    d
                })
                .collect()
        };
        Ok(NormUp {
            partial: parse_norm(&bytes[..8])?,
            digests: digests(&bytes[8..rest]),
            outer: digests(&bytes[rest..]),
        })
    }
}

/// Parses a squared norm, refusing non-finite or negative values.
pub fn parse_norm(bytes: &[u8]) -> Result<f64, DataplaneError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| DataplaneError::Protocol(format!("norm of {} bytes", bytes.len())))?;
    let v = f64::from_le_bytes(arr);
    if !(v.is_finite() && v >= 0.0) {
        return Err(DataplaneError::Protocol(format!("squared norm {v}")));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_refuse_other_steps() {
        let tag = Header {
            kind: MsgKind::Grad,
            round: Round { epoch: 3, step: 9 },
            seq: 2,
        };
        let framed = tag.frame(b"xyz");
        assert_eq!(tag.expect(&framed).unwrap(), b"xyz");
        let stale = Header {
            round: Round { epoch: 2, step: 9 },
            ..tag
        };
        assert!(matches!(
            tag.expect(&stale.frame(b"")),
            Err(DataplaneError::Stale(_))
        ));
        let other = Header {
            round: Round { epoch: 3, step: 10 },
            ..tag
        };
        assert!(matches!(
            tag.expect(&other.frame(b"")),
            Err(DataplaneError::Protocol(_))
        ));
        assert!(tag.expect(&[1, 2]).is_err());
    }

    #[test]
    fn norm_payloads_are_checked() {
        let d = [[7u8; 32], [9u8; 32]];
        let up = NormUp {
            partial: 2.5,
            digests: d.to_vec(),
            outer: Vec::new(),
        };
        let p = up.payload();
        assert_eq!(NormUp::parse(&p, 2, false).unwrap(), up);
        assert!(NormUp::parse(&p, 3, false).is_err());
        let bare = NormUp {
            partial: 1.0,
            ..NormUp::default()
        };
        assert_eq!(NormUp::parse(&bare.payload(), 3, false).unwrap(), bare);
        assert!(NormUp::parse(&p[..40], 2, false).is_err());
        assert!(
            NormUp::parse(&bare.payload(), 1, true).is_err(),
            "outer digests missing"
        );
        for digests in [Vec::new(), d.to_vec()] {
            let round = NormUp {
                partial: 0.5,
                digests,
                outer: vec![[1u8; 32], [2u8; 32]],
            };
            assert_eq!(NormUp::parse(&round.payload(), 2, true).unwrap(), round);
        }
        let both = NormUp {
            partial: 0.5,
            digests: d.to_vec(),
            outer: d.to_vec(),
        };
        assert!(NormUp::parse(&both.payload(), 2, false).is_err());
        assert!(parse_norm(&f64::NAN.to_le_bytes()).is_err());
        assert!(parse_norm(&(-1.0f64).to_le_bytes()).is_err());
    }

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let r = Request::Fetch {
            history: 1,
            step: 4,
            start: 1,
            end: 3,
        };
        assert_eq!(decode::<Request>(&encode(&r).unwrap()).unwrap(), r);
        assert!(decode::<Request>(&[0xff; 40]).is_err());
    }
}
