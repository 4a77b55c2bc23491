//! `parcae-node prepare-data`: text or JSONL through a Hugging Face `tokenizer.json` into the
//! token file the trainer maps ([`parcae_model::TokenFileDataset`]). Offline (the tokenizer is a
//! file, nothing is downloaded) and streaming: inputs are read a line at a time and the output
//! is written as it goes, so a corpus larger than memory is fine. The output appears under its
//! name only when complete (written beside it, then renamed), and its SHA-256 is printed: the
//! content hash that names the dataset.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use parcae_model::TokenDtype;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

/// The longest input line accepted (a JSONL document included).
pub const MAX_LINE: usize = 64 << 20;

/// How input lines are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    /// Plain text; every line (with its newline) is tokenized in turn.
    Text,
    /// One JSON object per line; its `--field` is one document.
    Jsonl,
}

/// What to prepare (the command line of `parcae-node prepare-data`).
#[derive(Debug, Clone, clap::Args)]
pub struct PrepareOptions {
    /// The tokenizer (a Hugging Face `tokenizer.json`).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Input files, in order (repeatable).
    #[arg(long = "input", required = true)]
    pub inputs: Vec<PathBuf>,
    /// How to read the inputs.
    #[arg(long, value_enum, default_value = "text")]
    pub format: InputFormat,
    /// The JSONL field holding a document's text.
    #[arg(long, default_value = "text")]
    pub field: String,
    /// A token appended after each JSONL document, e.g. `<|endoftext|>`.
    #[arg(long)]
    pub document_end: Option<String>,
    /// `u16` or `u32` (default: the narrowest that holds the vocabulary).
    #[arg(long)]
    pub dtype: Option<TokenDtype>,
    /// The token file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Token ids written.
    pub tokens: u64,
    /// The tokenizer's vocabulary, added tokens included.
    pub vocab_size: usize,
    /// Width of the ids.
    pub dtype: TokenDtype,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}

/// Why preparing failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The tokenizer file does not load.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An input line is not what the format says.
    #[error("{path} line {line}: {reason}")]
    Input {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    /// The vocabulary does not fit the asked width.
    #[error("the tokenizer's vocabulary of {vocab} does not fit {dtype:?} ids")]
    Width { vocab: usize, dtype: TokenDtype },
    /// `--document-end` is not a token of the tokenizer.
    #[error("document end {0:?} is not a token of the tokenizer")]
    UnknownToken(String),
}

/// Tokenizes the inputs into `opts.out`.
pub fn prepare(opts: &PrepareOptions) -> Result<Prepared, PrepareError> {
    let tokenizer = Tokenizer::from_file(&opts.tokenizer).map_err(|e| PrepareError::Tokenizer {
        path: opts.tokenizer.clone(),
        reason: e.to_string(),
    })?;
    let vocab_size = tokenizer.get_vocab_size(true);
    let dtype = opts
        .dtype
        .unwrap_or_else(|| TokenDtype::for_vocab(vocab_size));
    if dtype == TokenDtype::U16 && vocab_size > 1 << 16 {
        return Err(PrepareError::Width {
            vocab: vocab_size,
            dtype,
        });
    }
    let document_end = match &opts.document_end {
        Some(token) => Some(
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| PrepareError::UnknownToken(token.clone()))?,
        ),
        None => None,
    };
    let partial = partial_path(&opts.out);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrepareError::Io { path, source }
    };
    let file = std::fs::File::create(&partial).map_err(io(&partial))?;
    let mut out = HashingWriter::new(BufWriter::new(file));
    let mut tokens = 0u64;
    let mut encoded = Vec::new();
    for input in &opts.inputs {
        let file = std::fs::File::open(input).map_err(io(input))?;
        let mut lines = BufReader::new(file);
        let mut line = String::new();
        let mut number = 0u64;
        loop {
            line.clear();
            number += 1;
            let bad = |reason: String| PrepareError::Input {
                path: input.clone(),
                line: number,
                reason,
            };
            let read = (&mut lines)
                .take(MAX_LINE as u64 + 1)
                .read_line(&mut line)
                .map_err(|e| bad(e.to_string()))?;
            if read == 0 {
                break;
            }
            if read > MAX_LINE {
                return Err(bad(format!("longer than {MAX_LINE} bytes")));
            }
            let text = match opts.format {
                InputFormat::Text => line.clone(),
                InputFormat::Jsonl if line.trim().is_empty() => continue,
                InputFormat::Jsonl => document(&line, &opts.field).map_err(bad)?,
            };
            let ids = tokenizer
                .encode(text, false)
                .map_err(|e| bad(format!("tokenizing: {e}")))?;
            encoded.clear();
            for &id in ids.get_ids().iter().chain(document_end.as_ref()) {
                dtype.encode(id, &mut encoded).ok_or(PrepareError::Width {
                    vocab: vocab_size,
                    dtype,
                })?;
                tokens += 1;
            }
            out.write_all(&encoded).map_err(io(&partial))?;
        }
    }
    let (file, sha256) = out.finish().map_err(io(&partial))?;
    file.sync_all().map_err(io(&partial))?;
    std::fs::rename(&partial, &opts.out).map_err(io(&opts.out))?;
    Ok(Prepared {
        tokens,
        vocab_size,
        dtype,
        sha256,
    })
}

/// The text of one JSONL document.
fn document(line: &str, field: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    value
        .get(field)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("no string field {field:?}"))
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

/// A writer that hashes what passes through it.
struct HashingWriter {
    inner: BufWriter<std::fs::File>,
    hash: Sha256,
}

impl HashingWriter {
    fn new(inner: BufWriter<std::fs::File>) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.inner.write_all(bytes)
    }

    fn finish(self) -> std::io::Result<(std::fs::File, String)> {
        let file = self.inner.into_inner().map_err(|e| e.into_error())?;
        Ok((file, hex::encode(self.hash.finalize())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jsonl_document_is_its_field() {
        assert_eq!(document(r#"{"text":"hi","id":1}"#, "text").unwrap(), "hi");
        assert!(
            document(r#"{"body":"hi"}"#, "text")
                .unwrap_err()
                .contains("\"text\"")
        );
        assert!(
            document("not json", "text")
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn a_missing_tokenizer_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PrepareOptions {
            tokenizer: dir.path().join("tokenizer.json"),
            inputs: vec![],
            format: InputFormat::Text,
            field: "text".into(),
            document_end: None,
            dtype: None,
            out: dir.path().join("out.bin"),
        };
        let e = prepare(&opts).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
        assert!(!opts.out.exists());
    }
}
