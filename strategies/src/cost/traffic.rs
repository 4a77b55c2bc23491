//! What one training iteration of a placed plan sends between zones, and what it costs: the
//! pools of a fleet by index over a table of the links between them, so pricing a placement
//! compares no names (the planner prices thousands of placements a decision).

use parcae_pool::AllReduce;

use super::links::GRADIENT_BYTES_PER_PARAM;
use super::spec::ModelSpec;

/// Bytes of a billed GB (the clouds' price lists bill decimal gigabytes).
const GB: f64 = 1e9;

/// Pipelines of one shape in a plan: the pool of each of their stages, and how many of them
/// the plan runs (a plan of 512 pipelines has a few shapes: kept as shapes, not slot by slot).
#[derive(Clone, Debug, PartialEq)]
pub struct Pipelines {
    /// The pool of each stage, by the table's index.
    pub pools: Vec<usize>,
    /// How many pipelines of this shape.
    pub count: u32,
}

/// What one training iteration of a placed plan sends between zones, and what it costs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Bytes that cross a zone boundary, activations and gradients together.
    pub cross_zone_bytes: f64,
    /// Their egress charges, dollars.
    pub egress_usd: f64,
    /// The slowest activation transfer between two neighbouring stages of any pipeline, ms.
    pub slowest_boundary_ms: f64,
    /// Each stage's all-reduce, ms.
    pub allreduce_ms: Vec<f64>,
    /// How the stages whose replicas span zones all-reduce (by zone where that was allowed
    /// and no slower for one of them).
    pub all_reduce: AllReduce,
}

/// The traffic of one iteration of the plan of `pipelines`, whose stage `s` runs the layers
/// between `bounds[s]` and `bounds[s + 1]` in its pool of `table`: each pipeline
/// sends every micro-batch's activation forward and its gradient back across each stage
/// boundary, and each stage's replicas all-reduce their gradients: in a ring that visits the
/// pools in the order of their names (so a ring over `k` zones crosses `k` zone boundaries, the
/// fewest there can be), or, where `by_zone` allows it and it is no slower, by zone
/// ([`LinkTable::reduction`]). `None` when there is no pipeline, one has other than
/// `bounds.len() - 1` stages or a pool is not in `table`.
pub fn traffic(
    spec: &ModelSpec,
    bounds: &[usize],
    pipelines: &[Pipelines],
    table: &LinkTable,
    by_zone: bool,
) -> Option<Traffic> {
    let stages = bounds.len().checked_sub(1)?;
    let d: u32 = pipelines.iter().map(|p| p.count).sum();
    if d == 0
        || pipelines
            .iter()
            .any(|p| p.pools.len() != stages || p.pools.iter().any(|&z| z >= table.pools()))
    {
        return None;
    }
    let micro = f64::from(
        (spec.global_batch / spec.micro_batch.max(1))
            .div_ceil(d)
            .max(1),
    );
    let mut out = Traffic::default();
    for shape in pipelines.iter().filter(|p| p.count > 0) {
        for pair in shape.pools.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let link = table.link(a, b);
            out.slowest_boundary_ms = out
                .slowest_boundary_ms
                .max(link.transfer_ms(spec.boundary_bytes));
            let bytes = 2.0 * micro * spec.boundary_bytes * f64::from(shape.count);
            out.add_crossing(table, a, b, bytes);
        }
    }
    let mut members = vec![0u32; table.pools()];
    // Most stages spread over the pools as the one before them (every stage of a pipeline
    // inside one zone does): their reduction is priced once.
    let mut last: Option<(Vec<u32>, Reduction)> = None;
    for (s, w) in bounds.windows(2).enumerate() {
        let params: f64 = spec.layers.get(w[0]..w[1])?.iter().map(|l| l.params).sum();
        members.fill(0);
        for shape in pipelines {
            members[shape.pools[s]] += shape.count;
        }
        let reduction = match last.take() {
            Some((of, reduction)) if of == members => (of, reduction),
            _ => (members.clone(), table.reduction(&members, by_zone)),
        };
        let ms = out.all_reduce(table, &reduction.1, params * GRADIENT_BYTES_PER_PARAM);
        out.allreduce_ms.push(ms);
        last = Some(reduction);
    }
    Some(out)
}

impl Traffic {
    fn add_crossing(&mut self, table: &LinkTable, a: usize, b: usize, bytes: f64) {
        if table.crosses(a, b) {
            self.cross_zone_bytes += bytes;
            self.egress_usd += bytes / GB * table.link(a, b).usd_per_gb;
        }
    }

    /// The all-reduce of `bytes` as `reduction` prices it ([`reduce`]): its crossings counted;
    /// its time, ms.
    fn all_reduce(&mut self, table: &LinkTable, reduction: &Reduction, bytes: f64) -> f64 {
        for (a, b, sent) in reduction.crossings(bytes) {
            self.add_crossing(table, a, b, sent);
        }
        if reduction.kind == AllReduce::ByZone {
            self.all_reduce = AllReduce::ByZone;
        }
        reduction.ms(bytes)
    }
}

mod reduce;
mod table;
pub use reduce::{Reduction, by_zone_time, share};
pub use table::LinkTable;

#[cfg(test)]
mod tests;
