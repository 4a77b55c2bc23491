//! GPT-2 weights in Hugging Face's safetensors layout, both ways: [`write_gpt2_safetensors`]
//! stores a [`Gpt`]'s layers under the names `transformers`' `GPT2LMHeadModel` saves, and
//! [`Gpt2Safetensors`] starts a model from such a file (OpenAI's published GPT-2 weights, or an
//! export of an earlier run).
//!
//! Our `Linear` keeps its weight as `[in, out]`, as GPT-2's `Conv1D` does, so block weights
//! map one to one. The head is untied: an export writes it as `lm_head.weight` (`[vocab,
//! d_model]`, as `nn.Linear` stores it; load it in `transformers` with `tie_word_embeddings =
//! False`), and a file without one (published GPT-2, whose head is the token embedding) gives
//! the head a copy of `wte`. Published files have 1024 positions; a model with a shorter
//! `seq_len` takes the first rows of `wpe`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView, View};
use sha2::{Digest, Sha256};

use burn::tensor::Device;

use crate::data::hash_file;
use crate::error::{ModelError, Result};
use crate::gpt::{Gpt, GptConfig};
use crate::params::{ParamInfo, param_infos};
use crate::pipeline_model::PipelineModel;
use crate::weights::WeightSource;

/// Where one of our parameters lives in a GPT-2 file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HfTensor {
    /// The name without `transformer.` (`h.0.attn.c_attn.weight`, `wte.weight`), or
    /// `lm_head.weight`.
    name: String,
    /// Stored as the transpose of ours (the head).
    transposed: bool,
}

const HEAD: &str = "lm_head.weight";
const PREFIX: &str = "transformer.";

/// The GPT-2 name of parameter `path` (as [`ParamInfo::path`] gives it) of layer `layer`.
fn hf_tensor(config: &GptConfig, layer: usize, path: &str) -> Result<HfTensor> {
    let plain = |name: String| HfTensor {
        name,
        transposed: false,
    };
    let unknown = || {
        ModelError::Weights(format!(
            "layer {layer} parameter {path} has no GPT-2 counterpart"
        ))
    };
    let (kind, rest) = path.split_once('.').ok_or_else(unknown)?;
    match (kind, rest) {
        ("Embedding", "token.weight") if layer == 0 => Ok(plain("wte.weight".into())),
        ("Embedding", "position.weight") if layer == 0 => Ok(plain("wpe.weight".into())),
        ("Head", "lm_head.weight") if layer == config.n_blocks + 1 => Ok(HfTensor {
            name: HEAD.into(),
            transposed: true,
        }),
        ("Head", rest) if layer == config.n_blocks + 1 => {
            let (module, param) = rest.split_once('.').ok_or_else(unknown)?;
            match module {
                "ln" => Ok(plain(format!(
                    "ln_f.{}",
                    norm_param(param).ok_or_else(unknown)?
                ))),
                _ => Err(unknown()),
            }
        }
        ("Block", rest) if (1..=config.n_blocks).contains(&layer) => {
            let (module, param) = rest.split_once('.').ok_or_else(unknown)?;
            let block = layer - 1;
            let (hf_module, hf_param) = match module {
                "ln_attn" => ("ln_1", norm_param(param)),
                "ln_mlp" => ("ln_2", norm_param(param)),
                "qkv" => ("attn.c_attn", linear_param(param)),
                "proj" => ("attn.c_proj", linear_param(param)),
                "fc_in" => ("mlp.c_fc", linear_param(param)),
                "fc_out" => ("mlp.c_proj", linear_param(param)),
                _ => return Err(unknown()),
            };
            Ok(plain(format!(
                "h.{block}.{hf_module}.{}",
                hf_param.ok_or_else(unknown)?
            )))
        }
        _ => Err(unknown()),
    }
}

fn norm_param(param: &str) -> Option<&'static str> {
    match param {
        "gamma" => Some("weight"),
        "beta" => Some("bias"),
        _ => None,
    }
}

fn linear_param(param: &str) -> Option<&'static str> {
    match param {
        "weight" => Some("weight"),
        "bias" => Some("bias"),
        _ => None,
    }
}

/// The shape a GPT-2 file stores our parameter of `shape` in.
fn hf_shape(tensor: &HfTensor, shape: &[usize]) -> Vec<usize> {
    if tensor.transposed {
        shape.iter().rev().copied().collect()
    } else {
        shape.to_vec()
    }
}

/// `values` of a row-major `[rows, cols]` matrix as `[cols, rows]`.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// One layer's parameters, as [`crate::Stage::param_infos`] and
/// [`crate::Stage::param_values`] give them.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The layer's index in the model.
    pub layer: usize,
    /// Its parameters' names and shapes, in visit order.
    pub infos: Vec<ParamInfo>,
    /// Their values, flat, in the same order.
    pub values: Vec<Vec<f32>>,
}

/// An f32 tensor to write.
struct Owned {
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl View for &Owned {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        self.values.len() * 4
    }
}

/// Writes every layer of a `config` model to `path` as f32 safetensors under GPT-2's names
/// (with `transformer.`, as `GPT2LMHeadModel` saves), through a temporary file renamed into
/// place. `layers` must hold each layer of the model exactly once.
pub fn write_gpt2_safetensors(
    config: &GptConfig,
    layers: &[LayerWeights],
    path: &Path,
) -> Result<()> {
    let n_layers = config.n_blocks + 2;
    let mut seen = vec![false; n_layers];
    let mut tensors: Vec<(String, Owned)> = Vec::new();
    for l in layers {
        let slot = seen.get_mut(l.layer).ok_or_else(|| {
            ModelError::Weights(format!(
                "layer {} is not in a {n_layers}-layer model",
                l.layer
            ))
        })?;
        if std::mem::replace(slot, true) {
            return Err(ModelError::DuplicateLayer(l.layer));
        }
        if l.infos.len() != l.values.len() {
            return Err(ModelError::Weights(format!(
                "layer {}: {} parameters named, {} given",
                l.layer,
                l.infos.len(),
                l.values.len()
            )));
        }
        for (info, values) in l.infos.iter().zip(&l.values) {
            if values.len() != info.numel() {
                return Err(ModelError::Weights(format!(
                    "layer {} {}: {} values for shape {:?}",
                    l.layer,
                    info.path,
                    values.len(),
                    info.shape
                )));
            }
            let hf = hf_tensor(config, l.layer, &info.path)?;
            let values = if hf.transposed {
                transpose(values, info.shape[0], info.shape[1])
            } else {
                values.clone()
            };
            let name = if hf.name == HEAD {
                hf.name.clone()
            } else {
                format!("{PREFIX}{}", hf.name)
            };
            let shape = hf_shape(&hf, &info.shape);
            tensors.push((name, Owned { shape, values }));
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(ModelError::MissingLayer(missing));
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
        &tmp,
    )
    .map_err(|e| ModelError::Weights(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| ModelError::Weights(format!("renaming to {}: {e}", path.display())))
}

/// A GPT-2 safetensors file, memory-mapped, as the starting weights of a [`Gpt`] of `config`:
/// every tensor the model needs was found with a fitting shape and a float dtype (f32, f16,
/// bf16) when it was opened.
pub struct Gpt2Safetensors {
    path: PathBuf,
    map: Mmap,
    config: GptConfig,
    /// `transformer.` when the file's names carry it (as `GPT2LMHeadModel` saves), else empty
    /// (OpenAI's published files).
    prefix: &'static str,
    /// Whether the file has its own head (else the head is a copy of `wte`).
    has_head: bool,
}

impl std::fmt::Debug for Gpt2Safetensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpt2Safetensors")
            .field("path", &self.path)
            .field("has_head", &self.has_head)
            .finish()
    }
}

impl Gpt2Safetensors {
    /// Opens `path` for a model of `config` and checks every tensor the model needs.
    pub fn open(path: &Path, config: &GptConfig) -> Result<Self> {
        let fail = |what: String| ModelError::Weights(format!("{}: {what}", path.display()));
        let file = File::open(path).map_err(|e| fail(e.to_string()))?;
        // SAFETY: the file is only read; a file truncated underneath the map would fault, as
        // with any memory-mapped input (documented for token files too).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| fail(e.to_string()))?;
        let (prefix, has_head) = {
            let parsed = SafeTensors::deserialize(&map)
                .map_err(|e| fail(format!("not safetensors: {e}")))?;
            let prefix = if parsed.tensor(&format!("{PREFIX}wte.weight")).is_ok() {
                PREFIX
            } else if parsed.tensor("wte.weight").is_ok() {
                ""
            } else {
                return Err(fail(
                    "no wte.weight or transformer.wte.weight: not a GPT-2 checkpoint".into(),
                ));
            };
            (prefix, parsed.tensor(HEAD).is_ok())
        };
        let weights = Self {
            path: path.to_path_buf(),
            map,
            config: config.clone(),
            prefix,
            has_head,
        };
        let parsed = weights.parse()?;
        // Every block has the same parameters: build the embedding, one block and the head
        // (not the whole model) to learn their names and shapes.
        let model = Gpt::new(config.clone())?;
        let last = model.num_layers() - 1;
        let infos = |layer| param_infos(&model.init_layer(layer, &Device::flex()));
        let (embedding, block, head) = (infos(0), infos(1.min(last)), infos(last));
        for layer in 0..=last {
            let of_layer = match layer {
                0 => &embedding,
                l if l == last => &head,
                _ => &block,
            };
            for info in of_layer {
                weights.view_for(&parsed, layer, info)?;
            }
        }
        drop(parsed);
        Ok(weights)
    }

    fn parse(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.map).map_err(|e| self.fail(format!("not safetensors: {e}")))
    }

    /// Whether the file has a head of its own (`lm_head.weight`).
    pub fn has_head(&self) -> bool {
        self.has_head
    }

    fn fail(&self, what: String) -> ModelError {
        ModelError::Weights(format!("{}: {what}", self.path.display()))
    }

    /// The file's tensor for `info` of `layer`, its shape and dtype checked, and whether it
    /// is stored as the transpose of ours.
    fn view_for<'a>(
        &self,
        file: &SafeTensors<'a>,
        layer: usize,
        info: &ParamInfo,
    ) -> Result<(TensorView<'a>, bool)> {
        let hf = hf_tensor(&self.config, layer, &info.path)?;
        // The head of a file without one is the token embedding, [vocab, d] like a head.
        let name = match (hf.name.as_str(), self.has_head) {
            (HEAD, true) => hf.name.clone(),
            (HEAD, false) => format!("{}wte.weight", self.prefix),
            _ => format!("{}{}", self.prefix, hf.name),
        };
        let view = file
            .tensor(&name)
            .map_err(|_| self.fail(format!("no tensor {name}")))?;
        let want = hf_shape(&hf, &info.shape);
        let stored = view.shape();
        let fits = if hf.name == "wpe.weight" {
            stored.len() == 2 && stored[1] == want[1] && stored[0] >= want[0]
        } else {
            stored == want.as_slice()
        };
        if !fits {
            let hint = if name.ends_with("wte.weight") {
                " (is [train] vocab_size the file's vocabulary?)"
            } else {
                ""
            };
            return Err(self.fail(format!(
                "{name} has shape {stored:?}, this model needs {want:?}{hint}"
            )));
        }
        if !matches!(view.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(self.fail(format!(
                "{name} is {:?}; f32, f16 and bf16 are read",
                view.dtype()
            )));
        }
        Ok((view, hf.transposed))
    }
}

/// The values of a float tensor as f32.
fn to_f32(view: &TensorView<'_>) -> Vec<f32> {
    let data = view.data();
    match view.dtype() {
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

impl WeightSource for Gpt2Safetensors {
    fn layer_values(&self, layer: usize, infos: &[ParamInfo]) -> Result<Vec<Vec<f32>>> {
        let file = self.parse()?;
        infos
            .iter()
            .map(|info| {
                let (view, transposed) = self.view_for(&file, layer, info)?;
                let mut values = to_f32(&view);
                values.truncate(info.numel());
                if transposed {
                    let stored = view.shape();
                    values = transpose(&values, stored[0], stored[1]);
                }
                Ok(values)
            })
            .collect()
    }

    /// `safetensors sha256:` and the SHA-256 of the file's bytes.
    fn identity(&self) -> Result<String> {
        let mut h = Sha256::new();
        hash_file(&mut h, &self.path).map_err(|e| self.fail(e.to_string()))?;
        Ok(format!("safetensors sha256:{:x}", h.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::block_kernel::Gelu;
    use crate::stage::{Stage, StageConfig};

    fn config() -> GptConfig {
        GptConfig {
            vocab_size: 50,
            d_model: 16,
            n_heads: 2,
            n_blocks: 2,
            seq_len: 8,
            d_ff: 64,
            gelu: Gelu::Tanh,
            kernel: crate::BlockKernel::Composed,
            ops: crate::OpSet::Native,
        }
    }

    fn stage(seed: u64) -> Stage<Gpt> {
        let model = Arc::new(Gpt::new(config()).unwrap());
        Stage::new(model, 0..4, seed, &Device::flex(), StageConfig::default()).unwrap()
    }

    fn weights(s: &Stage<Gpt>) -> Vec<LayerWeights> {
        (0..4)
            .map(|layer| LayerWeights {
                layer,
                infos: s.param_infos(layer).unwrap().to_vec(),
                values: s.param_values(layer).unwrap(),
            })
            .collect()
    }

    #[test]
    fn every_parameter_has_the_name_transformers_gives_it() {
        let c = config();
        let s = stage(1);
        let names: Vec<String> = (0..4)
            .flat_map(|l| {
                s.param_infos(l)
                    .unwrap()
                    .iter()
                    .map(|i| hf_tensor(&c, l, &i.path).unwrap().name)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(&names[..2], ["wte.weight", "wpe.weight"]);
        assert_eq!(
            &names[2..14],
            [
                "h.0.ln_1.weight",
                "h.0.ln_1.bias",
                "h.0.attn.c_attn.weight",
                "h.0.attn.c_attn.bias",
                "h.0.attn.c_proj.weight",
                "h.0.attn.c_proj.bias",
                "h.0.ln_2.weight",
                "h.0.ln_2.bias",
                "h.0.mlp.c_fc.weight",
                "h.0.mlp.c_fc.bias",
                "h.0.mlp.c_proj.weight",
                "h.0.mlp.c_proj.bias",
            ]
        );
        assert_eq!(names[14], "h.1.ln_1.weight");
        assert_eq!(&names[26..], ["ln_f.weight", "ln_f.bias", "lm_head.weight"]);
        assert!(hf_tensor(&c, 1, "Embedding.token.weight").is_err());
        assert!(hf_tensor(&c, 0, "Block.qkv.weight").is_err());
    }

    #[test]
    fn an_export_loads_back_into_an_identical_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let original = stage(1);
        write_gpt2_safetensors(&config(), &weights(&original), &path).unwrap();
        let file = Gpt2Safetensors::open(&path, &config()).unwrap();
        assert!(file.has_head());
        let mut other = stage(2);
        assert_ne!(
            other.param_values(1).unwrap(),
            original.param_values(1).unwrap()
        );
        other.load_weights(&file).unwrap();
        for layer in 0..4 {
            assert_eq!(
                other.param_values(layer).unwrap(),
                original.param_values(layer).unwrap(),
                "layer {layer}"
            );
        }
    }

    #[test]
    fn a_file_without_a_head_ties_it_to_the_embedding_and_longer_positions_are_cut() {
        let c = config();
        let wte: Vec<f32> = (0..c.vocab_size * c.d_model).map(|i| i as f32).collect();
        let wpe: Vec<f32> = (0..32 * c.d_model).map(|i| -(i as f32)).collect();
        let mut tensors = vec![
            (
                "wte.weight".to_string(),
                Owned {
                    shape: vec![c.vocab_size, c.d_model],
                    values: wte.clone(),
                },
            ),
            (
                "wpe.weight".to_string(),
                Owned {
                    shape: vec![32, c.d_model],
                    values: wpe.clone(),
                },
            ),
        ];
        let s = stage(1);
        for layer in 1..4 {
            for (info, v) in s
                .param_infos(layer)
                .unwrap()
                .iter()
                .zip(s.param_values(layer).unwrap())
            {
                let hf = hf_tensor(&c, layer, &info.path).unwrap();
                if hf.name != HEAD {
                    tensors.push((
                        hf.name,
                        Owned {
                            shape: info.shape.clone(),
                            values: v,
                        },
                    ));
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("published.safetensors");
        safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), None, &path)
            .unwrap();
        let file = Gpt2Safetensors::open(&path, &c).unwrap();
        assert!(!file.has_head());
        let mut loaded = stage(3);
        loaded.load_weights(&file).unwrap();
        let embedding = loaded.param_values(0).unwrap();
        assert_eq!(embedding[0], wte);
        assert_eq!(embedding[1], wpe[..c.seq_len * c.d_model]);
        let head = loaded.param_values(3).unwrap();
        assert_eq!(head[2], transpose(&wte, c.vocab_size, c.d_model));
    }

    #[test]
    fn a_file_that_does_not_fit_is_refused_naming_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write_gpt2_safetensors(&config(), &weights(&stage(1)), &path).unwrap();
        let bigger = GptConfig {
            vocab_size: 51,
            ..config()
        };
        let e = Gpt2Safetensors::open(&path, &bigger)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transformer.wte.weight has shape [50, 16]"),
            "{e}"
        );
        let garbage = dir.path().join("g.safetensors");
        std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\xffnot json").unwrap();
        let e = Gpt2Safetensors::open(&garbage, &config())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not safetensors"), "{e}");
        let e = write_gpt2_safetensors(&config(), &weights(&stage(1))[..3], &path).unwrap_err();
        assert_eq!(e, ModelError::MissingLayer(3));
    }
}
