//! `liveput`: the simulator's node default (`liveput-zone` in `docs/strategies.md`), Parcae's
//! look-ahead optimizer on the zone model's forecast (persistence plus its time-of-day drift,
//! known notices folded in), its look-ahead valued past the horizon by the zone's expected
//! stay. Over zones, each zone has its own model and each step of the look-ahead is valued at
//! the composition forecast for it.

use parcae_strategies::ParallelConfig;
use parcae_strategies::liveput::LiveputOptimizer;
use parcae_strategies::predict::{NoticeAware, ZoneForecasts, ZoneModel};

use super::{Situation, Strategy, look_ahead};
use crate::planner::forecast::{zone_forecast, zones_forecast};

/// The strategy and what it remembers.
pub struct Liveput {
    zone: NoticeAware<ZoneModel>,
    /// One model per zone, for the zones named (while the workers are planned over them).
    zones: Option<(Vec<String>, ZoneForecasts)>,
    optimizer: Option<LiveputOptimizer>,
    lookahead: usize,
    interval_secs: f64,
}

impl Liveput {
    /// Looks `lookahead` intervals of `interval_secs` ahead.
    pub fn new(lookahead: usize, interval_secs: f64) -> Self {
        Self {
            zone: NoticeAware::new(ZoneModel::new(interval_secs)),
            zones: None,
            optimizer: None,
            lookahead,
            interval_secs,
        }
    }
}

impl Strategy for Liveput {
    fn acts_on_notices(&self) -> bool {
        true
    }

    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig> {
        let by_zone = at.zones.as_ref().and_then(|zones| {
            let known = self
                .zones
                .as_ref()
                .is_some_and(|(names, _)| names.iter().eq(zones.names.iter()));
            if !known {
                let names = zones.names.iter().map(|n| n.to_string()).collect();
                let models = ZoneForecasts::new(zones.names.len(), self.interval_secs);
                self.zones = Some((names, models));
            }
            let (_, models) = self.zones.as_mut()?;
            zones_forecast(models, at.state, zones, self.lookahead)
        });
        // The pooled model learns from every interval, zoned or not, so a cluster that falls
        // back to one zone goes on with what it knows.
        let pooled = zone_forecast(
            &mut self.zone,
            at.state,
            at.workers,
            self.lookahead,
            self.interval_secs,
        );
        let forecast = by_zone.unwrap_or(pooled);
        Some(look_ahead(
            &mut self.optimizer,
            at,
            forecast,
            self.interval_secs,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parcae_consensus::state::PeerInfo;
    use parcae_consensus::{Command, ControlState, NodeId};
    use parcae_strategies::cost::CostModel;
    use parcae_strategies::liveput::PlanState;

    use super::*;
    use crate::planner::forecast::Forecast;

    #[test]
    fn the_choice_at_a_notice_is_the_one_made_after_the_leave() {
        let cost = Arc::new(CostModel::builtin("gpt-1.5b").unwrap());
        let interval_secs = 60.0;
        let mut zone = NoticeAware::new(ZoneModel::new(interval_secs));
        let mut optimizer = LiveputOptimizer::new(cost.clone(), interval_secs, 1);
        let mut state = ControlState::default();
        let ids: Vec<NodeId> = (1..=32u8)
            .map(|n| {
                let id = NodeId::from_peer_bytes(&[n]);
                let peer = PeerInfo {
                    peer_id: vec![n],
                    ..PeerInfo::default()
                };
                state.apply(&Command::Join { node: id, peer }).unwrap();
                id
            })
            .collect();
        // A cluster that grew by a node an interval: the zone expects more to come.
        for (interval, count) in (24..=32).enumerate() {
            let tick = Command::AvailabilityTick {
                interval: interval as u64,
                count,
                pools: Vec::new(),
            };
            state.apply(&tick).unwrap();
        }
        let mut decide = |state: &ControlState, n: u32, now: ParallelConfig| {
            let Forecast {
                before,
                future,
                terminal,
                ..
            } = zone_forecast(&mut zone, state, n, 8, interval_secs);
            assert_eq!(
                future[0].nodes, n,
                "the upcoming interval is observed: {future:?}"
            );
            assert_eq!(before, future[0].nodes + future[0].removed);
            let state = PlanState {
                nodes: before,
                config: now,
                leftover_ms: 0.0,
            };
            let decision = optimizer.decide_with_terminal(state, &future, terminal);
            decision.config.clamp_to(n)
        };
        let running = ParallelConfig::new(4, 8);
        for id in &ids[..3] {
            state
                .apply(&Command::Notice {
                    node: *id,
                    deadline_ms: 10_000,
                })
                .unwrap();
        }
        let at_notice = decide(&state, 29, running);
        assert!(at_notice.nodes() <= 29, "{at_notice:?}");
        for id in &ids[..3] {
            state.apply(&Command::Leave { node: *id }).unwrap();
        }
        assert_eq!(decide(&state, 29, at_notice), at_notice, "no move back");
    }
}
