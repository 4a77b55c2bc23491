//! Cloud preemption notices: a local fake AWS metadata server (IMDSv2) triggers the same flow as
//! SIGTERM: gossip, `Notice` in raft, exit 0 at the deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parcae_tests::{TEST_CONFIG, TestCluster, serial, wait_for};

/// Formats a Unix time as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, Howard Hinnant).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).expect("after epoch").as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Serves IMDSv2: a token for PUT /latest/api/token, then instance-action (404 until a deadline
/// is armed). Requests without the token are refused with 401, like the real service.
fn fake_imds(armed: Arc<Mutex<Option<SystemTime>>>) -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("fake imds");
    let addr = server.server_addr().to_ip().expect("ip");
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let has = |name: &str, value: Option<&str>| {
                req.headers().iter().any(|h| {
                    h.field.as_str().as_str().eq_ignore_ascii_case(name)
                        && value.is_none_or(|v| h.value.as_str() == v)
                })
            };
            let (code, body) = match (req.method(), req.url()) {
                (tiny_http::Method::Put, "/latest/api/token")
                    if has("X-aws-ec2-metadata-token-ttl-seconds", None) =>
                {
                    (200, "test-token".to_string())
                }
                (tiny_http::Method::Get, "/latest/meta-data/spot/instance-action") => {
                    if !has("X-aws-ec2-metadata-token", Some("test-token")) {
                        (401, String::new())
                    } else if let Some(deadline) = *armed.lock().expect("lock") {
                        (
                            200,
                            format!(
                                r#"{{"action": "terminate", "time": "{}"}}"#,
                                rfc3339(deadline)
                            ),
                        )
                    } else {
                        (404, "Not Found".to_string())
                    }
                }
                _ => (400, String::new()),
            };
            let _ = req.respond(tiny_http::Response::from_string(body).with_status_code(code));
        }
    });
    format!("http://{addr}")
}

#[test]
fn fake_aws_spot_notice_triggers_the_notice_flow() {
    let _serial = serial();
    let armed = Arc::new(Mutex::new(None));
    let imds = fake_imds(armed.clone());

    let mut c = TestCluster::start(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let spot = c.spawn_with_config(
        &[founder],
        &format!("{TEST_CONFIG}[notices]\npoll_interval_ms = 200\naws_base_url = \"{imds}\"\n"),
    );
    c.wait_converged(&[0, 1, 2, spot], 4, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("spot node did not join\n{}", c.logs()));
    let peer = c.nodes[spot].peer_id().expect("peer id");
    assert!(
        c.nodes[spot].running(),
        "404 from the metadata service means no notice"
    );

    let deadline = SystemTime::now() + Duration::from_secs(20);
    *armed.lock().expect("lock") = Some(deadline);
    let deadline_ms = deadline
        .duration_since(UNIX_EPOCH)
        .expect("epoch")
        .as_secs()
        * 1000;
    for i in 0..3 {
        wait_for(Duration::from_secs(5), || {
            let s = c.nodes[i].status()?;
            let gossiped = s["notices"].as_array()?.iter().any(|n| {
                n["peer_id"] == peer.as_str() && n["deadline_unix_ms"].as_u64() == Some(deadline_ms)
            });
            let replicated = s["members"].as_array()?.iter().any(|m| {
                m["peer_id"] == peer.as_str()
                    && m["status"] == "leaving"
                    && m["deadline_unix_ms"].as_u64() == Some(deadline_ms)
            });
            (gossiped && replicated).then_some(())
        })
        .unwrap_or_else(|| panic!("node {i} did not learn the AWS notice\n{}", c.logs()));
    }
    let s = c.nodes[spot].status().expect("status");
    assert_eq!(s["leaving_deadline_unix_ms"].as_u64(), Some(deadline_ms));
    assert!(
        c.nodes[spot].running(),
        "the node serves until its deadline"
    );
}

#[test]
fn rfc3339_formatting_matches_aws() {
    let t = UNIX_EPOCH + Duration::from_secs(1_505_722_920);
    assert_eq!(rfc3339(t), "2017-09-18T08:22:00Z");
}
