//! The model a cluster trains is the one a single process trains: a 2 x 2 run over four
//! processes, the same over two zones (each slot on a node of the zone its placement names),
//! and a run that loses a whole stage and rolls back, end within 1e-4 of the same steps in one
//! process.

use std::time::Duration;

use parcae_tests::training::*;
use parcae_tests::{LocalCluster, new_cluster, serial, start_cluster, wait_for};

/// Waits until one of the four nodes committed `steps_total` steps, each on the samples after
/// the last one's; that node.
fn all_steps_committed(c: &LocalCluster, steps_total: u64) -> usize {
    let done = wait_for(Duration::from_secs(240), || {
        (0..4).find(|&i| steps(c, i).len() as u64 == steps_total)
    });
    let Some(i) = done else {
        panic!("{steps_total} steps did not commit\n{}", c.logs());
    };
    for (k, s) in steps(c, i).iter().enumerate() {
        assert_eq!(s.step, k as u64);
        assert_eq!(s.sample_start, k as u64 * BATCH, "exactly-once cursor");
    }
    i
}

/// Four nodes of `config`, node `k` in zone `zone(k)`.
fn four_nodes_in_zones(config: &str, zone: impl Fn(usize) -> &'static str) -> LocalCluster {
    let mut c = new_cluster(config);
    if let Err(e) = c.start_nodes_with(4, &|_| true, &mut |k| {
        Ok(format!("{config}[placement]\nzone = \"{}\"\n", zone(k)))
    }) {
        panic!("starting 4 nodes: {e}\n{}", c.logs());
    }
    c
}

#[test]
fn two_by_two_across_processes_matches_one_process() {
    let _serial = serial();
    let steps_total = 30u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = {steps_total}"),
    );
    let c = start_cluster(&config, 4);
    let i = all_steps_committed(&c, steps_total);
    let record = steps(&c, i);
    let first = record[0].loss;
    let last = record[record.len() - 1].loss;
    assert!(last < 0.8 * first, "loss fell: {first} -> {last}");
    let status = c.nodes[i].status().unwrap();
    assert_eq!(status.config, Some((2, 2)));
    assert_model_equals_one_process(&c, steps_total);
}

/// Four nodes in two zones (`[placement] zone`), pinned to 2 x 2: the planner lays the plan over
/// the zones (`cost::fleet`), so either each pipeline stays in a zone or each stage's two
/// replicas share one, and the model is still the one a single process trains.
#[test]
fn two_zones_place_every_slot_in_a_zone_and_train_as_one_process() {
    let _serial = serial();
    let steps_total = 30u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = {steps_total}"),
    );
    // Interleaved so that slots taken in the order the nodes joined cross zones both ways.
    let zone = |k: usize| {
        if k == 0 || k == 3 {
            "us-east-1a"
        } else {
            "us-east-1b"
        }
    };
    let c = four_nodes_in_zones(&config, zone);
    let i = all_steps_committed(&c, steps_total);
    let slots: Vec<(usize, [u32; 2])> = c
        .statuses()
        .into_iter()
        .filter_map(|(k, s)| Some((k, s.training?.slot?)))
        .collect();
    assert_eq!(slots.len(), 4, "{slots:?}");
    let zone_at = |pipeline: u32, stage: u32| {
        slots
            .iter()
            .find(|(_, slot)| *slot == [pipeline, stage])
            .map(|(k, _)| zone(*k))
            .unwrap()
    };
    let pipelines_in_a_zone = (0..2).all(|d| zone_at(d, 0) == zone_at(d, 1));
    let stages_in_a_zone = (0..2).all(|s| zone_at(0, s) == zone_at(1, s));
    assert!(
        pipelines_in_a_zone || stages_in_a_zone,
        "slots across zones both ways: {slots:?}"
    );
    let status = c.nodes[i].status().unwrap();
    let zones: Vec<&str> = status
        .members
        .iter()
        .map(|m| m.placement.zone.as_str())
        .collect();
    assert_eq!(
        zones.iter().filter(|z| **z == "us-east-1a").count(),
        2,
        "{zones:?}"
    );
    assert!(c.logs().contains("planning over zones"), "{}", c.logs());
    assert_model_equals_one_process(&c, steps_total);
}

/// Four nodes, two in each zone, pinned to 4 x 1: the one stage's four replicas span both zones,
/// so the plan all-reduces by zone (issue 67): each zone's pair reduce-scatter the gradients,
/// each sends its half's share to its counterpart in the other zone, and each pair all-gathers.
/// The model is the one a single process trains, and each node sends across zones a third of
/// what it sends (a flat ring over the zones sends all of a crossing member's 2 x 3/4 buffers
/// across, and nothing of the others').
#[test]
fn replicas_in_two_zones_all_reduce_by_zone_and_train_as_one_process() {
    let _serial = serial();
    let steps_total = 12u64;
    let config = train_config(
        "pin = [4, 1]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = {steps_total}"),
    );
    let zone = |k: usize| {
        if k.is_multiple_of(2) {
            "us-east-1a"
        } else {
            "us-east-1b"
        }
    };
    let c = four_nodes_in_zones(&config, zone);
    all_steps_committed(&c, steps_total);
    let sent: Vec<(u64, u64)> = c
        .statuses()
        .into_iter()
        .filter_map(|(_, s)| {
            let t = s.training?;
            Some((t.allreduce_bytes, t.allreduce_cross_zone_bytes))
        })
        .collect();
    assert_eq!(sent.len(), 4, "{sent:?}");
    for (all, across) in &sent {
        let share = *across as f64 / *all as f64;
        assert!((0.3..0.37).contains(&share), "a third across: {sent:?}");
    }
    assert_model_equals_one_process_as(&c, steps_total, [4, 1]);
}

/// Both replicas of a stage are SIGKILLed at once in a 2 x 2 run: the cluster rolls back to
/// its newest complete checkpoint cut (no layer is restored from an older step than the live
/// ones), trains the rolled-back samples again, and ends with the model one process trains.
#[test]
fn losing_a_whole_stage_rolls_back_and_the_model_still_equals_one_process() {
    let _serial = serial();
    let steps_total = 30u64;
    let config = train_config(
        "pin = [2, 2]",
        &format!("max_steps = {steps_total}\ncheckpoint_every = 10"),
    );
    let mut c = training_cluster(&config, 6, 1);
    let stage_nodes = |stage: u64| -> Vec<usize> {
        workers(&c)
            .into_iter()
            .filter(|(_, slot)| slot[1] == stage)
            .map(|(i, _)| i)
            .collect()
    };
    let victims = [stage_nodes(0), stage_nodes(1)]
        .into_iter()
        .find(|v| v.len() == 2)
        .unwrap_or_else(|| panic!("a stage without the leader\n{}", c.logs()));
    // The stage dies between two checkpoints: its step is past the newest complete cut (which
    // ends at `cut` and so restores the state entering step `cut + 1`), so no cut holds the
    // step and the cluster must roll back.
    let cut = wait_for(Duration::from_secs(120), || {
        let cut = c
            .statuses()
            .into_iter()
            .filter_map(|(_, s)| s.checkpoint_step)
            .max()?;
        last_step(&c).filter(|s| *s > cut).map(|_| cut)
    })
    .unwrap_or_else(|| panic!("no checkpoint\n{}", c.logs()));
    for &v in &victims {
        c.nodes[v].kill();
    }
    eprintln!("killed nodes {victims:?} past the checkpoint of step {cut}");
    let rolled_back = wait_for(Duration::from_secs(90), || {
        c.statuses()
            .into_iter()
            .map(|(_, s)| s.rolled_back_steps)
            .find(|r| *r > 0)
    })
    .unwrap_or_else(|| panic!("no rollback\n{}", c.logs()));
    eprintln!("rolled back {rolled_back} steps");
    let done = wait_for(Duration::from_secs(240), || {
        (0..c.nodes.len())
            .filter(|i| !victims.contains(i))
            .find(|&i| steps(&c, i).len() as u64 == steps_total)
    })
    .unwrap_or_else(|| panic!("{steps_total} steps did not commit\n{}", c.logs()));
    let status = c.nodes[done].status().unwrap();
    assert_eq!(status.rolled_back_steps, rolled_back);
    assert_eq!(status.history, 1);
    let record = steps(&c, done);
    for (k, s) in record.iter().enumerate() {
        assert_eq!(s.step, k as u64);
        assert_eq!(s.sample_start, k as u64 * BATCH, "exactly-once cursor");
    }
    assert!(
        record.iter().any(|r| r.history == 1),
        "steps after the cut are committed in the new history"
    );
    let logs = c.logs();
    assert!(logs.contains("rolled back to the newest complete checkpoint"));
    assert!(!logs.contains("start afresh"));
    assert_model_equals_one_process(&c, steps_total);
}
