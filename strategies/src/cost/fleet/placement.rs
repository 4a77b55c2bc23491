//! What a placement says of the slots and the zones it uses, and what it is worth per dollar.

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

    /// The rate as a planner for samples per dollar weighs it: the placement's samples per
    /// dollar while the pools it uses are held (`counts[z]` nodes of pool `z`, billed at
    /// `usd_per_node_hour[z]`), every pool it leaves idle released, and its egress paid, scaled
    /// back to samples per second by the bill `C` of every pool held: `r C / (C_used + e r)`.
    /// A placement over every pool that crosses no zone keeps its rate; one that leaves pools
    /// idle gains what they would have cost, so the planner's migration and look-ahead
    /// arithmetic stays in samples. The rate itself where nothing is billed.
    pub fn per_dollar_rate(&self, counts: &[u32], usd_per_node_hour: &[f64]) -> f64 {
        let used = self.nodes_per_zone(counts.len());
        let (mut all, mut billed) = (0.0, 0.0);
        for ((&held, &used), &usd) in counts.iter().zip(&used).zip(usd_per_node_hour) {
            let per_sec = f64::from(held) * usd / 3600.0;
            all += per_sec;
            if used > 0 {
                billed += per_sec;
            }
        }
        let r = self.samples_per_sec;
        let cost = billed + self.egress_usd_per_sample * r;
        if all.is_finite() && all > 0.0 && cost > 0.0 {
            r * all / cost
        } else {
            r
        }
    }
}
