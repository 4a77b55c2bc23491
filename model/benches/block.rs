//! `cargo bench -p parcae-model --bench block`: one GPT block's forward and backward for one
//! micro-batch at the emulated accelerator's stand-in width (d 16, 2 heads, feed-forward 32,
//! 8 tokens, one sample: `parcae-node`'s `emulate::STAND_IN`), as Burn's composed operations
//! and as the fused block (`BlockKernel::Fused`), on Flex with autodiff. At this width the
//! cost is per operation, not arithmetic: the testnet's 32 emulated nodes on two cores kept
//! pace with the profiled times only with the fused block.

use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};
use parcae_model::{
    Activation, BlockKernel, Gpt, GptConfig, GptLayer, PipelineModel, StageRng, init_layers,
};

/// The allocator `parcae-node` trains with (see its `main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn block(c: &mut Criterion) {
    let device = Device::flex().autodiff();
    let mut group = c.benchmark_group("gpt block forward+backward, 1 x 8 tokens, d 16");
    for kernel in [BlockKernel::Composed, BlockKernel::Fused] {
        let model = Gpt::new(GptConfig {
            d_model: 16,
            n_heads: 2,
            d_ff: 32,
            seq_len: 8,
            kernel,
            ..GptConfig::tiny()
        })
        .expect("the stand-in's width is a valid GPT");
        let Some(GptLayer::Block(layer)) = init_layers(&model, 1..2, 1, &device).pop() else {
            panic!("layer 1 of a GPT is a block");
        };
        let layer = GptLayer::Block(layer);
        let x = Tensor::<3>::random([1, 8, 16], Distribution::Default, &device);
        let mut rng = StageRng::from_seed_u64(1);
        group.bench_function(format!("{kernel:?}"), |b| {
            b.iter(|| {
                let input = Activation::Hidden(x.clone().require_grad());
                let Ok(Activation::Hidden(y)) = model.forward(1, &layer, input, &mut rng) else {
                    panic!("a block maps hidden states to hidden states");
                };
                let grads = y.sum().backward();
                GradientsParams::from_grads(grads, &layer).len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, block);
criterion_main!(benches);
