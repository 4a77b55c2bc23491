use parcae_strategies::cost::objective::ObjectiveKind;

use super::*;

#[test]
fn defaults_and_overrides() {
    let c = NodeConfig::parse("", "x").unwrap();
    assert_eq!(c, NodeConfig::default());
    assert_eq!(c.grace(), Duration::from_secs(30));
    let c = NodeConfig::parse(
        "grace_secs = 2.5\n[raft]\ntick_ms = 50\n[notices]\naws_base_url = \"http://127.0.0.1:1\"\n",
        "x",
    )
    .unwrap();
    assert_eq!(c.grace(), Duration::from_millis(2500));
    assert_eq!(c.raft.tick_ms, 50);
    assert_eq!(c.raft.election_ticks, 10);
    assert_eq!(
        c.notices.aws_base_url.as_deref(),
        Some("http://127.0.0.1:1")
    );
}

#[test]
fn diloco_is_a_train_setting_and_auto_or_a_bad_outer_step_is_refused() {
    let c = NodeConfig::parse(
        "[train]\nsync = \"diloco:20\"\nouter_lr = 1.0\nouter_momentum = 0.0\npseudo_gradient = \"int8\"",
        "x",
    )
    .unwrap();
    let spec = c.train.job_spec();
    assert_eq!(spec.sync, parcae_outer::SyncMode::Diloco(20));
    assert_eq!((spec.outer.lr, spec.outer.momentum), (1.0, 0.0));
    assert_eq!(spec.outer.wire, parcae_outer::Wire::Int8);
    assert_eq!(c.train.with_spec(&spec), c.train);
    for (text, needle) in [
        ("sync = \"auto\"", "does not choose"),
        ("sync = \"diloco:20\"\nouter_momentum = 1.0", "momentum"),
        ("sync = \"diloco:0\"", "diloco"),
        ("pseudo_gradient = \"fp8\"", "pseudo_gradient"),
    ] {
        let e = NodeConfig::parse(&format!("[train]\n{text}"), "x").unwrap_err();
        assert!(e.to_string().contains(needle), "{text}: {e}");
    }
    // An emulated device paces DiLoCo's rounds too (`emulate::costs`' `round`).
    let emulated =
        "[train]\nsync = \"diloco:20\"\n[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"";
    assert!(NodeConfig::parse(emulated, "x").is_ok());
}

#[test]
fn rejects_typos_and_bad_ranges() {
    assert!(matches!(
        NodeConfig::parse("grace_sec = 1", "x"),
        Err(ConfigError::Parse { .. })
    ));
    assert!(matches!(
        NodeConfig::parse("[raft]\nelection_ticks = 1", "x"),
        Err(ConfigError::Invalid(_))
    ));
    assert!(matches!(
        NodeConfig::parse("grace_secs = -1.0", "x"),
        Err(ConfigError::Invalid(_))
    ));
    let e = NodeConfig::parse(
        "[planner]
max_nodes = 0",
        "x",
    )
    .unwrap_err();
    assert!(e.to_string().contains("planner.max_nodes"), "{e}");
    assert!(
        NodeConfig::parse(
            "[planner]
strategy = \"liveput_predict\"",
            "x"
        )
        .is_err()
    );
}

#[test]
fn the_planner_runs_any_of_the_three_strategies() {
    for (name, strategy) in [
        ("liveput", PlanStrategy::Liveput),
        ("liveput-predict", PlanStrategy::LiveputPredict),
        ("reactive", PlanStrategy::Reactive),
    ] {
        let text = format!("[planner]\nstrategy = {name:?}\nmax_nodes = 32\n");
        let c = NodeConfig::parse(&text, "x").unwrap();
        assert_eq!((c.planner.strategy, c.planner.max_nodes), (strategy, 32));
    }
    assert_eq!(NodeConfig::default().planner.max_nodes, 64);
}

#[test]
fn an_emulated_device_can_be_a_faster_kind_with_the_same_links() {
    let device = |extra: &str| {
        let text = format!(
            "[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = 4.0\n{extra}"
        );
        NodeConfig::parse(&text, "x").map(|c| c.device)
    };
    let (base, fast) = (device("").unwrap(), device("speed = 1.5\n").unwrap());
    let stage = |d: &DeviceConfig| d.emulation().unwrap().unwrap().stage(1..9, 1, 2).unwrap();
    let (b, f) = (stage(&base), stage(&fast));
    let ratio = b.forward.as_secs_f64() / f.forward.as_secs_f64();
    assert!((ratio - 1.5).abs() < 1e-6, "{ratio}");
    assert!((b.backward.as_secs_f64() / f.backward.as_secs_f64() - 1.5).abs() < 1e-6);
    assert_eq!(
        (b.to_next, b.all_reduce),
        (f.to_next, f.all_reduce),
        "links unchanged"
    );
    assert_eq!(base.name(), "emulated:gpt-1.5b");
    assert_eq!(fast.name(), "emulated:gpt-1.5b:x1.5");
    for (bad, named) in [("speed = 0.0", "speed"), ("speed = 1000.0", "speed")] {
        let e = device(&format!("{bad}\n")).unwrap_err().to_string();
        assert!(e.contains(named), "{e}");
    }
    let e = NodeConfig::parse("[device]\nspeed = 2.0\n", "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("only an emulated device"), "{e}");
}

#[test]
fn an_emulated_device_trains_the_profile_s_layer_list() {
    let c = NodeConfig::parse(
        "[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = 4.0\n",
        "x",
    )
    .unwrap();
    let e = c.device.emulation().unwrap().expect("emulated");
    assert_eq!(e.time_scale(), 4.0);
    assert_eq!(c.model().n_blocks, 48);
    assert_eq!(c.model().d_model, crate::emulate::STAND_IN.d_model);
    assert_eq!(c.model().kernel, parcae_model::BlockKernel::Fused);
    assert_eq!(
        NodeConfig::default().model().kernel,
        parcae_model::BlockKernel::Composed
    );
    let wider = NodeConfig::parse(
        "[train]\nd_model = 64\n[device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\n",
        "x",
    )
    .unwrap();
    assert_eq!((wider.model().d_model, wider.model().n_blocks), (64, 48));
    assert_eq!(
        NodeConfig::default().model(),
        parcae_model::GptConfig::tiny()
    );
    for (bad, named) in [
        ("profile = \"gpt-9b\"", "gpt-9b"),
        ("time_scale = 0.0", "time_scale"),
    ] {
        let text = format!("[device]\nkind = \"emulated\"\n{bad}\n");
        let e = NodeConfig::parse(&text, "x").unwrap_err().to_string();
        assert!(e.contains(named), "{e}");
    }
    assert!(NodeConfig::parse("[device]\nkind = \"tpu\"\n", "x").is_err());
    let timeout = |device: &str| {
        let text = format!("[train]\npeer_timeout_secs = 6.0\n[device]\n{device}\n");
        NodeConfig::parse(&text, "x").unwrap().peer_timeout()
    };
    assert_eq!(timeout(""), Duration::from_secs(6));
    assert_eq!(
        timeout("kind = \"emulated\"\ntime_scale = 4.0"),
        Duration::from_secs(6)
    );
    assert_eq!(
        timeout("kind = \"emulated\"\ntime_scale = 0.5"),
        Duration::from_secs(12)
    );
}

#[test]
fn the_lost_member_timeout_runs_on_emulated_time_above_three_heartbeats() {
    let lost = |device: &str| {
        let text = format!(
            "[raft]\ntick_ms = 100\nheartbeat_ticks = 2\nlost_timeout_ms = 2000\n[device]\n{device}\n"
        );
        NodeConfig::parse(&text, "x").unwrap().lost_timeout()
    };
    let ms = Duration::from_millis;
    assert_eq!(lost(""), ms(2000));
    assert_eq!(lost("kind = \"emulated\"\ntime_scale = 2.0"), ms(1000));
    // Three heartbeats of 200 ms at the least.
    assert_eq!(lost("kind = \"emulated\"\ntime_scale = 12.0"), ms(600));
    // A slower emulated device does not wait longer: heartbeats are not paced.
    assert_eq!(lost("kind = \"emulated\"\ntime_scale = 0.5"), ms(2000));
}

#[test]
fn the_model_is_one_of_the_presets() {
    let c = NodeConfig::parse(
        "[train]\ndata = \"t.bin\"\ntokens = \"u16\"\nvocab_size = 50257",
        "x",
    )
    .unwrap();
    assert_eq!(c.train.tokens, Some(TokenDtypeName::U16));
    assert_eq!(c.model().vocab_size, 50_257);
    for bad in ["tokens = \"u16\"", "tokens = \"u8\"", "vocab_size = 1"] {
        assert!(
            NodeConfig::parse(&format!("[train]\n{bad}"), "x").is_err(),
            "{bad}"
        );
    }
    let c = NodeConfig::parse("[train]\nmodel = \"small\"", "x").unwrap();
    assert_eq!(c.train.model, ModelPreset::Small);
    assert_eq!(c.train.model.gpt(), parcae_model::GptConfig::small());
    let c = NodeConfig::parse(
        "[train]\nmodel = \"gpt2-124m\"\nd_model = 64\nn_heads = 4\nd_ff = 256",
        "x",
    )
    .unwrap();
    let gpt = c.model();
    assert_eq!(
        (
            gpt.d_model,
            gpt.n_heads,
            gpt.d_ff,
            gpt.n_blocks,
            gpt.vocab_size
        ),
        (64, 4, 256, 12, 50_257)
    );
    assert_eq!(gpt.gelu, parcae_model::Gelu::Tanh);
    let e = NodeConfig::parse("[train]\nmodel = \"gpt2-124m\"\nd_model = 100", "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("n_heads 12 does not divide d_model 100"), "{e}");
    let e = NodeConfig::parse("[train]\nmodel = \"huge\"", "x").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("huge") && text.contains("tiny") && text.contains("small"),
        "{text}"
    );
}

#[test]
fn a_cuda_device_is_refused_by_a_build_without_it_and_names_the_command() {
    let text = "[device]\nkind = \"cuda\"\nindex = 1\n";
    let parsed = NodeConfig::parse(text, "x");
    if cfg!(feature = "cuda") {
        let c = parsed.unwrap();
        assert_eq!((c.device.kind, c.device.index), (DeviceKind::Cuda, 1));
        assert!(c.device.emulation().unwrap().is_none());
    } else {
        let e = parsed.unwrap_err().to_string();
        assert!(e.contains("`cuda` feature"), "{e}");
        assert!(e.contains("--features cuda"), "{e}");
        let mut device = DeviceConfig::default();
        device.choose("cuda:1".parse().unwrap());
        let e = device.burn_device().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
    assert!(
        NodeConfig::default()
            .device
            .burn_device()
            .unwrap()
            .is_autodiff()
    );
}

#[test]
fn gradient_checkpointing_is_asked_for_in_the_device_section() {
    use burn::tensor::GradientCheckpointingStrategy;
    let strategy = |text: &str| {
        NodeConfig::parse(text, "x")
            .unwrap()
            .device
            .burn_device()
            .unwrap()
            .gradient_checkpointing_strategy()
    };
    assert_eq!(
        strategy("[device]\ngradient_checkpointing = true\n"),
        Some(GradientCheckpointingStrategy::Balanced)
    );
    assert_eq!(strategy(""), Some(GradientCheckpointingStrategy::Disabled));
    let e = NodeConfig::parse("[device]\ngradient_checkpointing = 1\n", "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("gradient_checkpointing"), "{e}");
}

#[test]
fn the_command_line_names_cpu_or_a_cuda_gpu() {
    let parse = |s: &str| s.parse::<DeviceChoice>();
    let choice = |kind, index| Ok(DeviceChoice { kind, index });
    assert_eq!(parse("cpu"), choice(DeviceKind::Cpu, 0));
    assert_eq!(parse("cuda"), choice(DeviceKind::Cuda, 0));
    assert_eq!(parse("cuda:3"), choice(DeviceKind::Cuda, 3));
    for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "emulated", ""] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains("cpu, cube-cpu, cuda or cuda:N"), "{bad}: {e}");
    }
    let mut device = DeviceConfig {
        kind: DeviceKind::Emulated,
        ..DeviceConfig::default()
    };
    device.choose(DeviceChoice {
        kind: DeviceKind::Cuda,
        index: 2,
    });
    assert_eq!((device.kind, device.index), (DeviceKind::Cuda, 2));
}

#[test]
fn a_planner_profile_must_read_and_match_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.json");
    crate::profile::profile(&crate::profile::tests::tiny(&out)).unwrap();
    let with = |train: &str, path: &Path| {
        NodeConfig::parse(
            &format!(
                "[train]\n{train}[planner]\nprofile = {:?}\n",
                path.display()
            ),
            "x",
        )
    };
    let c = with("model = \"tiny\"\n", &out).unwrap();
    assert_eq!(c.planner.profile.as_deref(), Some(out.as_path()));
    let e = with("model = \"small\"\n", &out).unwrap_err().to_string();
    assert!(
        e.contains("planner.profile") && e.contains("(4 layers)") && e.contains("has 8 layers"),
        "{e}"
    );
    let missing = dir.path().join("missing.json");
    let e = with("", &missing).unwrap_err().to_string();
    assert!(e.contains("missing.json"), "{e}");
    std::fs::write(&missing, "{\"format\": \"parcae-profile/1\"}").unwrap();
    let e = with("", &missing).unwrap_err().to_string();
    assert!(e.contains("missing field"), "{e}");
}

#[test]
fn the_node_says_its_zone_instance_type_and_device() {
    let c = NodeConfig::parse(
        "[placement]\nzone = \"us-east-1a\"\ninstance_type = \"p3.2xlarge\"\n\
         [device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\n",
        "x",
    )
    .unwrap();
    let caps = c.capabilities();
    assert_eq!(
        (caps.zone.as_str(), caps.instance_type.as_str()),
        ("us-east-1a", "p3.2xlarge")
    );
    assert_eq!(caps.device, "emulated:gpt-1.5b");
    assert_eq!(NodeConfig::default().capabilities().device, "cpu");
    assert_eq!(caps.check(), Ok(()));
    let from_file = |profile: String| DeviceConfig {
        kind: DeviceKind::Emulated,
        profile,
        ..DeviceConfig::default()
    };
    assert_eq!(
        from_file("/profiles/my h100.json".into()).name(),
        "emulated:my_h100.json"
    );
    assert_eq!(from_file("p".repeat(200)).name().len(), 64);
    let e = NodeConfig::parse("[placement]\nzone = \"us east\"\n", "x").unwrap_err();
    assert!(
        e.to_string().contains("placement.zone") && e.to_string().contains("\"us east\" must be"),
        "{e}"
    );
    let e = NodeConfig::parse("[placement]\nrack = \"r1\"\n", "x").unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
}

#[test]
fn a_dollar_objective_needs_sound_zone_prices() {
    let c = NodeConfig::parse(
        "[planner]\nobjective = \"samples-per-dollar\"\n\
         zone_prices = { \"us-east-1a\" = 0.918, \"us-east-1b\" = 1.2 }\n",
        "x",
    )
    .unwrap();
    assert_eq!(c.planner.objective, ObjectiveKind::SamplesPerDollar);
    assert_eq!(c.planner.zone_prices["us-east-1b"], 1.2);
    assert_eq!(
        NodeConfig::default().planner.objective,
        ObjectiveKind::Samples
    );
    for (text, needle) in [
        (
            "objective = \"samples-per-dollar\"\n",
            "needs planner.zone_prices",
        ),
        ("zone_prices = { a = -1.0 }\n", "planner.zone_prices.\"a\""),
        ("zone_prices = { a = nan }\n", "is not a price"),
        ("objective = \"cheapest\"\n", "objective"),
    ] {
        let e = NodeConfig::parse(&format!("[planner]\n{text}"), "x").unwrap_err();
        assert!(e.to_string().contains(needle), "{text}: {e}");
    }
}

#[test]
fn links_set_by_zone_pair_are_checked_and_kept() {
    let c = NodeConfig::parse(
        "[planner]\nlinks = [\"us-west-2a/us-east-1a=1,40,0.09\", \"a/a=20,0.01,0\"]\n",
        "x",
    )
    .unwrap();
    let links = c.planner.set_links().unwrap();
    assert_eq!(links.between("us-east-1a", "us-west-2a").usd_per_gb, 0.09);
    assert_eq!(links.between("a", "a").gbit_per_s, 20.0);
    assert!(NodeConfig::default().planner.links.is_empty());
    for (text, needle) in [
        ("links = [\"a-b=1,1,0\"]\n", "planner.links[0]"),
        (
            "links = [\"a/b=1,1,0\", \"A/b=1,1,0\"]\n",
            "planner.links[1]",
        ),
        ("links = [\"a/b=-1,1,0\"]\n", "planner.links[0]"),
    ] {
        let e = NodeConfig::parse(&format!("[planner]\n{text}"), "x").unwrap_err();
        assert!(e.to_string().contains(needle), "{text}: {e}");
    }
}
