//! Stage state by layer: parameters, AdamW moments, step count, random streams and the DiLoCo
//! outer state.
//!
//! A hand-off moves layers between machines, so the state is a list of independent per-layer
//! sections, each with its own CRC-32: a receiver can verify and import any subset, and a
//! repartition can assemble a stage from several senders. Parameters are named by visit order
//! and path (never by Burn's per-process `ParamId`).
//!
//! Speed: the export gathers every tensor's host memory first (Flex storage is read in place, see
//! `host`), sizes the output exactly, then writes the layers in parallel, checksumming each chunk
//! right after copying it. The import checks the header and the layout, then copies the wanted
//! sections in parallel while computing their checksums, so every byte is read once; damage
//! that also breaks a section's layout is still reported as a checksum mismatch.
//!
//! Layout (little-endian):
//!
//! ```text
//! header:  magic "PSTS" | version u32 | model fingerprint u64 | model layers u32 | step u64
//!          | layer count u32 | crc32(header so far) u32
//! layer:   index u32 | section length u64 | crc32(section) u32 | section
//! section: rng seed [32] | rng word position u128 | param count u32 | param* | outer
//! param:   path length u16 | path | rank u8 | dims u64*rank | adam time u64
//!          | values f32*n | (moment 1 f32*n | moment 2 f32*n, when adam time > 0)
//! outer:   flag u8 | (anchor f32*N | velocity f32*N, N the layer's values, when flag = 1)
//! ```
//!
//! Version 1 had no `outer` (a layer of it holds no outer state); this build reads both.

use std::ops::Range;

use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::codec::{CrcWriter, Reader, copy_with_crc};
use crate::error::{ModelError, Result};
use crate::host::HostF32;
use crate::params::{ParamInfo, param_values, with_values};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;
use crate::stage::{LayerOuter, Stage};
use source::{LAYER_PREFIX, LayerSource, ParamSource};

const MAGIC: &[u8; 4] = b"PSTS";
/// Bytes of the header including its checksum.
const HEADER_LEN: usize = 4 + 4 + 8 + 4 + 8 + 4 + 4;
/// Version of the state layout this build writes and reads.
pub const STATE_VERSION: u32 = 2;
/// The oldest version this build reads.
const OLDEST_VERSION: u32 = 1;
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

/// One layer's section; verified against its checksum by [`StageState::parse`].
#[derive(Debug)]
pub struct LayerSection<'a> {
    /// Layer index in the model.
    pub index: usize,
    /// The CRC-32 the writer stored for the body.
    stored: u32,
    /// The layout version it was written in.
    version: u32,
    /// The section bytes (after the checksum).
    body: &'a [u8],
}

/// Where one parameter lies in a section (byte ranges of the body).
struct ParamRecord {
    time: u64,
    values: Range<usize>,
    moments: Option<(Range<usize>, Range<usize>)>,
}

/// One parameter copied out of a section: values, and AdamW time and moments once stepped.
struct DecodedParam {
    values: Vec<f32>,
    moments: Option<(u64, Vec<f32>, Vec<f32>)>,
}

/// One layer copied out of a section and verified, not yet turned into tensors.
struct DecodedLayer {
    rng: StageRng,
    params: Vec<DecodedParam>,
    outer: Option<LayerOuter>,
}

/// Where a layer's section holds its outer state (byte ranges of the body).
struct OuterRecord {
    anchor: Range<usize>,
    velocity: Range<usize>,
}

impl<'a> StageState<'a> {
    /// Parses the header and every section header, verifying each layer's checksum.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let state = Self::parse_unverified(bytes)?;
        let checked: Vec<Result<()>> = state.layers.par_iter().map(LayerSection::verify).collect();
        checked.into_iter().collect::<Result<()>>()?;
        Ok(state)
    }

    /// [`Self::parse`] without the section checksums, which [`Stage::import_state`] verifies
    /// while it copies the sections, reading each byte once.
    fn parse_unverified(bytes: &'a [u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, WHAT);
        if &r.array::<4>()? != MAGIC {
            return Err(ModelError::BadMagic { what: WHAT });
        }
        let version = r.u32()?;
        if !(OLDEST_VERSION..=STATE_VERSION).contains(&version) {
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
            layers.push(LayerSection {
                index,
                stored,
                version,
                body,
            });
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

impl LayerSection<'_> {
    /// Fails unless `computed` is the stored checksum.
    fn check(&self, computed: u32) -> Result<()> {
        if computed == self.stored {
            Ok(())
        } else {
            Err(ModelError::ChecksumMismatch {
                layer: self.index,
                stored: self.stored,
                computed,
            })
        }
    }

    /// Verifies the checksum of the whole section.
    fn verify(&self) -> Result<()> {
        self.check(crc32fast::hash(self.body))
    }

    /// Verifies the section and copies it out against the parameters `expected` of the
    /// receiving layer, reading every byte once. Damage anywhere is reported as a checksum
    /// mismatch, even where it also breaks the layout.
    fn decode(&self, expected: &[ParamInfo]) -> Result<DecodedLayer> {
        let (rng, records, outer) = match self.read(expected) {
            Ok(read) => read,
            Err(e) => return self.verify().and(Err(e)),
        };
        let mut crc = crc32fast::Hasher::new();
        let mut done = 0;
        let mut copy = |range: &Range<usize>| -> Vec<f32> {
            crc.update(&self.body[done..range.start]);
            let mut values = vec![0f32; range.len() / 4];
            copy_with_crc(
                bytemuck::cast_slice_mut(&mut values),
                &self.body[range.clone()],
                &mut crc,
            );
            done = range.end;
            values
        };
        let params = records
            .iter()
            .map(|p| DecodedParam {
                values: copy(&p.values),
                moments: p
                    .moments
                    .as_ref()
                    .map(|(m1, m2)| (p.time, copy(m1), copy(m2))),
            })
            .collect();
        let outer = outer.map(|o| LayerOuter {
            anchor: copy(&o.anchor),
            velocity: copy(&o.velocity),
        });
        crc.update(&self.body[done..]);
        self.check(crc.finalize())?;
        Ok(DecodedLayer { rng, params, outer })
    }

    /// Reads the layout of the section against the parameters `expected` of the receiving
    /// layer, without touching the values.
    fn read(
        &self,
        expected: &[ParamInfo],
    ) -> Result<(StageRng, Vec<ParamRecord>, Option<OuterRecord>)> {
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
            let values = r.skip(bytes)?;
            let moments = if time > 0 {
                Some((r.skip(bytes)?, r.skip(bytes)?))
            } else {
                None
            };
            params.push(ParamRecord {
                time,
                values,
                moments,
            });
        }
        let outer = self.read_outer(&mut r, expected)?;
        r.finish()?;
        Ok((StageRng::at_position(seed, word_pos), params, outer))
    }

    /// Reads where the section's outer state lies (none in a version 1 section).
    fn read_outer(
        &self,
        r: &mut Reader<'_>,
        expected: &[ParamInfo],
    ) -> Result<Option<OuterRecord>> {
        if self.version < 2 {
            return Ok(None);
        }
        let bytes = expected.iter().map(ParamInfo::numel).sum::<usize>() * 4;
        match r.u8()? {
            0 => Ok(None),
            1 => Ok(Some(OuterRecord {
                anchor: r.skip(bytes)?,
                velocity: r.skip(bytes)?,
            })),
            flag => Err(ModelError::ParamMismatch {
                layer: self.index,
                index: expected.len(),
                detail: format!("outer state flag {flag}, expected 0 or 1"),
            }),
        }
    }
}

impl<M: PipelineModel> Stage<M> {
    /// Encodes layers `layers` (a sub-range of this stage) with their moments, step and random
    /// streams. Call between steps (no micro-batch in flight). Layers are written in parallel,
    /// each parameter copied once from the device's memory into the output.
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
        let sources = layers
            .clone()
            .map(|index| self.layer_source(index))
            .collect::<Result<Vec<_>>>()?;
        let lens: Vec<usize> = sources
            .iter()
            .map(|s| LAYER_PREFIX + s.body_len())
            .collect();
        // Zeroed: a large buffer then comes as untouched pages from the kernel (no memset), and
        // its page faults, which bound the export, are taken by the parallel writers below.
        let mut out = vec![0u8; HEADER_LEN + lens.iter().sum::<usize>()];
        let (header, mut rest) = out.split_at_mut(HEADER_LEN);
        let model = self.model();
        let mut w = CrcWriter::new(&mut header[..HEADER_LEN - 4]);
        w.put(MAGIC);
        w.put(&STATE_VERSION.to_le_bytes());
        w.put(&model.fingerprint().to_le_bytes());
        w.put(&(model.num_layers() as u32).to_le_bytes());
        w.put(&self.step.to_le_bytes());
        w.put(&(layers.len() as u32).to_le_bytes());
        let header_crc = w.finish();
        header[HEADER_LEN - 4..].copy_from_slice(&header_crc.to_le_bytes());
        let mut slices = Vec::with_capacity(lens.len());
        for len in lens {
            let (slice, tail) = rest.split_at_mut(len);
            slices.push(slice);
            rest = tail;
        }
        sources
            .par_iter()
            .zip(slices)
            .for_each(|(source, slice)| source.write(slice));
        Ok(out)
    }

    /// Gathers what layer `index` writes, holding its tensors' host memory.
    fn layer_source(&self, index: usize) -> Result<LayerSource<'_>> {
        let k = index - self.layer_range().start;
        let values = param_values(&self.layers[k]);
        let params = self.infos[k]
            .iter()
            .zip(values)
            .zip(&self.states[k])
            .map(|((info, value), state)| {
                let mut tensors = vec![HostF32::read(value)?];
                if let Some(s) = state {
                    tensors.push(HostF32::read(s.momentum.moment_1.clone())?);
                    tensors.push(HostF32::read(s.momentum.moment_2.clone())?);
                }
                Ok(ParamSource {
                    info,
                    time: state.as_ref().map_or(0, |s| s.momentum.time as u64),
                    tensors,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerSource {
            index,
            rng: self.rngs[k].position(),
            params,
            outer: self.outer[k].as_ref(),
        })
    }

    /// Imports layers `wanted` (a sub-range of this stage) from a state buffer, with their
    /// moments and random streams; other layers in the buffer are ignored but must pass their
    /// checksums. The whole import is validated before anything changes. A stage that has not
    /// stepped adopts the buffer's step; otherwise the steps must agree. Sections are verified
    /// and copied in parallel, each byte read once.
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
        let state = StageState::parse_unverified(bytes)?;
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
        if let Some(missing) = wanted
            .clone()
            .find(|i| state.layers.iter().all(|l| l.index != *i))
        {
            return Err(ModelError::MissingLayer(missing));
        }
        let decoded: Vec<Result<Option<DecodedLayer>>> = state
            .layers
            .par_iter()
            .map(|section| {
                if wanted.contains(&section.index) {
                    let local = section.index - range.start;
                    section.decode(&self.infos[local]).map(Some)
                } else {
                    section.verify().map(|()| None)
                }
            })
            .collect();
        let mut layers = Vec::with_capacity(wanted.len());
        for (section, layer) in state.layers.iter().zip(decoded) {
            if let Some(layer) = layer? {
                layers.push((section.index - range.start, layer));
            }
        }
        let inner = self.device().clone().inner();
        for (local, DecodedLayer { rng, params, outer }) in layers {
            let flat = |v: Vec<f32>| -> Tensor<1> {
                let n = v.len();
                Tensor::from_data(TensorData::new(v, [n]), &inner)
            };
            let mut values = Vec::with_capacity(params.len());
            let mut states = Vec::with_capacity(params.len());
            for p in params {
                values.push(flat(p.values));
                states.push(p.moments.map(|(time, m1, m2)| {
                    AdamWState::new(AdaptiveMomentumState {
                        time: time as usize,
                        moment_1: flat(m1),
                        moment_2: flat(m2),
                        max_moment_2: None,
                    })
                }));
            }
            self.layers[local] = with_values(self.layers[local].clone(), values);
            self.states[local] = states;
            self.rngs[local] = rng;
            self.outer[local] = outer;
            self.reset_layer_grads(local);
        }
        self.step = state.step;
        Ok(())
    }

    /// SHA-256 of the state of all this stage's layers: equal on every replica of a stage after
    /// the same steps, recorded in the replicated log to verify hand-offs.
    pub fn state_digest(&self) -> Result<[u8; 32]> {
        let bytes = self.export_state(self.layer_range())?;
        Ok(Sha256::digest(&bytes).into())
    }
}

mod source;
