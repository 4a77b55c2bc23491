//! Assembling a node: identity, swarm, HTTP status server, trainer and actors, then running
//! until the node leaves (exit code 0) or fails. [`RunArgs`] is `parcae-node run`'s command
//! line, [`RunOptions`] what a node runs with (loaded from that command line, or made by
//! [`crate::Trainer`]'s builder), and [`run`] the assembly.

mod args;
mod options;
mod run;

pub use args::{ArgsError, RunArgs};
pub use options::{JobAdopter, NodeError, RunOptions};
pub use run::{NodeExit, run, run_to_exit};
