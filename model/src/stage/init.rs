//! Building a stage's layers: each from its own seed, so a stage built on its own holds exactly
//! the weights of the same layers in the unsplit model, in any process.

use std::ops::Range;
use std::sync::Mutex;

use burn::tensor::Device;

use crate::params::param_infos;
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;

/// Serialises seeding + initialisation: the backend RNG is process-global, so two stages built at
/// once on different threads would interleave their draws.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Builds layers `range` of `model` on `device`, layer `i` from the backend RNG seeded with
/// [`layer_seed`]`(seed, i)`, and materialises every (lazily initialised) parameter before the
/// next layer is seeded. Stages and reference models built this way agree weight for weight, in
/// any process. Serialised by a process-wide lock because the backend RNG is global.
pub fn init_layers<M: PipelineModel + ?Sized>(
    model: &M,
    range: Range<usize>,
    seed: u64,
    device: &Device,
) -> Vec<M::Layer> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    range
        .map(|index| {
            device.seed(layer_seed(seed, index));
            let layer = model.init_layer(index, device);
            param_infos(&layer);
            layer
        })
        .collect()
}

/// The initial random stream of layer `index`: travels with the layer in its state.
pub(super) fn layer_rng(seed: u64, index: usize) -> StageRng {
    StageRng::from_seed_u64(layer_seed(!seed, index))
}

/// The seed of layer `index` of a model seeded with `seed`: the same in every process, so that
/// stages built on their own hold the weights of the unsplit model.
pub fn layer_seed(seed: u64, index: usize) -> u64 {
    // splitmix64 of the pair, so neighbouring layers get unrelated streams.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_seeds_differ_between_layers_and_seeds() {
        assert_ne!(layer_seed(1, 0), layer_seed(1, 1));
        assert_ne!(layer_seed(1, 0), layer_seed(2, 0));
        assert_eq!(layer_seed(7, 3), layer_seed(7, 3));
    }
}
