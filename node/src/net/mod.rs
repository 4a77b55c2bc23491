//! Networking: the libp2p swarm and the actor that owns it.

pub mod actor;
pub mod admission;
pub mod codec;
pub mod control_streams;
pub mod log_limit;
pub mod messages;
pub mod seed_dialer;
pub mod seeds;
pub mod swarm;
