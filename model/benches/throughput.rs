//! `cargo bench -p parcae-model`: training throughput of the `small` GPT through the stage
//! executor against a plain Burn loop (and the same model in PyTorch, `benches/torch_gpt.py`,
//! when `python3 -c "import torch"` works), state and wire-tensor serialization speeds, and
//! where the time of a step goes per layer. Prints markdown tables.
//!
//! `PARCAE_BENCH_STEPS` (default 4) measured steps per configuration after 1 warm-up step;
//! `PARCAE_BENCH_PRESET=tiny` for a quick smoke run; `PARCAE_BENCH_IO_ONLY=1` skips the training
//! and per-layer tables.

use std::sync::Arc;
use std::time::Instant;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use parcae_model::{
    Batch, Dataset, Gpt, GptConfig, GptLayer, Pipeline, PipelineModel, Sampler, Stage, StageConfig,
    StageRng, SyntheticTask, WireDType, WireLimits, WireTensor, default_lanes, even_ranges,
    init_layers, token_batch,
};

/// The allocator `parcae-node` trains with (see its `main.rs`): every row below uses it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// As `parcae-node` does at start (its `keep_freed_memory`): no purging of freed memory
/// (`mi_option_purge_delay`, index 15, set to -1).
fn keep_freed_memory() {
    // SAFETY: sets a plain integer option.
    unsafe { libmimalloc_sys::mi_option_set(15, -1) };
}

const BATCH: usize = 8;
const SEED: u64 = 1;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn steps() -> usize {
    std::env::var("PARCAE_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

fn config() -> GptConfig {
    match std::env::var("PARCAE_BENCH_PRESET").as_deref() {
        Ok("tiny") => GptConfig::tiny(),
        _ => GptConfig::small(),
    }
}

fn batches(model: &Gpt, step: usize, micro: usize) -> Vec<Batch> {
    let c = model.config();
    let task = SyntheticTask::default_for(3, c.vocab_size, c.seq_len).expect("task");
    let sampler = Sampler::new(4, task.len()).expect("sampler");
    let size = BATCH / micro;
    (0..micro)
        .map(|k| {
            let first = (step * BATCH + k * size) as u64;
            token_batch(&task, &sampler, first, size, &Device::flex().autodiff()).expect("batch")
        })
        .collect()
}

/// Seconds per step of a closure that runs one training step on the micro-batches it is given
/// (made before the clock starts, as the PyTorch script makes its data).
fn time_steps(model: &Gpt, micro: usize, mut step: impl FnMut(usize, Vec<Batch>)) -> f64 {
    let mut data: Vec<Vec<Batch>> = (0..=steps()).map(|s| batches(model, s, micro)).collect();
    step(0, data.remove(0));
    median(
        data.into_iter()
            .enumerate()
            .map(|(k, b)| {
                let t = Instant::now();
                step(k + 1, b);
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

#[derive(Module, Debug)]
struct Full {
    layers: Vec<GptLayer>,
}

/// The same model in a plain Burn training loop: one graph, `ModuleOptimizer` AdamW.
fn plain_burn(model: &Arc<Gpt>) -> f64 {
    let device = Device::flex().autodiff();
    let opt = StageConfig::default().optimizer;
    let mut full = Full {
        layers: init_layers(model.as_ref(), 0..model.num_layers(), SEED, &device),
    };
    let mut optim = opt.adamw_config().init();
    let mut rng = StageRng::from_seed_u64(0);
    time_steps(model, 1, |s, mut b| {
        let b = b.remove(0);
        let mut x = b.inputs;
        for (i, l) in full.layers.iter().enumerate() {
            x = model.forward(i, l, x, &mut rng).expect("forward");
        }
        let loss = model.loss(x, &b.targets).expect("loss");
        let grads = GradientsParams::from_grads(loss.backward(), &full);
        full = optim.step(opt.lr_at(s as u64), full.clone(), grads);
    })
}

fn executor(model: &Arc<Gpt>, stages: usize, micro: usize, lanes: usize) -> f64 {
    let ranges = even_ranges(model.num_layers(), stages).expect("ranges");
    let mut p = Pipeline::new(
        model.clone(),
        &ranges,
        SEED,
        &Device::flex().autodiff(),
        StageConfig {
            lanes,
            ..StageConfig::default()
        },
    )
    .expect("pipeline");
    time_steps(model, micro, |_, b| {
        p.train_step(&b).expect("step");
    })
}

fn state_speed(model: &Arc<Gpt>) {
    let mut p = Pipeline::new(
        model.clone(),
        &even_ranges(model.num_layers(), 1).expect("ranges"),
        SEED,
        &Device::flex().autodiff(),
        StageConfig::default(),
    )
    .expect("pipeline");
    p.train_step(&batches(model, 0, 1)).expect("step");
    let stage = &mut p.stages_mut()[0];
    let range = stage.layer_range();
    let (mut exp, mut imp) = (Vec::new(), Vec::new());
    let mut len = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let bytes = stage.export_state(range.clone()).expect("export");
        exp.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        stage.import_state(&bytes, range.clone()).expect("import");
        imp.push(t.elapsed().as_secs_f64());
        len = bytes.len();
    }
    let (e, i) = (median(exp), median(imp));
    let bytes = stage.export_state(range).expect("export");
    let memcpy = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                let copy = bytes.to_vec();
                let s = t.elapsed().as_secs_f64();
                assert_eq!(copy.len(), bytes.len());
                s
            })
            .collect(),
    );
    let gb = len as f64 / 1e9;
    println!(
        "\n| state ({} params, {:.1} MB) | s | GB/s |",
        stage.num_params(),
        len as f64 / 1e6
    );
    println!("|---|---|---|");
    println!("| export | {e:.3} | {:.2} |", gb / e);
    println!("| import | {i:.3} | {:.2} |", gb / i);
    println!("| export + import | {:.3} | {:.2} |", e + i, gb / (e + i));
    println!(
        "| baseline: copy into a fresh Vec | {memcpy:.3} | {:.2} |",
        gb / memcpy
    );
}

fn wire_speed() {
    let device = Device::flex();
    println!("\n| wire tensor | dtype | encode GB/s | decode GB/s |");
    println!("|---|---|---|---|");
    for shape in [[8usize, 128, 512], [8, 128, 4096]] {
        let t = Tensor::<3>::random(shape, burn::tensor::Distribution::Default, &device);
        for dtype in [WireDType::F32, WireDType::Bf16] {
            let (mut enc, mut dec) = (Vec::new(), Vec::new());
            let mut bytes = Vec::new();
            for _ in 0..5 {
                let s = Instant::now();
                bytes = WireTensor::encode_tensor(&t, dtype).expect("encode");
                enc.push(s.elapsed().as_secs_f64());
                let s = Instant::now();
                let back = WireTensor::decode(&bytes, &WireLimits::default())
                    .expect("decode")
                    .into_tensor::<3>(&device)
                    .expect("tensor");
                dec.push(s.elapsed().as_secs_f64());
                drop(back);
            }
            let gb = (shape.iter().product::<usize>() * 4) as f64 / 1e9;
            println!(
                "| {shape:?} ({:.0} MiB f32, {} B on wire) | {dtype:?} | {:.2} | {:.2} |",
                gb * 1e9 / 1048576.0,
                bytes.len(),
                gb / median(enc),
                gb / median(dec)
            );
        }
    }
}

fn layer_costs(model: &Arc<Gpt>) {
    let stage = Stage::new(
        model.clone(),
        0..model.num_layers(),
        SEED,
        &Device::flex().autodiff(),
        StageConfig::default(),
    )
    .expect("stage");
    let b = batches(model, 0, 1).remove(0);
    let costs = stage
        .measure_layer_costs(
            b.inputs,
            Some(&b.targets),
            parcae_model::Runs {
                warmup: 0,
                repeats: 2,
            },
        )
        .expect("costs");
    println!("\n| layer | forward ms | backward ms | AdamW ms | params | output bytes |");
    println!("|---|---|---|---|---|---|");
    for c in costs {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} |",
            c.name, c.forward_ms, c.backward_ms, c.optimizer_ms, c.param_count, c.output_bytes
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    keep_freed_memory();
    let model = Arc::new(Gpt::new(config()).expect("config"));
    let c = model.config();
    let tokens = (BATCH * c.seq_len) as f64;
    println!(
        "model {:?}, batch {BATCH} x seq {}, {} measured steps (median), rayon threads {}",
        c,
        c.seq_len,
        steps(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into())
    );
    if std::env::var("PARCAE_BENCH_IO_ONLY").is_ok() {
        state_speed(&model);
        wire_speed();
        return;
    }
    let plain = plain_burn(&model);
    println!("\n| training step | s/step | tokens/s | vs plain Burn |");
    println!("|---|---|---|---|");
    println!(
        "| plain Burn loop | {plain:.3} | {:.0} | 1.000 |",
        tokens / plain
    );
    let mut single = plain;
    let lanes = default_lanes();
    for (p, m, l) in [(1, 1, lanes), (1, 1, 1), (2, 1, lanes), (2, 4, lanes)] {
        let t = executor(&model, p, m, l);
        if (p, m, l) == (1, 1, lanes) {
            single = t;
        }
        println!(
            "| stage executor P={p}, {m} micro-batch(es), {l} lane(s) | {t:.3} | {:.0} | {:.3} |",
            tokens / t,
            t / plain
        );
    }
    match pytorch(c) {
        Ok((torch, version)) => {
            println!(
                "| PyTorch {version} (same model and threads) | {torch:.3} | {:.0} | {:.3} |",
                tokens / torch,
                torch / plain
            );
            println!(
                "\nstage executor P=1, {lanes} lane(s) / PyTorch: {:.2}x the time per step",
                single / torch
            );
        }
        Err(why) => println!("\nPyTorch: not measured ({why})"),
    }
    layer_costs(&model);
    state_speed(&model);
    wire_speed();
}

/// Seconds per step of `benches/torch_gpt.py` on `c` with as many threads as Burn has cores,
/// and the torch version.
fn pytorch(c: &GptConfig) -> Result<(f64, String), String> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_gpt.py");
    let version = std::process::Command::new("python3")
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !version.status.success() {
        return Err("python3 -c \"import torch\" failed".into());
    }
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(
            [
                ("--vocab", c.vocab_size),
                ("--d_model", c.d_model),
                ("--heads", c.n_heads),
                ("--blocks", c.n_blocks),
                ("--seq", c.seq_len),
                ("--d_ff", c.d_ff),
                ("--batch", BATCH),
                ("--steps", steps()),
                ("--threads", threads),
            ]
            .iter()
            .flat_map(|(k, v)| [k.to_string(), v.to_string()]),
        )
        .output()
        .map_err(|e| format!("{script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{script} printed no JSON: {e}"))?;
    let secs = line["seconds_per_step"]
        .as_f64()
        .ok_or_else(|| format!("{script}: no seconds_per_step in {line}"))?;
    Ok((
        secs,
        String::from_utf8_lossy(&version.stdout).trim().to_string(),
    ))
}
