//! Pre-tokenized corpora of any size: a flat file of little-endian token ids, the layout nanoGPT
//! and others write (`np.array(ids, dtype=np.uint16).tofile("train.bin")`). The file is
//! memory-mapped, so a node reads only the pages of the examples it trains, never the whole
//! file; its page cache is the kernel's to drop.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

use crate::data::{Dataset, hash_file};
use crate::error::{ModelError, Result};

/// The width of one stored token id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDtype {
    /// 2 bytes (vocabularies up to 65,536, GPT-2's 50,257 among them).
    U16,
    /// 4 bytes.
    U32,
}

impl TokenDtype {
    /// Bytes per token.
    pub fn width(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The narrowest width that holds ids below `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            TokenDtype::U16
        } else {
            TokenDtype::U32
        }
    }

    /// Appends `token` in this width, little-endian; `None` if it does not fit.
    pub fn encode(self, token: u32, out: &mut Vec<u8>) -> Option<()> {
        match self {
            TokenDtype::U16 => out.extend_from_slice(&u16::try_from(token).ok()?.to_le_bytes()),
            TokenDtype::U32 => out.extend_from_slice(&token.to_le_bytes()),
        }
        Some(())
    }

    fn decode(self, bytes: &[u8]) -> u32 {
        match self {
            TokenDtype::U16 => u32::from(u16::from_le_bytes([bytes[0], bytes[1]])),
            TokenDtype::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        }
    }
}

impl std::str::FromStr for TokenDtype {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "u16" | "uint16" => Ok(TokenDtype::U16),
            "u32" | "uint32" => Ok(TokenDtype::U32),
            other => Err(ModelError::Dataset(format!(
                "token dtype {other:?}: expected u16 or u32"
            ))),
        }
    }
}

/// A memory-mapped token file: example `i` is the window of `seq_len + 1` tokens starting at
/// token `i * seq_len` (consecutive windows share one token, so every token is a target once).
#[derive(Debug)]
pub struct TokenFileDataset {
    map: Mmap,
    dtype: TokenDtype,
    tokens: u64,
    seq_len: usize,
    vocab_size: usize,
    path: PathBuf,
}

impl TokenFileDataset {
    /// Maps the file at `path`, whose ids must stay below `vocab_size` (checked per example as
    /// it is read: a file of any size opens at once).
    pub fn open(path: &Path, dtype: TokenDtype, seq_len: usize, vocab_size: usize) -> Result<Self> {
        let name = path.display().to_string();
        let bad = |why: String| ModelError::Dataset(format!("{name}: {why}"));
        let file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let bytes = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        let width = dtype.width() as u64;
        if bytes % width != 0 {
            return Err(bad(format!(
                "{bytes} bytes is not a whole number of {}-byte tokens (is the dtype right?)",
                width
            )));
        }
        let tokens = bytes / width;
        if seq_len == 0 || tokens <= seq_len as u64 {
            return Err(bad(format!(
                "{tokens} tokens are too few for sequences of {seq_len}"
            )));
        }
        // SAFETY: the map is read-only and private to this process. The file must not be
        // truncated while the node runs (as with any dataset, a changed file is a new job);
        // the mapping is what keeps a corpus larger than memory trainable.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        Ok(Self {
            map,
            dtype,
            tokens,
            seq_len,
            vocab_size,
            path: path.to_path_buf(),
        })
    }

    /// Token ids in the file.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

impl Dataset for TokenFileDataset {
    fn len(&self) -> u64 {
        (self.tokens - 1) / self.seq_len as u64
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn example(&self, index: u64) -> Result<Vec<u32>> {
        if index >= self.len() {
            return Err(ModelError::ExampleOutOfRange {
                index,
                len: self.len(),
            });
        }
        let width = self.dtype.width();
        let first = index as usize * self.seq_len;
        let bytes = &self.map[first * width..(first + self.seq_len + 1) * width];
        bytes
            .chunks_exact(width)
            .enumerate()
            .map(|(at, b)| {
                let token = self.dtype.decode(b);
                if (token as usize) < self.vocab_size {
                    Ok(token)
                } else {
                    Err(ModelError::Dataset(format!(
                        "{}: token {token} at position {} is not below the model's vocabulary of {}",
                        self.path.display(),
                        first + at,
                        self.vocab_size
                    )))
                }
            })
            .collect()
    }

    /// The file's bytes (read through a buffer, not the map), with the dtype and window.
    fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        h.update(b"parcae token file v1");
        h.update((self.dtype.width() as u64).to_le_bytes());
        h.update((self.seq_len as u64).to_le_bytes());
        hash_file(&mut h, &self.path)
            .map_err(|e| ModelError::Dataset(format!("{}: {e}", self.path.display())))?;
        Ok(h.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dtype: TokenDtype, ids: &[u32]) -> tempfile::NamedTempFile {
        let mut bytes = Vec::new();
        for &id in ids {
            dtype.encode(id, &mut bytes).unwrap();
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), bytes).unwrap();
        file
    }

    #[test]
    fn examples_are_overlapping_windows_of_the_stored_ids() {
        for dtype in [TokenDtype::U16, TokenDtype::U32] {
            let ids: Vec<u32> = (0..11).map(|i| i * 1000).collect();
            let file = write(dtype, &ids);
            let d = TokenFileDataset::open(file.path(), dtype, 4, 50_257).unwrap();
            assert_eq!(d.tokens(), 11);
            assert_eq!(d.len(), 2);
            assert_eq!(d.example(0).unwrap(), vec![0, 1000, 2000, 3000, 4000]);
            assert_eq!(d.example(1).unwrap(), vec![4000, 5000, 6000, 7000, 8000]);
            assert!(d.example(2).is_err());
        }
    }

    #[test]
    fn bad_files_and_ids_are_named() {
        let odd = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(odd.path(), [1u8, 2, 3]).unwrap();
        let e = TokenFileDataset::open(odd.path(), TokenDtype::U16, 1, 10).unwrap_err();
        assert!(e.to_string().contains("whole number"), "{e}");
        let short = write(TokenDtype::U16, &[1, 2]);
        let e = TokenFileDataset::open(short.path(), TokenDtype::U16, 4, 10).unwrap_err();
        assert!(e.to_string().contains("too few"), "{e}");
        let big = write(TokenDtype::U16, &[1, 2, 300, 4, 5]);
        let d = TokenFileDataset::open(big.path(), TokenDtype::U16, 4, 256).unwrap();
        let e = d.example(0).unwrap_err().to_string();
        assert!(e.contains("token 300 at position 2"), "{e}");
        assert!("u8".parse::<TokenDtype>().is_err());
        assert_eq!(TokenDtype::for_vocab(50_257), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab(100_000), TokenDtype::U32);
        assert!(TokenDtype::U16.encode(70_000, &mut Vec::new()).is_none());
    }

    #[test]
    fn a_file_larger_than_memory_opens_at_once_and_reads_only_what_it_samples() {
        // 2 GiB of u16 tokens, sparse: nothing is written but one example far in.
        let file = tempfile::NamedTempFile::new().unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap();
        f.set_len(2 << 30).unwrap();
        let d = TokenFileDataset::open(file.path(), TokenDtype::U16, 64, 50_257).unwrap();
        assert_eq!(d.tokens(), 1 << 30);
        assert_eq!(d.example(d.len() - 1).unwrap(), vec![0; 65]);
    }
}
