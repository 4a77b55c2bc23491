use super::*;
use parcae_testnet::background_http::BackgroundServer;
use std::time::UNIX_EPOCH;

/// A fake metadata server answering `status` and `body` to every request that carries
/// `header`, 403 otherwise; stopped when dropped.
fn fake(header: (&'static str, &'static str), status: u16, body: &'static str) -> BackgroundServer {
    use actix_web::http::StatusCode;
    use actix_web::{HttpRequest, HttpResponse, web};
    BackgroundServer::start(move |cfg| {
        cfg.default_service(web::to(move |req: HttpRequest| async move {
            let ok = req
                .headers()
                .get(header.0)
                .is_some_and(|v| v.as_bytes() == header.1.as_bytes());
            if ok {
                HttpResponse::build(StatusCode::from_u16(status).expect("status")).body(body)
            } else {
                HttpResponse::Forbidden().finish()
            }
        }));
    })
    .expect("fake metadata server")
}

#[test]
fn gce_preempted_flag() {
    let t = Duration::from_secs(2);
    let yes = fake(("Metadata-Flavor", "Google"), 200, "TRUE");
    let n = GcePoller::new(yes.url(), t).check().unwrap().unwrap();
    assert_eq!(n.source, NoticeSource::Gce);
    assert!(n.deadline > SystemTime::now());
    let no = fake(("Metadata-Flavor", "Google"), 200, "FALSE");
    assert_eq!(GcePoller::new(no.url(), t).check().unwrap(), None);
    let junk = fake(("Metadata-Flavor", "Google"), 200, "maybe");
    assert!(matches!(
        GcePoller::new(junk.url(), t).check(),
        Err(PollError::Parse { .. })
    ));
}

#[test]
fn azure_scheduled_events() {
    let t = Duration::from_secs(2);
    let preempt = fake(
        ("Metadata", "true"),
        200,
        r#"{"DocumentIncarnation": 1, "Events": [{"EventId": "x", "EventType": "Preempt", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}"#,
    );
    let n = AzurePoller::new(preempt.url(), t).check().unwrap().unwrap();
    assert_eq!(n.source, NoticeSource::Azure);
    let reboot = fake(
        ("Metadata", "true"),
        200,
        r#"{"Events": [{"EventType": "Reboot"}]}"#,
    );
    assert_eq!(AzurePoller::new(reboot.url(), t).check().unwrap(), None);
    let broken = fake(("Metadata", "true"), 500, "");
    assert!(matches!(
        AzurePoller::new(broken.url(), t).check(),
        Err(PollError::Status { status: 500, .. })
    ));
}

#[test]
fn azure_deadlines_come_from_not_before() {
    let now = UNIX_EPOCH + Duration::from_secs(1_474_309_787); // 18:29:47 GMT
    let later = azure_deadline("Mon, 19 Sep 2016 18:30:17 GMT", now);
    assert_eq!(later.duration_since(now).unwrap(), Duration::from_secs(30));
    assert_eq!(azure_deadline("", now), now + DEFAULT_LEAD);
    assert_eq!(
        azure_deadline("Mon, 19 Sep 2016 18:29:00 GMT", now),
        now + DEFAULT_LEAD,
        "a past NotBefore"
    );
    assert_eq!(azure_deadline("soon", now), now + DEFAULT_LEAD);
}

#[test]
fn each_cloud_answers_its_own_probe_and_no_other() {
    use parcae_testnet::imds::{FakeCloud, FakeMetadata};
    let t = Duration::from_secs(2);
    for fake in [FakeCloud::Aws, FakeCloud::Gce, FakeCloud::Azure] {
        let server = FakeMetadata::start(fake).unwrap();
        let url = server.url();
        let answers = [
            AwsPoller::new(url, t).answers(),
            GcePoller::new(url, t).answers(),
            AzurePoller::new(url, t).answers(),
        ];
        let expected = [
            fake == FakeCloud::Aws,
            fake == FakeCloud::Gce,
            fake == FakeCloud::Azure,
        ];
        assert_eq!(answers, expected, "{fake:?}");
    }
}

#[test]
fn each_cloud_says_where_its_machine_runs() {
    use parcae_testnet::imds::{FakeCloud, FakeMetadata};
    let t = Duration::from_secs(2);
    for fake in [FakeCloud::Aws, FakeCloud::Gce, FakeCloud::Azure] {
        let server = FakeMetadata::start(fake).unwrap();
        let url = server.url();
        let read = match fake {
            FakeCloud::Aws => AwsPoller::new(url, t).placement(),
            FakeCloud::Gce => GcePoller::new(url, t).placement(),
            FakeCloud::Azure => AzurePoller::new(url, t).placement(),
        };
        let (zone, instance_type) = fake.placement();
        let expected = CloudPlacement {
            zone: zone.into(),
            instance_type: instance_type.into(),
        };
        assert_eq!(read.unwrap(), expected, "{fake:?}");
    }
    let junk = fake(("Metadata", "true"), 200, r#"{"location": 7}"#);
    assert!(matches!(
        AzurePoller::new(junk.url(), t).placement(),
        Err(PollError::Parse { .. })
    ));
    let refused = fake(("Metadata-Flavor", "Google"), 500, "");
    assert!(matches!(
        GcePoller::new(refused.url(), t).placement(),
        Err(PollError::Status { status: 500, .. })
    ));
}

#[test]
fn the_fakes_announce_what_the_pollers_read() {
    use parcae_testnet::imds::{FakeCloud, FakeMetadata};
    let t = Duration::from_secs(2);
    let deadline = SystemTime::now() + Duration::from_secs(90);
    let gce = FakeMetadata::start(FakeCloud::Gce).unwrap();
    let azure = FakeMetadata::start(FakeCloud::Azure).unwrap();
    assert_eq!(GcePoller::new(gce.url(), t).check().unwrap(), None);
    assert_eq!(AzurePoller::new(azure.url(), t).check().unwrap(), None);
    gce.arm(deadline);
    azure.arm(deadline);
    let g = GcePoller::new(gce.url(), t).check().unwrap().unwrap();
    assert_eq!(g.source, NoticeSource::Gce);
    let a = AzurePoller::new(azure.url(), t).check().unwrap().unwrap();
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(
        secs(a.deadline),
        secs(deadline),
        "Azure states its deadline"
    );
}

#[test]
fn unreachable_endpoint_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    assert!(matches!(
        AwsPoller::new(&base, Duration::from_millis(500)).check(),
        Err(PollError::Http { .. })
    ));
}

#[test]
fn parses_aws_times() {
    let t = parse_rfc3339_utc("2017-09-18T08:22:00Z").unwrap();
    assert_eq!(
        t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
        1_505_722_920
    );
    let t = parse_rfc3339_utc("1970-01-01T00:00:01.500Z").unwrap();
    assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 1);
    assert!(parse_rfc3339_utc("2017-13-18T08:22:00Z").is_none());
    assert!(parse_rfc3339_utc("garbage").is_none());
    assert!(parse_rfc3339_utc("2017-09-18T08:22:00").is_none());
}
