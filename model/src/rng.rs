//! The random stream each layer carries through steps and hand-offs.
//!
//! Burn's backend RNG is process-global and shared by everything in the process, so a stochastic
//! layer (dropout, noise) that wants to continue identically after it moved to another machine
//! must draw from a stream that belongs to the layer and travels with its state. This is that
//! stream: ChaCha8, exported as its seed and word position.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A layer's own random stream, exported and imported with [`crate::StageState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRng(ChaCha8Rng);

impl StageRng {
    /// A stream seeded from `seed`.
    pub fn from_seed_u64(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// The next 64 random bits; layers derive their masks from it (for example by seeding their
    /// own generator with it), so that the stream advances by one word per use.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// The seed and position, which restore the stream exactly.
    pub fn position(&self) -> ([u8; 32], u128) {
        (self.0.get_seed(), self.0.get_word_pos())
    }

    /// Rebuilds a stream at a position returned by [`StageRng::position`].
    pub fn at_position(seed: [u8; 32], word_pos: u128) -> Self {
        let mut rng = ChaCha8Rng::from_seed(seed);
        rng.set_word_pos(word_pos);
        Self(rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_restores_the_stream() {
        let mut a = StageRng::from_seed_u64(7);
        a.next_u64();
        a.next_u64();
        let (seed, pos) = a.position();
        let mut b = StageRng::at_position(seed, pos);
        assert_eq!(a.next_u64(), b.next_u64());
        assert_eq!(a, b);
    }
}
