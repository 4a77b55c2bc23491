//! The splits of `chaos --partition-every`: which links to cut, and which nodes form the
//! minority that must not commit while it is cut off.
//!
//! They take turns as Jepsen's partition nemeses do: a random majority/minority split every
//! other time, and in between, alternately, one node isolated from all others and a bridge: two
//! sides that cannot reach each other and one node that reaches both (each side plus the bridge
//! may be a majority, so neither is a minority; what must hold there is that no step is
//! committed twice with different content).

use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The shape of a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A random minority cut off from the majority.
    Halves,
    /// One node cut off from every other.
    Isolated,
    /// Two sides cut off from each other, one node in touch with both.
    Bridged,
}

/// One split of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Its shape.
    pub shape: Shape,
    /// The node pairs whose link is cut.
    pub cuts: Vec<(usize, usize)>,
    /// The nodes that are a minority while the split lasts (none for a bridge).
    pub minority: Vec<usize>,
}

/// The `n`th split (from 0) of the running nodes `nodes`; `None` with fewer than two.
pub fn plan(n: u32, nodes: &[usize], rng: &mut ChaCha8Rng) -> Option<Split> {
    if nodes.len() < 2 {
        return None;
    }
    let mut shuffled = nodes.to_vec();
    shuffled.shuffle(rng);
    let minority_size = ((nodes.len() - 1) / 2).max(1);
    let shape = match n % 4 {
        1 => Shape::Isolated,
        3 if nodes.len() >= 3 => Shape::Bridged,
        3 => Shape::Isolated,
        _ => Shape::Halves,
    };
    let (minority, majority): (Vec<usize>, Vec<usize>) = match shape {
        Shape::Halves => (
            shuffled[..minority_size].to_vec(),
            shuffled[minority_size..].to_vec(),
        ),
        Shape::Isolated => (vec![shuffled[0]], shuffled[1..].to_vec()),
        Shape::Bridged => {
            // shuffled[0] is the bridge: it is on neither side.
            let rest = &shuffled[1..];
            let side = ((rest.len()) / 2).max(1);
            (rest[..side].to_vec(), rest[side..].to_vec())
        }
    };
    let cuts = minority
        .iter()
        .flat_map(|&a| majority.iter().map(move |&b| (a, b)))
        .collect();
    let minority = if shape == Shape::Bridged {
        Vec::new()
    } else {
        minority
    };
    Some(Split {
        shape,
        cuts,
        minority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn reachable(split: &Split, a: usize, b: usize) -> bool {
        !split.cuts.contains(&(a, b)) && !split.cuts.contains(&(b, a))
    }

    #[test]
    fn splits_take_turns_and_cut_exactly_across_the_sides() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let nodes = [0, 1, 2, 3, 4];
        let shapes: Vec<Shape> = (0..4)
            .map(|n| plan(n, &nodes, &mut rng).unwrap().shape)
            .collect();
        assert_eq!(
            shapes,
            [
                Shape::Halves,
                Shape::Isolated,
                Shape::Halves,
                Shape::Bridged
            ]
        );
        let halves = plan(0, &nodes, &mut rng).unwrap();
        assert_eq!(halves.minority.len(), 2);
        assert_eq!(halves.cuts.len(), 2 * 3, "every minority-majority pair");
        for &a in &nodes {
            for &b in &nodes {
                let same_side = halves.minority.contains(&a) == halves.minority.contains(&b);
                assert_eq!(reachable(&halves, a, b), same_side, "{a}-{b}");
            }
        }
        let isolated = plan(1, &nodes, &mut rng).unwrap();
        let [lonely] = isolated.minority[..] else {
            panic!("{isolated:?}")
        };
        assert_eq!(isolated.cuts.len(), 4);
        assert!(
            nodes
                .iter()
                .all(|&b| b == lonely || !reachable(&isolated, lonely, b))
        );
    }

    #[test]
    fn a_bridge_node_reaches_both_sides_and_no_side_is_a_minority() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let nodes = [3, 5, 7, 9, 11];
        let bridged = plan(3, &nodes, &mut rng).unwrap();
        assert_eq!(bridged.shape, Shape::Bridged);
        assert!(bridged.minority.is_empty());
        let bridges: Vec<usize> = nodes
            .iter()
            .copied()
            .filter(|&x| nodes.iter().all(|&b| reachable(&bridged, x, b)))
            .collect();
        assert_eq!(bridges.len(), 1, "{bridged:?}");
        assert_eq!(bridged.cuts.len(), 2 * 2);
    }

    #[test]
    fn two_nodes_are_cut_apart_and_one_cannot_be() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let two = plan(3, &[0, 1], &mut rng).unwrap();
        assert_eq!(two.shape, Shape::Isolated, "too few for a bridge");
        assert_eq!(two.cuts.len(), 1);
        assert_eq!(plan(0, &[4], &mut rng), None);
    }
}
