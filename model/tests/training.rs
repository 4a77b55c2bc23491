//! Done-when tests of the model crate: pipeline equivalence, data parallelism, hand-off and
//! learning, on the `tiny` GPT.

use std::ops::Range;
use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use parcae_model::{
    Batch, Dataset, Gelu, Gpt, GptConfig, GptLayer, OpSet, OptimizerConfig, Pipeline,
    PipelineModel, Sampler, Stage, StageConfig, StageRng, StageState, SyntheticTask,
    data_parallel_step, even_ranges, init_layers, token_batch,
};

const SEED: u64 = 11;
const MICRO: usize = 4;
const MICRO_SIZE: usize = 2;
/// AdamW epsilon of the equivalence runs. The gradient of the attention key bias is zero in
/// exact arithmetic (softmax is invariant to a per-query constant), so what reaches it is
/// rounding noise of about 1e-9 whose value depends on summation order; with a tiny epsilon AdamW
/// normalises that noise into full-size steps of random sign, which no two summation orders (one
/// batch or four micro-batches) reproduce. Burn's default of 1e-5 keeps noise-sized gradients
/// noise-sized.
const EPSILON: f32 = 1e-5;

fn device() -> Device {
    Device::flex().autodiff()
}

fn tiny() -> Arc<Gpt> {
    Arc::new(Gpt::new(GptConfig::tiny()).unwrap())
}

fn data() -> (SyntheticTask, Sampler) {
    let c = GptConfig::tiny();
    let task = SyntheticTask::default_for(5, c.vocab_size, c.seq_len).unwrap();
    let sampler = Sampler::new(9, task.len()).unwrap();
    (task, sampler)
}

/// Micro-batches of step `step`: `count` micro-batches of `size` samples starting at sample
/// `step * count * size + offset`.
fn micro_batches(step: u64, count: usize, size: usize, offset: u64) -> Vec<Batch> {
    micro_batches_on(&device(), step, count, size, offset)
}

fn micro_batches_on(
    device: &Device,
    step: u64,
    count: usize,
    size: usize,
    offset: u64,
) -> Vec<Batch> {
    let (task, sampler) = data();
    let first = step * (MICRO * MICRO_SIZE) as u64 + offset;
    (0..count)
        .map(|k| token_batch(&task, &sampler, first + (k * size) as u64, size, device).unwrap())
        .collect()
}

fn whole_batch(step: u64) -> Batch {
    micro_batches(step, 1, MICRO * MICRO_SIZE, 0).remove(0)
}

/// No clipping, so that the reference (Burn's `ModuleOptimizer`, which clips per parameter) and
/// the stages apply the same update.
fn unclipped() -> StageConfig {
    StageConfig {
        optimizer: OptimizerConfig {
            peak_lr: 1e-2,
            warmup_steps: 3,
            total_steps: 20,
            max_grad_norm: None,
            epsilon: EPSILON,
            ..OptimizerConfig::default()
        },
        ..StageConfig::default()
    }
}

fn pipeline(stages: usize, seed: u64, config: StageConfig) -> Pipeline<Gpt> {
    let model = tiny();
    let ranges = even_ranges(model.num_layers(), stages).unwrap();
    Pipeline::new(model, &ranges, seed, &device(), config).unwrap()
}

/// All parameters of a pipeline, layer by layer in visit order, flattened.
fn params(p: &Pipeline<Gpt>) -> Vec<f32> {
    let mut out = Vec::new();
    for s in p.stages() {
        for l in s.layer_range() {
            out.extend(s.param_values(l).unwrap().into_iter().flatten());
        }
    }
    out
}

fn grads(p: &Pipeline<Gpt>) -> Vec<f32> {
    p.stages()
        .iter()
        .flat_map(|s| {
            s.export_grads()
                .unwrap()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
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

/// The unsplit model trained by a plain Burn loop: the reference.
#[derive(Module, Debug)]
struct Full {
    layers: Vec<GptLayer>,
}

struct Reference {
    model: Arc<Gpt>,
    full: Full,
}

struct Collect<'a> {
    grads: Option<&'a GradientsParams>,
    out: Vec<f32>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = match self.grads {
            Some(g) => g
                .get::<D>(param.id)
                .expect("every parameter has a gradient"),
            None => param.val(),
        };
        self.out
            .extend(t.into_data().try_into_vec_as::<f32>().unwrap());
    }
}

impl Reference {
    fn new() -> Self {
        let model = tiny();
        let layers = init_layers(model.as_ref(), 0..model.num_layers(), SEED, &device());
        Self {
            model,
            full: Full { layers },
        }
    }

    fn loss(&self, batch: &Batch) -> Tensor<1> {
        let mut x = batch.inputs.clone();
        let mut rng = StageRng::from_seed_u64(0);
        for (i, l) in self.full.layers.iter().enumerate() {
            x = self.model.forward(i, l, x, &mut rng).unwrap();
        }
        self.model.loss(x, &batch.targets).unwrap()
    }

    fn grads(&self, batch: &Batch) -> (f32, GradientsParams, Vec<f32>) {
        let loss = self.loss(batch);
        let value = loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(loss.backward(), &self.full);
        let mut c = Collect {
            grads: Some(&grads),
            out: Vec::new(),
        };
        self.full.visit(&mut c);
        let flat = c.out;
        (value, grads, flat)
    }

    fn params(&self) -> Vec<f32> {
        let mut c = Collect {
            grads: None,
            out: Vec::new(),
        };
        self.full.visit(&mut c);
        c.out
    }
}

#[test]
fn split_pipelines_match_the_unsplit_model() {
    let opt = unclipped().optimizer;
    let mut reference = Reference::new();
    let mut optim = opt.adamw_config().init();
    let mut pipes: Vec<Pipeline<Gpt>> = [1, 2, 4].map(|p| pipeline(p, SEED, unclipped())).into();
    for p in &pipes {
        assert_eq!(max_abs_diff(&params(p), &reference.params()), 0.0);
    }
    for step in 0..10u64 {
        let (ref_loss, ref_grads, ref_flat) = reference.grads(&whole_batch(step));
        let mbs = micro_batches(step, MICRO, MICRO_SIZE, 0);
        for p in &mut pipes {
            p.forward_backward(&mbs).unwrap();
            let totals = p.step_totals().unwrap();
            let loss = totals.loss.unwrap() as f32;
            assert!(
                (loss - ref_loss).abs() < 1e-5,
                "step {step}: {loss} vs {ref_loss}"
            );
            if step == 0 {
                let d = max_abs_diff(&grads(p), &ref_flat);
                assert!(d <= 1e-5, "P={}: grad diff {d}", p.stages().len());
            }
            p.optimizer_step(totals.grad_sq_norm).unwrap();
        }
        reference.full = optim.step(opt.lr_at(step), reference.full, ref_grads);
    }
    let want = reference.params();
    for p in &pipes {
        let d = max_abs_diff(&params(p), &want);
        assert!(
            d <= 1e-4,
            "P={}: parameter diff after 10 steps {d}",
            p.stages().len()
        );
        assert!(p.stages().iter().all(|s| s.step() == 10));
    }
}

#[test]
fn data_parallel_halves_match_the_whole_batch() {
    let config = StageConfig::default();
    let mut single = vec![pipeline(2, SEED, config.clone())];
    let mut pair = vec![pipeline(2, SEED, config.clone()), pipeline(2, SEED, config)];
    for step in 0..3u64 {
        let all = micro_batches(step, MICRO, MICRO_SIZE, 0);
        let halves = vec![all[..2].to_vec(), all[2..].to_vec()];
        let l1 = data_parallel_step(&mut single, &[all]).unwrap();
        let l2 = data_parallel_step(&mut pair, &halves).unwrap();
        assert!((l1 - l2).abs() < 1e-5, "step {step}: {l1} vs {l2}");
    }
    let want = params(&single[0]);
    for replica in &pair {
        let d = max_abs_diff(&params(replica), &want);
        assert!(d <= 1e-5, "D=2 vs D=1 parameter diff {d}");
    }
    assert_eq!(params(&pair[0]), params(&pair[1]), "replicas diverged");
}

/// Cutting micro-batches into lanes (slices trained at once on their own threads, including
/// uneven slices and slices of received activations) computes the same step as running them
/// whole.
#[test]
fn lanes_match_whole_micro_batches() {
    let with = |lanes| StageConfig {
        lanes,
        lane_min_flops: 0.0,
        ..unclipped()
    };
    let mut pipes: Vec<Pipeline<Gpt>> =
        [1, 2, 3].map(|lanes| pipeline(2, SEED, with(lanes))).into();
    for step in 0..6u64 {
        let mbs = micro_batches(step, 2, 5, 0);
        let losses: Vec<f32> = pipes
            .iter_mut()
            .map(|p| {
                p.forward_backward(&mbs).unwrap();
                p.step_totals().unwrap().loss.unwrap() as f32
            })
            .collect();
        let want = grads(&pipes[0]);
        for (p, loss) in pipes.iter().zip(&losses).skip(1) {
            assert!(
                (loss - losses[0]).abs() < 1e-6,
                "step {step}: {loss} vs {}",
                losses[0]
            );
            let d = max_abs_diff(&grads(p), &want);
            assert!(d <= 1e-6, "step {step}: grad diff {d}");
        }
        for p in &mut pipes {
            let norm = p.grad_sq_norm().unwrap();
            p.optimizer_step(norm).unwrap();
        }
    }
    let want = params(&pipes[0]);
    for p in &pipes[1..] {
        let d = max_abs_diff(&params(p), &want);
        assert!(d <= 1e-5, "parameter diff after 6 steps {d}");
    }
}

fn train(p: &mut Pipeline<Gpt>, steps: Range<u64>) -> Vec<f32> {
    steps
        .map(|s| {
            p.train_step(&micro_batches(s, MICRO, MICRO_SIZE, 0))
                .unwrap()
        })
        .collect()
}

#[test]
fn handoff_continues_the_same_run() {
    let mut uninterrupted = pipeline(2, SEED, StageConfig::default());
    let first = train(&mut uninterrupted, 0..5);
    let want = train(&mut uninterrupted, 5..10);

    let mut source = pipeline(2, SEED, StageConfig::default());
    assert_eq!(train(&mut source, 0..5), first);
    let exported: Vec<Vec<u8>> = source
        .stages()
        .iter()
        .map(|s| s.export_state(s.layer_range()).unwrap())
        .collect();

    let parsed = StageState::parse(&exported[1]).unwrap();
    assert_eq!((parsed.step, parsed.layer_indices()), (5, vec![2, 3]));
    assert_eq!(parsed.fingerprint, tiny().fingerprint());

    // Full import into stages built with another seed.
    let mut full = pipeline(2, SEED + 100, StageConfig::default());
    for (stage, bytes) in full.stages_mut().iter_mut().zip(&exported) {
        stage.import_state(bytes, stage.layer_range()).unwrap();
        assert_eq!(stage.step(), 5);
    }
    let got = train(&mut full, 5..10);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-6, "full import: {got:?} vs {want:?}");
    }

    // Partial import: every stage first gets all but its first layer, then that layer alone
    // from a buffer that holds only it.
    let mut partial = pipeline(2, SEED + 200, StageConfig::default());
    for (k, stage) in partial.stages_mut().iter_mut().enumerate() {
        let r = stage.layer_range();
        stage
            .import_state(&exported[k], r.start + 1..r.end)
            .unwrap();
        let single = source.stages()[k]
            .export_state(r.start..r.start + 1)
            .unwrap();
        stage.import_state(&single, r.start..r.start + 1).unwrap();
    }
    let got = train(&mut partial, 5..10);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-6, "partial import: {got:?} vs {want:?}");
    }

    // Repartition: P = 2 state into P = 4 stages, each taking its layers from the holder.
    let mut wide = pipeline(4, SEED + 300, StageConfig::default());
    for stage in wide.stages_mut() {
        for l in stage.layer_range() {
            let holder = source
                .stages()
                .iter()
                .position(|s| s.layer_range().contains(&l))
                .unwrap();
            stage.import_state(&exported[holder], l..l + 1).unwrap();
        }
    }
    let got = train(&mut wide, 5..10);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "repartition: {got:?} vs {want:?}");
    }
}

#[test]
fn replicas_have_equal_digests_and_training_changes_them() {
    let mut a = pipeline(2, SEED, StageConfig::default());
    let b = pipeline(2, SEED, StageConfig::default());
    let d0 = a.stages()[1].state_digest().unwrap();
    assert_eq!(d0, b.stages()[1].state_digest().unwrap());
    train(&mut a, 0..1);
    assert_ne!(d0, a.stages()[1].state_digest().unwrap());
}

#[test]
fn tiny_gpt_learns_the_synthetic_task() {
    let config = StageConfig {
        optimizer: OptimizerConfig {
            peak_lr: 1e-2,
            min_lr: 1e-3,
            warmup_steps: 20,
            total_steps: 200,
            ..OptimizerConfig::default()
        },
        ..StageConfig::default()
    };
    let mut p = pipeline(2, SEED, config);
    let (task, sampler) = data();
    let mut losses = Vec::new();
    for step in 0..200u64 {
        let first = step * 32;
        let mbs: Vec<Batch> = (0..2)
            .map(|k| token_batch(&task, &sampler, first + k * 16, 16, &device()).unwrap())
            .collect();
        losses.push(p.train_step(&mbs).unwrap());
    }
    let initial = losses[0];
    let last: f32 = losses[190..].iter().sum::<f32>() / 10.0;
    println!("synthetic task: loss {initial:.4} at step 0, {last:.4} over steps 190..200");
    assert!(
        (initial - (64f32).ln()).abs() < 0.5,
        "initial loss {initial} should be near ln(64)"
    );
    assert!(
        last < 0.4 * initial,
        "loss went from {initial} to {last} (need < 40 %)"
    );
}

#[test]
fn layer_costs_cover_every_layer_without_changing_the_stage() {
    let model = tiny();
    let stage = Stage::new(
        model.clone(),
        0..model.num_layers(),
        SEED,
        &device(),
        StageConfig::default(),
    )
    .unwrap();
    let before = stage.state_digest().unwrap();
    let b = whole_batch(0);
    let costs = stage
        .measure_layer_costs(
            b.inputs.clone(),
            Some(&b.targets),
            parcae_model::Runs {
                warmup: 1,
                repeats: 3,
            },
        )
        .unwrap();
    assert_eq!(costs.len(), model.num_layers());
    assert_eq!(
        costs.iter().map(|c| c.param_count).sum::<usize>(),
        stage.num_params()
    );
    assert!(
        costs
            .iter()
            .all(|c| c.forward_ms > 0.0 && c.backward_ms > 0.0)
    );
    assert_eq!(costs[1].output_bytes, 8 * 16 * 32 * 4);
    assert_eq!(stage.state_digest().unwrap(), before);
}

#[test]
fn recomputed_activations_train_as_kept_ones() {
    // Burn's balanced gradient checkpointing keeps fewer activations and recomputes the rest in
    // the backward pass: the same arithmetic, so the same losses and weights. Steps after the
    // first run on parameters the optimizer rebuilt, which must keep the device's strategy.
    let model = tiny();
    let ranges = even_ranges(model.num_layers(), 2).unwrap();
    let recompute = device().gradient_checkpointing();
    let mut kept = pipeline(2, SEED, StageConfig::default());
    let mut recomputed =
        Pipeline::new(model, &ranges, SEED, &recompute, StageConfig::default()).unwrap();
    for step in 0..4 {
        let a = kept
            .train_step(&micro_batches(step, MICRO, MICRO_SIZE, 0))
            .unwrap();
        let b = recomputed
            .train_step(&micro_batches_on(&recompute, step, MICRO, MICRO_SIZE, 0))
            .unwrap();
        assert!(
            (a - b).abs() <= 1e-6,
            "step {step}: loss {a} kept, {b} recomputed"
        );
    }
    let d = max_abs_diff(&params(&kept), &params(&recomputed));
    assert!(d <= 1e-6, "parameter diff after 4 steps {d}");
}

#[test]
fn native_and_reference_operations_train_the_same_losses() {
    // 20 steps of two stages of the tiny GPT, with each GELU, activations kept and recomputed:
    // the native operations (attention, layer norm, GELU, the head fused with its loss) train
    // the reference composition's losses.
    #[cfg_attr(not(feature = "cube-cpu"), expect(unused_mut, reason = "one backend"))]
    let mut devices = vec![device(), device().gradient_checkpointing()];
    #[cfg(feature = "cube-cpu")]
    {
        // Made as a node makes it: one cubecl stream for the process (with a stream per OS
        // thread, cubecl's default, the same run gave other losses from step 1 on).
        let cube = parcae_model::Backend::CubeCpu.device().unwrap();
        devices.extend([cube.clone(), cube.gradient_checkpointing()]);
    }
    for gelu in [Gelu::Erf, Gelu::Tanh] {
        for device in devices.clone() {
            let run = |ops: OpSet| {
                let config = GptConfig {
                    gelu,
                    ops,
                    ..GptConfig::tiny()
                };
                let model = Arc::new(Gpt::new(config).unwrap());
                let ranges = even_ranges(model.num_layers(), 2).unwrap();
                let mut p = Pipeline::new(model, &ranges, SEED, &device, unclipped()).unwrap();
                (0..20)
                    .map(|s| {
                        p.train_step(&micro_batches_on(&device, s, MICRO, MICRO_SIZE, 0))
                            .unwrap()
                    })
                    .collect::<Vec<f32>>()
            };
            let (reference, native) = (run(OpSet::Reference), run(OpSet::Native));
            for (step, (a, b)) in reference.iter().zip(&native).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{gelu:?} on {device:?} step {step}: reference {a}, native {b}"
                );
            }
            assert!(native[19] < native[0] - 0.1, "it learns: {native:?}");
        }
    }
}
