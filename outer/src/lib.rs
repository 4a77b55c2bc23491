//! DiLoCo's outer loop (Douillard et al. 2023) for groups of pools that train on their own:
//! each group runs `H` synchronous inner steps from the round's outer weights, then the groups
//! average their pseudo-gradients (the outer weights minus their own) and every group applies
//! the same outer Nesterov step. This crate holds the parts that decide, each a pure function:
//!
//! * [`sync`]: how a job synchronises, `step` (every step's all-reduce spans every group) or
//!   `diloco:H`, with the outer optimizer's settings, checked on the way in;
//! * [`codec`]: the pseudo-gradient's wire forms (f32, bf16, int8 with a scale per block),
//!   each with its error bound, decoding refusing whatever a peer could send wrong;
//! * [`outer`]: the pseudo-gradient, the groups' weighted average in one fixed order (so every
//!   group computes the same bits) and the outer Nesterov step;
//! * [`round`]: who takes part in a round and when it closes (every member in, or the
//!   deadline passed with at least one contribution), a group that vanishes dropped.
//!
//! The node moves the bytes and raft commits the round; nothing here does I/O.

pub mod codec;
pub mod outer;
pub mod round;
pub mod sync;

pub use codec::{CodecError, Wire};
pub use outer::{Contribution, NesterovSgd, OuterError, average, pseudo_gradient};
pub use round::{Close, Membership, Round, RoundError};
pub use sync::{OuterSettings, SyncError, SyncMode};
