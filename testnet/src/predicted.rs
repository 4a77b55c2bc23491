//! The simulator's account of a testnet run: the same strategy on the replayed trace with the
//! cost model the cluster ran under.
//!
//! An emulated cluster ([`emulated_model`]) runs under its profile's per-layer costs (what its
//! accelerators pace every operation to, and what its planner measures), 1F1B-simulated for
//! every `(D, P)` on the emulated V100 and 10 Gb/s link, with the profile's restart costs; the
//! simulated trace's interval is the emulated one (`interval_secs x time_scale`), so the
//! simulated samples are the emulated cluster's. Parcae's measured throughput table is 2-2.9
//! times faster than its own per-layer profile (`docs/testnet.md`), so simulating the table
//! would hold the cluster to hardware it does not emulate.
//!
//! Every cluster's reactive baseline is killed without notice, which Parcae's simulator does
//! not charge: here each kill costs it, when it hits a node in use, the failure detection and
//! the step in flight, and when it takes every replica of a stage, the steps since the newest
//! checkpoint ([`UNANNOUNCED_KILLS`]); the liveput family acts on notices and loses none of it.
//!
//! A CPU cluster's costs are measured on the testnet itself ([`measured_model`]):
//!
//! * Throughput: for every `(D, P)` the runs trained in, committed samples over the seconds
//!   spent in it (from the once-per-second timeline, pairs of samples in the same epoch);
//!   configurations never run take the mean of the leaders' estimates (`/status`
//!   `training.estimates`, the planner's measured cost model); configurations with neither
//!   are not offered to the simulator.
//! * Restart cost: the mean duration the nodes reported for `restart` reconfigurations
//!   ([`DEFAULT_RESTART_MS`] when none happened). The simulator's reactive baseline adds
//!   Parcae's checkpoint reload ([`CHECKPOINT_MS`], 14 s, measured for GPT-1.5B) to every
//!   resumed restart, so the model's restart part is the measured duration minus that (at
//!   least 0): the simulated restart then costs what the testnet measured, or 14 s when the
//!   testnet restarts faster ([`restart_floor_note`] says so in the output).
//! * Layers and state sizes: the preset's parameter counts (GPT-2 layer arithmetic), moved at
//!   [`LOOPBACK`] speed: the nodes do not report their transfer rates, and on loopback state
//!   transfer of these models is far below a second either way.
//!
//! The trace is the one the testnet replayed (after fitting to `nodes_max`), with the
//! testnet's compressed interval length, so simulated seconds are testnet seconds.

use std::collections::BTreeMap;
use std::sync::Arc;

use parcae_api::MigrationKind;
use parcae_strategies::ParallelConfig;
use parcae_strategies::baselines::{CHECKPOINT_MS, UnannouncedKills};
use parcae_strategies::cost::analytic::throughput_table;
use parcae_strategies::cost::spec::{Family, LayerCost, ModelSpec, RestartCost};
use parcae_strategies::cost::throughput::ThroughputTable;
use parcae_strategies::cost::transfer::TransferModel;
use parcae_strategies::cost::{CostModel, RepartitionRule};
use parcae_strategies::sim::{self, SimSetup, StrategyRun};
use parcae_strategies::trace::{Interval, Trace};

use crate::engine::Observed;
use crate::monitor::Sample;
use crate::node_args::LOST_TIMEOUT_MS;

pub mod zones;

/// Restart cost assumed when no restart was measured, ms.
pub const DEFAULT_RESTART_MS: f64 = 5000.0;
/// Loopback transfer assumed for state moves.
pub const LOOPBACK: TransferModel = TransferModel::Linear {
    latency_ms: 1.0,
    bytes_per_sec: 1e9,
};
/// The liveput variant a node's planner runs: the zone model's forecast with the notices and
/// joins it sees before deciding, and the zone's terminal value.
pub const LIVEPUT: &str = sim::NODE_DEFAULT;
/// How long `parcae-node`'s planner waits after a departure for the others of the same
/// boundary before it plans, ms (its `planner::settle::DEPARTURE_SETTLE`).
pub const DEPARTURE_SETTLE_MS: f64 = 500.0;
/// What a kill without notice costs the reactive baseline beyond its restart, as its nodes
/// run: the failure detector's timeout ([`LOST_TIMEOUT_MS`]) and the planner's settle, the
/// step in flight, and the steps since the newest checkpoint when a stage lost every replica
/// ([`CHECKPOINT_EVERY`]). The
/// emulated nodes floor their lost timeout at three heartbeats of wall time and do not scale
/// the settle, so at a time scale above one they take longer (docs/testnet.md measures it);
/// this is what a cluster of the emulated devices would take.
pub const UNANNOUNCED_KILLS: UnannouncedKills = UnannouncedKills {
    detection_ms: LOST_TIMEOUT_MS as f64 + DEPARTURE_SETTLE_MS,
    checkpoint_every: CHECKPOINT_EVERY as f64,
};
/// Steps between a job's checkpoints: `parcae-node`'s default `checkpoint_every`, which the
/// testnet keeps.
pub const CHECKPOINT_EVERY: u64 = 20;
/// Intervals the simulated strategies look ahead: the node planner's default
/// (`[planner] lookahead`, Parcae's 8).
pub const LOOKAHEAD: usize = 8;
/// Least seconds in a configuration for its throughput to count.
const MIN_SECS: f64 = 2.0;

/// Samples/s per configuration over the runs' timelines, completed by the leaders' estimates.
pub fn measured_throughput(runs: &[&Observed]) -> ThroughputTable {
    let mut acc: BTreeMap<ParallelConfig, (f64, f64)> = BTreeMap::new();
    for run in runs {
        for (c, a, b) in training_pairs(&run.monitor.timeline) {
            let e = acc.entry(c).or_default();
            e.0 += (b.samples - a.samples) as f64;
            e.1 += b.t - a.t;
        }
    }
    let mut rows: BTreeMap<ParallelConfig, f64> = acc
        .into_iter()
        .filter(|(c, (samples, secs))| *secs >= MIN_SECS && *samples > 0.0 && c.d > 0)
        .map(|(c, (samples, secs))| (c, samples / secs))
        .collect();
    let mut estimated: BTreeMap<ParallelConfig, (f64, f64)> = BTreeMap::new();
    for e in runs.iter().flat_map(|r| &r.monitor.estimates) {
        if e.samples_per_sec.is_finite() && e.samples_per_sec > 0.0 && e.config[0] > 0 {
            let slot = estimated
                .entry(ParallelConfig::new(e.config[0], e.config[1]))
                .or_default();
            slot.0 += e.samples_per_sec;
            slot.1 += 1.0;
        }
    }
    for (c, (sum, n)) in estimated {
        rows.entry(c).or_insert(sum / n);
    }
    ThroughputTable::from_rows(rows)
}

/// Consecutive samples of a timeline spent in one configuration of one plan epoch (the
/// cursor not moving back), with that configuration: the spans a throughput is measured on.
pub fn training_pairs(
    timeline: &[Sample],
) -> impl Iterator<Item = (ParallelConfig, &Sample, &Sample)> {
    timeline.windows(2).filter_map(|w| {
        let (a, b) = (&w[0], &w[1]);
        let (ca, cb) = (a.config?, b.config?);
        (ca == cb && a.epoch == b.epoch && b.t > a.t && b.samples >= a.samples)
            .then(|| (ParallelConfig::new(ca.0, ca.1), a, b))
    })
}

/// Mean measured restart duration, ms.
pub fn measured_restart_ms(runs: &[&Observed]) -> f64 {
    let secs: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.monitor.migrations.migrations())
        .filter(|(_, m)| m.kind == MigrationKind::Restart)
        .map(|(_, m)| m.secs)
        .collect();
    if secs.is_empty() {
        DEFAULT_RESTART_MS
    } else {
        1000.0 * secs.iter().sum::<f64>() / secs.len() as f64
    }
}

/// Parameters per pipeline layer of a preset: embedding, blocks, head.
fn preset_layers(model: &str) -> Vec<f64> {
    // (vocab, d_model, blocks, seq_len, d_ff) of parcae-model's presets.
    let (vocab, d, blocks, seq, ff) = match model {
        "small" => (4096.0, 512.0, 6, 128.0, 2048.0),
        "gpt2-124m" => (50257.0, 768.0, 12, 1024.0, 3072.0),
        "gpt2-355m" => (50257.0, 1024.0, 24, 1024.0, 4096.0),
        _ => (64.0, 32.0, 2, 16.0, 128.0),
    };
    let embed = vocab * d + seq * d;
    let block = 4.0 * (d * d + d) + (d * ff + ff) + (ff * d + d) + 4.0 * d;
    let head = 2.0 * d + d * vocab + vocab;
    let mut layers = vec![embed];
    layers.extend(std::iter::repeat_n(block, blocks));
    layers.push(head);
    layers
}

/// The cost model measured on the testnet, or `None` when no configuration trained long
/// enough to measure.
pub fn measured_model(model: &str, runs: &[&Observed]) -> Option<CostModel> {
    let table = measured_throughput(runs);
    table.configs().next()?;
    let layers: Vec<LayerCost> = preset_layers(model)
        .into_iter()
        .map(|params| LayerCost {
            forward_ms: 0.0,
            backward_ms: 0.0,
            optimizer_ms: 0.0,
            activation_mb: 0.0,
            params,
        })
        .collect();
    let depths = (1..=layers.len() as u32).collect();
    let spec = ModelSpec {
        name: model.to_string(),
        family: Family::Transformer,
        layers,
        optimizer_states: 2,
        global_batch: 1,
        micro_batch: 1,
        boundary_bytes: 0.0,
        depths,
        min_d: 1,
        restart: RestartCost::Fixed {
            ms: (measured_restart_ms(runs) - CHECKPOINT_MS).max(0.0),
        },
    };
    Some(CostModel::new(spec, table, LOOPBACK).with_repartition(RepartitionRule::Handoff))
}

/// A note when the simulator charges reactive restarts more than the testnet measured.
pub fn restart_floor_note(runs: &[&Observed]) -> Option<String> {
    let measured = measured_restart_ms(runs);
    (measured < CHECKPOINT_MS).then(|| {
        format!(
            "note: the simulator charges every reactive restart at least {:.0} s (Parcae's \
             checkpoint reload); the testnet measured {:.1} s",
            CHECKPOINT_MS / 1000.0,
            measured / 1000.0
        )
    })
}

/// The replayed trace as the simulator sees it.
pub fn replayed_trace(source: &str, counts: &[u32], interval_secs: u64) -> Trace {
    let mut prev = 0;
    let intervals = counts
        .iter()
        .map(|&nodes| {
            let iv = Interval {
                nodes,
                added: nodes.saturating_sub(prev),
                removed: prev.saturating_sub(nodes),
            };
            prev = nodes;
            iv
        })
        .collect();
    Trace {
        source: source.to_string(),
        interval_secs,
        intervals,
    }
}

/// The simulator's name for a node's planning strategy (`[planner] strategy`).
pub fn simulated_strategy(node_strategy: &str) -> &str {
    match node_strategy {
        "liveput" => LIVEPUT,
        other => other,
    }
}

/// The cost model an emulated cluster of `profile` (a built-in model or a profile file) runs
/// under, for up to `nodes_max` nodes.
pub fn emulated_model(profile: &str, nodes_max: u32) -> Option<CostModel> {
    let emulated = parcae_strategies::cost::profile::emulated(profile).ok()?;
    let link = TransferModel::Profiled10Gbps;
    let table = throughput_table(&emulated.spec, emulated.hardware, &link, nodes_max);
    // The nodes hand state off as `parcae-node` does, which the simulator prices so.
    Some(CostModel::new(emulated.spec, table, link).with_repartition(RepartitionRule::Handoff))
}

/// `node_strategy` simulated on the whole of `trace` with `model` (`None` for a strategy the
/// simulator does not know).
pub fn simulate(
    model: &Arc<CostModel>,
    trace: &Trace,
    nodes_max: u32,
    seed: u64,
    node_strategy: &str,
) -> Option<StrategyRun> {
    let bounds = sim::job_bounds(model, nodes_max);
    let strategy = sim::strategy_by_name(simulated_strategy(node_strategy), bounds, seed).ok()?;
    let setup = SimSetup {
        model: model.clone(),
        lookahead: LOOKAHEAD,
        seed,
        unannounced_kills: Some(UNANNOUNCED_KILLS),
    };
    Some(sim::simulate(&setup, trace, 0..trace.len(), strategy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::Monitor;
    use parcae_api::EstimateView;

    fn sample(t: f64, epoch: u64, config: Option<(u32, u32)>, samples: u64) -> Sample {
        Sample {
            t,
            running: 4,
            target: 4,
            epoch,
            config,
            step: 0,
            samples,
            loss: None,
        }
    }

    fn observed(timeline: Vec<Sample>) -> Observed {
        let mut monitor = Monitor::default();
        monitor.timeline = timeline;
        Observed {
            monitor,
            final_seq: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn throughput_is_measured_within_epochs() {
        let run = observed(vec![
            sample(0.0, 1, Some((2, 2)), 0),
            sample(1.0, 1, Some((2, 2)), 100),
            sample(2.0, 1, Some((2, 2)), 200),
            sample(3.0, 1, Some((2, 2)), 300),
            // Epoch change: this pair is a migration, not throughput.
            sample(4.0, 2, Some((1, 2)), 300),
            sample(5.0, 2, Some((1, 2)), 350),
        ]);
        let mut run = run;
        run.monitor.estimates = vec![
            EstimateView {
                config: [2, 2],
                samples_per_sec: 80.0,
                pools: Vec::new(),
            },
            EstimateView {
                config: [1, 4],
                samples_per_sec: 60.0,
                pools: Vec::new(),
            },
        ];
        let table = measured_throughput(&[&run]);
        assert_eq!(
            table.samples_per_sec(ParallelConfig::new(2, 2)),
            100.0,
            "measured beats estimated"
        );
        assert_eq!(table.samples_per_sec(ParallelConfig::new(1, 4)), 60.0);
        assert_eq!(
            table.samples_per_sec(ParallelConfig::new(1, 2)),
            0.0,
            "1 s is too short to count"
        );
    }

    #[test]
    fn the_reactive_baseline_pays_for_its_kills_without_notice_and_nothing_else_does() {
        let model = Arc::new(emulated_model("gpt-1.5b", 8).unwrap());
        // Eight nodes, two killed at the third boundary, and time for the charge to run out.
        let trace = replayed_trace("test", &[8, 8, 6, 6, 6, 6, 6, 6, 6, 6], 60);
        let ours = |name: &str| simulate(&model, &trace, 8, 1, name).unwrap();
        let parcae = |name: &str| {
            let setup = SimSetup {
                model: model.clone(),
                lookahead: LOOKAHEAD,
                seed: 1,
                unannounced_kills: None,
            };
            let bounds = sim::job_bounds(&model, 8);
            let strategy = sim::strategy_by_name(simulated_strategy(name), bounds, 1).unwrap();
            sim::simulate(&setup, &trace, 0..trace.len(), strategy)
        };
        let (with, without) = (ours("reactive"), parcae("reactive"));
        let running = without.configs[1];
        let rate = model.samples_per_sec(running);
        let step_ms = 1000.0 * f64::from(model.spec.global_batch) / rate;
        let extra_ms = UNANNOUNCED_KILLS.expected_ms(8, 2, running, step_ms);
        assert!(extra_ms >= 2500.0, "{extra_ms}");
        // Charged from the third interval on, as long as it lasts.
        let charged = with.migration_secs - without.migration_secs;
        assert!(
            (charged - extra_ms / 1000.0).abs() < 1e-6,
            "{charged} vs {extra_ms} ms"
        );
        assert_eq!(with.charged_secs[..2], without.charged_secs[..2]);
        assert!(with.configs[2..].iter().all(|&c| c == with.configs[2]));
        let lost = without.samples - with.samples;
        let expected = model.samples_per_sec(with.configs[2]) * extra_ms / 1000.0;
        assert!((lost - expected).abs() < 1e-6, "{lost} vs {expected}");
        // The liveput family acts on notices: its kills cost what they did.
        assert_eq!(ours("liveput").samples, parcae("liveput").samples);
    }

    #[test]
    fn preset_parameter_counts() {
        let tiny: f64 = preset_layers("tiny").iter().sum();
        assert_eq!(preset_layers("tiny").len(), 4);
        // parcae-model reports 30,080 for tiny; GPT-2 arithmetic with biases is within 1 %.
        assert!((tiny - 30_080.0).abs() / 30_080.0 < 0.01, "{tiny}");
        assert_eq!(preset_layers("small").len(), 8);
        // GPT-2 124M with its untied head: 124,439,808 + 38,597,376 in parcae-model.
        let gpt2: f64 = preset_layers("gpt2-124m").iter().sum();
        assert!(
            (gpt2 - 163_037_184.0).abs() / 163_037_184.0 < 0.01,
            "{gpt2}"
        );
        assert_eq!(preset_layers("gpt2-355m").len(), 26);
    }

    #[test]
    fn ratio_on_a_churning_trace_favours_liveput_when_restarts_are_slow() {
        let run = observed(
            (0..20)
                .map(|i| sample(f64::from(i), 1, Some((2, 1)), 50 * i as u64))
                .chain((20..40).map(|i| sample(f64::from(i), 2, Some((4, 1)), 90 * i as u64)))
                .collect(),
        );
        let model = measured_model("tiny", &[&run]).expect("measured");
        // 5 s measured is below the simulator's 14 s checkpoint reload: nothing on top.
        assert_eq!(model.spec.restart, RestartCost::Fixed { ms: 0.0 });
        assert!(
            restart_floor_note(&[&run])
                .unwrap()
                .contains("measured 5.0 s")
        );
        let trace = replayed_trace("t", &[4, 2, 4, 2, 4, 2, 4, 2], 10);
        assert_eq!(trace.intervals[1].removed, 2);
        assert_eq!(trace.intervals[2].added, 2);
        let model = Arc::new(model);
        let samples = |strategy| simulate(&model, &trace, 4, 1, strategy).unwrap().samples;
        let (live, reactive) = (samples("liveput"), samples("reactive"));
        // Reactive pays a 14 s restart on every 10 s interval; liveput keeps a configuration
        // that every interval can run.
        assert!(reactive > 0.0 && live > reactive, "{live} vs {reactive}");
        assert!(samples("ideal") >= live);
        assert!(simulate(&model, &trace, 4, 1, "bogus").is_none());
        assert!(measured_model("tiny", &[&observed(Vec::new())]).is_none());
    }

    #[test]
    fn the_emulated_model_is_the_per_layer_profile_and_its_restarts() {
        let model = emulated_model("gpt-1.5b", 32).unwrap();
        assert_eq!(model.spec.layers.len(), 50);
        assert!(matches!(model.spec.restart, RestartCost::Profiled { .. }));
        // Parcae's best configuration for 32 V100s, from the per-layer costs: about 2.4 times
        // slower than its measured 43.5 samples/s (docs/testnet.md).
        let best = model.samples_per_sec(ParallelConfig::new(4, 8));
        assert!(best > 12.0 && best < 25.0, "{best}");
        assert_eq!(model.samples_per_sec(ParallelConfig::new(8, 1)), 0.0, "OOM");
        assert!(emulated_model("gpt-9b", 32).is_none());
        assert_eq!(simulated_strategy("liveput"), LIVEPUT);
        assert_eq!(simulated_strategy("liveput-predict"), "liveput-predict");
    }
}
