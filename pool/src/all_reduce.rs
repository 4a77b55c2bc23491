//! How a stage's replicas average their gradients, as a plan names it: the planner prices both
//! kinds over the zones the replicas are in, and every replica of a plan runs the one it names.

use serde::{Deserialize, Serialize};

/// How a stage's replicas average their gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllReduce {
    /// One ring over every replica in pipeline order: a ring over `k` zones sends the whole
    /// buffer over each of its `k` crossings (Parcae's, and any system blind to zones).
    #[default]
    Ring,
    /// A ring inside each zone, then the zones' partial sums exchanged in shards across zones:
    /// each replica sends across only a share of its zone's shard of the buffer.
    ByZone,
}
