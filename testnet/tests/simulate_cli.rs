//! `parcae-testnet simulate` end to end: output on the embedded default, JSON schema, and a
//! one-line error with exit code 2 for every kind of bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn testnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parcae-testnet"))
        .args(args)
        .output()
        .expect("run parcae-testnet")
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("parcae-testnet-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn assert_one_line_error(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

/// Runs `simulate` with `args` and `--json`, asserts it succeeded and returns its stdout and
/// its JSON.
fn simulate_json(args: &[&str], name: &str) -> (String, serde_json::Value) {
    let json = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    all.extend(["--json", json.to_str().unwrap()]);
    let out = testnet(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), v)
}

#[test]
fn default_run_prints_every_strategy_and_writes_json_and_plot() {
    let json = std::env::temp_dir().join(format!("sim-{}.json", std::process::id()));
    let png = std::env::temp_dir().join(format!("sim-{}.png", std::process::id()));
    let out = testnet(&[
        "simulate",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for name in [
        "ideal",
        "reactive",
        "liveput-truth",
        "liveput-predict",
        "liveput-aware",
        "liveput-zone",
        "liveput-zone-truth",
    ] {
        assert!(table.contains(name), "{name} missing: {table}");
    }
    assert!(
        table.contains("liveput-zone *"),
        "default unmarked: {table}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["trace"], "synthetic:hh:0");
    assert_eq!(v["model"], "gpt-1.5b");
    assert_eq!(v["node_default"], "liveput-zone");
    let intervals = v["intervals"].as_u64().unwrap();
    assert!(intervals > 0);
    let strategies = v["strategies"].as_array().unwrap();
    let ideal = &strategies[0];
    assert_eq!(ideal["name"], "ideal");
    assert!((ideal["pct_ideal"].as_f64().unwrap() - 100.0).abs() < 1e-9);
    let by_name = |n: &str| strategies.iter().find(|s| s["name"] == n).unwrap();
    let reactive = by_name("reactive")["samples"].as_f64().unwrap();
    let predict = by_name("liveput-predict")["samples"].as_f64().unwrap();
    let zone = by_name("liveput-zone");
    let samples = zone["samples"].as_f64().unwrap();
    assert!((zone["x_reactive"].as_f64().unwrap() - samples / reactive).abs() < 1e-9);
    let best = reactive.max(predict);
    assert!((zone["x_best_baseline"].as_f64().unwrap() - samples / best).abs() < 1e-9);
    for s in strategies {
        assert_eq!(s["configs"].as_array().unwrap().len() as u64, intervals);
        assert!(s["samples"].as_f64().unwrap() <= ideal["samples"].as_f64().unwrap() + 1e-6);
        assert!(s["migration_secs"].as_f64().unwrap() >= 0.0);
        assert!(s["migrations"].as_u64().is_some());
    }
    let png_bytes = std::fs::read(&png).unwrap();
    assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bad_inputs_give_one_line_errors_with_exit_code_2() {
    let out = testnet(&["simulate", "--model", "gpt-9b"]);
    assert_one_line_error(&out, &["unknown model", "gpt-9b"]);

    let missing = Path::new("/nonexistent/trace.csv");
    let out = testnet(&["simulate", "--trace", missing.to_str().unwrap()]);
    assert_one_line_error(&out, &["/nonexistent/trace.csv"]);

    let empty = scratch("empty.csv", "");
    let out = testnet(&["simulate", "--trace", empty.to_str().unwrap()]);
    assert_one_line_error(&out, &["empty.csv", "empty"]);

    let unsorted = scratch("unsorted.csv", "0,add,a\n120000,add,b\n60000,add,c\n");
    let out = testnet(&["simulate", "--trace", unsorted.to_str().unwrap()]);
    assert_one_line_error(&out, &["unsorted.csv:3"]);

    let negative = scratch("negative.csv", "0,5\n60000,-2\n");
    let out = testnet(&["simulate", "--trace", negative.to_str().unwrap()]);
    assert_one_line_error(&out, &["negative.csv:2"]);

    let malformed = scratch("malformed.csv", "0,add,a\nnot a line\n");
    let out = testnet(&["simulate", "--trace", malformed.to_str().unwrap()]);
    assert_one_line_error(&out, &["malformed.csv:2"]);

    let profile = scratch("profile.csv", "model,train_batch_size\n");
    let out = testnet(&["simulate", "--profile", profile.to_str().unwrap()]);
    assert_one_line_error(&out, &["profile.csv:1"]);

    let out = testnet(&["simulate", "--strategies", "ideal,magic"]);
    assert_one_line_error(&out, &["magic"]);

    let out = testnet(&["simulate", "--price-spot", "0.9"]);
    assert_one_line_error(&out, &["--price-on-demand"]);
    let out = testnet(&["simulate", "--price-spot=-1", "--price-on-demand", "3"]);
    assert_one_line_error(&out, &["--price-spot \"-1\"", "from 0 to 1e6"]);
    let out = testnet(&["simulate", "--price-spot=0", "--price-on-demand", "3"]);
    assert_one_line_error(&out, &["spot price 0"]);
    let out = testnet(&[
        "simulate",
        "--price-spot",
        "a=0.9",
        "--price-on-demand",
        "3",
    ]);
    assert_one_line_error(&out, &["--price-spot ZONE=USD", "--zones"]);
}

#[test]
fn prices_give_every_strategy_its_bill_against_on_demand() {
    let (table, v) = simulate_json(
        &[
            "--strategies",
            "ideal,reactive,liveput-zone",
            "--price-spot",
            "0.918",
            "--price-on-demand",
            "3.06",
        ],
        "sim-money",
    );
    assert!(
        table.contains("machine-hours") && table.contains("saving"),
        "{table}"
    );
    let strategies = v["strategies"].as_array().unwrap();
    let hours = strategies[0]["cost"]["machine_hours"].as_f64().unwrap();
    assert!(hours > 0.0);
    for s in strategies {
        let cost = s["cost"].as_object().expect("a bill per strategy");
        assert_eq!(cost.len(), 4, "{cost:?}");
        // Every strategy holds the same machines; they differ in what they trained on them.
        assert_eq!(cost["machine_hours"].as_f64().unwrap(), hours);
        assert!((cost["cost"].as_f64().unwrap() - 0.918 * hours).abs() < 1e-9);
        let samples = s["samples"].as_f64().unwrap();
        let per_m = cost["cost_per_million_samples"].as_f64().unwrap();
        assert!((per_m - 0.918 * hours / samples * 1e6).abs() < 1e-6);
        let saving = cost["saving_vs_on_demand"].as_f64().unwrap();
        assert!(saving < 1.0, "{saving}");
    }
    let saving = |name: &str| {
        strategies.iter().find(|s| s["name"] == name).unwrap()["cost"]["saving_vs_on_demand"]
            .as_f64()
            .unwrap()
    };
    assert!(
        saving("ideal") >= saving("reactive"),
        "more samples on the same machines save more"
    );
}

#[test]
fn zones_run_the_fleet_strategies_with_their_bills_and_refuse_bad_zones() {
    let png = std::env::temp_dir().join(format!("sim-zones-{}.png", std::process::id()));
    let (_, v) = simulate_json(
        &[
            "--zones",
            "a=synthetic:quiet:1:nodes=12:days=1,b=synthetic:diurnal:2:nodes=12:days=1@1.5/24",
            "--zone-price",
            "a=0.9,b=1.2",
            "--end-hour",
            "3",
            "--plot",
            png.to_str().unwrap(),
        ],
        "sim-zones",
    );
    // The zones' plot: a PNG of 1200 x 1000 (the width and height of its IHDR chunk).
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(bytes[16..24], [0, 0, 4, 176, 0, 0, 3, 232]);
    assert_eq!(v["node_default"], "liveput-zone");
    assert_eq!(v["objective"], "samples");
    assert_eq!(v["intervals"], 180);
    assert_eq!(v["zones"][1]["speed"], 1.5);
    assert_eq!(v["zones"][1]["memory_gib"], 24.0);
    let strategies = v["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["liveput-zone", "zone-blind", "reactive", "single-zone-best"]
    );
    for s in strategies {
        let hours = s["node_hours"].as_f64().unwrap();
        let egress = s["egress_usd"].as_f64().unwrap();
        let cost = s["cost"].as_f64().unwrap();
        assert!(hours > 0.0 && egress >= 0.0, "{s}");
        // Node-hours at 0.9 or 1.2, plus egress.
        assert!(cost >= 0.9 * hours + egress - 1e-9 && cost <= 1.2 * hours + egress + 1e-9);
        let per_usd = s["samples_per_usd"].as_f64().unwrap();
        assert!((per_usd - s["samples"].as_f64().unwrap() / cost).abs() < 1e-6);
        // The ledger per pool adds up to the bill, each pool billed at most what it offered.
        let pools = s["pools"].as_array().unwrap();
        let billed: f64 = pools
            .iter()
            .map(|p| p["billed_node_hours"].as_f64().unwrap())
            .sum();
        let usd: f64 = pools.iter().map(|p| p["usd"].as_f64().unwrap()).sum();
        assert!(
            (billed - hours).abs() < 1e-9 && (usd + egress - cost).abs() < 1e-6,
            "{s}"
        );
        for p in pools {
            assert!(
                p["billed_node_hours"].as_f64() <= p["held_node_hours"].as_f64(),
                "{p}"
            );
        }
    }
    // Advice for each pool under the plan at the run's end.
    let advice = v["advice"].as_array().unwrap();
    assert_eq!(advice.len(), 2);
    for (a, pool) in advice.iter().zip(["a", "b"]) {
        assert_eq!(a["pool"], pool);
        let want = match (a["nodes_now"].as_u64(), a["nodes_used"].as_u64()) {
            (_, Some(0)) => "release",
            (now, used) if used >= now => "grow",
            _ => "keep",
        };
        assert_eq!(a["action"], want, "{a}");
    }
    let ours = strategies[0]["samples"].as_f64().unwrap();
    assert!(ours >= strategies[1]["samples"].as_f64().unwrap());
    assert!(ours >= strategies[3]["samples"].as_f64().unwrap());
    assert!(strategies[0]["x_zone_blind"].as_f64().unwrap() >= 1.0);
    assert!(strategies[3]["zone"].is_string());

    let out = testnet(&["simulate", "--zones", "A=synthetic:quiet"]);
    assert_one_line_error(&out, &["zone \"A=synthetic:quiet\"", "the name \"A\""]);
    let out = testnet(&["simulate", "--zones", "a=synthetic:quiet@fast"]);
    assert_one_line_error(&out, &["speed \"fast\""]);
    let out = testnet(&[
        "simulate",
        "--zones",
        "a=synthetic:quiet,b=synthetic:quiet",
        "--price-spot",
        "a=1",
    ]);
    assert_one_line_error(&out, &["--price-spot", "\"b\" has no price"]);
    let out = testnet(&["simulate", "--zones", "a=synthetic:quiet,a=synthetic:hh"]);
    assert_one_line_error(&out, &["pool \"a\" is named twice"]);
    let out = testnet(&["simulate", "--link", "a/b=1,1,0"]);
    assert_one_line_error(&out, &["--zones"]);
    let out = testnet(&["simulate", "--objective", "samples-per-dollar"]);
    assert_one_line_error(&out, &["--objective", "--zones"]);
    let out = testnet(&[
        "simulate",
        "--zones",
        "a=synthetic:quiet,b=synthetic:quiet",
        "--objective",
        "samples-per-dollar",
    ]);
    assert_one_line_error(&out, &["samples-per-dollar needs --price-spot"]);
}

#[test]
fn two_instance_types_of_one_zone_are_pools_priced_apart_that_pay_no_egress() {
    let (_, v) = simulate_json(
        &[
            "--zones",
            "a/p3.2xlarge=synthetic:quiet:1:nodes=12:days=1,\
             a/g5.2xlarge=synthetic:diurnal:2:nodes=12:days=1@1.5/24",
            "--price-spot",
            "a=0.9,a/g5.2xlarge=1.2",
            "--end-hour",
            "3",
        ],
        "sim-pools",
    );
    let zones = v["zones"].as_array().unwrap();
    let priced: Vec<(&str, f64)> = zones
        .iter()
        .map(|z| {
            let usd = z["usd_per_node_hour"].as_f64().unwrap();
            (z["name"].as_str().unwrap(), usd)
        })
        .collect();
    assert_eq!(priced, [("a/p3.2xlarge", 0.9), ("a/g5.2xlarge", 1.2)]);
    for s in v["strategies"].as_array().unwrap() {
        assert_eq!(s["egress_usd"].as_f64().unwrap(), 0.0, "{s}");
    }
    let ours = &v["strategies"][0];
    assert!(
        ours["x_single_zone_best"].as_f64().unwrap() >= 1.0,
        "{ours}"
    );
    let out = testnet(&[
        "simulate",
        "--zones",
        "a/p3=synthetic:quiet,b/p3=synthetic:quiet",
        "--price-spot",
        "a=1,c=2",
    ]);
    assert_one_line_error(&out, &["--price-spot \"c=2\"", "no zone or pool \"c\""]);
}

#[test]
fn diloco_between_the_pools_reports_its_rounds_and_bad_sync_modes_are_refused() {
    let zones = "a=synthetic:quiet:1:nodes=12:days=1,b=synthetic:quiet:2:nodes=12:days=1@1.5/24";
    let (_, v) = simulate_json(
        &[
            "--zones",
            zones,
            "--price-spot",
            "a=0.9,b=1.2",
            "--end-hour",
            "3",
            "--sync",
            "diloco:20",
            "--pseudo-gradient",
            "bf16",
        ],
        "sim-diloco",
    );
    let strategies = v["strategies"].as_array().unwrap();
    let by = |name: &str| strategies.iter().find(|s| s["name"] == name).unwrap();
    let (diloco, single) = (by("diloco:20"), by("single-zone-best"));
    assert_eq!(strategies.last().unwrap()["name"], "diloco:20");
    // Both pools train, each on its own: more samples than either alone, every node billed.
    let samples = |s: &serde_json::Value| s["samples"].as_f64().unwrap();
    assert!(
        samples(diloco) > 1.5 * samples(single),
        "{diloco} vs {single}"
    );
    assert_eq!(diloco["node_hours"], diloco["held_node_hours"]);
    let rounds = &diloco["rounds"];
    let (n, crossed) = (
        rounds["rounds"].as_f64().unwrap(),
        rounds["cross_zone_bytes"].as_f64().unwrap(),
    );
    assert!(n >= 1.0, "{rounds}");
    // Two groups: each sends the whole model once a round, two bytes a parameter (bf16),
    // gpt-1.5b's 1.5 B parameters or so.
    let per_round = crossed / n;
    assert!(
        (2.0 * 2.0 * 1.4e9..2.0 * 2.0 * 1.7e9).contains(&per_round),
        "{per_round}"
    );
    assert!(diloco["egress_usd"].as_f64().unwrap() > 0.0);
    assert!(single.get("rounds").is_none());
    // Auto, planned for samples: both pools join the rounds, H one of the planner's.
    let (_, v) = simulate_json(
        &["--zones", zones, "--end-hour", "3", "--sync", "auto"],
        "sim-auto",
    );
    let auto = v["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "auto")
        .unwrap()
        .clone();
    assert_eq!(auto["rounds"]["pools"], serde_json::json!(["a", "b"]));
    let h = auto["rounds"]["inner_steps"].as_u64().unwrap();
    assert!([20, 50, 100, 200, 500].contains(&h), "{auto}");
    // Refused as the command line is parsed: clap's error, exit code 2.
    let refused = |out: &Output, needles: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stderr: {err}");
        assert!(needles.iter().all(|n| err.contains(n)), "{err}");
    };
    let out = testnet(&["simulate", "--zones", zones, "--sync", "diloco:0"]);
    refused(&out, &["diloco:0", "inner steps must be 1 to"]);
    let out = testnet(&[
        "simulate",
        "--zones",
        zones,
        "--sync",
        "diloco:20",
        "--pseudo-gradient",
        "fp8",
    ]);
    refused(&out, &["fp8", "f32, bf16 or int8"]);
    let out = testnet(&["simulate", "--sync", "diloco:20"]);
    assert_one_line_error(&out, &["--sync diloco:H|auto", "--zones"]);
}

#[test]
fn plot_learning_draws_a_learn_report_and_refuses_anything_else() {
    let curve = |last: f64| {
        format!(
            "[{{\"samples\": 0, \"val_loss\": 4.2}}, {{\"samples\": 64, \"val_loss\": {last}}}]"
        )
    };
    let run = |sync: &str, seed: u64, last: f64| {
        format!(
            "{{\"sync\": \"{sync}\", \"seed\": {seed}, \"samples\": 64, \"curve\": {}, \
             \"val_loss_last\": {last}, \"cross_group_bytes\": 10, \"rounds\": 1, \"secs\": 1.0}}",
            curve(last)
        )
    };
    let report = format!(
        "{{\"model\": \"tiny\", \"d_model\": 32, \"n_blocks\": 2, \"seq_len\": 16, \
         \"params\": 30080, \"data\": \"synthetic\", \"groups\": 2, \"replicas\": 1, \
         \"stages\": 1, \"global_batch\": 16, \"micro_batch\": 4, \"lr\": 0.003, \
         \"outer_lr\": 0.7, \"outer_momentum\": 0.9, \"pseudo_gradient\": \"f32\", \
         \"runs\": [{}, {}, {}]}}",
        run("step", 1, 3.1),
        run("diloco:20", 1, 3.3),
        run("step", 2, 3.0)
    );
    let json = scratch("learn.json", &report);
    let png = json.with_extension("png");
    let out = testnet(&[
        "plot-learning",
        json.to_str().unwrap(),
        "--out",
        png.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.len() > 1000 && bytes.starts_with(b"\x89PNG"),
        "{}",
        bytes.len()
    );
    let bad = scratch("not-learn.json", "{\"runs\": 3}");
    let out = testnet(&[
        "plot-learning",
        bad.to_str().unwrap(),
        "--out",
        png.to_str().unwrap(),
    ]);
    assert_one_line_error(
        &out,
        &[
            "not-learn.json",
            "not a report of parcae-node learn or of a parcae-testnet run",
        ],
    );
}
