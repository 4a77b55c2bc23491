//! Bad trace input: one-line errors naming the file, the line and the problem; never a panic.

use parcae_strategies::trace::{self, TraceErrorKind};
use proptest::prelude::*;

/// The one-line message of parsing `text` as `file`, which must fail.
fn error(text: &str, file: &str) -> String {
    let e = trace::parse_str(text, file, 60).expect_err("must fail");
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "{msg:?}");
    msg
}

#[test]
fn messages_name_file_line_and_problem() {
    let cases = [
        (
            "0,add,a\n60000,add,b\n59000,remove,a\n",
            "p3bad.csv:3: timestamps not sorted (59000 after 60000)",
        ),
        ("0,3\n60000,-1\n", "c.csv:2: negative count -1"),
        (
            "0,add,a\n60000,boom,a\n",
            "e.csv:2: unknown op \"boom\" (expected add or remove)",
        ),
        (
            "0,add,a\n60000,remove,b\n",
            "e.csv:2: remove of unknown node \"b\"",
        ),
        (
            "0,add,a\n0,add,a\n",
            "e.csv:2: add of node \"a\" which is already alive",
        ),
        (
            "0,remove,a\n",
            "e.csv:1: node count would go negative (0 alive, 1 removed)",
        ),
        (
            "0,add,a\nx60000,add,b\n",
            "e.csv:2: malformed line \"x60000,add,b\": timestamp is not an integer (ms)",
        ),
        (
            "0,add,a\n60000,add\n",
            "e.csv:2: malformed line \"60000,add\": expected 3 fields `t_ms,add|remove,name`",
        ),
        (
            "0,add,a\n-5,add,b\n",
            "e.csv:2: malformed line \"-5,add,b\": negative timestamp",
        ),
        (
            "0,4\n60000,3,1\n",
            "c.csv:2: malformed line \"60000,3,1\": expected 2 fields `t_ms,count`",
        ),
        ("", "x.csv: empty trace (no events)"),
        (
            "t_ms,count\n\n# nothing\n",
            "x.csv: empty trace (no events)",
        ),
        (
            "0;1;2\n",
            "x.csv:1: unknown trace format: \"0;1;2\" is neither `t_ms,add|remove,name`, `t_ms,count` nor a JSON array",
        ),
        (
            "[0, \"add\", {\"nodes\": [\"n0\"]}]\n[60000, \"jump\", {}]\n",
            "r.txt:2: unknown op \"jump\" (expected add, remove, migration or no-op)",
        ),
        (
            "[0, \"add\", {\"nodes\": [\"n0\"]}]\n[60000, \"remove\", {\"nodes\": [\"n1\"]}]\n",
            "r.txt:2: remove of unknown node \"n1\"",
        ),
        (
            "[0, \"add\", {}]\n",
            "r.txt:1: malformed line \"[0, \\\"add\\\", {}]\": add/remove without a \"nodes\" array",
        ),
    ];
    for (text, want) in cases {
        let file = want.split(':').next().unwrap();
        assert_eq!(error(text, file), want);
    }
}

#[test]
fn control_characters_stay_escaped() {
    let msg = error("0,add,a\n1,ad\u{1b}d,b\r\n", "we\nird.csv");
    assert_eq!(
        msg,
        "we\\nird.csv:2: unknown op \"ad\\u{1b}d\" (expected add or remove)"
    );
}

#[test]
fn unreadable_file_and_bad_specs() {
    let e = trace::load("/nonexistent/p3.csv", 60).unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::Unreadable(_)));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/p3.csv: cannot read: "),
        "{e}"
    );
    let dir = std::env::temp_dir();
    let e = trace::load(dir.to_str().unwrap(), 60).unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
    assert_eq!(
        trace::load("synthetic:xx", 60).unwrap_err().to_string(),
        "synthetic:xx: invalid synthetic trace spec: unknown band \"xx\" (expected hh, hl, lh or ll, or a multi-day zone: quiet, outage, diurnal or shifting)"
    );
    assert!(trace::load("synthetic:hh:7:nodes=0", 60).is_err());
    assert!(trace::load("synthetic:hh:7:colour=red", 60).is_err());
    assert_eq!(
        trace::parse_str("0,1\n", "c.csv", 0)
            .unwrap_err()
            .to_string(),
        "c.csv: invalid interval length 0 s (expected 1 to 86400)"
    );
}

#[test]
fn size_limits_hold() {
    let huge = "0".repeat(trace::MAX_INPUT_BYTES + 1);
    let e = trace::parse_str(&huge, "big.csv", 60).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "big.csv: input larger than the limit of {} bytes",
            trace::MAX_INPUT_BYTES
        )
    );
    // A far-away timestamp would otherwise pad billions of empty intervals.
    let e = trace::parse_str("0,1\n999999999999999,2\n", "c.csv", 60).unwrap_err();
    assert_eq!(e.kind, TraceErrorKind::TooLong);
    let e = trace::parse_str("0,4000000000\n", "c.csv", 60).unwrap_err();
    assert!(matches!(e.kind, TraceErrorKind::TooManyNodes(_)), "{e}");
}

#[test]
fn non_utf8_file_names_its_line() {
    let path =
        std::env::temp_dir().join(format!("parcae-trace-bad-utf8-{}.csv", std::process::id()));
    std::fs::write(&path, b"0,1\n60000,2\n\xff\xfe,3\n").unwrap();
    let e = trace::load(path.to_str().unwrap(), 60).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!((e.line, e.kind), (Some(3), TraceErrorKind::NotUtf8));
}

/// Lines that look almost right, to reach deep into every parser.
fn near_line() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            0u64..200_000,
            prop::sample::select(vec!["add", "remove", "boom", ""]),
            "[a-c]{0,2}"
        )
            .prop_map(|(t, op, n)| format!("{t},{op},{n}")),
        (-5i64..200_000, -3i64..40).prop_map(|(t, c)| format!("{t},{c}")),
        (
            0u64..200_000,
            prop::sample::select(vec!["add", "remove", "no-op", "migration", "x"]),
            "[a-c]{0,2}"
        )
            .prop_map(|(t, op, n)| format!("[{t}, \"{op}\", {{\"nodes\": [\"{n}\"]}}]")),
        ".{0,30}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = trace::parse_str(&text, "fuzz", 60) {
            prop_assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn random_lines_never_panic_and_stay_consistent(
        lines in prop::collection::vec(near_line(), 0..30),
        secs in 1u64..200,
        grid in any::<bool>(),
    ) {
        let options = trace::ParseOptions {
            interval_secs: secs,
            binning: if grid { trace::Binning::Grid } else { trace::Binning::Records },
        };
        match trace::parse_str_with(&lines.join("\n"), "fuzz", &options) {
            Ok(t) => {
                prop_assert!(!t.is_empty());
                for (k, iv) in t.intervals.iter().enumerate() {
                    prop_assert_eq!(iv.nodes + iv.removed, t.nodes_before(k) + iv.added);
                }
            }
            Err(e) => prop_assert!(!e.to_string().contains('\n')),
        }
    }
}
