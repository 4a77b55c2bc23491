use super::*;
use crate::job::Identity;
use parcae_consensus::Command;
use parcae_consensus::state::{LayerCost as Reported, LinkTime, PeerInfo};
use parcae_strategies::ParallelConfig;

/// The cost model of `state`'s measured costs, from a fresh cache.
fn measured(state: &ControlState, shape: &JobShape) -> Option<Arc<CostModel>> {
    MeasuredCache::default().get(state, shape)
}

/// A job of 16 samples in micro-batches of 2 on at most 4 CPU nodes.
fn small_job() -> JobShape {
    JobShape {
        global_batch: 16,
        micro_batch: 2,
        max_nodes: 4,
        restart_ms: 2000.0,
        memory_mb: CPU_MEMORY_MB,
        min_depth: 1,
        profile: None,
        steps_in_zone: false,
    }
}

/// A layer as a node measures it, with `params` parameters and a 4 KiB output.
fn layer(params: u64) -> Reported {
    Reported {
        forward_s: 0.01,
        backward_s: 0.02,
        optimizer_s: 0.001,
        params,
        output_bytes: 4096,
    }
}

/// What a report says beyond its layers.
#[derive(Default)]
struct Report {
    bandwidth: Vec<(NodeId, f64)>,
    reconfiguration_s: Option<f64>,
    allreduce_bytes_per_sec: Option<f64>,
    boundary_link: Option<LinkTime>,
}

/// Three layers of `params` parameters each: the fewest a pipeline of two stages splits.
fn three_layers(params: u64) -> Vec<(u32, Reported)> {
    (0..3).map(|l| (l, layer(params))).collect()
}

/// Node `n` joins `state` and reports `layers` and `report`.
fn reports(state: &mut ControlState, n: u8, layers: &[(u32, Reported)], report: Report) {
    let node = NodeId::from_peer_bytes(&[n]);
    let peer = PeerInfo {
        peer_id: vec![n],
        ..PeerInfo::default()
    };
    state.apply(&Command::Join { node, peer }).unwrap();
    state
        .apply(&Command::CostReport {
            node,
            step: 0,
            layers: layers.to_vec(),
            bandwidth: report.bandwidth,
            reconfiguration_s: report.reconfiguration_s,
            allreduce_bytes_per_sec: report.allreduce_bytes_per_sec,
            boundary_link: report.boundary_link,
        })
        .unwrap();
}

/// Two nodes that fetched from each other at 1 GB/s, each reporting `report`.
fn two_nodes(report: impl Fn() -> Report) -> Arc<CostModel> {
    let mut state = ControlState::default();
    for n in [1u8, 2] {
        let other = NodeId::from_peer_bytes(&[3 - n]);
        let report = Report {
            bandwidth: vec![(other, 1e9)],
            ..report()
        };
        reports(&mut state, n, &three_layers(10_000_000), report);
    }
    measured(&state, &small_job()).unwrap()
}

fn rate(m: &CostModel, d: u32, p: u32) -> f64 {
    m.samples_per_sec(ParallelConfig::new(d, p))
}

#[test]
fn a_reconfiguration_is_priced_at_what_the_nodes_measured() {
    let shape = small_job();
    let mut state = ControlState::default();
    let restart = |state: &ControlState| match &measured(state, &shape).unwrap().spec.restart {
        RestartCost::Fixed { ms } => *ms,
        other => panic!("{other:?}"),
    };
    for (n, reconfiguration_s) in [(1u8, None), (2, Some(12.0)), (3, Some(20.0))] {
        let report = Report {
            reconfiguration_s,
            ..Report::default()
        };
        reports(&mut state, n, &three_layers(1000), report);
        if n == 1 {
            assert_eq!(restart(&state), 2000.0, "nothing measured yet");
        }
    }
    assert_eq!(restart(&state), 20_000.0);
    let deep = JobShape {
        min_depth: 2,
        ..shape.clone()
    };
    let model = measured(&state, &deep).unwrap();
    assert!(
        model.candidates().iter().all(|c| c.p == 2),
        "only depth 2 fits"
    );
}

#[test]
fn the_all_reduce_is_priced_at_the_ring_rate_the_nodes_report() {
    let ring = |allreduce_bytes_per_sec| {
        two_nodes(|| Report {
            allreduce_bytes_per_sec,
            ..Report::default()
        })
    };
    let (fetched, fast, slow) = (ring(None), ring(Some(1e9)), ring(Some(1e8)));
    assert_eq!(rate(&fetched, 2, 1), rate(&fast, 2, 1), "the fetches' rate");
    assert!(rate(&slow, 2, 1) < 0.9 * rate(&fast, 2, 1));
    assert_eq!(rate(&slow, 1, 1), rate(&fast, 1, 1), "no ring, no change");
}

#[test]
fn a_boundary_activation_is_priced_at_the_crossing_the_nodes_report() {
    let crossing = |secs: Option<f64>| {
        two_nodes(|| Report {
            boundary_link: secs.map(|secs| LinkTime { bytes: 4096, secs }),
            ..Report::default()
        })
    };
    let (assumed, timed, instant) = (crossing(None), crossing(Some(2e-4)), crossing(Some(1e-6)));
    let boundary = |m: &CostModel| m.transfer.cost_ms(m.spec.boundary_bytes);
    assert_eq!(assumed.spec.boundary_bytes, 4096.0);
    assert!((boundary(&assumed) - (DEFAULT_LATENCY_MS + 4096e-6)).abs() < 1e-9);
    assert!(
        (boundary(&timed) - 0.2).abs() < 1e-9,
        "{}",
        boundary(&timed)
    );
    assert!(
        (boundary(&instant) - 4096e-6).abs() < 1e-9,
        "never faster than the bytes at the fetches' rate"
    );
    assert!(
        rate(&timed, 1, 2) > rate(&assumed, 1, 2),
        "a pipeline gains"
    );
    // Before any state fetch was timed, the crossings' rate is the links'.
    let mut state = ControlState::default();
    for n in [1u8, 2] {
        let report = Report {
            boundary_link: Some(LinkTime {
                bytes: 4096,
                secs: 2e-4,
            }),
            ..Report::default()
        };
        reports(&mut state, n, &three_layers(10_000_000), report);
    }
    let unfetched = measured(&state, &small_job()).unwrap();
    assert!((boundary(&unfetched) - 0.2).abs() < 1e-9);
    let moved = 1e6;
    assert!((unfetched.transfer.cost_ms(moved) - moved / 4096.0 * 0.2).abs() < 1e-6);
    assert_eq!(
        rate(&timed, 2, 1),
        rate(&assumed, 2, 1),
        "no boundary, no change"
    );
}

/// The planner's model of an emulated gpt-1.5b cluster, from what its devices report (every
/// layer measured, a stage's state fetched, the ring's rate, a boundary activation's crossing),
/// prices every configuration the simulator's model of that cluster has as that model does,
/// on the paced clock, and chooses what it chooses.
#[test]
fn the_model_of_an_emulated_cluster_is_the_simulator_s() {
    use crate::emulate::accelerator::Accelerator;
    use crate::emulate::costs::{Emulation, Fetched};
    use crate::emulate::pacing::Pacing;
    use parcae_strategies::cost::analytic::throughput_table;
    use parcae_strategies::cost::transfer::TransferModel;

    let scale = 6.0;
    let emulation = Emulation::new("gpt-1.5b", scale).unwrap();
    let device = Accelerator::new(emulation.clone());
    let layers: Vec<(u32, Reported)> = (0..emulation.layers())
        .map(|layer| {
            let real = parcae_model::LayerCost {
                layer,
                name: format!("layer{layer}"),
                forward_ms: 0.0,
                backward_ms: 0.0,
                optimizer_ms: 0.0,
                param_count: 1,
                param_bytes: 4,
                optimizer_state_bytes: 8,
                output_bytes: 4,
                activation_bytes: None,
            };
            crate::train::launch::reported(&device.measured_layer(real, 1).unwrap())
        })
        .collect();
    let fetched = device.measured_fetch(&[Fetched::from(1..9)], 0.0).unwrap();
    // Before a state fetch (the job's first plan) and after one.
    let cluster = |fetches: bool| {
        let mut state = ControlState::default();
        for n in [1u8, 2] {
            let other = NodeId::from_peer_bytes(&[3 - n]);
            let report = Report {
                bandwidth: Vec::from_iter(fetches.then_some((other, fetched.rates[0]))),
                allreduce_bytes_per_sec: device.allreduce_rate(),
                boundary_link: device.boundary_link(1),
                ..Report::default()
            };
            reports(&mut state, n, &layers, report);
        }
        state
    };
    let shape = JobShape {
        global_batch: 128,
        micro_batch: 1,
        max_nodes: 32,
        restart_ms: 2000.0,
        memory_mb: emulation.memory_mb(),
        min_depth: emulation.min_depth(),
        profile: None,
        steps_in_zone: false,
    };
    let emulated = parcae_strategies::cost::profile::emulated("gpt-1.5b").unwrap();
    let link = TransferModel::Profiled10Gbps;
    let table = throughput_table(&emulated.spec, emulated.hardware, &link, 32);
    let simulator = CostModel::new(emulated.spec, table, link);
    for planner in [false, true].map(|fetches| measured(&cluster(fetches), &shape).unwrap()) {
        for &c in simulator.candidates() {
            let (theirs, ours) = (
                simulator.samples_per_sec(c),
                planner.samples_per_sec(c) / scale,
            );
            assert!(
                (ours / theirs - 1.0).abs() < 1e-3,
                "{c:?}: {ours} against {theirs}"
            );
        }
        for nodes in 6..=32 {
            assert_eq!(planner.best(nodes), simulator.best(nodes), "{nodes} nodes");
        }
    }
}

#[test]
fn the_leader_plans_the_batch_of_the_cluster_s_job() {
    let own = JobShape {
        max_nodes: 32,
        ..small_job()
    };
    let spec = JobSpec {
        global_batch: 64,
        micro_batch: 0,
        ..JobSpec::default()
    };
    let job = spec.job(&Identity::default(), &[]).unwrap();
    let shape = own.for_job(Some(&job));
    assert_eq!((shape.global_batch, shape.micro_batch), (64, 2));
    assert_eq!(shape.max_nodes, 32);
    let shape = own.for_job(None);
    assert_eq!((shape.global_batch, shape.micro_batch), (16, 2));
}

#[test]
fn a_profile_prices_the_layers_before_any_node_reported() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.json");
    let profile = crate::profile::profile(&crate::profile::tests::tiny(&out)).unwrap();
    let shape = JobShape {
        micro_batch: 4,
        ..small_job()
    };
    let state = ControlState::default();
    assert!(measured(&state, &shape).is_none(), "nothing reported");
    let shape = JobShape {
        profile: Some(Arc::new(profile.clone())),
        ..shape
    };
    let model = measured(&state, &shape).unwrap();
    assert_eq!(model.spec.layers.len(), 4);
    let block = &model.spec.layers[1];
    assert_eq!(block.forward_ms, 2.0 * profile.layers[1].forward_ms);
    assert_eq!(block.optimizer_ms, profile.layers[1].optimizer_ms);
    assert_eq!(
        model.spec.boundary_bytes,
        2.0 * profile.layers[1].output_bytes as f64,
        "the hidden state at the job's micro-batch of 4, not the head's logits"
    );
    assert!(!model.candidates().is_empty());
}

#[test]
fn the_cost_model_is_kept_until_what_it_is_priced_from_changes() {
    let mut state = ControlState::default();
    reports(&mut state, 1, &three_layers(10_000_000), Report::default());
    let mut cache = MeasuredCache::default();
    let first = cache.get(&state, &small_job()).unwrap();
    let again = cache.get(&state, &small_job()).unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the same costs, the same model"
    );
    let wider = JobShape {
        max_nodes: 3,
        ..small_job()
    };
    let other = cache.get(&state, &wider).unwrap();
    assert!(
        !Arc::ptr_eq(&first, &other),
        "another job shape, another model"
    );
    reports(&mut state, 2, &three_layers(20_000_000), Report::default());
    let reported = cache.get(&state, &wider).unwrap();
    assert!(!Arc::ptr_eq(&other, &reported), "new costs, a new model");
    assert_ne!(reported.spec.layers, other.spec.layers);
}
