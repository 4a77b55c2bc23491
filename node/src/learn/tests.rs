use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    learn: LearnOptions,
}

/// Options of a short run of the tiny model: six steps of 16 samples, a validation every
/// three steps.
fn opts(extra: &[&str]) -> LearnOptions {
    let out = std::env::temp_dir().join(format!("parcae-learn-{}.json", std::process::id()));
    let mut args = vec![
        "learn",
        "--samples",
        "96",
        "--global-batch",
        "16",
        "--micro-batch",
        "4",
        "--eval-every",
        "48",
        "--val-samples",
        "16",
        "--stages",
        "2",
        "--out",
    ];
    let out = out.to_string_lossy().into_owned();
    args.push(&out);
    args.extend_from_slice(extra);
    Cli::parse_from(args).learn
}

fn run(opts: &LearnOptions, mode: &str) -> LearnRun {
    let job = Job::new(opts).unwrap();
    job.run(opts, mode.parse().unwrap(), 1).unwrap()
}

#[test]
fn one_group_whose_outer_step_takes_its_weights_trains_as_step() {
    // With one group, an outer learning rate of 1 and no momentum, the outer step lands on the
    // group's own weights (up to f32 rounding of `a - (a - b)`): DiLoCo is then the
    // synchronous job.
    let o = opts(&[
        "--groups",
        "1",
        "--replicas",
        "2",
        "--outer-lr",
        "1",
        "--outer-momentum",
        "0",
    ]);
    let step = run(&o, "step");
    let diloco = run(&o, "diloco:3");
    assert_eq!(diloco.rounds, 2);
    let at = |r: &LearnRun| r.curve.iter().map(|p| p.samples).collect::<Vec<_>>();
    assert_eq!(at(&step), [0, 48, 96]);
    assert_eq!(at(&diloco), at(&step));
    for (a, b) in step.curve.iter().zip(&diloco.curve) {
        assert!(
            (a.val_loss - b.val_loss).abs() < 1e-4,
            "{step:?} {diloco:?}"
        );
    }
    assert_eq!((step.cross_group_bytes, diloco.cross_group_bytes), (0, 0));
}

#[test]
fn bytes_between_groups_are_a_ring_by_zone_of_each_step_or_round() {
    let o = opts(&["--groups", "2", "--pseudo-gradient", "int8"]);
    let job = Job::new(&o).unwrap();
    let stages: Vec<usize> = job
        .pipeline(1)
        .unwrap()
        .stages()
        .iter()
        .map(|s| s.num_params())
        .collect();
    let params: usize = stages.iter().sum();
    let step = run(&o, "step");
    // Six steps, each all-reducing every f32 gradient by zone: 2 (G - 1) buffers across.
    assert_eq!(step.cross_group_bytes, 6 * 2 * 4 * params as u64);
    let diloco = run(&o, "diloco:4");
    // Rounds after steps 4 and 6 (the last), each sending every stage's int8 pseudo-gradient.
    assert_eq!(diloco.rounds, 2);
    let encoded: usize = stages
        .iter()
        .map(|&n| Wire::Int8.encoded_len(n).unwrap())
        .sum();
    assert_eq!(diloco.cross_group_bytes, 2 * 2 * encoded as u64);
    assert!(diloco.cross_group_bytes * 10 < step.cross_group_bytes);
    // Validations only where the groups agree: after the rounds.
    let at: Vec<u64> = diloco.curve.iter().map(|p| p.samples).collect();
    assert_eq!(at, [0, 64, 96]);
}

#[test]
fn a_round_leaves_every_group_on_the_same_outer_weights() {
    let o = opts(&["--groups", "2"]);
    let job = Job::new(&o).unwrap();
    let mut replicas = vec![job.pipeline(1).unwrap(), job.pipeline(1).unwrap()];
    let mut outer = Outer::new(&mut replicas, job.outer).unwrap();
    let sampler = Sampler::new(1, job.train.len()).unwrap();
    let shards = job.shards(&sampler, 0, 2, &o).unwrap();
    for (replica, shard) in replicas.iter_mut().zip(&shards) {
        data_parallel_step(std::slice::from_mut(replica), std::slice::from_ref(shard)).unwrap();
    }
    let before: Vec<Vec<f32>> = replicas
        .iter()
        .map(|r| r.stages()[0].export_params().unwrap())
        .collect();
    assert_ne!(before[0], before[1], "the groups trained different samples");
    outer.round(&mut replicas, 1, 8).unwrap();
    for s in 0..2 {
        let a = replicas[0].stages()[s].export_params().unwrap();
        assert_eq!(a, replicas[1].stages()[s].export_params().unwrap());
        // Every replica holds the same outer weights, and its weights are them.
        let (x, y) = (&replicas[0].stages()[s], &replicas[1].stages()[s]);
        assert!(x.outer_digest().is_some());
        assert_eq!(x.outer_digest(), y.outer_digest());
        assert!(x.pseudo_gradient().unwrap().iter().all(|v| *v == 0.0));
    }
    // The outer step moved along the mean pseudo-gradient, past it by the Nesterov term:
    // w = anchor - 0.7 (g + 0.9 g) with g the mean of the groups' pseudo-gradients.
    let anchor = job.pipeline(1).unwrap().stages()[0]
        .export_params()
        .unwrap();
    let after = replicas[0].stages()[0].export_params().unwrap();
    for i in [0, anchor.len() / 2, anchor.len() - 1] {
        let g = anchor[i] - (before[0][i] + before[1][i]) / 2.0;
        let want = anchor[i] - 0.7 * 1.9 * g;
        assert!(
            (after[i] - want).abs() < 1e-5,
            "{i}: {} vs {want}",
            after[i]
        );
    }
}

#[test]
fn options_no_run_can_train_are_refused() {
    let o = opts(&["--groups", "3"]);
    let err = Job::new(&o).err().unwrap().to_string();
    assert!(err.contains("3 equal shares"), "{err}");
    let o = opts(&["--groups", "0"]);
    assert!(Job::new(&o).is_err());
    let o = opts(&["--outer-lr=-1"]);
    assert!(Job::new(&o).is_err());
    let o = opts(&["--d-model", "1000000000"]);
    let err = Job::new(&o).err().unwrap().to_string();
    assert!(err.contains("--d-model 1000000000"), "{err}");
}
