//! The paper's five profiled models (spec 2.1-2.2, 3.2), shipped with the crate.

use std::collections::BTreeMap;

use super::spec::{BuildCost, Family, GroupCost, LayerCost, ModelSpec, RestartCost};
use super::throughput::Profile;
use super::transfer::TransferModel;

/// Names accepted by [`builtin`].
pub const MODELS: [&str; 5] = ["gpt-1.5b", "gpt-6.7b", "bert", "resnet152", "vgg19"];

/// Rendezvous with new nodes, ms.
const RENDEZVOUS_MS: f64 = 6600.0;

fn profile_text(name: &str) -> Option<&'static str> {
    Some(match name {
        "gpt-1.5b" => include_str!("../../profiles/gpt-1.5b.csv"),
        "gpt-6.7b" => include_str!("../../profiles/gpt-6.7b.csv"),
        "bert" => include_str!("../../profiles/bert.csv"),
        "resnet152" => include_str!("../../profiles/resnet152.csv"),
        "vgg19" => include_str!("../../profiles/vgg19.csv"),
        _ => return None,
    })
}

fn layer(
    forward_ms: f64,
    backward_ms: f64,
    optimizer_ms: f64,
    activation_mb: f64,
    params: f64,
) -> LayerCost {
    LayerCost {
        forward_ms,
        backward_ms,
        optimizer_ms,
        activation_mb,
        params,
    }
}

/// Embedding, `blocks` identical blocks, head.
fn transformer_layers(
    embed: LayerCost,
    block: LayerCost,
    head: LayerCost,
    blocks: usize,
) -> Vec<LayerCost> {
    let mut v = Vec::with_capacity(blocks + 2);
    v.push(embed);
    v.extend(std::iter::repeat_n(block, blocks));
    v.push(head);
    v
}

fn table(entries: &[(u32, f64)]) -> BuildCost {
    BuildCost::Table(entries.iter().copied().collect::<BTreeMap<_, _>>())
}

/// Placeholder timings the artifact used for models whose throughput is table-only.
fn cnn_layer(params: f64) -> LayerCost {
    layer(140.248, 272.695, 8.359, 10940.249, params)
}

/// Process start of a GPT job's restart on Parcae's cluster (gpt-1.5b), ms.
pub const GPT_PROC_MS: f64 = 240.0;

/// Rebuilding one communication group of a GPT job when no node joined (gpt-1.5b), ms.
pub const GPT_GROUP_MS: f64 = 39.3;

/// A GPT job's restart as Parcae profiled them: process start, rendezvous, extra start-up work
/// when nodes join, `other_ms` per communication group (500 ms each when nodes join) and the
/// stage `build`.
pub fn gpt_restart(
    proc_ms: f64,
    add_extra_ms: f64,
    other_ms: f64,
    build: BuildCost,
) -> RestartCost {
    RestartCost::Profiled {
        proc_ms,
        rendezvous_ms: RENDEZVOUS_MS,
        add_extra_ms,
        groups: GroupCost::PerGroup {
            add_ms: 500.0,
            other_ms,
        },
        build,
    }
}

/// A restart priced as Parcae's gpt-1.5b's (240 ms process start, rendezvous, 39.3 ms per
/// communication group) with a stage build of `base_ms` plus `per_block_ms` for each of the
/// stage's share of `blocks`.
pub fn per_block_restart(base_ms: f64, per_block_ms: f64, blocks: u32) -> RestartCost {
    gpt_restart(
        240.0,
        0.0,
        39.3,
        BuildCost::PerBlock {
            base_ms,
            per_block_ms,
            blocks,
        },
    )
}

/// The spec of a built-in model and its profiled throughput table, or `None` if unknown.
pub fn builtin(name: &str) -> Option<(ModelSpec, Profile)> {
    let text = profile_text(name)?;
    let profile = Profile::parse(text, name).ok()?;
    let spec = match name {
        "gpt-1.5b" => ModelSpec {
            name: name.into(),
            family: Family::Transformer,
            layers: transformer_layers(
                layer(0.752, 0.798, 5.655, 8.984, 82_124_800.0),
                layer(6.51, 13.448, 2.117, 268.969, 30_740_800.0),
                layer(11.238, 23.762, 5.656, 177.758, 82_128_000.0),
                48,
            ),
            optimizer_states: 2,
            global_batch: 128,
            micro_batch: 1,
            boundary_bytes: 1024.0 * 1600.0 * 4.0,
            depths: (6..=32).collect(),
            min_d: 1,
            restart: per_block_restart(
                TransferModel::Profiled10Gbps.cost_ms(50257.0 * 1024.0 * 4.0),
                430.0,
                48,
            ),
        },
        "gpt-6.7b" => ModelSpec {
            name: name.into(),
            family: Family::Transformer,
            layers: transformer_layers(
                layer(0.607, 1.357, 11.852, 20.0, 214_433_792.0),
                layer(31.861, 63.118, 11.131, 268.508, 201_379_840.0),
                layer(28.082, 59.148, 11.852, 148.508, 214_441_984.0),
                36,
            ),
            optimizer_states: 2,
            global_batch: 64,
            micro_batch: 1,
            boundary_bytes: 1024.0 * 4096.0 * 4.0,
            depths: vec![12, 13, 14, 15, 16, 18, 20, 22, 24, 26],
            min_d: 1,
            restart: gpt_restart(
                240.0,
                2000.0,
                115.6,
                table(&[
                    (12, 7961.0),
                    (13, 6911.0),
                    (14, 6926.0),
                    (15, 7002.0),
                    (16, 7195.0),
                    (18, 4734.0),
                    (20, 5245.0),
                    (22, 4818.0),
                    (24, 4798.0),
                    (26, 4932.0),
                ]),
            ),
        },
        "bert" => ModelSpec {
            name: name.into(),
            family: Family::Transformer,
            layers: transformer_layers(
                layer(140.248, 272.695, 8.359, 420.995, 31_782_912.0),
                layer(140.248, 272.695, 8.359, 278.96, 12_596_224.0),
                layer(140.248, 272.695, 8.359, 420.995, 31_782_912.0),
                24,
            ),
            optimizer_states: 2,
            global_batch: 1024,
            micro_batch: 8,
            boundary_bytes: 8.0 * 512.0 * 1024.0 * 4.0,
            depths: (2..=16).filter(|p| ![9, 11, 13, 15].contains(p)).collect(),
            min_d: 1,
            restart: RestartCost::Profiled {
                proc_ms: 30.0,
                rendezvous_ms: RENDEZVOUS_MS,
                add_extra_ms: 0.0,
                groups: GroupCost::ByWidth,
                build: table(&[
                    (2, 1752.0),
                    (3, 1123.0),
                    (4, 1095.0),
                    (5, 854.0),
                    (6, 860.0),
                    (7, 767.0),
                    (8, 754.0),
                    (10, 633.0),
                    (12, 626.0),
                    (14, 505.0),
                    (16, 531.0),
                ]),
            },
        },
        "resnet152" => ModelSpec {
            name: name.into(),
            family: Family::Cnn,
            layers: {
                let mut v = vec![cnn_layer(1_162_876.16); 51];
                v.push(cnn_layer(204_900.0));
                v
            },
            optimizer_states: 2,
            global_batch: 2048,
            micro_batch: 32,
            boundary_bytes: 0.0,
            depths: (2..=16).step_by(2).collect(),
            min_d: 1,
            restart: RestartCost::Profiled {
                proc_ms: 30.0,
                rendezvous_ms: RENDEZVOUS_MS,
                add_extra_ms: 3360.374,
                groups: GroupCost::ByWidth,
                build: table(&[
                    (2, 110.0),
                    (4, 90.0),
                    (6, 133.0),
                    (8, 135.0),
                    (10, 120.0),
                    (12, 55.0),
                    (14, 120.0),
                    (16, 125.0),
                ]),
            },
        },
        "vgg19" => ModelSpec {
            name: name.into(),
            family: Family::Cnn,
            layers: {
                let mut v = vec![cnn_layer(1_251_524.0); 16];
                v.extend([
                    cnn_layer(102_764_544.0),
                    cnn_layer(16_781_312.0),
                    cnn_layer(409_700.0),
                ]);
                v
            },
            optimizer_states: 2,
            global_batch: 2048,
            micro_batch: 32,
            boundary_bytes: 0.0,
            depths: (2..=9).collect(),
            min_d: 2,
            restart: RestartCost::Profiled {
                proc_ms: 30.0,
                rendezvous_ms: RENDEZVOUS_MS,
                add_extra_ms: 2000.0,
                groups: GroupCost::PerNode {
                    add_ms: 440.0,
                    other_ms: 340.0,
                },
                build: table(&[
                    (2, 110.0),
                    (3, 94.0),
                    (4, 90.0),
                    (5, 105.0),
                    (6, 133.0),
                    (7, 90.0),
                    (8, 120.0),
                    (9, 106.0),
                ]),
            },
        },
        _ => return None,
    };
    Some((spec, profile))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ParallelConfig;
    use crate::cost::spec::RestartKind;

    #[test]
    fn every_builtin_loads() {
        for m in MODELS {
            let (spec, profile) = builtin(m).expect(m);
            assert_eq!(spec.global_batch, profile.global_batch, "{m}");
            assert!(profile.table.configs().count() >= 10, "{m}");
        }
        assert!(builtin("gpt-9b").is_none());
    }

    #[test]
    fn restart_costs_match_spec_examples() {
        let (spec, _) = builtin("gpt-1.5b").unwrap();
        let c = ParallelConfig::new(4, 8);
        let add = spec.restart.restart_ms(c, RestartKind::Add);
        let rm = spec.restart.restart_ms(c, RestartKind::Remove);
        assert!((add - 32_189.8).abs() < 0.1, "{add}");
        assert!((rm - 4_858.3).abs() < 0.1, "{rm}");
        let intra = spec
            .restart
            .groups_ms(ParallelConfig::new(3, 8), RestartKind::Remove)
            + spec.restart.proc_ms();
        assert!((intra - 1689.8).abs() < 0.01, "{intra}");
    }
}
