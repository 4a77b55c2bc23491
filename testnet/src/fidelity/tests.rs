use super::*;
use crate::predicted::{LOOPBACK, emulated_model};
use parcae_strategies::cost::throughput::ThroughputTable;
use parcae_strategies::sim::MigrationCounts;

const WIDE: ParallelConfig = ParallelConfig::new(2, 1);
const NARROW: ParallelConfig = ParallelConfig::new(1, 1);

/// 10 samples/s on two nodes, 5 on one.
fn model() -> CostModel {
    let spec = emulated_model("gpt-1.5b", 2).unwrap().spec;
    CostModel::new(
        spec,
        ThroughputTable::from_rows([(WIDE, 10.0), (NARROW, 5.0)]),
        LOOPBACK,
    )
}

fn sample(t: f64, epoch: u64, config: ParallelConfig, step: u64, samples: u64) -> Sample {
    Sample {
        t,
        running: config.d,
        target: config.d,
        epoch,
        config: Some((config.d, config.p)),
        step,
        samples,
        loss: None,
    }
}

/// Two 10 s intervals. The first trains on two nodes at 8 samples/s (a step of 8 samples a
/// second). One node is killed at 10 s; the plan for one node shows at 12 s, its nodes are
/// ready 1 s later, and its first step commits at 15 s, then one every 2 s (4 samples/s).
fn timeline() -> Vec<Sample> {
    let mut t: Vec<Sample> = (0..=11)
        .map(|i| {
            let step = i.min(10);
            sample(i as f64, 1, WIDE, step, 8 * step)
        })
        .collect();
    t.extend((12..=14).map(|i| sample(i as f64, 2, NARROW, 10, 80)));
    t.extend((15..=21u64).map(|i| {
        let step = 11 + (i - 15) / 2;
        sample(i as f64, 2, NARROW, step, 8 * step)
    }));
    t
}

/// The simulator ran the same configurations at the model's rates, charging 2 s in the second.
fn simulated() -> StrategyRun {
    StrategyRun {
        name: "reactive".into(),
        samples: 140.0,
        migrations: 1,
        kinds: MigrationCounts::default(),
        migration_secs: 2.0,
        configs: vec![WIDE, NARROW],
        cumulative: vec![100.0, 140.0],
        charged_secs: vec![0.0, 2.0],
    }
}

fn restart(epoch: u64, at_step: u64, seen_at_secs: f64, secs: f64) -> Reconfiguration {
    Reconfiguration {
        epoch,
        kind: MigrationKind::Restart,
        at_step,
        seen_at_secs,
        secs,
    }
}

/// The ledger of [`timeline`] with one restart to epoch 2 (first step 11, ready after 1 s).
fn ledger_of(events: &[Event], simulated: &StrategyRun, time_scale: f64, samples: u64) -> Fidelity {
    ledger(&Inputs {
        timeline: &timeline(),
        events,
        reconfigurations: &[restart(2, 11, 14.0, 1.0)],
        simulated,
        model: &model(),
        interval_secs: 10.0,
        time_scale,
        samples,
        rolled_back_steps: 0,
    })
}

#[test]
fn a_kill_is_detected_restarted_and_refilled_and_the_terms_add_up_to_the_gap() {
    let events = [Event {
        t: 10.0,
        kind: EventKind::Kill,
    }];
    let simulated = simulated();
    let f = ledger_of(&events, &simulated, 1.0, 112);
    let [stall] = f.reconfigurations.as_slice() else {
        panic!("{:?}", f.reconfigurations)
    };
    assert_eq!(stall.cause, Some(EventKind::Kill));
    assert_eq!(stall.plan_at_secs, 12.0);
    assert_eq!(stall.detection_secs, 2.0);
    assert_eq!(stall.restart_secs, 1.0);
    // 15 s - 12 s - 1 s of restart - one 2 s step.
    assert_eq!(stall.refill_secs, 0.0);
    assert_eq!(stall.stalled_secs, 3.0);
    assert_eq!((stall.interval, stall.charged_secs), (1, 2.0));

    let i: Vec<(Option<[u32; 2]>, f64, f64, f64)> = f
        .intervals
        .iter()
        .map(|i| (i.config, i.samples, i.simulated_samples, i.stalled_secs))
        .collect();
    assert_eq!(
        i,
        [
            (Some([2, 1]), 80.0, 100.0, 0.0),
            (Some([1, 1]), 24.0, 40.0, 3.0)
        ]
    );
    // The kill's stall is not throughput: 72 samples in 9 s, then 24 in 6 s.
    let rates: Vec<([u32; 2], f64, f64)> = f
        .throughput
        .iter()
        .map(|c| (c.config, c.measured_per_sec, c.model_per_sec))
        .collect();
    assert_eq!(rates, [([1, 1], 4.0, 5.0), ([2, 1], 8.0, 10.0)]);

    let g = &f.gap;
    assert_eq!(g.gap, 112.0 - 140.0);
    assert_eq!(g.configuration, 0.0, "the simulator's configurations");
    // 3 s stalled at 5/s against 2 s charged at 5/s.
    assert_eq!(g.stalls, -5.0);
    // 2/s short for 10 s, then 1/s short for the 7 s not stalled.
    assert_eq!(g.throughput, -27.0);
    assert_eq!(
        g.outside_intervals, 8.0,
        "the final sequence is 8 samples past 20 s"
    );
    // The second interval trained 24 samples where 4/s over 7 s is 28.
    assert_eq!(g.unexplained, -4.0);
    assert_eq!(g.terms()[0], ("throughput", -27.0));
}

#[test]
fn a_notice_stalls_nothing_before_its_plan_and_other_configurations_are_named() {
    // The kill at an earlier notice's deadline came before the notice that caused the plan.
    let events = [
        Event {
            t: 9.0,
            kind: EventKind::Kill,
        },
        Event {
            t: 11.5,
            kind: EventKind::Notice,
        },
    ];
    let mut simulated = simulated();
    simulated.configs = vec![WIDE, WIDE];
    simulated.cumulative = vec![100.0, 180.0];
    simulated.samples = 180.0;
    let f = ledger_of(&events, &simulated, 2.0, 104);
    let stall = &f.reconfigurations[0];
    assert_eq!(
        (stall.cause, stall.cause_at_secs),
        (Some(EventKind::Notice), Some(11.5))
    );
    assert_eq!(stall.detection_secs, 0.0);
    assert_eq!(
        stall.charged_secs, 1.0,
        "2 emulated seconds at time scale 2"
    );
    // Rates per wall second are the model's per emulated second times the time scale.
    assert_eq!(f.throughput[0].model_per_sec, 10.0);
    // One node run where the simulator ran two: (5 - 10) x 2 per wall second for 10 s.
    assert_eq!(f.gap.configuration, -100.0);
    let g = &f.gap;
    let sum = g.configuration + g.stalls + g.throughput + g.outside_intervals + g.unexplained;
    assert!((sum - g.gap).abs() < 1e-9, "{g:?}");
}

#[test]
fn an_action_more_than_an_interval_before_a_plan_is_not_its_cause() {
    // The kill at 1 s is the deadline of a notice answered before the replay; the plan at 12 s
    // is the planner's own.
    let events = [Event {
        t: 1.0,
        kind: EventKind::Kill,
    }];
    let simulated = simulated();
    let f = ledger_of(&events, &simulated, 1.0, 112);
    let stall = &f.reconfigurations[0];
    assert_eq!((stall.cause, stall.detection_secs), (None, 0.0));
    assert_eq!(stall.stalled_secs, 1.0, "the restart alone");
}

#[test]
fn the_longest_held_configuration_names_an_interval() {
    let timeline = timeline();
    assert_eq!(held_longest(&timeline, 10.0, 20.0), Some(NARROW));
    assert_eq!(held_longest(&timeline, 0.0, 12.0), Some(WIDE));
    assert_eq!(held_longest(&timeline, 30.0, 40.0), None);
    assert_eq!(cursor(&timeline, 10.5), 80.0);
    assert_eq!(cursor(&timeline, -1.0), 0.0);
    assert_eq!(samples_per_step(&timeline), 8.0);
}

#[test]
fn the_job_s_start_is_a_stall_of_the_first_interval() {
    // The cluster formed for 3 s: its first step (8 samples at 8 a second) committed at 4 s.
    let mut timeline = timeline();
    for s in &mut timeline[..4] {
        (s.step, s.samples) = (0, 0);
    }
    timeline[4] = sample(4.0, 1, WIDE, 1, 8);
    let mut simulated = simulated();
    simulated.charged_secs = vec![2.5, 2.0];
    let f = ledger(&Inputs {
        timeline: &timeline,
        events: &[],
        reconfigurations: &[restart(2, 11, 14.0, 1.0)],
        simulated: &simulated,
        model: &model(),
        interval_secs: 10.0,
        time_scale: 1.0,
        samples: 112,
        rolled_back_steps: 0,
    });
    // Less one steady step of WIDE (8 samples at the rate measured in it).
    let wide = f.throughput.iter().find(|c| c.config == [2, 1]).unwrap();
    let start = 4.0 - 8.0 / wide.measured_per_sec;
    assert!(start > 2.0 && start < 4.0, "{start}");
    assert_eq!(f.start_secs, start);
    assert_eq!(f.intervals[0].stalled_secs, start);
    // The start at WIDE's 10/s against the simulator's 2.5 s charge; the restart at NARROW's
    // 5/s, 1 s against its 2 s.
    let stalls = -(10.0 * start - 10.0 * 2.5) - (5.0 * 1.0 - 5.0 * 2.0);
    assert!((f.gap.stalls - stalls).abs() < 1e-9, "{:?}", f.gap);
    assert!(summary("reactive", &f).contains(&format!("stalls: start {start:.1} s")));
    // Without a committed step there is no start to measure.
    assert_eq!(start_secs(&timeline[..4], |_| 1.0), 0.0);
}

#[test]
fn a_stall_that_outlasts_its_interval_stalls_the_next_and_overlapping_stalls_count_once() {
    // A kill at 10 s, its plan at 12 s restarting for 12 s; an arrival at 15 s, whose plan at
    // 16 s replaces it before the cluster trained in it; the first step of both commits at
    // 26 s, then one every 2 s.
    let mut timeline: Vec<Sample> = (0..=11)
        .map(|i| sample(i as f64, 1, WIDE, i.min(10), 8 * i.min(10)))
        .collect();
    timeline.extend((12..=15).map(|i| sample(i as f64, 2, NARROW, 10, 80)));
    timeline.extend((16..=25).map(|i| sample(i as f64, 3, NARROW, 10, 80)));
    timeline.extend((26..=31u64).map(|i| {
        let step = 11 + (i - 26) / 2;
        sample(i as f64, 3, NARROW, step, 8 * step)
    }));
    let events = [
        Event {
            t: 10.0,
            kind: EventKind::Kill,
        },
        Event {
            t: 15.0,
            kind: EventKind::Arrival,
        },
    ];
    let simulated = StrategyRun {
        configs: vec![WIDE, NARROW, NARROW],
        cumulative: vec![100.0, 100.0, 130.0],
        charged_secs: vec![0.0, 10.0, 4.0],
        samples: 130.0,
        ..simulated()
    };
    let f = ledger(&Inputs {
        timeline: &timeline,
        events: &events,
        reconfigurations: &[restart(2, 11, 13.0, 12.0), restart(3, 11, 17.0, 6.0)],
        simulated: &simulated,
        model: &model(),
        interval_secs: 10.0,
        time_scale: 1.0,
        samples: 104,
        rolled_back_steps: 0,
    });
    let [killed, arrived] = f.reconfigurations.as_slice() else {
        panic!("{:?}", f.reconfigurations)
    };
    assert_eq!(
        (killed.cause, killed.stalled_secs),
        (Some(EventKind::Kill), 14.0)
    );
    assert_eq!(arrived.cause, Some(EventKind::Arrival));
    // The kill's 14 s stall runs from 10 s to 24 s, the arrival's lies within it.
    let stalled: Vec<f64> = f.intervals.iter().map(|i| i.stalled_secs).collect();
    assert_eq!(stalled, [0.0, 10.0, 4.0]);
    let g = &f.gap;
    let sum = g.configuration + g.stalls + g.throughput + g.outside_intervals + g.unexplained;
    assert!((sum - g.gap).abs() < 1e-9, "{g:?}");
    // Stalled as long as charged, in the same configurations: the stall costs nothing against
    // the simulator.
    assert_eq!(g.stalls, 0.0);
}

#[test]
fn a_kill_cuts_off_the_step_in_flight_and_a_rollback_gives_up_its_steps() {
    // Steps of 16 samples every 2 s on two nodes; step 5 is seen at 10 s and a node is killed
    // at 11 s, one second into step 6. The plan shows at 12 s, its nodes are ready a second
    // later, and its first step commits at 15 s, then one every 2 s. A rollback gave up two
    // committed steps.
    let mut timeline: Vec<Sample> = (0..=11u64)
        .map(|i| sample(i as f64, 1, WIDE, i / 2, 16 * (i / 2)))
        .collect();
    timeline.extend((12..=14).map(|i| sample(i as f64, 2, NARROW, 5, 80)));
    timeline.extend((15..=21u64).map(|i| {
        let step = 6 + (i - 15) / 2;
        sample(i as f64, 2, NARROW, step, 16 * step)
    }));
    let events = [Event {
        t: 11.0,
        kind: EventKind::Kill,
    }];
    let f = ledger(&Inputs {
        timeline: &timeline,
        events: &events,
        reconfigurations: &[restart(2, 6, 14.0, 1.0)],
        simulated: &simulated(),
        model: &model(),
        interval_secs: 10.0,
        time_scale: 1.0,
        samples: 112,
        rolled_back_steps: 2,
    });
    let [stall] = f.reconfigurations.as_slice() else {
        panic!("{:?}", f.reconfigurations)
    };
    assert_eq!(
        (stall.cut_off_secs, stall.detection_secs, stall.restart_secs),
        (1.0, 1.0, 1.0)
    );
    // 15 s - 12 s - 1 s of restart - one 2 s step.
    assert_eq!((stall.refill_secs, stall.stalled_secs), (0.0, 3.0));
    // The second the killed step trained is the stall's, not the steady rate's: 64 samples in
    // the 8 s from the first step to the last one committed (7.1/s with it).
    let wide = f.throughput.iter().find(|c| c.config == [2, 1]).unwrap();
    assert_eq!(wide.measured_per_sec, 8.0);
    assert_eq!(f.intervals[1].stalled_secs, 3.0);
    let g = &f.gap;
    assert_eq!(g.rolled_back, -32.0, "two steps of 16 samples");
    let sum = g.configuration
        + g.stalls
        + g.throughput
        + g.rolled_back
        + g.outside_intervals
        + g.unexplained;
    assert!((sum - g.gap).abs() < 1e-9, "{g:?}");
    assert!(summary("reactive", &f).contains("cut off 1.0 s, detection 1.0 s"));
}
