//! What several integration tests share.

use std::path::PathBuf;

use parcae_strategies::trace::{self, Trace};

/// Parcae's p3 trace (32 x p3.2xlarge, 11.4 h) from `../shared`, or `None` (with a note) when
/// it is not beside the checkout.
pub fn p3() -> Option<Trace> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/traces/parcae/liveput/traces/p3trace.csv"
    ));
    if !p.exists() {
        eprintln!("skipping: {} not found", p.display());
        return None;
    }
    Some(trace::load(p.to_str().expect("a UTF-8 path"), 60).expect("the p3 trace parses"))
}
