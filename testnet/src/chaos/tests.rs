//! The chaos schedule: kills, the outage, pauses and splits on their periods.

use super::schedule::{Outage, Recurring, recurring};
use super::*;

fn schedule(nodes: u32, duration: f64, outage: Option<Outage>) -> Schedule {
    Schedule {
        nodes,
        duration,
        kill_every: 20.0,
        interval_secs: 10.0,
        outage,
        pauses: None,
        partitions: None,
        disks_full: None,
        clock_skew: None,
        slow_links: None,
        slow_link_kbit: 1000,
    }
}

#[test]
fn kills_on_the_period_until_the_end() {
    let mut c = Chaos::new(schedule(6, 60.0, None), 1);
    assert_eq!(c.initial_nodes(), 6);
    assert_eq!(c.next_action(), Some(20.0));
    c.next_kill += c.schedule.kill_every;
    assert_eq!(c.next_action(), Some(40.0));
    c.next_kill += c.schedule.kill_every;
    assert_eq!(c.next_action(), None, "no kill at the very end");
    assert_eq!(c.interval_at(35.0), (3, 6));
    assert_eq!(c.target(1.0), 6);
}

#[test]
fn an_outage_stops_every_node_then_starts_new_ones() {
    let outage = Outage {
        at: 30.0,
        secs: 15.0,
    };
    let mut c = Chaos::new(schedule(4, 90.0, Some(outage)), 1);
    assert_eq!(c.next_action(), Some(20.0), "the first kill");
    c.next_kill += c.schedule.kill_every;
    assert_eq!(
        c.next_action(),
        Some(30.0),
        "the outage before the kill at 40"
    );
    c.cut_off = Some(CutOff {
        last_step: Some(12),
        history: 0,
    });
    assert_eq!(c.next_action(), Some(40.0));
    assert!(c.in_outage(40.0) && c.in_outage(44.9) && !c.in_outage(45.0));
    assert_eq!(c.target(35.0), 0);
    assert_eq!(c.next_outage_edge(), Some(45.0), "the restart");
    c.restarted = true;
    assert_eq!(c.next_outage_edge(), None);
    let rec = |step, history| parcae_api::StepRecord {
        step,
        history,
        samples: 8,
        sample_start: step * 8,
        ..parcae_api::StepRecord::default()
    };
    let seq: Vec<_> = (0..=9)
        .map(|s| rec(s, 0))
        .chain((10..15).map(|s| rec(s, 1)))
        .collect();
    assert_eq!(
        c.outage_report(&seq),
        Some(OutageReport {
            last_step_before: Some(12),
            resumed_from_step: Some(9),
            steps_after: 5
        })
    );
    let fresh: Vec<_> = (0..3).map(|s| rec(s, 0)).collect();
    assert_eq!(
        c.outage_report(&fresh).and_then(|o| o.resumed_from_step),
        None,
        "a new cluster that started over did not resume"
    );
}

#[test]
fn pauses_alternate_with_wake_ups_and_stay_clear_of_the_outage_and_the_end() {
    let outage = Outage {
        at: 50.0,
        secs: 10.0,
    };
    let mut s = schedule(4, 100.0, Some(outage));
    s.kill_every = 1000.0;
    s.pauses = Some(Recurring {
        every: 30.0,
        secs: 8.0,
    });
    let mut c = Chaos::new(s, 1);
    assert_eq!(c.next_pause_edge(), Some(30.0));
    c.frozen = Some(Held {
        node: 2,
        until: 38.0,
        fault: 0,
    });
    assert_eq!(c.next_action(), Some(38.0), "the wake-up comes first");
    c.frozen = None;
    c.next_pause = 60.0;
    assert!(c.schedule.fits(30.0, 8.0));
    assert!(!c.schedule.fits(45.0, 8.0), "it would last into the outage");
    assert!(!c.schedule.fits(55.0, 8.0), "during the outage");
    assert!(c.schedule.fits(60.0, 8.0), "after it");
    assert!(!c.schedule.fits(95.0, 8.0), "past the end");
}

#[test]
fn the_leader_is_frozen_first_then_random_nodes_that_are_up() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    assert_eq!(pause_victim(Some(3), &[0, 1, 3], &mut rng), Some(3));
    let down_leader = pause_victim(Some(4), &[0, 1, 3], &mut rng);
    assert!(down_leader.is_some_and(|v| [0, 1, 3].contains(&v)));
    let picks: std::collections::BTreeSet<usize> = (0..50)
        .filter_map(|_| pause_victim(None, &[0, 1, 3], &mut rng))
        .collect();
    assert_eq!(picks, [0, 1, 3].into(), "every node up may be frozen");
    assert_eq!(pause_victim(None, &[], &mut rng), None);
}

#[test]
fn the_name_says_what_the_chaos_does() {
    let mut s = schedule(4, 100.0, None);
    assert_eq!(trace_name(&s), "chaos:kill-every=20s");
    s.outage = Some(Outage { at: 8.0, secs: 5.0 });
    s.pauses = Some(Recurring {
        every: 30.0,
        secs: 8.0,
    });
    assert_eq!(
        trace_name(&s),
        "chaos:kill-every=20s:outage=8s+5s:pause-every=30s+8s"
    );
    s.slow_links = Some(Recurring {
        every: 40.0,
        secs: 10.0,
    });
    assert!(
        trace_name(&s).ends_with(":slow-link-every=40s+10s@1000kbit"),
        "{}",
        trace_name(&s)
    );
}

#[test]
fn a_slow_link_comes_on_its_period_and_ends_after_its_seconds() {
    let mut s = schedule(4, 100.0, None);
    s.slow_links = Some(Recurring {
        every: 30.0,
        secs: 10.0,
    });
    let mut c = Chaos::new(s, 1);
    assert_eq!(c.next_slow_edge(), Some(30.0));
    assert_eq!(
        c.schedule.turn(s.slow_links, &mut c.next_slow, 30.0),
        Some(10.0)
    );
    assert_eq!(c.next_slow_edge(), Some(60.0));
    c.slowed = Some(Held {
        node: 2,
        until: 40.0,
        fault: 0,
    });
    assert_eq!(c.next_action(), Some(20.0), "the kill first");
    c.next_kill = 50.0;
    assert_eq!(c.next_action(), Some(40.0), "then the link's recovery");
}

#[test]
fn a_recurring_fault_ends_before_the_next_and_before_the_run() {
    assert_eq!(recurring("pause", None, 15, 100).unwrap(), None);
    assert_eq!(
        recurring("pause", Some(30), 8, 100).unwrap(),
        Some(Recurring {
            every: 30.0,
            secs: 8.0
        })
    );
    let err = recurring("partition", Some(10), 10, 100).unwrap_err();
    assert!(
        err.to_string()
            .contains("--partition-secs 10 must be shorter than --partition-every 10"),
        "{err}"
    );
    assert!(
        recurring("pause", Some(90), 15, 100).is_err(),
        "ends after the run"
    );
}

#[test]
fn a_counter_is_read_from_the_metrics_text() {
    let text = "# TYPE parcae_checkpoint_write_failures counter\n\
                parcae_checkpoint_write_failures_total 3\n\
                parcae_checkpoints_total 9\n";
    assert_eq!(counter(text, "parcae_checkpoint_write_failures_total"), 3);
    assert_eq!(counter(text, "parcae_checkpoints_total"), 9);
    assert_eq!(counter(text, "parcae_missing_total"), 0);
}
