//! Networking: the libp2p swarm and the actor that owns it.

pub mod actor;
pub mod admission;
pub mod codec;
pub mod log_limit;
pub mod seeds;
pub mod swarm;
