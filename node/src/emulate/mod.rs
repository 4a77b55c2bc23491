//! The emulated accelerator: a node trains a real (narrow) Burn stage and waits out the rest
//! of what the emulated model would take on the emulated GPU cluster, from the profiled tables
//! that `parcae-strategies` embeds (per-layer forward, backward and optimizer times, the
//! 10 Gb/s transfer curve, the cost model's ring all-reduce): the hardware the simulator plans
//! for.
//!
//! Real work runs first; pacing waits only for the remainder, and a remainder below zero is
//! an overrun, counted and never hidden ([`Overrun`]). Every emulated duration is divided by
//! the time scale. The planner learns the emulated costs only by measuring them, as it
//! measures real ones: nothing here reaches it but time.
//!
//! * [`accelerator`]: the emulated device a trainer holds, and what measuring on it finds;
//! * [`costs`]: what the emulated hardware takes for one stage's work (pure);
//! * [`pacer`]: waiting out the remainder and counting overruns;
//! * [`pacing`]: the one interface the trainer paces its work through, a no-op on a real
//!   device ([`RealTime`]), the emulated accelerator's waits otherwise;
//! * [`paced`]: the pacing decorators of the 1F1B driver's neighbours and of the collective.

pub mod accelerator;
pub mod costs;
pub mod paced;
pub mod pacer;
pub mod pacing;

pub use accelerator::{Accelerator, reactive_restart_kind, restart_kind};
pub use costs::{
    Crossings, EmulatedStage, Emulation, EmulationError, Fetched, Rebuild, RoundCrossing, STAND_IN,
    StandInWidth, ZoneSpread,
};
pub use paced::{PacedCollective, PacedNeighbours, Reduction};
pub use pacer::{Overrun, OverrunSnapshot, Pacer};
pub use pacing::{Change, MeasuredFetch, Pacing, RealTime, StepPacing};
