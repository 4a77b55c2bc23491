//! The data plane: encrypted, authenticated bulk channels between cluster members for tensors
//! and stage state, kept off the libp2p connections that carry raft and notices.
//!
//! libp2p's pnet + noise + yamux stack moved a loopback transfer at 0.08x raw TCP in the
//! project's prototype; a stage handoff of a few hundred MB must not be slower than the
//! 10 Gb/s links of Parcae's evaluation. This channel is plain TCP with AES-256-GCM records
//! (hardware AES through ring), keyed by a Noise `XXpsk3` handshake (`snow`) that
//! * proves both ends hold the cluster key (the pre-shared key),
//! * binds the libp2p identities of both ends (each signs its static Noise key), so a member
//!   cannot impersonate another and a relay can neither read nor inject, and
//! * derives per-direction keys from ephemeral Diffie-Hellman: a recorded session cannot be
//!   decrypted later, not even with the cluster key.
//!
//! Its parts, bottom up: `handshake` (keying and admission), `channel` (records framed by
//! tokio-util's `LengthDelimitedCodec`, messages made of records), [`protocol`] (the request
//! that opens a connection, replies, and the one round [`protocol::Header`] of every training
//! message), [`server`] (the endpoint: links for the trainer, state and checkpoints served
//! concurrently with training, disk work on tokio's blocking pool), [`client`] (asking another
//! member's endpoint), [`links`] (a plan epoch's pipeline and ring links) and [`collective`]
//! (the ring all-reduce). Nothing here knows the model: the trainer hands bytes in and out.

mod channel;
pub mod client;
pub mod collective;
mod error;
mod handshake;
pub mod limits;
pub mod links;
pub mod protocol;
pub mod server;

pub use channel::{MAX_RECORD, SecureReader, SecureStream, SecureWriter};
pub use error::DataplaneError;
pub use handshake::{accept, connect};
