//! The stage's DiLoCo outer state: each layer's outer weights (the weights every group started
//! the round from) and the outer optimizer's momentum. It is part of the stage's state like
//! AdamW's moments (`crate::state` writes it with each layer), so a hand-off or a checkpoint
//! carries it, and a stage that takes a layer mid-round continues that round.
//!
//! The outer step itself is `parcae_outer`'s (the pseudo-gradient, Nesterov SGD); the stage
//! only keeps its state and lays it out as [`Stage::export_params`] lays out the weights.

use parcae_outer::{NesterovSgd, OuterSettings, pseudo_gradient};
use sha2::{Digest, Sha256};

use super::{LayerOuter, Stage};
use crate::error::{ModelError, Result};
use crate::pipeline_model::PipelineModel;

impl<M: PipelineModel> Stage<M> {
    /// Whether every layer holds outer state.
    pub fn has_outer(&self) -> bool {
        self.outer.iter().all(Option::is_some)
    }

    /// Starts the outer loop where a layer has no outer state yet: its outer weights are its
    /// current weights, its momentum zero (a job's first round).
    pub fn begin_outer(&mut self) -> Result<()> {
        for local in 0..self.layers.len() {
            if self.outer[local].is_none() {
                let anchor: Vec<f32> = self.layer_params(local)?;
                let velocity = vec![0.0; anchor.len()];
                self.outer[local] = Some(LayerOuter { anchor, velocity });
            }
        }
        Ok(())
    }

    /// The round's pseudo-gradient: the outer weights minus the current ones, in
    /// [`Stage::export_params`]' layout.
    pub fn pseudo_gradient(&self) -> Result<Vec<f32>> {
        let anchor = self.outer_concat(|o| &o.anchor)?;
        pseudo_gradient(&anchor, &self.export_params()?).map_err(outer_error)
    }

    /// Closes a round: the outer optimizer steps the outer weights along the groups' mean
    /// pseudo-gradient `mean`, and the stage's weights become them (moments, random streams
    /// and step stay: each group keeps its inner optimizer).
    pub fn outer_step(&mut self, mean: &[f32], settings: &OuterSettings) -> Result<()> {
        let mut anchor = self.outer_concat(|o| &o.anchor)?;
        let velocity = self.outer_concat(|o| &o.velocity)?;
        let mut optimizer = NesterovSgd::with_velocity(settings, velocity);
        optimizer.step(&mut anchor, mean).map_err(outer_error)?;
        self.import_params(&anchor)?;
        let mut offset = 0;
        for layer in self.outer.iter_mut().flatten() {
            let n = layer.anchor.len();
            layer.anchor.copy_from_slice(&anchor[offset..offset + n]);
            layer
                .velocity
                .copy_from_slice(&optimizer.velocity()[offset..offset + n]);
            offset += n;
        }
        Ok(())
    }

    /// SHA-256 of the outer weights (little-endian f32, layer by layer), once the outer loop
    /// has begun: equal on every replica of the stage, whatever its group, after a round.
    pub fn outer_digest(&self) -> Option<[u8; 32]> {
        let mut hash = Sha256::new();
        for layer in &self.outer {
            for v in &layer.as_ref()?.anchor {
                hash.update(v.to_le_bytes());
            }
        }
        Some(hash.finalize().into())
    }

    /// The outer state's `part` of every layer, concatenated; refused where a layer has none.
    fn outer_concat(&self, part: impl Fn(&LayerOuter) -> &Vec<f32>) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.num_params());
        for (local, layer) in self.outer.iter().enumerate() {
            let layer = layer.as_ref().ok_or_else(|| {
                ModelError::InvalidConfig(format!(
                    "layer {} has no outer state (the outer loop has not begun)",
                    self.range.start + local
                ))
            })?;
            out.extend_from_slice(part(layer));
        }
        Ok(out)
    }

    /// Layer `local`'s parameter values, concatenated in visit order.
    fn layer_params(&self, local: usize) -> Result<Vec<f32>> {
        Ok(self
            .param_values(self.range.start + local)?
            .into_iter()
            .flatten()
            .collect())
    }
}

fn outer_error(e: parcae_outer::OuterError) -> ModelError {
    ModelError::InvalidConfig(format!("outer step: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parcae_outer::OuterSettings;

    use crate::{Gpt, GptConfig, Stage, StageConfig, default_device};

    fn stage(seed: u64) -> Stage<Gpt> {
        let gpt = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
        Stage::new(gpt, 1..3, seed, &default_device(), StageConfig::default()).unwrap()
    }

    /// A round from weights `a` to `b`: the pseudo-gradient is `a - b`, and the outer step
    /// lands on `a - lr (g + mu v)` with `v = g` on the first round, written back into the
    /// weights and kept as the next round's outer weights.
    #[test]
    fn a_round_steps_the_outer_weights_and_the_stage_continues_from_them() {
        let mut s = stage(1);
        assert!(!s.has_outer());
        assert!(s.pseudo_gradient().is_err(), "no round before it begins");
        s.begin_outer().unwrap();
        let start = s.export_params().unwrap();
        let moved: Vec<f32> = start.iter().map(|w| w - 0.25).collect();
        s.import_params(&moved).unwrap();
        let g = s.pseudo_gradient().unwrap();
        assert!(g.iter().all(|v| (v - 0.25).abs() < 1e-6));
        let settings = OuterSettings::default();
        s.outer_step(&g, &settings).unwrap();
        let (lr, mu) = (settings.lr, settings.momentum);
        let want: Vec<f32> = start.iter().map(|w| w - lr * (0.25 + mu * 0.25)).collect();
        let got = s.export_params().unwrap();
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5));
        assert!(s.pseudo_gradient().unwrap().iter().all(|v| v.abs() < 1e-6));
        let mut other = stage(2);
        other.begin_outer().unwrap();
        other.import_params(&moved).unwrap();
        other.outer[0] = s.outer[0].clone();
        other.outer[1] = s.outer[1].clone();
        assert_eq!(
            other.outer_digest(),
            s.outer_digest(),
            "the outer weights alone"
        );
        other.outer[1].as_mut().unwrap().anchor[0] += 1e-3;
        assert_ne!(other.outer_digest(), s.outer_digest());
        assert!(s.outer_step(&g[1..], &settings).is_err(), "a short mean");
    }

    /// The outer state travels with the layers: a stage that imports them continues the
    /// same round (same outer weights, same momentum), and the digest covers it.
    #[test]
    fn the_outer_state_travels_with_the_stage_state() {
        let mut s = stage(1);
        s.begin_outer().unwrap();
        let moved: Vec<f32> = s.export_params().unwrap().iter().map(|w| w * 0.5).collect();
        s.import_params(&moved).unwrap();
        let g = s.pseudo_gradient().unwrap();
        s.outer_step(&g, &OuterSettings::default()).unwrap();
        let shifted: Vec<f32> = s.export_params().unwrap().iter().map(|w| w + 0.1).collect();
        s.import_params(&shifted).unwrap();
        let bytes = s.export_state(1..3).unwrap();
        let mut t = stage(2);
        t.import_state(&bytes, 1..3).unwrap();
        assert!(t.has_outer());
        assert_eq!(t.pseudo_gradient().unwrap(), s.pseudo_gradient().unwrap());
        assert_eq!(t.state_digest().unwrap(), s.state_digest().unwrap());
        let mut without = stage(1);
        without.import_params(&s.export_params().unwrap()).unwrap();
        assert_ne!(without.state_digest().unwrap(), s.state_digest().unwrap());
        // Half the layers: the other keeps none.
        let mut half = stage(2);
        half.import_state(&bytes, 1..2).unwrap();
        assert!(!half.has_outer());
    }

    /// A state written before the outer state existed (layout version 1) still imports, with
    /// no outer state.
    #[test]
    fn a_version_one_state_imports_without_outer_state() {
        let s = stage(3);
        let v1 = downgrade(&s.export_state(1..3).unwrap());
        let mut t = stage(4);
        t.import_state(&v1, 1..3).unwrap();
        assert!(!t.has_outer());
        assert_eq!(t.export_params().unwrap(), s.export_params().unwrap());
    }

    /// `bytes` (version 2, no outer state) rewritten as version 1: each section loses its
    /// trailing outer flag, checksums recomputed.
    fn downgrade(bytes: &[u8]) -> Vec<u8> {
        const HEADER: usize = 36;
        let mut out = bytes[..HEADER].to_vec();
        out[4..8].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32fast::hash(&out[..HEADER - 4]);
        out[HEADER - 4..].copy_from_slice(&crc.to_le_bytes());
        let mut at = HEADER;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
            let body = &bytes[at + 16..at + 16 + len];
            assert_eq!(body.last(), Some(&0), "no outer state to drop");
            let body = &body[..len - 1];
            out.extend_from_slice(&bytes[at..at + 4]);
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
            out.extend_from_slice(body);
            at += 16 + len;
        }
        out
    }
}
