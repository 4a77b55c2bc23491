//! How one layer of a stage's state is written (`crate::state` has the layout): its section's
//! length, known before writing, and the bytes with their checksum.

use crate::codec::CrcWriter;
use crate::host::HostF32;
use crate::params::ParamInfo;
use crate::stage::LayerOuter;

/// Bytes before each section body: layer index, body length, checksum.
pub(super) const LAYER_PREFIX: usize = 4 + 8 + 4;

/// One layer as it will be written: its random stream, its parameters' tensors and its outer
/// state.
pub(super) struct LayerSource<'a> {
    pub(super) index: usize,
    pub(super) rng: ([u8; 32], u128),
    pub(super) params: Vec<ParamSource<'a>>,
    pub(super) outer: Option<&'a LayerOuter>,
}

/// One parameter as it will be written: its name and shape, AdamW time, and the values then
/// (once stepped) both moments.
pub(super) struct ParamSource<'a> {
    pub(super) info: &'a ParamInfo,
    pub(super) time: u64,
    pub(super) tensors: Vec<HostF32>,
}

impl ParamSource<'_> {
    /// Bytes of the parameter's record.
    fn len(&self) -> usize {
        2 + self.info.path.len()
            + 1
            + 8 * self.info.shape.len()
            + 8
            + self
                .tensors
                .iter()
                .map(|t| t.le_bytes().len())
                .sum::<usize>()
    }
}

impl LayerSource<'_> {
    /// Bytes of the section body.
    pub(super) fn body_len(&self) -> usize {
        let outer = self
            .outer
            .map_or(0, |o| 4 * (o.anchor.len() + o.velocity.len()));
        32 + 16 + 4 + self.params.iter().map(ParamSource::len).sum::<usize>() + 1 + outer
    }

    /// Writes the layer (index, length, checksum, body) into `out`, which is exactly
    /// `LAYER_PREFIX + body_len()` long.
    pub(super) fn write(&self, out: &mut [u8]) {
        let (prefix, body) = out.split_at_mut(LAYER_PREFIX);
        let body_len = body.len() as u64;
        let mut w = CrcWriter::new(body);
        w.put(&self.rng.0);
        w.put(&self.rng.1.to_le_bytes());
        w.put(&(self.params.len() as u32).to_le_bytes());
        for p in &self.params {
            w.put(&(p.info.path.len() as u16).to_le_bytes());
            w.put(p.info.path.as_bytes());
            w.put(&[p.info.shape.len() as u8]);
            for d in &p.info.shape {
                w.put(&(*d as u64).to_le_bytes());
            }
            w.put(&p.time.to_le_bytes());
            for t in &p.tensors {
                w.put(t.le_bytes());
            }
        }
        w.put(&[u8::from(self.outer.is_some())]);
        if let Some(o) = self.outer {
            w.put(bytemuck::cast_slice(&o.anchor));
            w.put(bytemuck::cast_slice(&o.velocity));
        }
        let crc = w.finish();
        prefix[..4].copy_from_slice(&(self.index as u32).to_le_bytes());
        prefix[4..12].copy_from_slice(&body_len.to_le_bytes());
        prefix[12..].copy_from_slice(&crc.to_le_bytes());
    }
}
