//! Typed errors of the crate.
//!
//! Every byte buffer this crate decodes may come from another machine, so every way in which it can
//! be wrong has its own variant naming what is wrong; no decoder panics on bad input.

use std::ops::Range;

/// Everything that can go wrong when building, driving or restoring a stage, or when decoding
/// bytes that came over the network.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    /// A buffer ended before the structure it encodes was complete.
    #[error("truncated {what}: need {needed} bytes, have {available}")]
    Truncated {
        /// Which structure was being read.
        what: &'static str,
        /// Bytes needed to continue.
        needed: usize,
        /// Bytes left in the buffer.
        available: usize,
    },
    /// A buffer carried bytes after the end of the structure it encodes.
    #[error("{what}: {extra} trailing bytes after the end")]
    TrailingBytes {
        /// Which structure was being read.
        what: &'static str,
        /// Number of unexpected bytes.
        extra: usize,
    },
    /// A buffer did not start with the expected magic bytes.
    #[error("{what}: bad magic bytes (not this format)")]
    BadMagic {
        /// Which structure was being read.
        what: &'static str,
    },
    /// A buffer was written by a format version this build does not read.
    #[error("{what}: unsupported format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Which structure was being read.
        what: &'static str,
        /// Version found in the buffer.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// A dtype code that is not one of the supported wire dtypes.
    #[error("unknown dtype code {0}")]
    UnknownDType(u8),
    /// A size field exceeded a configured bound.
    #[error("{what} too large: {value} exceeds the limit {limit}")]
    TooLarge {
        /// Which size field.
        what: &'static str,
        /// Declared value.
        value: u64,
        /// Allowed maximum.
        limit: u64,
    },
    /// A tensor of the wrong rank or shape reached a layer, a loss or a decoder.
    #[error("shape mismatch for {what}: expected {expected}, found {found:?}")]
    ShapeMismatch {
        /// Which tensor.
        what: String,
        /// The expected shape, in words (dimensions that may vary are named).
        expected: String,
        /// The shape that arrived.
        found: Vec<usize>,
    },
    /// An activation of the wrong kind (token ids where hidden states were expected, ...).
    #[error("wrong activation kind for {what}: expected {expected}, found {found}")]
    WrongActivationKind {
        /// Which input.
        what: String,
        /// Kind expected.
        expected: &'static str,
        /// Kind found.
        found: &'static str,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} out of range for vocabulary size {vocab_size}")]
    TokenOutOfRange {
        /// Offending token.
        token: u32,
        /// Vocabulary size of the model.
        vocab_size: usize,
    },
    /// A layer range that is empty or leaves the model.
    #[error("invalid layer range {start}..{end} for a model of {num_layers} layers")]
    InvalidLayerRange {
        /// First layer.
        start: usize,
        /// One past the last layer.
        end: usize,
        /// Layers in the model.
        num_layers: usize,
    },
    /// A per-layer checksum did not match its section.
    #[error("checksum mismatch in layer {layer}: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// Layer index.
        layer: usize,
        /// Checksum stored in the buffer.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// The header checksum of a state buffer did not match.
    #[error("state header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderChecksum {
        /// Checksum stored in the buffer.
        stored: u32,
        /// Checksum of the header read.
        computed: u32,
    },
    /// State written for another model architecture.
    #[error(
        "state belongs to another model: expected fingerprint {expected:#018x}, found {found:#018x}"
    )]
    ModelMismatch {
        /// Fingerprint of the model this stage runs.
        expected: u64,
        /// Fingerprint in the state.
        found: u64,
    },
    /// State that holds layers this stage does not run, or misses layers it must bring.
    #[error("layer {layer} is not in {expected:?}")]
    LayerOutOfRange {
        /// Offending layer.
        layer: usize,
        /// Layers acceptable here.
        expected: Range<usize>,
    },
    /// The same layer appears twice in one state buffer.
    #[error("layer {0} appears twice in the state")]
    DuplicateLayer(usize),
    /// Parameters of a layer in a state buffer do not match the layer of this model.
    #[error("layer {layer}: parameter {index} mismatch: {detail}")]
    ParamMismatch {
        /// Layer index.
        layer: usize,
        /// Parameter index in visit order.
        index: usize,
        /// What differs.
        detail: String,
    },
    /// A state buffer lacks a layer the import asked for.
    #[error("layer {0} is not in the state buffer")]
    MissingLayer(usize),
    /// A state buffer from another training step than the stage's.
    #[error("state is at step {state}, the stage at step {stage}")]
    StepMismatch {
        /// Steps applied to the stage.
        stage: u64,
        /// Steps recorded in the state.
        state: u64,
    },
    /// A non-UTF-8 parameter path.
    #[error("parameter path is not UTF-8")]
    BadPath,
    /// A micro-batch id that is already in flight.
    #[error("micro-batch {0} is already in flight")]
    DuplicateMicroBatch(u64),
    /// A backward for a micro-batch that has no forward in flight.
    #[error("micro-batch {0} is not in flight")]
    UnknownMicroBatch(u64),
    /// An operation that needs every micro-batch finished found some in flight.
    #[error("{0} micro-batches still in flight")]
    MicroBatchesInFlight(usize),
    /// The upstream of a backward does not fit the stage (a gradient at the last stage, a loss
    /// scale elsewhere).
    #[error("wrong upstream for backward: {0}")]
    WrongUpstream(&'static str),
    /// The last stage needs targets to compute the loss.
    #[error("the last stage needs targets")]
    MissingTargets,
    /// A gradient buffer of the wrong length.
    #[error("gradient buffer has {found} bytes, this stage needs {expected}")]
    GradLength {
        /// Bytes the stage's parameters need.
        expected: usize,
        /// Bytes received.
        found: usize,
    },
    /// A non-finite number where a finite one is required (a global norm, a loss).
    #[error("{0} is not finite")]
    NotFinite(&'static str),
    /// A configuration value out of its domain.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A dataset could not be read or is unusable.
    #[error("dataset: {0}")]
    Dataset(String),
    /// An index past the end of a dataset.
    #[error("example {index} out of range for a dataset of {len} examples")]
    ExampleOutOfRange {
        /// Requested index.
        index: u64,
        /// Examples in the dataset.
        len: u64,
    },
    /// A weights file (safetensors) could not be read, written or used for this model.
    #[error("weights {0}")]
    Weights(String),
    /// A tensor could not be read back from the device.
    #[error("tensor read-back failed: {0}")]
    ReadBack(String),
}

/// Result alias of the crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
