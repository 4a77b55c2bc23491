//! Wire tensors: activations and gradients between pipeline neighbours.
//!
//! Layout (all little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `PWT1` |
//! | 1 | dtype: 0 = f32, 1 = bf16 |
//! | 1 | rank (1..=[`MAX_RANK`]) |
//! | 2 | reserved, zero |
//! | 4 x rank | dimensions (u32) |
//! | numel x size(dtype) | values, row-major |
//!
//! bf16 halves the bytes sent at the cost of precision (rounding to nearest even); values are f32
//! again after decoding because training runs in f32. Decoding checks the magic, the dtype, the
//! rank, an element bound ([`WireLimits`]) and that the payload has exactly the declared length.

use burn::tensor::{Device, Tensor, TensorData};

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use crate::codec::{Reader, checked_numel, extend_f32_le, extend_u16_le, f32_from_le, u16_from_le};
use crate::error::{ModelError, Result};

const MAGIC: &[u8; 4] = b"PWT1";
/// Highest tensor rank the wire format carries.
pub const MAX_RANK: usize = 8;
const WHAT: &str = "wire tensor";

/// Element type of a wire tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireDType {
    /// 4 bytes per value, exact.
    F32,
    /// 2 bytes per value, rounded to bfloat16.
    Bf16,
}

impl WireDType {
    fn code(self) -> u8 {
        match self {
            Self::F32 => 0,
            Self::Bf16 => 1,
        }
    }

    fn from_code(code: u8) -> Result<Self> {
        match code {
            0 => Ok(Self::F32),
            1 => Ok(Self::Bf16),
            other => Err(ModelError::UnknownDType(other)),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }
}

impl Default for WireDType {
    /// Exact f32: the equivalence guarantees hold only without rounding on the wire.
    fn default() -> Self {
        Self::F32
    }
}

/// Bounds applied when decoding, so that a peer cannot make us allocate without limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    /// Largest number of elements accepted.
    pub max_elements: u64,
}

impl Default for WireLimits {
    /// 256 Mi elements (1 GiB of f32): far above any micro-batch activation of the presets.
    fn default() -> Self {
        Self {
            max_elements: 1 << 28,
        }
    }
}

/// A decoded wire tensor: a shape and f32 values, ready to become a Burn tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct WireTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Values in row-major order.
    pub values: Vec<f32>,
}

impl WireTensor {
    /// Encodes `values` of `shape` as `dtype`. Fails if the shape does not match the values or is
    /// outside the format's bounds.
    pub fn encode_values(shape: &[usize], values: &[f32], dtype: WireDType) -> Result<Vec<u8>> {
        let mut out = header(shape, values.len(), dtype)?;
        match dtype {
            WireDType::F32 => extend_f32_le(&mut out, values),
            WireDType::Bf16 => {
                let mut halves = vec![half::bf16::ZERO; values.len()];
                halves.convert_from_f32_slice(values);
                extend_u16_le(&mut out, halves.reinterpret_cast());
            }
        }
        Ok(out)
    }

    /// Encodes a float tensor (read back from its device) as `dtype`.
    pub fn encode_tensor<const D: usize>(tensor: &Tensor<D>, dtype: WireDType) -> Result<Vec<u8>> {
        let data = tensor.to_data();
        let shape = data.shape().to_vec();
        #[cfg(target_endian = "little")]
        if dtype == WireDType::F32 && data.dtype() == burn::tensor::DType::F32 {
            // The device's bytes are already the wire payload: one copy.
            let mut out = header(&shape, data.num_elements(), dtype)?;
            out.extend_from_slice(data.as_bytes());
            return Ok(out);
        }
        let values = tensor_values(data)?;
        Self::encode_values(&shape, &values, dtype)
    }

    /// Decodes and validates a wire buffer.
    pub fn decode(bytes: &[u8], limits: &WireLimits) -> Result<Self> {
        let mut r = Reader::new(bytes, WHAT);
        if &r.array::<4>()? != MAGIC {
            return Err(ModelError::BadMagic { what: WHAT });
        }
        let dtype = WireDType::from_code(r.u8()?)?;
        let rank = r.u8()? as usize;
        if rank == 0 || rank > MAX_RANK {
            return Err(ModelError::TooLarge {
                what: "wire tensor rank",
                value: rank as u64,
                limit: MAX_RANK as u64,
            });
        }
        r.take(2)?;
        let mut shape = Vec::with_capacity(rank);
        for _ in 0..rank {
            shape.push(r.u32()? as usize);
        }
        let numel = checked_numel(&shape, "wire tensor elements", limits.max_elements)?;
        let payload = r.take(numel * dtype.size())?;
        r.finish()?;
        let values = match dtype {
            WireDType::F32 => f32_from_le(payload),
            WireDType::Bf16 => {
                let bits = u16_from_le(payload);
                let mut values = vec![0.0f32; bits.len()];
                let halves: &[half::bf16] = bits.reinterpret_cast();
                halves.convert_to_f32_slice(&mut values);
                values
            }
        };
        Ok(Self { shape, values })
    }

    /// Turns the decoded values into a float tensor of rank `D` on `device`.
    pub fn into_tensor<const D: usize>(self, device: &Device) -> Result<Tensor<D>> {
        if self.shape.len() != D {
            return Err(ModelError::ShapeMismatch {
                what: "wire tensor".into(),
                expected: format!("rank {D}"),
                found: self.shape,
            });
        }
        Ok(Tensor::from_data(
            TensorData::new(self.values, self.shape),
            device,
        ))
    }
}

/// A buffer holding the header of a `numel`-element tensor of `shape`, with room for the payload.
fn header(shape: &[usize], numel: usize, dtype: WireDType) -> Result<Vec<u8>> {
    if shape.is_empty() || shape.len() > MAX_RANK {
        return Err(ModelError::ShapeMismatch {
            what: "wire tensor".into(),
            expected: format!("rank 1..={MAX_RANK}"),
            found: shape.to_vec(),
        });
    }
    let expected = checked_numel(shape, "wire tensor elements", u64::MAX)?;
    if expected != numel {
        return Err(ModelError::ShapeMismatch {
            what: "wire tensor values".into(),
            expected: format!("{expected} values"),
            found: vec![numel],
        });
    }
    let mut out = Vec::with_capacity(8 + 4 * shape.len() + numel * dtype.size());
    out.extend_from_slice(MAGIC);
    out.push(dtype.code());
    out.push(shape.len() as u8);
    out.extend_from_slice(&[0, 0]);
    for &d in shape {
        let d = u32::try_from(d).map_err(|_| ModelError::TooLarge {
            what: "wire tensor dimension",
            value: d as u64,
            limit: u32::MAX as u64,
        })?;
        out.extend_from_slice(&d.to_le_bytes());
    }
    Ok(out)
}

/// The f32 values of tensor data read back from a device.
pub(crate) fn tensor_values(data: TensorData) -> Result<Vec<f32>> {
    data.try_into_vec_as::<f32>()
        .map_err(|e| ModelError::ReadBack(format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_round_trip_is_exact() {
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.37 - 3.0).collect();
        let bytes = WireTensor::encode_values(&[2, 3, 4], &values, WireDType::F32).unwrap();
        assert_eq!(bytes.len(), 8 + 12 + 96);
        let t = WireTensor::decode(&bytes, &WireLimits::default()).unwrap();
        assert_eq!(t.shape, vec![2, 3, 4]);
        assert_eq!(t.values, values);
    }

    #[test]
    fn bf16_halves_the_payload_and_keeps_three_digits() {
        let values: Vec<f32> = (0..16).map(|i| (i as f32).sin() * 10.0).collect();
        let bytes = WireTensor::encode_values(&[16], &values, WireDType::Bf16).unwrap();
        assert_eq!(bytes.len(), 8 + 4 + 32);
        let t = WireTensor::decode(&bytes, &WireLimits::default()).unwrap();
        for (a, b) in t.values.iter().zip(&values) {
            assert!((a - b).abs() <= b.abs() / 128.0, "{a} vs {b}");
        }
    }

    #[test]
    fn rejects_bad_magic_dtype_and_length() {
        let good = WireTensor::encode_values(&[2, 2], &[1.0; 4], WireDType::F32).unwrap();
        let lim = WireLimits::default();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(
            WireTensor::decode(&bad, &lim),
            Err(ModelError::BadMagic { what: WHAT })
        );
        let mut bad = good.clone();
        bad[4] = 9;
        assert_eq!(
            WireTensor::decode(&bad, &lim),
            Err(ModelError::UnknownDType(9))
        );
        assert!(matches!(
            WireTensor::decode(&good[..good.len() - 1], &lim),
            Err(ModelError::Truncated { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            WireTensor::decode(&long, &lim),
            Err(ModelError::TrailingBytes { extra: 1, .. })
        ));
        let small = WireLimits { max_elements: 3 };
        assert!(matches!(
            WireTensor::decode(&good, &small),
            Err(ModelError::TooLarge { value: 4, .. })
        ));
    }

    #[test]
    fn tensor_encoding_matches_value_encoding() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
        let t = Tensor::<2>::from_data(TensorData::new(values.clone(), [3, 4]), &Device::flex());
        for dtype in [WireDType::F32, WireDType::Bf16] {
            assert_eq!(
                WireTensor::encode_tensor(&t, dtype).unwrap(),
                WireTensor::encode_values(&[3, 4], &values, dtype).unwrap()
            );
        }
        assert!(WireTensor::encode_values(&[3, 5], &values, WireDType::F32).is_err());
    }

    #[test]
    fn rejects_a_rank_mismatch_when_building_a_tensor() {
        let t = WireTensor {
            shape: vec![4],
            values: vec![0.0; 4],
        };
        assert!(matches!(
            t.into_tensor::<2>(&Device::flex()),
            Err(ModelError::ShapeMismatch { .. })
        ));
    }
}
