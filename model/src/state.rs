//! Stage state by layer: parameters, AdamW moments, step count and random streams.
//!
//! A hand-off moves layers between machines, so the state is a list of independent per-layer
//! sections, each with its own CRC-32: a receiver can verify and import any subset, and a
//! repartition can assemble a stage from several senders. Parameters are named by visit order
//! and path (never by Burn's per-process `ParamId`).
//!
//! Layout (little-endian):
//!
//! ```text
//! header:  magic "PSTS" | version u32 | model fingerprint u64 | model layers u32 | step u64
//!          | layer count u32 | crc32(header so far) u32
//! layer:   index u32 | section length u64 | crc32(section) u32 | section
//! section: rng seed [32] | rng word position u128 | param count u32 | param*
//! param:   path length u16 | path | rank u8 | dims u64*rank | adam time u64
//!          | values f32*n | (moment 1 f32*n | moment 2 f32*n, when adam time > 0)
//! ```

use std::ops::Range;

use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::{Tensor, TensorData};
use sha2::{Digest, Sha256};

use crate::codec::{Reader, extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::optim::ParamState;
use crate::params::{ParamInfo, param_values, with_values};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;
use crate::stage::Stage;
use crate::wire::tensor_values;

const MAGIC: &[u8; 4] = b"PSTS";
/// Bytes of the header including its checksum.
const HEADER_LEN: usize = 4 + 4 + 8 + 4 + 8 + 4 + 4;
/// Version of the state layout this build writes and reads.
pub const STATE_VERSION: u32 = 1;
const WHAT: &str = "stage state";
const MAX_PATH: usize = 1024;
const MAX_RANK: usize = 8;
const MAX_PARAMS_PER_LAYER: u32 = 1 << 16;

/// A parsed, checksum-verified view of a state buffer: which model, step and layers it holds.
/// Parameter data stays in the buffer until [`Stage::import_state`] copies it onto the device.
#[derive(Debug)]
pub struct StageState<'a> {
    /// Fingerprint of the model that wrote it ([`PipelineModel::fingerprint`]).
    pub fingerprint: u64,
    /// Number of layers of that model.
    pub model_layers: usize,
    /// Optimizer steps applied to these layers.
    pub step: u64,
    /// The per-layer sections, in buffer order.
    pub layers: Vec<LayerSection<'a>>,
}

/// One layer's section, verified against its checksum.
#[derive(Debug)]
pub struct LayerSection<'a> {
    /// Layer index in the model.
    pub index: usize,
    /// The section bytes (after the checksum).
    body: &'a [u8],
}

/// One parameter read from a section.
struct ParamRecord<'a> {
    shape: Vec<usize>,
    time: u64,
    values: &'a [u8],
    moments: Option<(&'a [u8], &'a [u8])>,
}

impl<'a> StageState<'a> {
    /// Parses the header and every section header, verifying each layer's checksum.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, WHAT);
        if &r.array::<4>()? != MAGIC {
            return Err(ModelError::BadMagic { what: WHAT });
        }
        let version = r.u32()?;
        if version != STATE_VERSION {
            return Err(ModelError::UnsupportedVersion {
                what: WHAT,
                found: version,
                supported: STATE_VERSION,
            });
        }
        let fingerprint = r.u64()?;
        let model_layers = r.u32()? as usize;
        let step = r.u64()?;
        let count = r.u32()? as usize;
        let stored = r.u32()?;
        let computed = crc32fast::hash(&bytes[..HEADER_LEN - 4]);
        if stored != computed {
            return Err(ModelError::HeaderChecksum { stored, computed });
        }
        if count > model_layers {
            return Err(ModelError::TooLarge {
                what: "layer count",
                value: count as u64,
                limit: model_layers as u64,
            });
        }
        let mut layers: Vec<LayerSection<'a>> = Vec::with_capacity(count);
        for _ in 0..count {
            let index = r.u32()? as usize;
            if index >= model_layers {
                return Err(ModelError::LayerOutOfRange {
                    layer: index,
                    expected: 0..model_layers,
                });
            }
            if layers.iter().any(|l| l.index == index) {
                return Err(ModelError::DuplicateLayer(index));
            }
            let len = r.u64()?;
            let stored = r.u32()?;
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= r.remaining())
                .ok_or(ModelError::Truncated {
                    what: "state layer section",
                    needed: len.min(usize::MAX as u64) as usize,
                    available: r.remaining(),
                })?;
            let body = r.take(len)?;
            let computed = crc32fast::hash(body);
            if computed != stored {
                return Err(ModelError::ChecksumMismatch {
                    layer: index,
                    stored,
                    computed,
                });
            }
            layers.push(LayerSection { index, body });
        }
        r.finish()?;
        Ok(Self {
            fingerprint,
            model_layers,
            step,
            layers,
        })
    }

    /// The layer indices held, in buffer order.
    pub fn layer_indices(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.index).collect()
    }
}

impl<'a> LayerSection<'a> {
    /// Reads the section against the parameters `expected` of the receiving layer.
    fn read(&self, expected: &[ParamInfo]) -> Result<(StageRng, Vec<ParamRecord<'a>>)> {
        let layer = self.index;
        let mut r = Reader::new(self.body, "state layer section");
        let seed = r.array::<32>()?;
        let word_pos = r.u128()?;
        let count = r.u32()?;
        if count > MAX_PARAMS_PER_LAYER {
            return Err(ModelError::TooLarge {
                what: "parameters per layer",
                value: count as u64,
                limit: MAX_PARAMS_PER_LAYER as u64,
            });
        }
        if count as usize != expected.len() {
            return Err(ModelError::ParamMismatch {
                layer,
                index: count as usize,
                detail: format!("{count} parameters, the layer has {}", expected.len()),
            });
        }
        let mut params = Vec::with_capacity(expected.len());
        for (index, info) in expected.iter().enumerate() {
            let mismatch = |detail: String| ModelError::ParamMismatch {
                layer,
                index,
                detail,
            };
            let path_len = r.u16()? as usize;
            if path_len > MAX_PATH {
                return Err(ModelError::TooLarge {
                    what: "parameter path",
                    value: path_len as u64,
                    limit: MAX_PATH as u64,
                });
            }
            let path = std::str::from_utf8(r.take(path_len)?).map_err(|_| ModelError::BadPath)?;
            if path != info.path {
                return Err(mismatch(format!("path {path:?}, expected {:?}", info.path)));
            }
            let rank = r.u8()? as usize;
            if rank > MAX_RANK {
                return Err(ModelError::TooLarge {
                    what: "parameter rank",
                    value: rank as u64,
                    limit: MAX_RANK as u64,
                });
            }
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(r.u64()?);
            }
            if shape
                .iter()
                .map(|d| *d as usize)
                .ne(info.shape.iter().copied())
                || shape.len() != info.shape.len()
            {
                return Err(mismatch(format!(
                    "shape {shape:?}, expected {:?}",
                    info.shape
                )));
            }
            let time = r.u64()?;
            let bytes = info.numel() * 4;
            let values = r.take(bytes)?;
            let moments = if time > 0 {
                Some((r.take(bytes)?, r.take(bytes)?))
            } else {
                None
            };
            params.push(ParamRecord {
                shape: info.shape.clone(),
                time,
                values,
                moments,
            });
        }
        r.finish()?;
        Ok((StageRng::at_position(seed, word_pos), params))
    }
}

/// A layer decoded and ready to swap in.
struct ImportedLayer<L> {
    local: usize,
    layer: L,
    states: Vec<ParamState>,
    rng: StageRng,
}

impl<M: PipelineModel> Stage<M> {
    /// Encodes layers `layers` (a sub-range of this stage) with their moments, step and random
    /// streams. Call between steps (no micro-batch in flight).
    pub fn export_state(&self, layers: Range<usize>) -> Result<Vec<u8>> {
        self.ensure_idle()?;
        let range = self.layer_range();
        if layers.start >= layers.end || layers.start < range.start || layers.end > range.end {
            return Err(ModelError::InvalidLayerRange {
                start: layers.start,
                end: layers.end,
                num_layers: self.model().num_layers(),
            });
        }
        let model = self.model();
        let estimate: usize = layers
            .clone()
            .map(|i| {
                self.infos[i - range.start]
                    .iter()
                    .map(ParamInfo::numel)
                    .sum::<usize>()
                    * 12
            })
            .sum();
        let mut out = Vec::with_capacity(estimate + 1024);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&model.fingerprint().to_le_bytes());
        out.extend_from_slice(&(model.num_layers() as u32).to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&(layers.len() as u32).to_le_bytes());
        let header_crc = crc32fast::hash(&out);
        out.extend_from_slice(&header_crc.to_le_bytes());
        for index in layers {
            let k = index - range.start;
            out.extend_from_slice(&(index as u32).to_le_bytes());
            let len_at = out.len();
            out.extend_from_slice(&[0u8; 12]);
            let body_at = out.len();
            self.write_layer(k, &mut out)?;
            let body_len = (out.len() - body_at) as u64;
            let crc = crc32fast::hash(&out[body_at..]);
            out[len_at..len_at + 8].copy_from_slice(&body_len.to_le_bytes());
            out[len_at + 8..len_at + 12].copy_from_slice(&crc.to_le_bytes());
        }
        Ok(out)
    }

    fn write_layer(&self, k: usize, out: &mut Vec<u8>) -> Result<()> {
        let (seed, word_pos) = self.rngs[k].position();
        out.extend_from_slice(&seed);
        out.extend_from_slice(&word_pos.to_le_bytes());
        out.extend_from_slice(&(self.infos[k].len() as u32).to_le_bytes());
        let values = param_values(&self.layers[k]);
        for ((info, value), state) in self.infos[k].iter().zip(values).zip(&self.states[k]) {
            out.extend_from_slice(&(info.path.len() as u16).to_le_bytes());
            out.extend_from_slice(info.path.as_bytes());
            out.push(info.shape.len() as u8);
            for d in &info.shape {
                out.extend_from_slice(&(*d as u64).to_le_bytes());
            }
            let time = state.as_ref().map_or(0, |s| s.momentum.time as u64);
            out.extend_from_slice(&time.to_le_bytes());
            write_tensor(out, value)?;
            if let Some(s) = state {
                write_tensor(out, s.momentum.moment_1.clone())?;
                write_tensor(out, s.momentum.moment_2.clone())?;
            }
        }
        Ok(())
    }

    /// Imports layers `wanted` (a sub-range of this stage) from a state buffer, with their
    /// moments and random streams; other layers in the buffer are ignored. The whole import is
    /// validated before anything changes. A stage that has not stepped adopts the buffer's step;
    /// otherwise the steps must agree.
    pub fn import_state(&mut self, bytes: &[u8], wanted: Range<usize>) -> Result<()> {
        self.ensure_idle()?;
        let range = self.layer_range();
        if wanted.start >= wanted.end || wanted.start < range.start || wanted.end > range.end {
            return Err(ModelError::LayerOutOfRange {
                layer: if wanted.start < range.start {
                    wanted.start
                } else {
                    wanted.end.saturating_sub(1)
                },
                expected: range,
            });
        }
        let state = StageState::parse(bytes)?;
        let expected = self.model().fingerprint();
        if state.fingerprint != expected || state.model_layers != self.model().num_layers() {
            return Err(ModelError::ModelMismatch {
                expected,
                found: state.fingerprint,
            });
        }
        if self.step != 0 && state.step != self.step {
            return Err(ModelError::StepMismatch {
                stage: self.step,
                state: state.step,
            });
        }
        let mut imported = Vec::with_capacity(wanted.len());
        for index in wanted {
            let section = state
                .layers
                .iter()
                .find(|l| l.index == index)
                .ok_or(ModelError::MissingLayer(index))?;
            imported.push(self.decode_layer(section)?);
        }
        for ImportedLayer {
            local,
            layer,
            states,
            rng,
        } in imported
        {
            self.layers[local] = layer;
            self.states[local] = states;
            self.rngs[local] = rng;
            self.reset_layer_grads(local);
        }
        self.step = state.step;
        Ok(())
    }

    fn decode_layer(&self, section: &LayerSection<'_>) -> Result<ImportedLayer<M::Layer>> {
        let local = section.index - self.layer_range().start;
        let (rng, params) = section.read(&self.infos[local])?;
        let inner = self.device().clone().inner();
        let flat = |bytes: &[u8], n: usize| -> Tensor<1> {
            Tensor::from_data(TensorData::new(f32_from_le(bytes), [n]), &inner)
        };
        let mut values = Vec::with_capacity(params.len());
        let mut states = Vec::with_capacity(params.len());
        for p in params {
            let n: usize = p.shape.iter().product();
            values.push(flat(p.values, n));
            states.push(p.moments.map(|(m1, m2)| {
                AdamWState::new(AdaptiveMomentumState {
                    time: p.time as usize,
                    moment_1: flat(m1, n),
                    moment_2: flat(m2, n),
                    max_moment_2: None,
                })
            }));
        }
        Ok(ImportedLayer {
            local,
            layer: with_values(self.layers[local].clone(), values),
            states,
            rng,
        })
    }

    /// SHA-256 of the state of all this stage's layers: equal on every replica of a stage after
    /// the same steps, recorded in the replicated log to verify hand-offs.
    pub fn state_digest(&self) -> Result<[u8; 32]> {
        let bytes = self.export_state(self.layer_range())?;
        Ok(Sha256::digest(&bytes).into())
    }
}

fn write_tensor(out: &mut Vec<u8>, t: Tensor<1>) -> Result<()> {
    let data = t.into_data();
    #[cfg(target_endian = "little")]
    if data.dtype() == burn::tensor::DType::F32 {
        out.extend_from_slice(data.as_bytes());
        return Ok(());
    }
    extend_f32_le(out, &tensor_values(data)?);
    Ok(())
}
