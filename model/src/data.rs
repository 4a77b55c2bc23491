//! Training data: a deterministic sampler and token datasets.
//!
//! The cluster accounts for samples by a global sample index (the cursor in the replicated
//! state): step `s` trains indices `s * batch .. (s + 1) * batch`, whatever the parallel
//! configuration. [`Sampler`] maps a global index to a dataset example through a seeded
//! permutation per epoch, so that every example is seen once per epoch, in an order that every
//! node computes alone, in O(1) memory.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::activation::Activation;
use crate::error::{ModelError, Result};
use crate::pipeline_model::{Batch, PipelineModel};

/// A source of fixed-length token sequences.
pub trait Dataset: Send + Sync {
    /// Number of examples.
    fn len(&self) -> u64;

    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per model input; examples have `seq_len + 1` tokens (inputs and shifted targets).
    fn seq_len(&self) -> usize;

    /// Token ids are below this.
    fn vocab_size(&self) -> usize;

    /// Example `index` (< `len()`): `seq_len + 1` token ids.
    fn example(&self, index: u64) -> Result<Vec<u32>>;

    /// SHA-256 of the dataset's content: its identity in the cluster's replicated job, so that
    /// every node trains the same data. The default hashes every example; a dataset with a
    /// cheaper identity of the same content (a file's bytes, a generator's parameters) says so.
    fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        for v in [self.len(), self.seq_len() as u64, self.vocab_size() as u64] {
            h.update(v.to_le_bytes());
        }
        for i in 0..self.len() {
            for token in self.example(i)? {
                h.update(token.to_le_bytes());
            }
        }
        Ok(h.finalize().into())
    }
}

/// Maps global sample indices to dataset indices: epoch `e` visits a seeded permutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sampler {
    seed: u64,
    len: u64,
    half_bits: u32,
}

impl Sampler {
    /// A sampler over `len` examples.
    pub fn new(seed: u64, len: u64) -> Result<Self> {
        if len == 0 {
            return Err(ModelError::Dataset("cannot sample an empty dataset".into()));
        }
        // Smallest even bit width whose domain holds len (at least 2 bits).
        let bits = (64 - (len - 1).leading_zeros()).max(2);
        let bits = bits + bits % 2;
        Ok(Self {
            seed,
            len,
            half_bits: bits / 2,
        })
    }

    /// The dataset index of global sample `global`.
    pub fn index(&self, global: u64) -> u64 {
        let epoch = global / self.len;
        let mut x = global % self.len;
        // Cycle-walk the Feistel permutation of [0, 4^half_bits) until it lands in [0, len).
        loop {
            x = self.feistel(epoch, x);
            if x < self.len {
                return x;
            }
        }
    }

    fn feistel(&self, epoch: u64, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for round in 0..4u64 {
            let f = mix(self.seed ^ mix(epoch ^ mix(round ^ mix(right)))) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A learnable synthetic language: a seeded Markov chain in which every token has one likely
/// successor (taken with probability `1 - noise`) and otherwise a uniformly random one. The best
/// achievable loss is about `noise * ln(vocab) + H(noise)`, far below the initial `ln(vocab)`.
#[derive(Debug, Clone)]
pub struct SyntheticTask {
    seed: u64,
    len: u64,
    seq_len: usize,
    successor: Vec<u32>,
    noise: f64,
}

impl SyntheticTask {
    /// `len` examples of `seq_len + 1` tokens over `vocab_size` ids.
    pub fn new(seed: u64, vocab_size: usize, seq_len: usize, len: u64, noise: f64) -> Result<Self> {
        if vocab_size < 2 || vocab_size > u32::MAX as usize || seq_len == 0 || len == 0 {
            return Err(ModelError::Dataset(format!(
                "synthetic task needs vocab >= 2, seq_len >= 1 and len >= 1 (got {vocab_size}, {seq_len}, {len})"
            )));
        }
        if !(0.0..=1.0).contains(&noise) {
            return Err(ModelError::Dataset(format!("noise {noise} outside [0, 1]")));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let successor = (0..vocab_size)
            .map(|_| rng.random_range(0..vocab_size as u32))
            .collect();
        Ok(Self {
            seed,
            len,
            seq_len,
            successor,
            noise,
        })
    }

    /// The default task for a model: 2^20 examples, 10 % noise.
    pub fn default_for(seed: u64, vocab_size: usize, seq_len: usize) -> Result<Self> {
        Self::new(seed, vocab_size, seq_len, 1 << 20, 0.1)
    }
}

impl Dataset for SyntheticTask {
    fn len(&self) -> u64 {
        self.len
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn vocab_size(&self) -> usize {
        self.successor.len()
    }

    fn example(&self, index: u64) -> Result<Vec<u32>> {
        if index >= self.len {
            return Err(ModelError::ExampleOutOfRange {
                index,
                len: self.len,
            });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed ^ mix(index)));
        let vocab = self.successor.len() as u32;
        let mut tok = rng.random_range(0..vocab);
        let mut out = Vec::with_capacity(self.seq_len + 1);
        out.push(tok);
        for _ in 0..self.seq_len {
            tok = if rng.random_bool(self.noise) {
                rng.random_range(0..vocab)
            } else {
                self.successor[tok as usize]
            };
            out.push(tok);
        }
        Ok(out)
    }

    /// The generator's parameters: its examples are a function of them.
    fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        h.update(b"parcae synthetic task v1");
        for v in [
            self.seed,
            self.len,
            self.seq_len as u64,
            self.successor.len() as u64,
        ] {
            h.update(v.to_le_bytes());
        }
        h.update(self.noise.to_le_bytes());
        Ok(h.finalize().into())
    }
}

/// Byte-level text: vocabulary 256, example `i` is the window of `seq_len + 1` bytes starting at
/// byte `i * seq_len` (consecutive windows share one byte so that every byte is a target once).
#[derive(Debug, Clone)]
pub struct ByteTextDataset {
    bytes: Vec<u8>,
    seq_len: usize,
}

impl ByteTextDataset {
    /// Reads the file at `path`.
    pub fn from_file(path: &Path, seq_len: usize) -> Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| ModelError::Dataset(format!("{}: {e}", path.display())))?;
        Self::from_bytes(bytes, seq_len)
    }

    /// Uses `bytes` as the corpus.
    pub fn from_bytes(bytes: Vec<u8>, seq_len: usize) -> Result<Self> {
        if seq_len == 0 || bytes.len() <= seq_len {
            return Err(ModelError::Dataset(format!(
                "text of {} bytes is too short for sequences of {seq_len}",
                bytes.len()
            )));
        }
        Ok(Self { bytes, seq_len })
    }
}

impl Dataset for ByteTextDataset {
    fn len(&self) -> u64 {
        ((self.bytes.len() - 1) / self.seq_len) as u64
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn vocab_size(&self) -> usize {
        256
    }

    fn example(&self, index: u64) -> Result<Vec<u32>> {
        if index >= self.len() {
            return Err(ModelError::ExampleOutOfRange {
                index,
                len: self.len(),
            });
        }
        let start = index as usize * self.seq_len;
        Ok(self.bytes[start..start + self.seq_len + 1]
            .iter()
            .map(|b| u32::from(*b))
            .collect())
    }

    fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        h.update(b"parcae byte text v1");
        h.update((self.seq_len as u64).to_le_bytes());
        h.update(&self.bytes);
        Ok(h.finalize().into())
    }
}

/// Whether `model` takes every token id of `dataset`: its vocabulary no larger than the
/// model's ([`PipelineModel::vocab_size`]).
pub fn check_vocabulary<M: PipelineModel>(model: &M, dataset: &dyn Dataset) -> Result<()> {
    match model.vocab_size() {
        Some(model_vocab) if dataset.vocab_size() > model_vocab => {
            Err(ModelError::InvalidConfig(format!(
                "the dataset's token ids run to {}, the model ({}) takes {model_vocab}",
                dataset.vocab_size(),
                model.architecture()
            )))
        }
        _ => Ok(()),
    }
}

/// The batch of global samples `first .. first + count`: inputs are the first `seq_len` tokens of
/// each example, targets the last `seq_len`.
pub fn token_batch(
    dataset: &dyn Dataset,
    sampler: &Sampler,
    first: u64,
    count: usize,
    device: &Device,
) -> Result<Batch> {
    if count == 0 {
        return Err(ModelError::InvalidConfig("empty batch".into()));
    }
    let t = dataset.seq_len();
    let vocab = dataset.vocab_size();
    let mut inputs = Vec::with_capacity(count * t);
    let mut targets = Vec::with_capacity(count * t);
    for k in 0..count as u64 {
        let global = first
            .checked_add(k)
            .ok_or_else(|| ModelError::InvalidConfig("sample index overflows".into()))?;
        let ex = dataset.example(sampler.index(global))?;
        if ex.len() != t + 1 {
            return Err(ModelError::Dataset(format!(
                "example has {} tokens, expected {}",
                ex.len(),
                t + 1
            )));
        }
        if let Some(&bad) = ex.iter().find(|&&v| v as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange {
                token: bad,
                vocab_size: vocab,
            });
        }
        inputs.extend(ex[..t].iter().map(|&v| v as i64));
        targets.extend(ex[1..].iter().map(|&v| v as i64));
    }
    let tensor = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [count, t]), device);
    Ok(Batch {
        inputs: Activation::Tokens(tensor(inputs)),
        targets: Activation::Tokens(tensor(targets)),
    })
}

/// Feeds the bytes of the file at `path` to `h` through a buffer: hashing a file larger than
/// memory must not map it (its pages would count as the process's memory).
pub(crate) fn hash_file(h: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// Examples `range` of another dataset as a dataset of their own: the training and held-out
/// splits of one corpus ([`split_validation`]).
pub struct Subset {
    inner: Arc<dyn Dataset>,
    range: Range<u64>,
}

impl Dataset for Subset {
    fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    fn seq_len(&self) -> usize {
        self.inner.seq_len()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn example(&self, index: u64) -> Result<Vec<u32>> {
        if index >= self.len() {
            return Err(ModelError::ExampleOutOfRange {
                index,
                len: self.len(),
            });
        }
        self.inner.example(self.range.start + index)
    }

    fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        h.update(self.inner.fingerprint()?);
        h.update(self.range.start.to_le_bytes());
        h.update(self.range.end.to_le_bytes());
        Ok(h.finalize().into())
    }
}

/// `dataset` cut into a training split and a validation split of its last `fraction` of
/// examples (at least one), which no step trains: `(train, validation)`.
pub fn split_validation(
    dataset: Arc<dyn Dataset>,
    fraction: f64,
) -> Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(ModelError::InvalidConfig(format!(
            "validation fraction {fraction}: must be between 0 and 1"
        )));
    }
    let len = dataset.len();
    let held_out = ((len as f64 * fraction).ceil() as u64).max(1);
    if held_out >= len {
        return Err(ModelError::Dataset(format!(
            "{len} examples leave none to train after holding out {held_out} for validation"
        )));
    }
    let cut = len - held_out;
    let part = |range: Range<u64>| -> Arc<dyn Dataset> {
        Arc::new(Subset {
            inner: dataset.clone(),
            range,
        })
    };
    Ok((part(0..cut), part(cut..len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_validation_split_is_the_tail_and_the_training_split_never_reaches_it() {
        let task: Arc<dyn Dataset> = Arc::new(SyntheticTask::new(1, 16, 4, 100, 0.0).unwrap());
        let (train, val) = split_validation(task.clone(), 0.05).unwrap();
        assert_eq!((train.len(), val.len()), (95, 5));
        assert_eq!(val.example(0).unwrap(), task.example(95).unwrap());
        assert_eq!(train.example(94).unwrap(), task.example(94).unwrap());
        assert!(matches!(
            train.example(95),
            Err(ModelError::ExampleOutOfRange { index: 95, len: 95 })
        ));
        assert!(split_validation(task.clone(), 0.0).is_err());
        assert!(split_validation(task.clone(), 1.0).is_err());
        let one: Arc<dyn Dataset> = Arc::new(SyntheticTask::new(1, 16, 4, 1, 0.0).unwrap());
        assert!(split_validation(one, 0.5).is_err());
    }

    #[test]
    fn sampler_is_a_permutation_per_epoch() {
        for len in [1u64, 2, 3, 10, 17, 64, 1000] {
            let s = Sampler::new(42, len).unwrap();
            for epoch in 0..2 {
                let mut seen: Vec<u64> = (0..len).map(|i| s.index(epoch * len + i)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}");
            }
        }
        let s = Sampler::new(1, 1000).unwrap();
        let first: Vec<u64> = (0..10).map(|i| s.index(i)).collect();
        assert_ne!(first, (0..10).collect::<Vec<_>>(), "not shuffled");
        assert_ne!(
            first,
            (1000..1010).map(|i| s.index(i)).collect::<Vec<_>>(),
            "epochs differ"
        );
    }

    #[test]
    fn synthetic_examples_are_deterministic_and_mostly_follow_the_chain() {
        let a = SyntheticTask::new(3, 64, 32, 100, 0.1).unwrap();
        let b = SyntheticTask::new(3, 64, 32, 100, 0.1).unwrap();
        assert_eq!(a.example(5).unwrap(), b.example(5).unwrap());
        let mut follow = 0;
        let mut total = 0;
        for i in 0..100 {
            let ex = a.example(i).unwrap();
            assert_eq!(ex.len(), 33);
            for w in ex.windows(2) {
                total += 1;
                follow += usize::from(a.successor[w[0] as usize] == w[1]);
            }
        }
        let rate = follow as f64 / total as f64;
        assert!((0.85..0.95).contains(&rate), "rate {rate}");
        assert!(matches!(
            a.example(100),
            Err(ModelError::ExampleOutOfRange { .. })
        ));
    }

    #[test]
    fn byte_text_windows_overlap_by_one() {
        let d = ByteTextDataset::from_bytes(b"abcdefghij".to_vec(), 3).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d.example(0).unwrap(), vec![97, 98, 99, 100]);
        assert_eq!(d.example(2).unwrap(), vec![103, 104, 105, 106]);
        assert!(d.example(3).is_err());
        assert!(ByteTextDataset::from_bytes(b"ab".to_vec(), 3).is_err());
    }
}
