//! What a placement says of the slots and the zones it uses.

use super::Placement;

impl Placement {
    /// The zone of each stage, per pipeline, one pipeline after another.
    pub fn slot_zones(&self) -> Vec<Vec<usize>> {
        self.pipelines
            .iter()
            .flat_map(|shape| std::iter::repeat_n(shape.pools.clone(), shape.count as usize))
            .collect()
    }

    /// How many of the plan's nodes each of `zones` zones holds (a zone past them counts
    /// nowhere).
    pub fn nodes_per_zone(&self, zones: usize) -> Vec<u32> {
        let mut nodes = vec![0; zones];
        for shape in &self.pipelines {
            for &z in &shape.pools {
                if let Some(n) = nodes.get_mut(z) {
                    *n += shape.count;
                }
            }
        }
        nodes
    }
}
