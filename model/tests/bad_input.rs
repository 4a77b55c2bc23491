//! Bad input: every decoder returns a typed error naming what is wrong, never panics.

use std::sync::Arc;

use burn::tensor::{Device, Int, Tensor, TensorData};
use parcae_model::{
    Activation, Dataset, Gpt, GptConfig, ModelError, PipelineModel, Sampler, Stage, StageConfig,
    StageState, SyntheticTask, WireDType, WireLimits, WireTensor, check_vocabulary, token_batch,
};
use proptest::prelude::*;

fn device() -> Device {
    Device::flex().autodiff()
}

fn tiny() -> Arc<Gpt> {
    Arc::new(Gpt::new(GptConfig::tiny()).unwrap())
}

fn stage(range: std::ops::Range<usize>) -> Stage<Gpt> {
    Stage::new(tiny(), range, 1, &device(), StageConfig::default()).unwrap()
}

fn tokens(values: Vec<i64>, b: usize, t: usize) -> Activation {
    Activation::Tokens(Tensor::<2, Int>::from_data(
        TensorData::new(values, [b, t]),
        &device(),
    ))
}

fn valid_wire() -> Vec<u8> {
    let values: Vec<f32> = (0..2 * 3 * 32).map(|i| i as f32 / 100.0).collect();
    WireTensor::encode_values(&[2, 3, 32], &values, WireDType::F32).unwrap()
}

fn state_bytes() -> Vec<u8> {
    let s = stage(1..3);
    s.export_state(1..3).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn wire_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = WireTensor::decode(&bytes, &WireLimits::default());
    }

    #[test]
    fn truncated_wire_is_an_error(cut in 0usize..(8 + 12 + 768)) {
        let bytes = valid_wire();
        prop_assert!(WireTensor::decode(&bytes[..cut], &WireLimits::default()).is_err());
    }

    #[test]
    fn wire_header_damage_never_panics(pos in 0usize..20, byte in any::<u8>()) {
        let mut bytes = valid_wire();
        bytes[pos] = byte;
        let _ = WireTensor::decode(&bytes, &WireLimits::default());
    }

    #[test]
    fn state_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = StageState::parse(&bytes);
    }

    #[test]
    fn truncated_state_is_an_error(frac in 0.0f64..1.0) {
        let bytes = state_bytes();
        let cut = (bytes.len() as f64 * frac) as usize;
        let mut s = stage(1..3);
        prop_assert!(s.import_state(&bytes[..cut], 1..3).is_err());
    }

    #[test]
    fn damaged_state_is_an_error(frac in 0.0f64..1.0, flip in 1u8..=255) {
        let mut bytes = state_bytes();
        let pos = (bytes.len() as f64 * frac) as usize;
        bytes[pos] ^= flip;
        let mut s = stage(1..3);
        prop_assert!(s.import_state(&bytes, 1..3).is_err(), "flip at {}", pos);
    }
}

#[test]
fn a_flipped_parameter_byte_is_a_checksum_error_naming_the_layer() {
    let mut bytes = state_bytes();
    let n = bytes.len();
    bytes[n - 10] ^= 0x40;
    let mut s = stage(1..3);
    assert!(matches!(
        s.import_state(&bytes, 1..3),
        Err(ModelError::ChecksumMismatch { layer: 2, .. })
    ));
}

#[test]
fn damage_is_a_checksum_error_in_the_layout_and_in_layers_not_imported() {
    // The first byte of the first parameter's path in layer 1: header 36, section prefix 16,
    // random stream 48, parameter count 4, path length 2.
    let mut bytes = state_bytes();
    bytes[36 + 16 + 48 + 4 + 2] ^= 0x01;
    let mut s = stage(1..3);
    assert!(matches!(
        s.import_state(&bytes, 1..3),
        Err(ModelError::ChecksumMismatch { layer: 1, .. })
    ));
    assert!(matches!(
        StageState::parse(&bytes),
        Err(ModelError::ChecksumMismatch { layer: 1, .. })
    ));

    let mut bytes = state_bytes();
    let n = bytes.len();
    bytes[n - 10] ^= 0x40;
    assert!(matches!(
        s.import_state(&bytes, 1..2),
        Err(ModelError::ChecksumMismatch { layer: 2, .. })
    ));
    assert_eq!(
        s.state_digest().unwrap(),
        stage(1..3).state_digest().unwrap()
    );
}

#[test]
fn state_of_another_model_or_range_is_refused() {
    let bytes = state_bytes();
    let other = Arc::new(
        Gpt::new(GptConfig {
            d_ff: 64,
            ..GptConfig::tiny()
        })
        .unwrap(),
    );
    let mut foreign = Stage::new(other, 1..3, 1, &device(), StageConfig::default()).unwrap();
    assert!(matches!(
        foreign.import_state(&bytes, 1..3),
        Err(ModelError::ModelMismatch { .. })
    ));
    let mut head = stage(2..4);
    assert_eq!(
        head.import_state(&bytes, 3..4),
        Err(ModelError::MissingLayer(3))
    );
    assert!(matches!(
        head.import_state(&bytes, 1..3),
        Err(ModelError::LayerOutOfRange { layer: 1, .. })
    ));
    // The import is all-or-nothing: the refused imports changed nothing.
    assert_eq!(
        head.state_digest().unwrap(),
        stage(2..4).state_digest().unwrap()
    );
}

#[test]
fn wrong_activations_are_typed_errors() {
    let mut middle = stage(1..3);
    let narrow = WireTensor::encode_values(&[2, 3, 16], &[0.0; 96], WireDType::F32).unwrap();
    assert!(matches!(
        middle.forward_wire(0, &narrow, None),
        Err(ModelError::ShapeMismatch { .. })
    ));
    let long = WireTensor::encode_values(&[1, 17, 32], &[0.0; 17 * 32], WireDType::F32).unwrap();
    assert!(matches!(
        middle.forward_wire(0, &long, None),
        Err(ModelError::ShapeMismatch { .. })
    ));
    let flat = WireTensor::encode_values(&[2, 32], &[0.0; 64], WireDType::F32).unwrap();
    assert!(matches!(
        middle.forward_wire(0, &flat, None),
        Err(ModelError::WrongActivationKind { .. })
    ));
    let mut bad_dtype = valid_wire();
    bad_dtype[4] = 7;
    assert_eq!(
        middle.forward_wire(0, &bad_dtype, None).unwrap_err(),
        ModelError::UnknownDType(7)
    );
    assert_eq!(middle.in_flight(), 0);

    let mut first = stage(0..2);
    // Token ids are checked where batches are made (the test below); their shape here.
    assert!(matches!(
        first.forward(0, tokens(vec![1; 17], 1, 17), None),
        Err(ModelError::ShapeMismatch { .. })
    ));

    let mut last = stage(2..4);
    let ok = WireTensor::encode_values(&[1, 2, 32], &[0.1; 64], WireDType::F32).unwrap();
    assert_eq!(
        last.forward_wire(0, &ok, None),
        Err(ModelError::MissingTargets)
    );
    let wrong_targets = tokens(vec![1, 2, 3], 1, 3);
    assert!(matches!(
        last.forward_wire(0, &ok, Some(&wrong_targets)),
        Err(ModelError::ShapeMismatch { .. })
    ));
}

/// A dataset whose examples hold an id its vocabulary does not.
struct OutOfVocabulary;

impl Dataset for OutOfVocabulary {
    fn len(&self) -> u64 {
        4
    }
    fn seq_len(&self) -> usize {
        16
    }
    fn vocab_size(&self) -> usize {
        64
    }
    fn example(&self, index: u64) -> parcae_model::Result<Vec<u32>> {
        Ok((0..17)
            .map(|i| if i == 5 { 64 } else { index as u32 })
            .collect())
    }
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused_on_the_host() {
    let model = tiny();
    let vocab = model.config().vocab_size;
    let wider = SyntheticTask::default_for(1, vocab + 1, 16).unwrap();
    let e = check_vocabulary(model.as_ref(), &wider).unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidConfig(m) if m.contains(&format!("to {}", vocab + 1))),
        "{e}"
    );
    check_vocabulary(
        model.as_ref(),
        &SyntheticTask::default_for(1, vocab, 16).unwrap(),
    )
    .unwrap();
    let sampler = Sampler::new(1, 4).unwrap();
    assert!(matches!(
        token_batch(&OutOfVocabulary, &sampler, 0, 2, &device()),
        Err(ModelError::TokenOutOfRange {
            token: 64,
            vocab_size: 64
        })
    ));
}

#[test]
fn micro_batch_bookkeeping_errors() {
    let mut middle = stage(1..3);
    let ok = WireTensor::encode_values(&[1, 2, 32], &[0.1; 64], WireDType::F32).unwrap();
    middle.forward_wire(3, &ok, None).unwrap();
    assert_eq!(
        middle.forward_wire(3, &ok, None),
        Err(ModelError::DuplicateMicroBatch(3))
    );
    assert_eq!(
        middle.backward_wire(4, Some(&ok), 1.0),
        Err(ModelError::UnknownMicroBatch(4))
    );
    assert!(matches!(
        middle.backward_wire(3, None, 1.0),
        Err(ModelError::WrongUpstream(_))
    ));
    let wrong = WireTensor::encode_values(&[1, 3, 32], &[0.1; 96], WireDType::F32).unwrap();
    assert!(matches!(
        middle.backward_wire(3, Some(&wrong), 1.0),
        Err(ModelError::ShapeMismatch { .. })
    ));
    // Still in flight after the refused backwards; a correct one completes it.
    assert_eq!(middle.in_flight(), 1);
    assert_eq!(
        middle.optimizer_step(0.0),
        Err(ModelError::MicroBatchesInFlight(1))
    );
    let dx = middle.backward_wire(3, Some(&ok), 1.0).unwrap().unwrap();
    assert_eq!(
        WireTensor::decode(&dx, &WireLimits::default())
            .unwrap()
            .shape,
        vec![1, 2, 32]
    );
    assert!(matches!(
        middle.import_grads(&[0u8; 12]),
        Err(ModelError::GradLength { found: 12, .. })
    ));
    assert!(matches!(
        middle.optimizer_step(f64::NAN),
        Err(ModelError::NotFinite(_))
    ));
    assert_eq!(tiny().num_layers(), 4);
}

/// A stage that cuts every micro-batch into lanes checks the batch of targets and upstream
/// gradients before slicing them.
#[test]
fn lanes_refuse_batches_that_do_not_match() {
    let config = StageConfig {
        lanes: 2,
        lane_min_flops: 0.0,
        ..StageConfig::default()
    };
    let two = WireTensor::encode_values(&[2, 2, 32], &[0.1; 128], WireDType::F32).unwrap();
    let three = WireTensor::encode_values(&[3, 2, 32], &[0.1; 192], WireDType::F32).unwrap();

    let mut last = Stage::new(tiny(), 2..4, 1, &device(), config.clone()).unwrap();
    let targets = tokens(vec![1, 2, 3, 4, 5, 6], 3, 2);
    assert!(matches!(
        last.forward_wire(0, &two, Some(&targets)),
        Err(ModelError::ShapeMismatch { what, .. }) if what == "targets"
    ));
    assert_eq!(last.in_flight(), 0);

    let mut middle = Stage::new(tiny(), 1..3, 1, &device(), config).unwrap();
    middle.forward_wire(0, &two, None).unwrap();
    for wrong in [&three, &valid_wire()] {
        assert!(matches!(
            middle.backward_wire(0, Some(wrong), 1.0),
            Err(ModelError::ShapeMismatch { .. })
        ));
    }
    assert_eq!(middle.in_flight(), 1);
    let dx = middle.backward_wire(0, Some(&two), 1.0).unwrap().unwrap();
    assert_eq!(
        WireTensor::decode(&dx, &WireLimits::default())
            .unwrap()
            .shape,
        vec![2, 2, 32]
    );
}

/// A diverged step (here a loss scale that is not a number) is refused where the step's loss is
/// read, with the gradient norm, before any weight moves.
#[test]
fn a_step_whose_loss_is_not_finite_is_refused_when_read() {
    let mut s = stage(0..4);
    let task = SyntheticTask::default_for(1, 64, 16).unwrap();
    let batch = token_batch(
        &task,
        &Sampler::new(1, task.len()).unwrap(),
        0,
        2,
        &device(),
    )
    .unwrap();
    s.forward(0, batch.inputs, Some(&batch.targets)).unwrap();
    s.backward(0, parcae_model::Upstream::Loss { scale: f32::NAN })
        .unwrap();
    assert_eq!(s.step_totals(), Err(ModelError::NotFinite("loss")));
    assert_eq!(s.step_loss(), Err(ModelError::NotFinite("loss")));
    s.clear_grads();
    assert_eq!(s.step_loss(), Ok(None));
}
