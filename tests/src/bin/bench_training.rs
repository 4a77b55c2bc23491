//! Training-step benchmark: a 2 x 2 run across four real `parcae-node` processes (activations,
//! gradients and the all-reduce over the encrypted data plane, every step committed through
//! raft before it is applied) against the same 2 x 2 pipeline in one process. Prints a table.
//!
//! `parcae-bench-training [tiny|small] [STEPS]` (defaults tiny and 20). All processes share this
//! machine's cores, so the ratio is what distribution and consensus cost on one host, not a
//! speed-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parcae_model::{
    Batch, Gpt, GptConfig, OptimizerConfig, Pipeline, Sampler, StageConfig, SyntheticTask,
    data_parallel_step, default_device, token_batch,
};
use parcae_tests::{TRAIN_BASE_CONFIG, start_cluster, wait_for};

const SEED: u64 = 1;

fn in_process(gpt: GptConfig, batch: u64, micro: u64, steps: u64) -> f64 {
    let model = Arc::new(Gpt::new(gpt.clone()).expect("model"));
    let task = SyntheticTask::default_for(SEED, gpt.vocab_size, gpt.seq_len).expect("task");
    let sampler = Sampler::new(SEED, parcae_model::Dataset::len(&task)).expect("sampler");
    let layers = parcae_model::PipelineModel::num_layers(model.as_ref());
    let ranges = parcae_model::even_ranges(layers, 2).expect("ranges");
    let config = StageConfig {
        optimizer: OptimizerConfig::default(),
        ..StageConfig::default()
    };
    let device = default_device();
    let mut replicas: Vec<Pipeline<Gpt>> = (0..2)
        .map(|_| {
            Pipeline::new(model.clone(), &ranges, SEED, &device, config.clone()).expect("pipeline")
        })
        .collect();
    let shards = |k: u64| -> Vec<Vec<Batch>> {
        (0..2)
            .map(|d| {
                (0..batch / 2 / micro)
                    .map(|m| {
                        let first = k * batch + d * batch / 2 + m * micro;
                        token_batch(&task, &sampler, first, micro as usize, &device).expect("batch")
                    })
                    .collect()
            })
            .collect()
    };
    data_parallel_step(&mut replicas, &shards(0)).expect("warm-up");
    let t = Instant::now();
    for k in 1..=steps {
        data_parallel_step(&mut replicas, &shards(k)).expect("step");
    }
    t.elapsed().as_secs_f64() * 1e3 / steps as f64
}

fn across_processes(model: &str, batch: u64, micro: u64, steps: u64) -> f64 {
    let config = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 5.0\npin = [2, 2]\n[train]\nmodel = \"{model}\"\n\
         seed = {SEED}\nglobal_batch = {batch}\nmicro_batch = {micro}\ncheckpoint_every = 0\n\
         peer_timeout_secs = 60.0\n"
    );
    let c = start_cluster(&config, 4);
    let step = || c.statuses().iter().map(|(_, s)| s.step).max();
    let start = wait_for(Duration::from_secs(600), || step().filter(|s| *s >= 2))
        .unwrap_or_else(|| panic!("no training\n{}", c.logs()));
    let t = Instant::now();
    wait_for(Duration::from_secs(3600), || {
        step().filter(|s| *s >= start + steps)
    })
    .unwrap_or_else(|| panic!("training stalled\n{}", c.logs()));
    t.elapsed().as_secs_f64() * 1e3 / steps as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "tiny".into());
    let steps: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let (gpt, batch, micro) = match model.as_str() {
        "small" => (GptConfig::small(), 8, 2),
        _ => (GptConfig::tiny(), 16, 2),
    };
    let local = in_process(gpt, batch, micro, steps);
    let distributed = across_processes(&model, batch, micro, steps);
    println!(
        "| model | batch | 2x2 in one process, ms/step | 2x2 across 4 processes, ms/step | ratio |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {model} | {batch} | {local:.1} | {distributed:.1} | {:.2} |",
        distributed / local
    );
}
