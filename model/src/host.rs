//! A tensor's f32 values as little-endian bytes in host memory, copied at most once.
//!
//! `Tensor::into_data` copies a tensor that something else still holds (a module parameter, an
//! optimizer moment), so reading it and then writing the bytes out costs two copies. On the Flex
//! backend the tensor's storage already is host memory: [`HostF32::read`] keeps a handle on that
//! storage (Burn's backend-extension downcast, no copy) and lends it out as bytes, so the state
//! export copies every value exactly once, straight into its output. Other backends (CUDA) and
//! non-f32 or strided tensors are read back through `into_data`, which they need anyway.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::kind::Basic;
use burn::tensor::{DType, Element, Tensor, TensorData};

use crate::codec::extend_f32_le;
use crate::error::{ModelError, Result};
use crate::wire::tensor_values;

/// The values of one tensor, readable as little-endian f32 bytes without further copies.
pub(crate) enum HostF32 {
    /// Flex storage, shared with the tensor; `range` is the span of f32 elements it occupies.
    Flex {
        tensor: FlexTensor,
        range: Range<usize>,
    },
    /// Read back as f32 data on a little-endian host: its bytes are already the layout.
    #[cfg_attr(
        target_endian = "big",
        expect(dead_code, reason = "little-endian only")
    )]
    Data(TensorData),
    /// Converted to little-endian bytes (other dtypes, big-endian hosts).
    Bytes(Vec<u8>),
}

/// Blocking read-backs from a device this process has made: every read of the model crate goes
/// through [`read_data`] or [`read_scalar`]. On a GPU each one waits for the stream to drain.
static READ_BACKS: AtomicU64 = AtomicU64::new(0);

/// How many blocking read-backs from a device the model crate has made in this process (a
/// step's count is the difference across it).
pub fn read_backs() -> u64 {
    READ_BACKS.load(Ordering::Relaxed)
}

/// `t`'s data, read back from its device: a device that failed (out of memory, a kernel that
/// could not run) is an error naming `what`, where Burn's `into_data` would panic.
pub(crate) fn read_data<const D: usize, K: Basic>(
    t: Tensor<D, K>,
    what: &str,
) -> Result<TensorData> {
    READ_BACKS.fetch_add(1, Ordering::Relaxed);
    t.try_into_data()
        .map_err(|e| ModelError::ReadBack(format!("{what}: {e}")))
}

/// `t`'s one value, read back from its device (see [`read_data`]).
pub(crate) fn read_scalar<E: Element, const D: usize, K: Basic>(
    t: Tensor<D, K>,
    what: &str,
) -> Result<E> {
    READ_BACKS.fetch_add(1, Ordering::Relaxed);
    t.try_into_scalar::<E>()
        .map_err(|e| ModelError::ReadBack(format!("{what}: {e}")))
}

impl HostF32 {
    /// Takes `t`'s values, borrowing Flex storage when it is contiguous f32.
    pub(crate) fn read<const D: usize>(t: Tensor<D>) -> Result<Self> {
        #[cfg(target_endian = "little")]
        if let Ok(tensor) = t.clone().try_into_primitive::<Flex>()
            && tensor.dtype() == DType::F32
            && let Some((start, end)) = tensor.layout().contiguous_offsets()
            && end * 4 <= tensor.bytes().len()
        {
            return Ok(Self::Flex {
                tensor,
                range: start..end,
            });
        }
        let data = read_data(t, "tensor values")?;
        #[cfg(target_endian = "little")]
        if data.dtype() == DType::F32 {
            return Ok(Self::Data(data));
        }
        let values = tensor_values(data)?;
        let mut bytes = Vec::with_capacity(values.len() * 4);
        extend_f32_le(&mut bytes, &values);
        Ok(Self::Bytes(bytes))
    }

    /// The values as little-endian f32 bytes, row-major.
    pub(crate) fn le_bytes(&self) -> &[u8] {
        match self {
            Self::Flex { tensor, range } => &tensor.bytes()[range.start * 4..range.end * 4],
            Self::Data(data) => data.as_bytes(),
            Self::Bytes(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    #[test]
    fn reads_flex_in_place_and_strided_tensors_by_copy() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let t = Tensor::<2>::from_data(TensorData::new(values.clone(), [3, 4]), &Device::flex());
        let host = HostF32::read(t.clone()).unwrap();
        assert!(matches!(host, HostF32::Flex { .. }));
        let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(host.le_bytes(), expected.as_slice());

        let transposed = HostF32::read(t.clone().transpose()).unwrap();
        assert!(!matches!(transposed, HostF32::Flex { .. }));
        let expected: Vec<u8> = (0..4)
            .flat_map(|c| (0..3).map(move |r| r * 4 + c))
            .flat_map(|i| values[i].to_le_bytes())
            .collect();
        assert_eq!(transposed.le_bytes(), expected.as_slice());

        let row = HostF32::read(t.slice([1..2, 0..4])).unwrap();
        let expected: Vec<u8> = values[4..8].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(row.le_bytes(), expected.as_slice());
    }
}
