//! Little-endian byte reading and writing shared by the wire and state formats.
//!
//! One bounds-checked reader so that every decoder reports truncation the same way, and one pair
//! of f32 slice conversions so that the byte order is handled in exactly one place.

use crate::error::{ModelError, Result};

/// A cursor over untrusted bytes; every read checks the remaining length first.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `bytes`, naming `what` in errors.
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self {
            bytes,
            pos: 0,
            what,
        }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Skips the next `n` bytes, returning where they are.
    pub(crate) fn skip(&mut self, n: usize) -> Result<std::ops::Range<usize>> {
        let start = self.pos;
        self.take(n)?;
        Ok(start..self.pos)
    }

    /// Takes the next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(ModelError::Truncated {
                what: self.what,
                needed: n,
                available: self.remaining(),
            });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Takes the next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// Fails unless every byte was consumed.
    pub(crate) fn finish(self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(ModelError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}

/// Bytes checksummed per step while copying: small enough that the checksum reads what was just
/// copied from cache instead of from memory.
const CRC_CHUNK: usize = 64 * 1024;

/// Copies `src` into `dst` (of the same length), folding the bytes into `crc` on the way.
pub(crate) fn copy_with_crc(dst: &mut [u8], src: &[u8], crc: &mut crc32fast::Hasher) {
    debug_assert_eq!(dst.len(), src.len());
    for (d, s) in dst.chunks_mut(CRC_CHUNK).zip(src.chunks(CRC_CHUNK)) {
        d.copy_from_slice(s);
        crc.update(s);
    }
}

/// Writes into a slice sized in advance, keeping the CRC-32 of everything written; lets
/// independent sections of one output be filled in parallel.
pub(crate) struct CrcWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
    crc: crc32fast::Hasher,
}

impl<'a> CrcWriter<'a> {
    /// Writes `buf` from its start.
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    /// Appends `bytes`. The caller sized the slice: writing past its end is a bug and panics.
    pub(crate) fn put(&mut self, bytes: &[u8]) {
        let end = self.pos + bytes.len();
        copy_with_crc(&mut self.buf[self.pos..end], bytes, &mut self.crc);
        self.pos = end;
    }

    /// The CRC-32 of what was written, which must fill the slice exactly.
    pub(crate) fn finish(self) -> u32 {
        assert_eq!(self.pos, self.buf.len(), "section size computed wrongly");
        self.crc.finalize()
    }
}

/// Appends `values` as little-endian f32.
pub(crate) fn extend_f32_le(out: &mut Vec<u8>, values: &[f32]) {
    #[cfg(target_endian = "little")]
    out.extend_from_slice(bytemuck::cast_slice(values));
    #[cfg(target_endian = "big")]
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads little-endian f32 values; `bytes.len()` must be a multiple of 4 (callers check it).
pub(crate) fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    #[cfg(target_endian = "little")]
    {
        bytemuck::pod_collect_to_vec(bytes)
    }
    #[cfg(target_endian = "big")]
    {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// Appends `values` as little-endian u16.
pub(crate) fn extend_u16_le(out: &mut Vec<u8>, values: &[u16]) {
    #[cfg(target_endian = "little")]
    out.extend_from_slice(bytemuck::cast_slice(values));
    #[cfg(target_endian = "big")]
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads little-endian u16 values; `bytes.len()` must be even (callers check it).
pub(crate) fn u16_from_le(bytes: &[u8]) -> Vec<u16> {
    #[cfg(target_endian = "little")]
    {
        bytemuck::pod_collect_to_vec(bytes)
    }
    #[cfg(target_endian = "big")]
    {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }
}

/// Checked product of dimensions, so that a hostile shape cannot overflow.
pub(crate) fn checked_numel(dims: &[usize], what: &'static str, limit: u64) -> Result<usize> {
    let mut n: u64 = 1;
    for &d in dims {
        n = n.checked_mul(d as u64).ok_or(ModelError::TooLarge {
            what,
            value: u64::MAX,
            limit,
        })?;
    }
    if n > limit {
        return Err(ModelError::TooLarge {
            what,
            value: n,
            limit,
        });
    }
    Ok(n as usize)
}
