//! The pseudo-gradient's wire forms. A round sends each stage's pseudo-gradient once between
//! groups, so its bytes are what crosses zones and regions: `f32` sends it whole, `bf16` halves
//! it (round to nearest even), `int8` quarters it with one f32 scale per block of
//! [`INT8_BLOCK`] values (a block's largest magnitude maps to 127). Each form's error is
//! bounded ([`Wire::error_bound`]). Decoding takes the count the receiver expects (its own
//! stage's parameters), so a peer's bytes never size an allocation, and refuses every length,
//! scale or value that could not have come from an honest encoder.
//!
//! Every form is settled: encoding what was decoded gives back the same bytes. A ring over
//! three or more zones forwards a total it received, re-encoding it, and every replica must
//! end with the same bytes: `int8` picks each block's scale among those that re-encoding
//! keeps (a few ulps above `max / 127` at most), and sends as zeros a block too small for a
//! normal scale (largest magnitude under [`INT8_FLUSH`]).

use std::fmt;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Serialize};

/// Values that share one scale in the `int8` form.
pub const INT8_BLOCK: usize = 256;
/// Bytes of a block's scale.
const SCALE_BYTES: usize = 4;
/// Blocks whose largest magnitude is below this (`127 * 2^-126`, where the scale would be
/// subnormal and lose the bits that keep it settled) are sent as zeros.
pub const INT8_FLUSH: f32 = 127.0 * f32::MIN_POSITIVE;
/// Scales tried from `max / 127` up for a settled one ([`settled_scale`]).
const SCALE_SEARCH: usize = 4;

/// How a pseudo-gradient travels between groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// Whole: four bytes a value, exact.
    #[default]
    F32,
    /// Two bytes a value, rounded to nearest even: a relative error of at most `2^-8`.
    Bf16,
    /// One byte a value and a scale a block: an error of at most the block's largest magnitude
    /// over 254.
    Int8,
}

impl FromStr for Wire {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Wire::F32),
            "bf16" => Ok(Wire::Bf16),
            "int8" => Ok(Wire::Int8),
            _ => Err(format!(
                "pseudo-gradient wire form \"{}\": expected f32, bf16 or int8",
                s.chars().take(64).collect::<String>()
            )),
        }
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Wire::F32 => "f32",
            Wire::Bf16 => "bf16",
            Wire::Int8 => "int8",
        })
    }
}

/// Why a pseudo-gradient could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CodecError {
    /// A value that is not finite: the inner steps diverged, or a peer sent garbage.
    #[error("pseudo-gradient value {index} is not finite")]
    NonFinite { index: usize },
    /// Bytes that are not the form's length for the values expected.
    #[error("pseudo-gradient of {values} values in {wire:?}: expected {expected} bytes, got {got}")]
    Length {
        wire: Wire,
        values: usize,
        expected: usize,
        got: usize,
    },
    /// An `int8` block's scale that no encoder writes (negative, not finite, or so large
    /// that a value would overflow).
    #[error("pseudo-gradient block {block}: scale {scale} is not one an encoder writes")]
    Scale { block: usize, scale: f32 },
    /// More values than the form can be sized for on this machine.
    #[error("pseudo-gradient of {values} values is too large to encode")]
    TooLarge { values: usize },
}

impl Wire {
    /// Bytes of `values` values in this form (`None`: past what this machine can address).
    pub fn encoded_len(self, values: usize) -> Option<usize> {
        match self {
            Wire::F32 => values.checked_mul(4),
            Wire::Bf16 => values.checked_mul(2),
            Wire::Int8 => values
                .div_ceil(INT8_BLOCK)
                .checked_mul(SCALE_BYTES)?
                .checked_add(values),
        }
    }

    /// The most a decoded value may differ from `value`, where the largest magnitude of its
    /// `int8` block is `block_max` (its own magnitude counts for the others).
    pub fn error_bound(self, value: f32, block_max: f32) -> f32 {
        match self {
            Wire::F32 => 0.0,
            // Half a unit in the last of bf16's 8 significant bits; the smallest subnormals'
            // absolute step past that.
            Wire::Bf16 => value.abs() * 2f32.powi(-8) + f32::from(bf16::from_bits(1)),
            // A block sent as zeros loses its values whole.
            Wire::Int8 if block_max < INT8_FLUSH => block_max,
            // Half a step of `block_max / 127` (the settled scale at most three ulps above it),
            // and the f32 rounding of the division and of the product back.
            Wire::Int8 => block_max / 254.0 + block_max * 2f32.powi(-21),
        }
    }
}

/// `values` in the `wire` form.
pub fn encode(values: &[f32], wire: Wire) -> Result<Vec<u8>, CodecError> {
    let len = wire.encoded_len(values.len()).ok_or(CodecError::TooLarge {
        values: values.len(),
    })?;
    let mut out = Vec::with_capacity(len);
    encode_into(values, wire, &mut out)?;
    Ok(out)
}

/// Appends `values` in the `wire` form to `out` (a frame's payload, range after range).
pub fn encode_into(values: &[f32], wire: Wire, out: &mut Vec<u8>) -> Result<(), CodecError> {
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(CodecError::NonFinite { index });
    }
    match wire {
        Wire::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Wire::Bf16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes())),
        Wire::Int8 => {
            for block in values.chunks(INT8_BLOCK) {
                let max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = settled_scale(max);
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend(block.iter().map(|&v| quantise(v, scale).to_le_bytes()[0]));
            }
        }
    }
    Ok(())
}

/// The scale of an `int8` block whose largest magnitude is `max`: the first from `max / 127`
/// up that re-encoding its decoded block picks again. The block's largest value decodes to
/// `127 * scale` (it quantises to +-127 at any of these scales), whose scale is
/// `(127 * scale) / 127` in f32: a settled scale is one that this gives back. Every normal
/// f32 lies at most two ulps below a settled one (a scan of all of them found no wider gap),
/// so the search always ends on one; `max / 127` itself only keeps the function total.
fn settled_scale(max: f32) -> f32 {
    if max < INT8_FLUSH {
        return 0.0;
    }
    let first = max / 127.0;
    std::iter::successors(Some(first), |s| Some(s.next_up()))
        .take(SCALE_SEARCH)
        .find(|&s| (127.0 * s) / 127.0 == s)
        .unwrap_or(first)
}

/// The `values` values that `bytes` holds in the `wire` form.
pub fn decode(bytes: &[u8], wire: Wire, values: usize) -> Result<Vec<f32>, CodecError> {
    let expected = wire
        .encoded_len(values)
        .ok_or(CodecError::TooLarge { values })?;
    if bytes.len() != expected {
        return Err(CodecError::Length {
            wire,
            values,
            expected,
            got: bytes.len(),
        });
    }
    let out: Vec<f32> = match wire {
        Wire::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Wire::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Wire::Int8 => {
            let mut out = Vec::with_capacity(values);
            for (block, chunk) in bytes.chunks(SCALE_BYTES + INT8_BLOCK).enumerate() {
                let (scale, quanta) = chunk.split_at(SCALE_BYTES);
                let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
                if !(0.0..=f32::MAX / 127.0).contains(&scale) {
                    return Err(CodecError::Scale { block, scale });
                }
                out.extend(quanta.iter().map(|&q| f32::from(q as i8) * scale));
            }
            out
        }
    };
    match out.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(CodecError::NonFinite { index }),
        None => Ok(out),
    }
}

/// `v` in steps of `scale`, within `[-127, 127]` (0 where the block is all zeros).
fn quantise(v: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    // In range by the scale's choice; the clamp holds against the division's rounding.
    (v / scale).round().clamp(-127.0, 127.0) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_is_exact_and_every_form_has_its_length() {
        let values = [0.0, -1.5, 3.25e-9, 7.0e30, -0.0];
        assert_eq!(
            decode(&encode(&values, Wire::F32).unwrap(), Wire::F32, 5).unwrap(),
            values
        );
        assert_eq!(Wire::F32.encoded_len(1000), Some(4000));
        assert_eq!(Wire::Bf16.encoded_len(1000), Some(2000));
        // Four blocks (256, 256, 256, 232), a scale each.
        assert_eq!(Wire::Int8.encoded_len(1000), Some(1016));
        assert_eq!(Wire::Int8.encoded_len(0), Some(0));
        assert_eq!(Wire::F32.encoded_len(usize::MAX), None);
        for wire in [Wire::F32, Wire::Bf16, Wire::Int8] {
            assert_eq!(
                encode(&[1.0; 1000], wire).unwrap().len(),
                wire.encoded_len(1000).unwrap()
            );
        }
    }

    #[test]
    fn wire_forms_parse_and_print_back() {
        for wire in [Wire::F32, Wire::Bf16, Wire::Int8] {
            assert_eq!(wire.to_string().parse::<Wire>(), Ok(wire));
        }
        assert!(
            "fp8"
                .parse::<Wire>()
                .unwrap_err()
                .contains("expected f32, bf16 or int8")
        );
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1.
        let halfway = 1.0 + 2f32.powi(-8);
        let back = decode(
            &encode(&[halfway, 1.0 + 3.0 * 2f32.powi(-9)], Wire::Bf16).unwrap(),
            Wire::Bf16,
            2,
        );
        assert_eq!(back.unwrap(), [1.0, 1.0 + 2f32.powi(-7)]);
    }

    #[test]
    fn int8_maps_each_block_s_largest_magnitude_to_127() {
        let mut values = vec![0.0f32; 300];
        values[0] = -2.54;
        values[1] = 1.27;
        values[256] = 0.5;
        let bytes = encode(&values, Wire::Int8).unwrap();
        let scale_at = |at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let ulps_above = |scale: f32, max: f32| scale.to_bits() - (max / 127.0).to_bits();
        assert!(ulps_above(scale_at(0), 2.54) <= 3);
        assert_eq!(bytes[4] as i8, -127);
        assert_eq!(bytes[5] as i8, 64);
        let second = 4 + 256;
        assert!(ulps_above(scale_at(second), 0.5) <= 3);
        let back = decode(&bytes, Wire::Int8, 300).unwrap();
        assert!((back[0] + 2.54).abs() < 1e-6 && (back[256] - 0.5).abs() < 1e-6);
        assert_eq!(
            decode(&encode(&[0.0; 10], Wire::Int8).unwrap(), Wire::Int8, 10).unwrap(),
            [0.0; 10]
        );
    }

    #[test]
    fn int8_scales_settle_within_three_ulps_and_tiny_blocks_go_as_zeros() {
        // A sweep across the exponents of every normal scale: each is settled and close.
        let (lo, hi) = (INT8_FLUSH.to_bits(), f32::MAX.to_bits());
        for bits in (lo..hi).step_by(4099) {
            let max = f32::from_bits(bits);
            let scale = settled_scale(max);
            assert_eq!((127.0 * scale) / 127.0, scale, "{max:e}");
            assert!(scale.to_bits() - (max / 127.0).to_bits() <= 3, "{max:e}");
        }
        let tiny = [1e-37f32, -5e-38, 0.0];
        let back = decode(&encode(&tiny, Wire::Int8).unwrap(), Wire::Int8, 3).unwrap();
        assert_eq!(back, [0.0; 3]);
        assert!(
            tiny.iter()
                .all(|v| v.abs() <= Wire::Int8.error_bound(*v, 1e-37))
        );
    }

    #[test]
    fn what_no_encoder_sends_is_refused_with_its_reason() {
        assert_eq!(
            encode(&[1.0, f32::NAN], Wire::Bf16),
            Err(CodecError::NonFinite { index: 1 })
        );
        assert_eq!(
            encode(&[f32::INFINITY], Wire::Int8),
            Err(CodecError::NonFinite { index: 0 })
        );
        let bytes = encode(&[1.0; 10], Wire::Int8).unwrap();
        assert_eq!(
            decode(&bytes, Wire::Int8, 11),
            Err(CodecError::Length {
                wire: Wire::Int8,
                values: 11,
                expected: 15,
                got: 14
            })
        );
        assert!(matches!(
            decode(&bytes[..13], Wire::Int8, 10),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            decode(&[0u8; 7], Wire::F32, usize::MAX),
            Err(CodecError::TooLarge { .. })
        ));
        for scale in [-1.0f32, f32::NAN, f32::INFINITY, f32::MAX] {
            let mut bad = bytes.clone();
            bad[..4].copy_from_slice(&scale.to_le_bytes());
            assert!(
                matches!(
                    decode(&bad, Wire::Int8, 10),
                    Err(CodecError::Scale { block: 0, .. })
                ),
                "{scale}"
            );
        }
        assert_eq!(
            decode(&f32::NAN.to_le_bytes(), Wire::F32, 1),
            Err(CodecError::NonFinite { index: 0 })
        );
        assert_eq!(
            decode(&bf16::INFINITY.to_bits().to_le_bytes(), Wire::Bf16, 1),
            Err(CodecError::NonFinite { index: 0 })
        );
    }

    proptest::proptest! {
        /// Every value comes back within its form's bound.
        #[test]
        fn decoded_values_are_within_the_bound(
            values in proptest::collection::vec(-1e6f32..1e6, 0..700),
            tiny in proptest::collection::vec(-1e-30f32..1e-30, 0..40),
        ) {
            let values: Vec<f32> = values.into_iter().chain(tiny).collect();
            for wire in [Wire::F32, Wire::Bf16, Wire::Int8] {
                let back = decode(&encode(&values, wire).unwrap(), wire, values.len()).unwrap();
                proptest::prop_assert_eq!(back.len(), values.len());
                for (i, (v, b)) in values.iter().zip(&back).enumerate() {
                    let block = &values[i / INT8_BLOCK * INT8_BLOCK..][..INT8_BLOCK.min(values.len() - i / INT8_BLOCK * INT8_BLOCK)];
                    let max = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let bound = wire.error_bound(*v, max);
                    proptest::prop_assert!((v - b).abs() <= bound, "{:?} value {}: {} back as {}, bound {}", wire, i, v, b, bound);
                }
            }
        }

        /// Encoding what was decoded gives back the same bytes: a total forwarded around a
        /// ring of zones arrives everywhere as its holder sent it.
        #[test]
        fn every_form_is_settled(
            values in proptest::collection::vec(-1e6f32..1e6, 0..600),
            scale in -120i32..100,
            tiny in proptest::collection::vec(-1e-36f32..1e-36, 0..40),
        ) {
            let values: Vec<f32> = values.iter().map(|v| v * 2f32.powi(scale)).chain(tiny).collect();
            for wire in [Wire::F32, Wire::Bf16, Wire::Int8] {
                let sent = encode(&values, wire).unwrap();
                let again = encode(&decode(&sent, wire, values.len()).unwrap(), wire).unwrap();
                proptest::prop_assert_eq!(&again, &sent, "{:?}", wire);
            }
        }

        /// Decoding any bytes of the right length gives values or a reason, never a panic.
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600), values in 0usize..300) {
            for wire in [Wire::F32, Wire::Bf16, Wire::Int8] {
                if let Ok(out) = decode(&bytes, wire, values) {
                    proptest::prop_assert_eq!(out.len(), values);
                    proptest::prop_assert!(out.iter().all(|v| v.is_finite()));
                }
            }
        }
    }
}
