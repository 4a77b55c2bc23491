//! The project's one wire codec: serde + bincode 2 with hard size limits, versioned envelopes and
//! typed errors.
//!
//! Why one module: every byte that crosses a process boundary (raft entries, snapshots, the node's
//! own request/response and gossip payloads) is decoded from an untrusted peer. Keeping encoding in
//! one place means one configuration (little-endian, varint integers), one size policy and one
//! error type for the whole project.
//!
//! Size limits are const generics because bincode's allocation guard (`with_limit`) is a type-level
//! constant: with it a forged length prefix can never make the decoder allocate more than `MAX`
//! bytes, and inputs longer than `MAX` are refused before decoding starts.
//!
//! Types decoded through this module must not contain sequences of zero-sized elements (such as
//! `Vec<()>`): a forged length for those costs time without consuming input.

use std::ops::RangeInclusive;

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why encoding or decoding failed. Each variant names what was wrong with the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The input (or the encoded output) is longer than the limit of the message type.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Length of the offending buffer.
        len: usize,
        /// The limit it was checked against.
        max: usize,
    },
    /// The envelope carries a version this build does not understand.
    #[error("unsupported wire version {found} (accepted {min}..={max})")]
    UnsupportedVersion {
        /// Version found in the envelope.
        found: u16,
        /// Oldest accepted version.
        min: u16,
        /// Newest accepted version.
        max: u16,
    },
    /// The input ended before the envelope header was complete.
    #[error("truncated envelope: {len} bytes, the header needs {needed}")]
    Truncated {
        /// Bytes available.
        len: usize,
        /// Bytes the header needs.
        needed: usize,
    },
    /// The bytes are not a valid encoding of the expected type.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A valid value was decoded but bytes were left over (a sign of a framing bug or tampering).
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// The value could not be encoded (e.g. a serde implementation refused it).
    #[error("cannot encode message: {0}")]
    Encode(String),
}

/// Number of bytes of the version prefix of a versioned envelope.
pub const VERSION_HEADER_BYTES: usize = 2;

fn config<const MAX: usize>() -> Configuration<LittleEndian, Varint, Limit<MAX>> {
    bincode::config::standard().with_limit::<MAX>()
}

/// Encodes `value`; fails with [`CodecError::TooLarge`] if the encoding is longer than `MAX`, so
/// that a sender never produces a message its peers are bound to refuse.
pub fn encode<T: Serialize, const MAX: usize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let bytes = bincode::serde::encode_to_vec(value, config::<MAX>())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    if bytes.len() > MAX {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX,
        });
    }
    Ok(bytes)
}

/// Decodes a whole buffer into `T`, refusing inputs longer than `MAX`, allocations beyond `MAX`
/// and trailing bytes.
pub fn decode<T: DeserializeOwned, const MAX: usize>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > MAX {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(bytes, config::<MAX>())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - used));
    }
    Ok(value)
}

/// Encodes `value` behind a 2-byte little-endian `version` prefix. Versioned envelopes let a
/// newer build read what an older one wrote (raft logs and snapshots outlive binaries).
pub fn encode_versioned<T: Serialize, const MAX: usize>(
    version: u16,
    value: &T,
) -> Result<Vec<u8>, CodecError> {
    let body = encode::<T, MAX>(value)?;
    let len = body.len() + VERSION_HEADER_BYTES;
    if len > MAX {
        return Err(CodecError::TooLarge { len, max: MAX });
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Reads the version of an envelope without decoding its body.
pub fn peek_version(bytes: &[u8]) -> Result<u16, CodecError> {
    match bytes {
        [a, b, ..] => Ok(u16::from_le_bytes([*a, *b])),
        _ => Err(CodecError::Truncated {
            len: bytes.len(),
            needed: VERSION_HEADER_BYTES,
        }),
    }
}

/// Decodes an envelope written by [`encode_versioned`] whose version lies in `accepted`; returns
/// the version with the value so that the caller can migrate older layouts.
pub fn decode_versioned<T: DeserializeOwned, const MAX: usize>(
    bytes: &[u8],
    accepted: RangeInclusive<u16>,
) -> Result<(u16, T), CodecError> {
    if bytes.len() > MAX {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX,
        });
    }
    let version = peek_version(bytes)?;
    if !accepted.contains(&version) {
        return Err(CodecError::UnsupportedVersion {
            found: version,
            min: *accepted.start(),
            max: *accepted.end(),
        });
    }
    let value = decode::<T, MAX>(&bytes[VERSION_HEADER_BYTES..])?;
    Ok((version, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        values: Vec<u64>,
        flag: Option<bool>,
    }

    const MAX: usize = 4096;

    fn sample() -> Sample {
        Sample {
            name: "stage-1".into(),
            values: vec![1, 2, 300_000],
            flag: Some(true),
        }
    }

    #[test]
    fn roundtrip_plain_and_versioned() {
        let bytes = encode::<_, MAX>(&sample()).unwrap();
        assert_eq!(decode::<Sample, MAX>(&bytes).unwrap(), sample());
        let env = encode_versioned::<_, MAX>(3, &sample()).unwrap();
        assert_eq!(peek_version(&env).unwrap(), 3);
        assert_eq!(
            decode_versioned::<Sample, MAX>(&env, 1..=3).unwrap(),
            (3, sample())
        );
    }

    #[test]
    fn rejects_wrong_version_truncation_and_trailing_bytes() {
        let env = encode_versioned::<_, MAX>(7, &sample()).unwrap();
        assert_eq!(
            decode_versioned::<Sample, MAX>(&env, 1..=2),
            Err(CodecError::UnsupportedVersion {
                found: 7,
                min: 1,
                max: 2
            })
        );
        assert_eq!(
            decode_versioned::<Sample, MAX>(&[1], 1..=2),
            Err(CodecError::Truncated { len: 1, needed: 2 })
        );
        let mut bytes = encode::<_, MAX>(&sample()).unwrap();
        bytes.extend_from_slice(&[0, 0]);
        assert_eq!(
            decode::<Sample, MAX>(&bytes),
            Err(CodecError::TrailingBytes(2))
        );
    }

    #[test]
    fn size_limits_apply_both_ways() {
        let big = Sample {
            name: "x".repeat(100),
            values: vec![],
            flag: None,
        };
        assert!(matches!(
            encode::<_, 64>(&big),
            Err(CodecError::TooLarge { .. }) | Err(CodecError::Encode(_))
        ));
        let bytes = encode::<_, MAX>(&big).unwrap();
        assert_eq!(
            decode::<Sample, 64>(&bytes),
            Err(CodecError::TooLarge {
                len: bytes.len(),
                max: 64
            })
        );
        // A forged string length far beyond the limit is refused without allocating it.
        let forged = [0xfdu8, 0xff, 0xff, 0xff, 0x7f, b'a'];
        assert!(matches!(
            decode::<String, MAX>(&forged),
            Err(CodecError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Sample, MAX>(&bytes);
            let _ = decode_versioned::<Sample, MAX>(&bytes, 0..=u16::MAX);
        }

        #[test]
        fn roundtrip_any_sample(name in ".{0,40}", values in proptest::collection::vec(any::<u64>(), 0..20), flag in any::<Option<bool>>()) {
            let s = Sample { name, values, flag };
            let bytes = encode_versioned::<_, MAX>(1, &s).unwrap();
            prop_assert_eq!(decode_versioned::<Sample, MAX>(&bytes, 1..=1).unwrap(), (1, s));
        }
    }
}
