//! `parcae-model`: Burn pipeline stages that train, hand their state off layer by layer, and
//! match unsplit training.
//!
//! # Design
//!
//! * A model is a [`PipelineModel`]: an ordered list of layers, each a Burn module built on its
//!   own from a per-layer seed, so that any contiguous range of layers is a stage whose weights
//!   equal the same layers of the unsplit model, in any process. [`Gpt`] is the reference
//!   GPT-2-style decoder (`embedding, block 1..N, head`; presets [`GptConfig::tiny`] and
//!   [`GptConfig::small`]).
//! * A [`Stage`] runs on a Burn [`Device`](burn::tensor::Device) chosen at run time (Flex CPU by
//!   default, `Device::cuda(i)` with the `cuda` feature). Forward keeps each micro-batch's graph
//!   until its backward; the backward of a middle stage is the backward of `sum(y * dL/dy)`, which
//!   yields parameter gradients and the gradient to send upstream. Gradients accumulate in
//!   (layer, parameter-visit-order) order, never by Burn's per-process random `ParamId`, so the
//!   flat gradient buffer has the same layout on every replica and the state format means the
//!   same thing on every machine.
//! * The optimizer is Burn's AdamW driven per tensor, with a warmup + cosine schedule and
//!   clipping by the global norm the caller sums over stages ([`Stage::grad_sq_norm`]).
//! * State ([`Stage::export_state`] / [`Stage::import_state`], [`StageState`]) is a versioned
//!   binary layout of independent per-layer sections with CRC-32s: parameters, AdamW moments and
//!   time, and each layer's random stream; the step count is in the (checksummed) header.
//!   Both directions are bound by page faults on fresh memory, not by copying: export reads Flex
//!   storage in place and import checksums while it copies (each value copied once), and the
//!   layers are written and read in parallel on rayon.
//! * Wire tensors ([`WireTensor`]) carry activations and gradients as little-endian f32 or bf16
//!   with a shape header and bounded sizes.
//! * Data: [`Sampler`] maps a global sample index to an example (a seeded permutation per epoch),
//!   [`SyntheticTask`] is a learnable seeded task (the default), [`ByteTextDataset`] reads text.
//!
//! # Public API summary (for the trainer in `parcae-node`)
//!
//! | need | call |
//! |---|---|
//! | build stage `s` of a plan | [`Stage::new`]`(model, layers, seed, &device, config)` |
//! | order of work in a step | [`one_f_one_b`]`(P, s, M)` |
//! | run a step's forwards and backwards | [`run_one_f_one_b`]`(stage, neighbours, position, micro_batches)` with your [`Neighbours`] ([`OneFOneB`] to interleave stages in one thread) |
//! | forward at stage 0 | [`Stage::forward`]`(mb, batch.inputs, targets_if_last)` then [`Stage::encode_output`] |
//! | forward elsewhere | [`Stage::forward_wire`]`(mb, bytes, targets_if_last)` -> [`WireOutput`] |
//! | backward | [`Stage::backward_wire`]`(mb, Some(grad_bytes) or None at the last stage, 1/M)` -> bytes to send upstream |
//! | data-parallel all-reduce | [`Stage::export_grads`] (flat LE f32, layout [`Stage::grad_layout`]), reduce (e.g. [`mean_f32_le`]), [`Stage::import_grads`] |
//! | clipping, the loss and the update | sum [`Stage::grad_sq_norm`] over stages ([`Stage::step_totals`]: with the step's loss, in one read), [`Stage::optimizer_step`]`(global_sq)` -> [`StepReport`] |
//! | hand-off / repartition | [`Stage::export_state`]`(layers)`, [`StageState::parse`] (inspect), [`Stage::import_state`]`(bytes, layers)` |
//! | digest for the replicated log | [`Stage::state_digest`] |
//! | cost model inputs | [`Stage::measure_layer_costs`] -> [`LayerCost`] per layer; [`StepReport::times`] per step |
//! | samples of step `s` | [`token_batch`]`(dataset, sampler, s * batch + offset, count, &device)` |
//! | backend | [`default_device`] (Flex, or CUDA when compiled in and requested) |
//!
//! The numbers behind the choices (autodiff at stage boundaries, serialization speed, Flex vs
//! NdArray) are in `notes/burn-0.22.md` of the project.

mod activation;
mod block_kernel;
mod codec;
mod costs;
mod data;
mod device;
mod error;
mod fused_block;
mod gpt;
mod gpt2_weights;
mod host;
mod lanes;
mod ops;
mod optim;
mod params;
mod pipeline;
mod pipeline_model;
mod rng;
mod schedule;
mod smoke;
mod stage;
mod state;
mod token_file;
mod weights;
mod wire;

pub use activation::Activation;
pub use block_kernel::Gelu;
pub use costs::{LayerCost, Runs, device_memory, median};
pub use data::{
    ByteTextDataset, Dataset, Sampler, Subset, SyntheticTask, check_vocabulary, split_validation,
    token_batch,
};
pub use device::{Backend, default_device};
pub use error::{ModelError, Result};
pub use gpt::{BlockKernel, Gpt, GptBlock, GptConfig, GptEmbedding, GptHead, GptLayer};
pub use gpt2_weights::{Gpt2Safetensors, LayerWeights, write_gpt2_safetensors};
pub use host::read_backs;
pub use lanes::{DEFAULT_LANE_MIN_FLOPS, MAX_LANES, default_lanes};
pub use ops::OpSet;
pub use optim::OptimizerConfig;
pub use params::ParamInfo;
pub use pipeline::{Pipeline, data_parallel_step, even_ranges, mean_f32_le};
pub use pipeline_model::{Batch, PipelineModel};
pub use rng::StageRng;
pub use schedule::{
    Collective, MicroBatches, Neighbours, OneFOneB, Op, StagePosition, one_f_one_b, run_one_f_one_b,
};
pub use smoke::{Comparison, SmokeReport, smoke, smoke_model};
pub use stage::{
    LayerSpan, PhaseTimes, Stage, StageConfig, StageOutput, StepReport, StepTotals, Upstream,
    WireOutput, init_layers, layer_seed,
};
pub use state::{LayerSection, STATE_VERSION, StageState};
pub use token_file::{TokenDtype, TokenFileDataset};
pub use weights::WeightSource;
pub use wire::{MAX_RANK, WireDType, WireLimits, WireTensor};
