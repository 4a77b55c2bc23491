//! The `Planner` actor: leader-side planning at every interval boundary.
//!
//! Every `planner.interval_secs` it asks the raft actor for the replicated state; when this node
//! leads, it proposes `AvailabilityTick{interval: last + 1, count: healthy members}`. All inputs
//! come from the replicated state, so whichever node leads next continues the sequence.

use std::time::Duration;

use actix::prelude::*;
use parcae_consensus::Command;

use crate::raft::{GetPlanningInput, PlanningInput, ProposeCommand, Raft};

/// The actor.
pub struct Planner {
    raft: Addr<Raft>,
    interval: Duration,
}

impl Planner {
    /// A planner proposing through `raft` every `interval`.
    pub fn new(raft: Addr<Raft>, interval: Duration) -> Self {
        Self { raft, interval }
    }
}

/// The availability command for the next interval.
pub fn availability_tick(input: &PlanningInput) -> Command {
    Command::AvailabilityTick {
        interval: input.last_interval.map_or(0, |i| i + 1),
        count: input.healthy_members,
    }
}

impl Actor for Planner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.interval, |act, ctx| {
            let raft = act.raft.clone();
            ctx.spawn(
                async move {
                    let Ok(Some(input)) = raft.send(GetPlanningInput).await else {
                        return;
                    };
                    match raft.send(ProposeCommand(availability_tick(&input))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!("availability tick not proposed: {e}"),
                        Err(e) => tracing::warn!("raft actor gone: {e}"),
                    }
                }
                .into_actor(act),
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_interval_continues_the_replicated_sequence() {
        let mut input = PlanningInput {
            last_interval: None,
            healthy_members: 4,
            state: parcae_consensus::ControlState::default(),
        };
        assert_eq!(
            availability_tick(&input),
            Command::AvailabilityTick {
                interval: 0,
                count: 4
            }
        );
        input.last_interval = Some(41);
        assert_eq!(
            availability_tick(&input),
            Command::AvailabilityTick {
                interval: 42,
                count: 4
            }
        );
    }
}
