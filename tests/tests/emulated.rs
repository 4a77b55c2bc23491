//! An emulated accelerator paces every step to the profile it emulates.

use parcae_tests::training::*;
use parcae_tests::{TRAIN_BASE_CONFIG, serial};

#[test]
fn an_emulated_accelerator_paces_every_step_to_the_profile() {
    let _serial = serial();
    let scale = 50.0;
    let config = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\npin = [1, 2]\n[train]\nseed = {SEED}\n\
         global_batch = 128\nmicro_batch = 1\npeer_timeout_secs = 10.0\ncheckpoint_every = 0\n\
         [device]\nkind = \"emulated\"\nprofile = \"gpt-1.5b\"\ntime_scale = {scale:?}\n"
    );
    let c = training_cluster(&config, 2, 2);
    // Whatever the partition, the slower of two stages holds at least half of the model's
    // forward and backward time, and a step runs it on all 128 micro-batches.
    let emulation = parcae_node::emulate::Emulation::new("gpt-1.5b", scale).unwrap();
    let whole = emulation.stage(0..emulation.layers(), 1, 1).unwrap();
    let floor_ms = 128.0 * (whole.forward + whole.backward).as_secs_f64() * 1e3 / 2.0;
    for (i, s) in c.statuses() {
        let t = s.training.expect("a training view");
        let e = t
            .emulated
            .unwrap_or_else(|| panic!("node{i} reports no emulated device"));
        assert_eq!((e.profile.as_str(), e.time_scale), ("gpt-1.5b", scale));
        assert!(e.busy_secs > 0.0, "node{i}: {e:?}");
        assert!(
            t.last_step_ms >= floor_ms,
            "node{i}: a step took {:.0} ms, the emulated profile at 1/{scale} at least {floor_ms:.0} ms",
            t.last_step_ms
        );
    }
    assert!(committed_sequence_of(&c, 128).len() >= 2);
}
