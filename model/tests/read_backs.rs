//! Blocking read-backs in a training step, counted (`parcae_model::read_backs`). On a GPU each
//! one drains the stream: a step of M micro-batches reads its loss and gradient norm together,
//! once (it read each loss and each parameter's norm before).
//!
//! Its own test binary: the counter is the process's, and no other test may read meanwhile.

use std::sync::Arc;

use burn::tensor::Device;
use parcae_model::{
    Dataset, Gpt, GptConfig, Pipeline, PipelineModel, Sampler, StageConfig, SyntheticTask,
    read_backs, token_batch,
};

#[test]
fn a_step_reads_back_its_loss_and_gradient_norm_once() {
    let device = Device::flex().autodiff();
    let config = GptConfig::tiny();
    let model = Arc::new(Gpt::new(config.clone()).unwrap());
    let whole = 0..model.num_layers();
    let stages = std::slice::from_ref(&whole);
    let mut pipe = Pipeline::new(model, stages, 3, &device, StageConfig::default()).unwrap();
    let task = SyntheticTask::default_for(1, config.vocab_size, config.seq_len).unwrap();
    let sampler = Sampler::new(2, task.len()).unwrap();
    let micro = 3;
    let batches: Vec<_> = (0..micro)
        .map(|k| token_batch(&task, &sampler, k * 4, 4, &device).unwrap())
        .collect();

    let before = read_backs();
    pipe.forward_backward(&batches).unwrap();
    // Each micro-batch's loss stays on the device; token ids are checked on the host, where
    // the batch is made.
    assert_eq!(
        read_backs() - before,
        0,
        "a forward or backward reads nothing back"
    );

    let before = read_backs();
    let totals = pipe.step_totals().unwrap();
    assert_eq!(
        read_backs() - before,
        1,
        "the gradient norm and the loss are one read-back"
    );
    assert!(totals.grad_sq_norm.is_finite() && totals.grad_sq_norm > 0.0);
    let loss = totals.loss.expect("the last stage's loss");
    assert!(loss > 0.0 && loss < f64::from(config.vocab_size as f32).ln() * 2.0);

    let before = read_backs();
    pipe.optimizer_step(totals.grad_sq_norm).unwrap();
    assert_eq!(read_backs() - before, 0, "AdamW reads nothing back");
}
