use super::*;
use crate::config::ParallelConfig;
use crate::cost::analytic::throughput_table;
use crate::cost::spec::RestartKind;
use crate::cost::transfer::TransferModel;

fn layer(name: &str, forward_ms: f64, params: u64, output_bytes: u64) -> ProfiledLayer {
    ProfiledLayer {
        name: name.into(),
        forward_ms,
        backward_ms: 2.0 * forward_ms,
        optimizer_ms: 0.5,
        params,
        param_bytes: params * 4,
        grad_bytes: params * 4,
        optimizer_state_bytes: params * 8,
        output_bytes,
        activation_bytes: None,
    }
}

/// Embedding, `blocks` blocks of 1 M parameters and 1 MiB of output, a head whose logits are
/// 50 MiB, on a device of `memory_mb`.
fn profile(blocks: usize, memory_mb: f64) -> DeviceProfile {
    let mib = 1 << 20;
    let mut layers = vec![layer("embed", 0.1, 2_000_000, mib)];
    layers.extend((0..blocks).map(|b| layer(&format!("block.{b}"), 1.0, 1_000_000, mib)));
    layers.push(layer("head", 2.0, 2_000_000, 50 * mib));
    DeviceProfile {
        format: FORMAT.into(),
        model: "gpt2-124m".into(),
        device: "cuda:0 NVIDIA H100".into(),
        precision: "f32".into(),
        micro_batch: 4,
        seq_len: 256,
        global_batch: 64,
        warmup: 3,
        repeats: 10,
        measured_unix_s: 1_795_000_000,
        memory_mb,
        peak_memory_bytes: 3 << 30,
        peak_memory_source: MemorySource::DevicePool,
        build: StageBuild {
            base_ms: 40.0,
            per_block_ms: 10.0,
        },
        layers,
    }
}

fn problem(text: &str) -> String {
    match DeviceProfile::parse(text, "p.json") {
        Err(ProfileError::Invalid {
            source_name,
            problem,
        }) => {
            assert_eq!(source_name, "p.json");
            problem
        }
        other => panic!("expected an invalid profile, got {other:?}"),
    }
}

#[test]
fn a_profile_reads_back_as_it_was_written_and_prices_its_layers() {
    let p = profile(12, 80.0 * 1024.0);
    let back = DeviceProfile::parse(&serde_json::to_string(&p).unwrap(), "p.json").unwrap();
    assert_eq!(back, p);
    let spec = back.spec();
    assert_eq!(spec.layers.len(), 14);
    assert_eq!(spec.layers[1].forward_ms, 1.0);
    assert_eq!(spec.layers[1].backward_ms, 2.0);
    assert_eq!(spec.layers[13].params, 2_000_000.0);
    assert_eq!(
        spec.boundary_bytes,
        f64::from(1 << 20),
        "the head's logits cross no boundary"
    );
    assert_eq!((spec.micro_batch, spec.global_batch), (4, 64));
    assert_eq!(
        spec.depths,
        (1..=14).collect::<Vec<_>>(),
        "everything fits 80 GiB"
    );
    let c = ParallelConfig::new(2, 7);
    let groups = spec.restart.groups_ms(c, RestartKind::Remove);
    let build = spec.restart.restart_ms(c, RestartKind::Remove) - groups - 240.0;
    assert!((build - (40.0 + 10.0 * 2.0)).abs() < 1e-9, "{build}");
}

#[test]
fn a_small_device_needs_a_deeper_pipeline() {
    // 14 layers of 1-2 M parameters: 16 B a parameter in training is ~16-32 MiB a layer.
    let roomy = profile(12, 1024.0);
    assert_eq!(roomy.min_depth(), Some(1));
    let tight = profile(12, 100.0);
    let depth = tight.min_depth().unwrap();
    assert!(depth > 1 && depth < 14, "{depth}");
    assert_eq!(tight.spec().depths.first(), Some(&depth));
    assert_eq!(profile(12, 1.0).min_depth(), None, "no layer fits 1 MiB");
    let table = throughput_table(
        &tight.spec(),
        tight.hardware(),
        &TransferModel::Profiled10Gbps,
        32,
    );
    assert!(table.configs().all(|(c, _)| c.p >= depth));
    assert!(table.configs().count() > 0);
}

#[test]
fn a_faster_card_plans_more_samples() {
    let slow = profile(12, 80.0 * 1024.0);
    let mut fast = slow.clone();
    for l in &mut fast.layers {
        l.forward_ms /= 2.0;
        l.backward_ms /= 2.0;
    }
    let best = |p: &DeviceProfile| {
        let t = throughput_table(&p.spec(), p.hardware(), &TransferModel::Profiled10Gbps, 8);
        t.samples_per_sec(t.best(8))
    };
    let (s, f) = (best(&slow), best(&fast));
    assert!(f > 1.3 * s, "fast {f} vs slow {s}");
}

#[test]
fn every_bad_value_is_named() {
    let good = profile(2, 1024.0);
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = serde_json::to_value(&good).unwrap();
        edit(&mut v);
        v.to_string()
    };
    assert!(problem(&with(&|v| v["format"] = "parcae-profile/9".into())).contains("format"));
    assert!(
        problem(&with(&|v| v["layers"][2]["backward_ms"] = (-1.0).into()))
            .contains("layers[2].backward_ms")
    );
    assert!(problem(&with(&|v| v["memory_mb"] = 0.0.into())).contains("memory_mb"));
    assert!(problem(&with(&|v| v["global_batch"] = 2.into())).contains("global_batch"));
    assert!(problem(&with(&|v| v["micro_batch"] = 0.into())).contains("micro_batch"));
    assert!(problem(&with(&|v| v["model"] = "".into())).contains("model"));
    assert!(problem(&with(&|v| v["layers"][0]["name"] = "a\nb".into())).contains("layers[0].name"));
    assert!(
        problem(&with(&|v| v["build"]["per_block_ms"] = (-2.0).into()))
            .contains("build.per_block_ms")
    );
    assert!(problem(&with(&|v| v["extra"] = 1.into())).contains("unknown field"));
    assert!(
        problem(&with(&|v| {
            v["layers"].as_array_mut().unwrap().truncate(2);
        }))
        .contains("layers: a profile lists")
    );
    assert!(problem("{").contains("EOF"));
}

#[test]
fn a_name_is_a_built_in_model_or_a_profile_file() {
    let builtin = emulated("gpt-1.5b").unwrap();
    assert_eq!(builtin.spec.layers.len(), 50);
    assert_eq!(builtin.hardware, Hardware::default());
    let e = emulated("gpt-9b").unwrap_err();
    assert!(
        e.to_string().contains("gpt-1.5b") && e.to_string().contains(".json"),
        "{e}"
    );
    let dir = std::env::temp_dir().join(format!("parcae-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.json");
    let e = emulated(missing.to_str().unwrap()).unwrap_err();
    assert!(
        matches!(&e, ProfileError::Read { path, .. } if path.ends_with("missing.json")),
        "{e}"
    );
    let file = dir.join("h100.json");
    let p = profile(12, 80.0 * 1024.0);
    std::fs::write(&file, serde_json::to_string(&p).unwrap()).unwrap();
    let measured = emulated(file.to_str().unwrap()).unwrap();
    assert_eq!(measured.spec, p.spec());
    assert_eq!(measured.hardware.memory_mb, 80.0 * 1024.0);
    let huge = dir.join("huge.json");
    std::fs::write(&huge, vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
    let e = emulated(huge.to_str().unwrap()).unwrap_err();
    assert!(e.to_string().contains("more than a profile's"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
