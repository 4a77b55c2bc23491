//! The throughput-optimal configuration for every node count equals the `throughut-opt`
//! column of Parcae's per-interval decision files, for every model whose profile ships.

use std::path::PathBuf;

use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::CostModel;

#[test]
fn best_config_matches_every_liveput_res_json() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/traces/parcae/aws/traces/liveput_res"
    ));
    if !dir.exists() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let files = [
        ("bert_p3_gbs1024_mbs8.json", "bert"),
        ("gpt-1.5b_p3_gbs128_mbs1.json", "gpt-1.5b"),
        ("gpt-6.7b_gbs64_mbs1.json", "gpt-6.7b"),
        ("resnet152_gbs2048_mbs32.json", "resnet152"),
        ("vgg19_gbs2048_mbs32.json", "vgg19"),
    ];
    for (file, model) in files {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        let cost = CostModel::builtin(model).unwrap();
        let mut checked = 0;
        for row in &rows {
            let iv: Vec<u32> = serde_json::from_value(row["interval"].clone()).unwrap();
            let want: (u32, u32) = serde_json::from_value(row["throughut-opt"].clone()).unwrap();
            let n = iv[0] + iv[1] - iv[2];
            assert_eq!(cost.best(n), ParallelConfig::from(want), "{file}: N = {n}");
            checked += 1;
        }
        assert!(checked >= 600, "{file}: {checked} rows");
    }
}
