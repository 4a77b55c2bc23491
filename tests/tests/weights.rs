//! Weights in and out: `parcae-node export` writes the model of a step's checkpoints as
//! safetensors with Hugging Face GPT-2 names; numpy runs GPT-2 on that file and gets the
//! node's logits; the file loads back into an identical model; and a cluster started from it
//! (`[train] init`) fine-tunes exactly as one process does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::{Int, Tensor, TensorData};
use parcae_model::{
    Activation, Batch, Gpt, Gpt2Safetensors, GptConfig, LayerWeights, OptimizerConfig, Pipeline,
    Sampler, Stage, StageConfig, SyntheticTask, data_parallel_step, default_device, token_batch,
    write_gpt2_safetensors,
};
use parcae_node::config::NodeConfig;
use parcae_tests::{
    TRAIN_BASE_CONFIG, checkpoint_files, node_binary, python_with_numpy, serial, start_cluster,
    wait_for,
};

/// GPT-2 124M's structure (12 blocks, tanh GELU, learned positions) at width 64 with a
/// 300-token vocabulary and 32 positions: the `[train]` lines and the same sizes in Rust.
const MODEL: &str = "model = \"gpt2-124m\"\nd_model = 64\nn_heads = 4\nd_ff = 256\n\
                     vocab_size = 300\nseq_len = 32\n";

fn gpt() -> GptConfig {
    NodeConfig::parse(&format!("[train]\n{MODEL}"), "test")
        .expect("config")
        .model()
}

fn stage(range: std::ops::Range<usize>, seed: u64) -> Stage<Gpt> {
    let model = Arc::new(Gpt::new(gpt()).expect("model"));
    Stage::new(
        model,
        range,
        seed,
        &default_device(),
        StageConfig::default(),
    )
    .expect("stage")
}

fn layer_weights(stage: &Stage<Gpt>) -> Vec<LayerWeights> {
    stage
        .layer_range()
        .map(|layer| LayerWeights {
            layer,
            infos: stage.param_infos(layer).expect("infos").to_vec(),
            values: stage.param_values(layer).expect("values"),
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `parcae-node export` and returns what it printed.
fn export(config: &Path, dirs: &[&Path], out: &Path) -> String {
    let mut cmd = Command::new(node_binary());
    cmd.arg("export").arg("--config").arg(config);
    for d in dirs {
        cmd.arg("--checkpoints").arg(d);
    }
    let done = cmd.arg("--out").arg(out).output().expect("export runs");
    let said = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(
        done.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    said
}

#[test]
fn exported_weights_give_the_node_s_logits_in_numpy_and_load_back_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, format!("[train]\n{MODEL}")).expect("config");
    // Two stage checkpoints of step 7, as pipeline 0 of a two-stage plan writes them.
    let layers = gpt().n_blocks + 2;
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir(&checkpoints).expect("dir");
    for range in [0..6, 6..layers] {
        let mut part = stage(range.clone(), 21);
        part.set_step(7);
        let bytes = part.export_state(range.clone()).expect("state");
        let name = format!("ckpt-7-{}-{}.state", range.start, range.end);
        std::fs::write(checkpoints.join(name), bytes).expect("checkpoint");
    }
    let out = dir.path().join("model.safetensors");
    let said = export(&config, &[dir.path()], &out);
    assert!(
        said.contains("after 7 steps (2 stage checkpoints"),
        "{said}"
    );

    // numpy's GPT-2 on the file against the node's model on the same tokens.
    let tokens: Vec<i64> = vec![5, 17, 299, 0, 42, 42, 7, 128, 64, 3, 250, 11];
    let logits_file = dir.path().join("logits.f32");
    let ran = Command::new(python_with_numpy())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gpt2_forward.py"))
        .arg(&out)
        .arg(gpt().n_heads.to_string())
        .arg(&logits_file)
        .args(tokens.iter().map(|t| t.to_string()))
        .output()
        .expect("python runs");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let numpy: Vec<f32> = std::fs::read(&logits_file)
        .expect("logits")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let whole = stage(0..layers, 21);
    let input = Tensor::<2, Int>::from_data(
        TensorData::new(tokens.clone(), [1, tokens.len()]),
        &default_device(),
    );
    let ours = whole
        .infer(Activation::Tokens(input))
        .expect("forward")
        .into_hidden("logits")
        .expect("logits")
        .into_data()
        .try_to_vec::<f32>()
        .expect("values");
    assert_eq!(ours.len(), tokens.len() * gpt().vocab_size);
    let spread = ours.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(spread > 1e-2, "logits too small to compare: {spread}");
    let diff = max_abs_diff(&ours, &numpy);
    assert!(diff <= 1e-4, "numpy's logits differ by {diff}");

    // The file loads back into the same model, value for value.
    let weights = Gpt2Safetensors::open(&out, &gpt()).expect("open");
    let mut back = stage(0..layers, 99);
    back.load_weights(&weights).expect("load");
    for layer in 0..layers {
        assert_eq!(
            back.param_values(layer).expect("values"),
            whole.param_values(layer).expect("values"),
            "layer {layer}"
        );
    }
}

const SEED: u64 = 5;
const BATCH: u64 = 8;
const MICRO: u64 = 2;
const STEPS: u64 = 10;

fn optimizer() -> OptimizerConfig {
    OptimizerConfig {
        peak_lr: 0.003,
        min_lr: 0.0003,
        warmup_steps: 3,
        epsilon: 1e-5,
        ..OptimizerConfig::default()
    }
}

#[test]
fn a_cluster_started_from_exported_weights_fine_tunes_exactly_as_one_process() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // The weights to fine-tune: another model's, exported.
    let layers = gpt().n_blocks + 2;
    let init: PathBuf = dir.path().join("init.safetensors");
    write_gpt2_safetensors(&gpt(), &layer_weights(&stage(0..layers, 77)), &init).expect("init");

    let train = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 2.0\npin = [1, 2]\n[train]\n{MODEL}\
         init = {:?}\nseed = {SEED}\nglobal_batch = {BATCH}\nmicro_batch = {MICRO}\n\
         peak_lr = 0.003\nwarmup_steps = 3\npeer_timeout_secs = 5.0\nmax_steps = {STEPS}\n\
         checkpoint_every = {STEPS}\n",
        init.display().to_string()
    );
    let c = start_cluster(&train, 2);
    let ranges = wait_for(Duration::from_secs(240), || {
        let mut r: Vec<_> = c
            .nodes
            .iter()
            .flat_map(|n| checkpoint_files(&n.data_dir))
            .filter(|(step, _, _)| *step == STEPS)
            .map(|(_, layers, _)| layers)
            .collect();
        r.sort_by_key(|r| r.start);
        r.dedup();
        (r.len() == 2).then_some(r)
    })
    .unwrap_or_else(|| panic!("no checkpoints of step {STEPS}\n{}", c.logs()));
    let config = dir.path().join("node.toml");
    std::fs::write(&config, &train).expect("config");
    let out = dir.path().join("tuned.safetensors");
    let dirs: Vec<&Path> = c.nodes.iter().map(|n| n.data_dir.as_path()).collect();
    let said = export(&config, &dirs, &out);
    assert!(said.contains(&format!("after {STEPS} steps")), "{said}");

    // One process: the same stages, the same start, the same samples in the same order.
    let model = Arc::new(Gpt::new(gpt()).expect("model"));
    let stage_config = StageConfig {
        optimizer: optimizer(),
        ..StageConfig::default()
    };
    let device = default_device();
    let mut pipeline =
        Pipeline::new(model.clone(), &ranges, SEED, &device, stage_config).expect("pipeline");
    let start = Gpt2Safetensors::open(&init, &gpt()).expect("init weights");
    for s in pipeline.stages_mut() {
        s.load_weights(&start).expect("load");
    }
    let c_gpt = gpt();
    let task = SyntheticTask::default_for(SEED, c_gpt.vocab_size, c_gpt.seq_len).expect("task");
    let sampler = Sampler::new(SEED, parcae_model::Dataset::len(&task)).expect("sampler");
    let mut replicas = vec![pipeline];
    for k in 0..STEPS {
        let batches: Vec<Batch> = (0..BATCH / MICRO)
            .map(|m| {
                token_batch(
                    &task,
                    &sampler,
                    k * BATCH + m * MICRO,
                    MICRO as usize,
                    &device,
                )
                .expect("batch")
            })
            .collect();
        data_parallel_step(&mut replicas, &[batches]).expect("step");
    }
    let tuned = Gpt2Safetensors::open(&out, &gpt()).expect("exported");
    let mut cluster_model = stage(0..layers, 1);
    cluster_model.load_weights(&tuned).expect("load");
    let mut moved = 0.0f32;
    for (s, range) in ranges.iter().enumerate() {
        for layer in range.clone() {
            let ours = cluster_model.param_values(layer).expect("values");
            let reference = replicas[0].stages()[s].param_values(layer).expect("values");
            let diff = max_abs_diff(&ours.concat(), &reference.concat());
            assert!(diff <= 1e-4, "layer {layer}: max abs difference {diff}");
            let started = Stage::new(
                model.clone(),
                layer..layer + 1,
                0,
                &device,
                StageConfig::default(),
            )
            .and_then(|mut s| s.load_weights(&start).map(|()| s))
            .expect("start")
            .param_values(layer)
            .expect("values");
            moved = moved.max(max_abs_diff(&ours.concat(), &started.concat()));
        }
    }
    assert!(moved > 1e-3, "training did not move the weights ({moved})");
}
