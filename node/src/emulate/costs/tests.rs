use super::*;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn the_ring_s_rate_is_the_hardware_s_on_the_paced_clock() {
    let e = Emulation::new("gpt-1.5b", 6.0).unwrap();
    let rate = 1.25 * MIB * 1000.0 * 6.0;
    assert!(
        (e.allreduce_rate() / rate - 1.0).abs() < 1e-9,
        "{}",
        e.allreduce_rate()
    );
    // A node timing its ring finds it: the paced ring of two replicas sends each member
    // half the gradient's bytes at that rate.
    let stage = e.stage(1..2, 1, 2).unwrap();
    let (params, _) = e.layer_size(1, 1).unwrap();
    let gradient = params * parcae_strategies::cost::links::GRADIENT_BYTES_PER_PARAM;
    let sent = gradient * 2.0 * (2.0 - 1.0) / 2.0;
    let secs = stage.all_reduce.as_secs_f64();
    assert!((sent / secs / e.allreduce_rate() - 1.0).abs() < 1e-5);
}

#[test]
fn a_stage_costs_the_sum_of_its_profiled_layers() {
    let e = Emulation::new("gpt-1.5b", 1.0).unwrap();
    assert_eq!(e.layers(), 50);
    assert_eq!(e.blocks(), 48);
    // Embedding and six blocks of gpt-1.5b at mbs 1 (spec 2.2 table).
    let s = e.stage(0..7, 1, 1).unwrap();
    assert!((ms(s.forward) - (0.752 + 6.0 * 6.51)).abs() < 1e-6);
    assert!((ms(s.backward) - (0.798 + 6.0 * 13.448)).abs() < 1e-6);
    assert!((ms(s.optimizer) - (5.655 + 6.0 * 2.117)).abs() < 1e-6);
    // Without replicas the first stage still reduces its gradients with the last stage's
    // (the tied embedding, spec 2.4): a ring of two at 1.25 MiB/ms; a middle stage not.
    let params = 82_124_800.0 + 6.0 * 30_740_800.0;
    let tied = params * 2.0 / MIB / 1.25;
    assert!((ms(s.all_reduce) - tied).abs() < 1e-6);
    assert_eq!(e.stage(7..13, 1, 1).unwrap().all_reduce, Duration::ZERO);
    // The boundary activation (1024 x 1600 f32 = 6.25 MiB) on the 10 Gb/s curve.
    let link = TransferModel::Profiled10Gbps.cost_ms(1024.0 * 1600.0 * 4.0);
    assert!((ms(s.to_next) - link).abs() < 1e-6);
    assert_eq!(s.to_prev, s.to_next);
    // Weights and two Adam moments, f32.
    let state = TransferModel::Profiled10Gbps.cost_ms(params * 12.0);
    assert!((ms(s.state) - state).abs() < 1e-6);
}

#[test]
fn time_scale_micro_batch_and_replicas_scale_as_documented() {
    let one = Emulation::new("gpt-1.5b", 1.0).unwrap();
    let fast = Emulation::new("gpt-1.5b", 4.0).unwrap();
    let a = one.stage(1..2, 1, 1).unwrap();
    let b = fast.stage(1..2, 1, 1).unwrap();
    assert!((ms(a.forward) / ms(b.forward) - 4.0).abs() < 1e-9);
    let double = one.stage(1..2, 2, 1).unwrap();
    assert!((ms(double.forward) / ms(a.forward) - 2.0).abs() < 1e-9);
    // Four replicas of one block: 2 (n - 1) / n of its fp16 gradients at 1.25 MiB/ms, the
    // cost model's ring (spec 2.4).
    let ring = one.stage(1..2, 1, 4).unwrap();
    let reduced = 30_740_800.0 * 2.0 / MIB / 1.25 * 1.5;
    assert!((ms(ring.all_reduce) - reduced).abs() < 1e-6);
}

#[test]
fn what_crosses_zones_takes_the_link_between_zones() {
    let e = Emulation::new("gpt-1.5b", 2.0).unwrap();
    let within = e.stage(1..9, 1, 3).unwrap();
    let crossing = Crossings {
        next: true,
        prev: false,
        ring: true,
        by_zone: None,
        round: None,
    };
    let s = e.stage_crossing(1..9, 1, 3, crossing).unwrap();
    let across = across_zones();
    // 5 Gb/s and 0.5 ms: the activation; the ring at 5 Gb/s.
    let activation = across.cost_ms(1024.0 * 1600.0 * 4.0) / 2.0;
    assert!((ms(s.to_next) - activation).abs() < 1e-6);
    assert_eq!(s.to_prev, within.to_prev);
    let five_gbit = 5e9 / 8.0 / MIB / 1000.0;
    let reduced = 8.0 * 30_740_800.0 * 2.0 / MIB / five_gbit * 4.0 / 3.0;
    assert!((ms(s.all_reduce) - reduced / 2.0).abs() < 1e-6);
    assert!(s.to_next > within.to_next && s.all_reduce > within.all_reduce);
    assert_eq!((s.forward, s.backward), (within.forward, within.backward));
    // A holder in another zone sends its state over that link too.
    let near = e.fetch(&[(1..3).into()]).unwrap();
    let far = e
        .fetch(&[Fetched {
            layers: 1..3,
            across: true,
            beside: Vec::new(),
        }])
        .unwrap();
    assert_eq!(near.0, far.0);
    assert!((far.1 - across.cost_ms(far.0) / 2000.0).abs() < 1e-9);
    assert!(far.1 > 1.3 * near.1, "{far:?} {near:?}");
}

#[test]
fn a_switch_costs_what_its_link_receives_its_restores_its_build_and_a_restart() {
    let e = Emulation::new("gpt-1.5b", 1.0).unwrap();
    let state = |params: f64| TransferModel::Profiled10Gbps.cost_ms(params * 12.0);
    let block = 30_740_800.0;
    let to = ParallelConfig::new(2, 8);
    let remove = RestartKind::Remove;
    // Groups rebuilt: 35 + 39.3 ms x (d + p + 1 + d p) (spec 3.2).
    let groups = 35.0 + 39.3 * (2.0 + 8.0 + 1.0 + 16.0);
    let kept = e.switch(to, remove, Rebuild::Groups, &[], &[]).unwrap();
    assert!((ms(kept) - groups).abs() < 1e-6);
    // Two sources at once: the three blocks they send share this node's link (the larger
    // share alone would take the time of two).
    let two_sources = [(1..3).into(), (3..4).into()];
    let t = e
        .switch(to, remove, Rebuild::Groups, &two_sources, &[])
        .unwrap();
    assert!((ms(t) - (groups + state(3.0 * block))).abs() < 1e-6);
    // A holder that sends two blocks to other nodes at once shares its link between them:
    // this node's one-block piece is through once the link carried a block of each, three
    // blocks in all (more than the two its own link receives).
    let shared = [
        Fetched {
            beside: vec![5..7, 7..8],
            ..(1..2).into()
        },
        (2..3).into(),
    ];
    let t = e.switch(to, remove, Rebuild::Groups, &shared, &[]).unwrap();
    assert!((ms(t) - (groups + state(3.0 * block))).abs() < 1e-6);
    // A stage of other layers is built: Parcae's profiled build of ceil(48 / p) blocks.
    let build = TransferModel::Profiled10Gbps.cost_ms(50257.0 * 1024.0 * 4.0) + 430.0 * 6.0;
    let built = e
        .switch(to, remove, Rebuild::Stage, &two_sources, &[])
        .unwrap();
    assert!((ms(built) - (groups + build + state(3.0 * block))).abs() < 1e-6);
    // A restore adds its state; a restart is Parcae's profiled restart: process 240 ms,
    // the groups, the build.
    let restored = std::slice::from_ref(&(5..6));
    let t = e
        .switch(to, remove, Rebuild::Restart, &[], restored)
        .unwrap();
    assert!(
        (ms(t) - (240.0 + groups + build + state(block))).abs() < 1e-6,
        "{t:?}"
    );
    // Nodes joining add the rendezvous (6.6 s) and dearer groups (500 ms each).
    let add = e
        .switch(to, RestartKind::Add, Rebuild::Restart, &[], &[])
        .unwrap();
    let joined = 6600.0 + 35.0 + 500.0 * 27.0 + 240.0 + build;
    assert!((ms(add) - joined).abs() < 1e-6, "{add:?}");
    let beyond = &[(49..51).into()];
    assert!(e.switch(to, remove, Rebuild::Groups, beyond, &[]).is_err());
}

#[test]
fn the_reactive_baseline_restarts_as_the_simulator_charges_it() {
    let model = parcae_strategies::cost::CostModel::builtin("gpt-1.5b").unwrap();
    for scale in [1.0, 4.0] {
        let e = Emulation::new("gpt-1.5b", scale).unwrap();
        for (to, kind) in [
            (ParallelConfig::new(4, 8), RestartKind::Remove),
            (ParallelConfig::new(2, 13), RestartKind::Add),
        ] {
            let simulated = parcae_strategies::baselines::restart_ms(&model, to, kind, true);
            let emulated = ms(e.reactive_restart(to, kind).unwrap()) * scale;
            assert!(
                (emulated - simulated).abs() < 1e-6,
                "{emulated} {simulated}"
            );
            // The checkpoint round trip and the whole model's state, beyond the restart.
            let restart = ms(e.switch(to, kind, Rebuild::Restart, &[], &[]).unwrap()) * scale;
            assert!(emulated > restart + 14_000.0, "{emulated} {restart}");
        }
    }
}

#[test]
fn bad_settings_are_named() {
    assert_eq!(
        Emulation::new("gpt-9b", 1.0).unwrap_err(),
        EmulationError::Profile(ProfileError::Unknown("gpt-9b".into()))
    );
    for scale in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Emulation::new("gpt-1.5b", scale),
            Err(EmulationError::TimeScale(_))
        ));
    }
    let e = Emulation::new("gpt-1.5b", 1.0).unwrap();
    for r in [49..51, 3..3] {
        let err = e.stage(r, 1, 1).unwrap_err();
        assert!(err.to_string().contains("of gpt-1.5b"), "{err}");
    }
}

#[test]
fn a_boundary_activation_takes_the_stage_s_crossing() {
    let e = Emulation::new("gpt-1.5b", 6.0).unwrap();
    let link = e.boundary_link(2);
    assert_eq!(link.bytes, 2 * 1024 * 1600 * 4);
    let stage = e.stage(3..9, 2, 4).unwrap();
    assert!((link.secs - stage.to_next.as_secs_f64()).abs() < 1e-12);
    // The profiled curve at 13.1 MB (14.7 ms at 10 Gb/s), on the paced clock.
    assert!((link.secs * 6.0 - 0.014730).abs() < 1e-5, "{}", link.secs);
}

#[test]
fn a_ring_by_zone_takes_its_zones_rings_then_a_share_across() {
    let e = Emulation::new("gpt-1.5b", 1.0).unwrap();
    let across = Crossings {
        ring: true,
        ..Crossings::default()
    };
    let spread = ZoneSpread {
        replicas: 4,
        zones: 2,
        fewest: 2,
        most: 2,
    };
    let by_zone = Crossings {
        by_zone: Some(spread),
        ..across
    };
    let (within, flat, zoned) = (
        ms(e.stage(1..9, 1, 4).unwrap().all_reduce),
        ms(e.stage_crossing(1..9, 1, 4, across).unwrap().all_reduce),
        ms(e.stage_crossing(1..9, 1, 4, by_zone).unwrap().all_reduce),
    );
    // The flat ring moves 2 * 3/4 of the gradients at the crossing's rate; by zone, 2 * 1/2
    // inside at the zone's rate, then 2 * 1/2 of each replica's half across.
    let at_across = flat / 1.5;
    let at_within = within / 1.5;
    let expected = at_within + 0.5 * at_across;
    assert!(
        (zoned - expected).abs() < 1e-6 * expected,
        "{zoned} vs {expected}"
    );
    assert!(zoned < flat);
}

#[test]
fn a_round_sends_f32_inside_each_zone_and_the_wire_form_across() {
    let e = Emulation::new("gpt-1.5b", 2.0).unwrap();
    let params = 8.0 * 30_740_800.0;
    let spread = ZoneSpread {
        replicas: 4,
        zones: 2,
        fewest: 2,
        most: 2,
    };
    let round = |wire: Wire, spread: ZoneSpread| {
        let crossing = Crossings {
            round: Some(RoundCrossing { spread, wire }),
            ..Crossings::default()
        };
        ms(e.stage_crossing(1..9, 1, 4, crossing).unwrap().round)
    };
    // Inside each zone of two: 2 * 1/2 of the f32 values at the hardware's 1.25 MiB/ms; across
    // two zones: 2 * 1/2 of each replica's half, at 5 Gb/s; all on a clock twice as fast.
    let five_gbit = 5e9 / 8.0 / MIB / 1000.0;
    let f32_mib = params * 4.0 / MIB;
    let inside = f32_mib / 1.25;
    let across = |bytes: f64| params * bytes / MIB * 0.5 / five_gbit;
    for (wire, bytes) in [
        (Wire::F32, 4.0),
        (Wire::Bf16, 2.0),
        (Wire::Int8, 1.0 + 4.0 / 256.0),
    ] {
        let expected = (inside + across(bytes)) / 2.0;
        let got = round(wire, spread);
        assert!(
            (got - expected).abs() < 1e-6 * expected,
            "{wire}: {got} vs {expected}"
        );
    }
    // Replicas in one zone never cross: the zone's ring alone, whatever the form.
    let one_zone = ZoneSpread {
        zones: 1,
        fewest: 4,
        most: 4,
        ..spread
    };
    let ring_of_four = f32_mib * 1.5 / 1.25 / 2.0;
    for wire in [Wire::F32, Wire::Int8] {
        assert!((round(wire, one_zone) - ring_of_four).abs() < 1e-6 * ring_of_four);
    }
    // No rounds, or no one to average with: nothing.
    assert_eq!(e.stage(1..9, 1, 4).unwrap().round, Duration::ZERO);
    let alone = ZoneSpread {
        replicas: 1,
        zones: 1,
        fewest: 1,
        most: 1,
    };
    assert_eq!(round(Wire::F32, alone), 0.0);
}
