use super::*;
use crate::monitor::Monitor;
use crate::run_check::check;
use parcae_api::{MigrationKind, MigrationView, StepRecord};

#[test]
fn report_fields_are_the_issue_contract() {
    let step = |step, start, loss| StepRecord {
        step,
        epoch: 1,
        sample_start: start,
        samples: 8,
        loss,
        validation_loss: (step != 2).then_some(loss + 0.5),
        history: 0,
        outer_digests: Vec::new(),
        groups: Vec::new(),
        partition: Vec::new(),
    };
    let mut monitor = Monitor::default();
    monitor.steps.observe(&[step(1, 0, 4.0), step(2, 8, 3.0)]);
    monitor.migrations.observe(
        &[MigrationView {
            epoch: 2,
            kind: MigrationKind::Inter,
            at_step: 2,
            secs: 0.5,
            received_bytes: 0,
        }],
        1.0,
    );
    let obs = Observed {
        monitor,
        final_seq: vec![step(1, 0, 4.0), step(2, 8, 3.0), step(3, 12, 2.5)],
        warnings: Vec::new(),
    };
    let meta = RunMeta {
        strategy: "liveput".into(),
        trace: "synthetic:hh:0".into(),
        intervals: 15,
        nodes_max: 6,
        wall_secs: 170.0,
        sync: "step".into(),
        seed: 1,
        outer: None,
        pseudo_gradient: None,
    };
    let (r, details) = build(meta, &obs);
    assert_eq!(details.gaps, 0);
    assert!(details.lost.is_empty());
    assert_eq!(r.committed_steps, 3);
    assert_eq!(r.samples, 24);
    assert_eq!(r.duplicate_samples, 4);
    assert_eq!(r.loss_first, Some(4.0));
    assert_eq!(r.loss_last, Some(2.5));
    assert_eq!((r.val_loss_first, r.val_loss_last), (Some(4.5), Some(3.0)));
    let curve: Vec<(u64, f64)> = r
        .val_curve
        .iter()
        .map(|p| (p.samples, p.val_loss))
        .collect();
    assert_eq!(curve.first(), Some(&(0, 4.5)), "before any sample trained");
    assert_eq!(curve.last().map(|p| p.1), Some(3.0));
    assert_eq!(r.migrations.inter, 1);
    assert_eq!(r.migration_secs, 0.5);
    assert_eq!(
        r.reconfigurations,
        vec![Reconfiguration {
            epoch: 2,
            kind: MigrationKind::Inter,
            at_step: 2,
            seen_at_secs: 1.0,
            secs: 0.5
        }]
    );
    assert_eq!(r.lost_committed_steps, 0);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["reconfigurations"][0]["kind"], "inter");
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "allreduce_bytes",
            "allreduce_cross_zone_bytes",
            "committed_steps",
            "duplicate_samples",
            "intervals",
            "loss_first",
            "loss_last",
            "lost_committed_steps",
            "migration_secs",
            "migrations",
            "nodes_max",
            "percent_of_ideal",
            "reconfigurations",
            "rolled_back_steps",
            "samples",
            "seed",
            "simulated_samples",
            "strategy",
            "sync",
            "trace",
            "val_curve",
            "val_loss_first",
            "val_loss_last",
            "vs_simulated",
            "wall_secs"
        ]
    );
    let mut kinds: Vec<&str> = v["migrations"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["inter", "intra", "repartition", "restart"]);
    let back: RunReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
    assert_eq!(
        check(&r).unwrap_err(),
        "liveput run failed its check: 4 samples were trained twice"
    );
    let clean = RunReport {
        duplicate_samples: 0,
        ..r.clone()
    };
    assert!(check(&clean).is_ok());
    let idle = RunReport {
        committed_steps: 0,
        loss_first: None,
        loss_last: None,
        val_loss_first: None,
        val_loss_last: None,
        val_curve: Vec::new(),
        sync: "step".into(),
        seed: 1,
        outer: None,
        pseudo_gradient: None,
        lost_committed_steps: 2,
        ..clean
    };
    assert_eq!(
        check(&idle).unwrap_err(),
        "liveput run failed its check: no step was committed; no loss was reported; \
         2 committed steps were lost"
    );
    assert_eq!(
        summary(&r),
        "liveput: loss 4.000 -> 2.500 over 3 committed steps (validation 4.500 -> 3.000); \
         1 reconfigurations \
         (0 intra, 1 inter, 0 repartition, 0 restart) taking 0.5 s; 0 committed steps \
         LOST, 4 samples trained twice"
    );
}

#[test]
fn emulated_overrun_is_summed_over_nodes_and_checked() {
    let view = |overrun_secs, busy_secs| EmulatedView {
        profile: "gpt-1.5b".into(),
        time_scale: 2.0,
        overrun_count: 3,
        overrun_secs,
        busy_secs,
    };
    assert_eq!(EmulatedReport::of(&[]), None);
    let e = EmulatedReport::of(&[view(1.0, 30.0), view(2.0, 30.0)]).unwrap();
    assert_eq!(e.overrun_count, 6);
    assert!((e.overrun_fraction - 0.05).abs() < 1e-12);
    let base = RunReport {
        strategy: "liveput".into(),
        trace: "t".into(),
        intervals: 1,
        nodes_max: 2,
        committed_steps: 2,
        samples: 16,
        loss_first: Some(2.0),
        loss_last: Some(1.0),
        val_loss_first: None,
        val_loss_last: None,
        val_curve: Vec::new(),
        sync: "step".into(),
        seed: 1,
        outer: None,
        pseudo_gradient: None,
        migrations: MigrationCounts::default(),
        migration_secs: 0.0,
        lost_committed_steps: 0,
        rolled_back_steps: 0,
        duplicate_samples: 0,
        wall_secs: 1.0,
        allreduce_bytes: 0,
        allreduce_cross_zone_bytes: 0,
        outer_rounds: None,
        emulated: Some(e),
        resources: None,
        leader_failover: None,
        outage: None,
        faults: Vec::new(),
        minority_commits: None,
        history_check: None,
        checkpoint_write_failures: None,
        reconfigurations: Vec::new(),
        simulated_samples: None,
        vs_simulated: None,
        fidelity: None,
        percent_of_ideal: None,
        cost: None,
    };
    let mut compared = base.clone();
    compared.compare_with_simulator(20.0, 32.0);
    assert_eq!(compared.vs_simulated, Some(0.8));
    assert_eq!(compared.percent_of_ideal, Some(50.0));
    compared.compare_with_simulator(0.0, 0.0);
    assert_eq!(
        (compared.vs_simulated, compared.percent_of_ideal),
        (None, None)
    );
    assert!(check(&base).is_ok(), "5 % is within the bound");
    let slow = RunReport {
        emulated: EmulatedReport::of(&[view(4.0, 30.0), view(2.0, 30.0)]),
        ..base.clone()
    };
    let err = check(&slow).unwrap_err();
    assert!(
        err.contains("overran the emulated gpt-1.5b by 10.0%"),
        "{err}"
    );
    let json = serde_json::to_value(&slow).unwrap();
    assert_eq!(json["emulated"]["overrun_fraction"], 0.1);
    let split_brain = RunReport {
        minority_commits: Some(2),
        ..base.clone()
    };
    let err = check(&split_brain).unwrap_err();
    assert!(
        err.contains("2 steps were applied by nodes cut off"),
        "{err}"
    );
    let torn = RunReport {
        history_check: Some(crate::history::HistoryCheck {
            passed: false,
            histories: 1,
            steps_checked: 4,
            minority_commits: None,
            replay_max_abs_diff: None,
            replay_max_loss_diff: None,
            problems: vec!["the final history jumps from step 1 to step 3".into()],
        }),
        ..base.clone()
    };
    let err = check(&torn).unwrap_err();
    assert!(
        err.contains("history check failed: the final history jumps"),
        "{err}"
    );
    let healed = RunReport {
        minority_commits: Some(0),
        ..base
    };
    assert!(check(&healed).is_ok());
}
