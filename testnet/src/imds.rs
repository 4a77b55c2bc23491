//! Local fakes of the clouds' instance metadata services, for `--notice metadata` and the
//! tests of the node's cloud detection.
//!
//! One server per node, speaking one cloud's dialect, as that cloud does:
//!
//! * AWS IMDSv2: `PUT /latest/api/token` hands out a token, and
//!   `GET /latest/meta-data/spot/instance-action` answers 404 until a deadline is armed, then
//!   `{"action": "terminate", "time": RFC 3339}` like AWS two minutes before a spot interruption.
//! * GCE: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` answers
//!   `FALSE`, then `TRUE` once armed (GCE states no deadline: it gives 30 s).
//! * Azure IMDS: `GET /metadata/instance` with `Metadata: true` describes the VM, and
//!   `GET /metadata/scheduledevents` lists a `Preempt` event with the deadline as `NotBefore`
//!   once armed.
//!
//! Each also says where its machine runs ([`FakeCloud::placement`]): AWS's
//! `placement/availability-zone` and `instance-type`, GCE's `instance/zone` and
//! `instance/machine-type` (resource paths), Azure's `GET /metadata/instance/compute`
//! (`location`, `zone`, `vmSize`).
//!
//! Anything else, or a request without the cloud's header, is refused as the real service
//! refuses it. The node's real pollers find the fakes through `[notices] *_base_url`, so the
//! notice path under test is the one production uses.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use actix_web::{HttpRequest, HttpResponse, web};

use crate::background_http::BackgroundServer;

/// Token the fake hands out and requires.
const TOKEN: &str = "parcae-testnet-token";

/// The deadline the fake announces, once armed.
type Armed = Arc<Mutex<Option<SystemTime>>>;

/// Which cloud a fake speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeCloud {
    /// AWS IMDSv2.
    Aws,
    /// The GCE metadata server.
    Gce,
    /// Azure IMDS with Scheduled Events.
    Azure,
}

impl FakeCloud {
    /// The zone and instance type a node reads from this fake.
    pub fn placement(self) -> (&'static str, &'static str) {
        match self {
            Self::Aws => ("us-east-1a", "p3.2xlarge"),
            Self::Gce => ("us-central1-a", "a2-highgpu-1g"),
            Self::Azure => ("eastus-1", "Standard_NC6s_v3"),
        }
    }
}

/// A running fake metadata server; stopped when dropped.
pub struct FakeMetadata {
    server: BackgroundServer,
    deadline: Armed,
}

impl FakeMetadata {
    /// Starts a fake of AWS's service on an ephemeral loopback port.
    pub fn aws() -> std::io::Result<Self> {
        Self::start(FakeCloud::Aws)
    }

    /// Starts a fake of `cloud`'s service on an ephemeral loopback port.
    pub fn start(cloud: FakeCloud) -> std::io::Result<Self> {
        let deadline: Armed = Arc::default();
        let data = web::Data::from(deadline.clone());
        let server = BackgroundServer::start(move |cfg| {
            cfg.app_data(data.clone());
            match cloud {
                FakeCloud::Aws => {
                    cfg.route("/latest/api/token", web::put().to(token))
                        .route(
                            "/latest/meta-data/spot/instance-action",
                            web::get().to(instance_action),
                        )
                        .route(
                            "/latest/meta-data/placement/availability-zone",
                            web::get().to(|req| aws_value(req, FakeCloud::Aws.placement().0)),
                        )
                        .route(
                            "/latest/meta-data/instance-type",
                            web::get().to(|req| aws_value(req, FakeCloud::Aws.placement().1)),
                        );
                }
                FakeCloud::Gce => {
                    let (zone, machine) = FakeCloud::Gce.placement();
                    cfg.route(
                        "/computeMetadata/v1/instance/preempted",
                        web::get().to(gce_preempted),
                    )
                    .route(
                        "/computeMetadata/v1/instance/zone",
                        web::get()
                            .to(move |req| gce_value(req, format!("projects/1/zones/{zone}"))),
                    )
                    .route(
                        "/computeMetadata/v1/instance/machine-type",
                        web::get().to(move |req| {
                            gce_value(req, format!("projects/1/machineTypes/{machine}"))
                        }),
                    );
                }
                FakeCloud::Azure => {
                    cfg.route("/metadata/instance", web::get().to(azure_instance))
                        .route("/metadata/instance/compute", web::get().to(azure_compute))
                        .route("/metadata/scheduledevents", web::get().to(azure_events));
                }
            }
            cfg.default_service(web::to(HttpResponse::NotFound));
        })?;
        Ok(Self { server, deadline })
    }

    /// Base URL for the node's `[notices] *_base_url`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// From now on, announce a termination at `deadline`.
    pub fn arm(&self, deadline: SystemTime) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
    }
}

/// `PUT /latest/api/token`: a token for any request that asks for a TTL, as IMDSv2.
async fn token(req: HttpRequest) -> HttpResponse {
    if req
        .headers()
        .contains_key("X-aws-ec2-metadata-token-ttl-seconds")
    {
        HttpResponse::Ok().body(TOKEN)
    } else {
        HttpResponse::BadRequest().finish()
    }
}

/// `GET /latest/meta-data/spot/instance-action`: 401 without the token, 404 until armed, then
/// the termination notice.
async fn instance_action(
    req: HttpRequest,
    deadline: web::Data<Mutex<Option<SystemTime>>>,
) -> HttpResponse {
    if !has_header(&req, "X-aws-ec2-metadata-token", TOKEN) {
        return HttpResponse::Unauthorized().finish();
    }
    match *deadline.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(at) => HttpResponse::Ok().body(format!(
            r#"{{"action": "terminate", "time": "{}"}}"#,
            rfc3339(at)
        )),
        None => HttpResponse::NotFound().body("Not Found"),
    }
}

/// An AWS metadata value: 401 without the token.
async fn aws_value(req: HttpRequest, value: &'static str) -> HttpResponse {
    if !has_header(&req, "X-aws-ec2-metadata-token", TOKEN) {
        return HttpResponse::Unauthorized().finish();
    }
    HttpResponse::Ok().body(value)
}

/// A GCE metadata value; 403 without `Metadata-Flavor: Google`, as GCE.
async fn gce_value(req: HttpRequest, value: String) -> HttpResponse {
    if !has_header(&req, "Metadata-Flavor", "Google") {
        return HttpResponse::Forbidden().finish();
    }
    HttpResponse::Ok()
        .insert_header(("Metadata-Flavor", "Google"))
        .body(value)
}

/// Azure's `compute` part of the VM's description: region, zone number and size.
async fn azure_compute(req: HttpRequest) -> HttpResponse {
    if !has_header(&req, "Metadata", "true") {
        return HttpResponse::BadRequest().finish();
    }
    let (zone, size) = FakeCloud::Azure.placement();
    let (location, number) = zone.rsplit_once('-').unwrap_or((zone, ""));
    HttpResponse::Ok()
        .content_type("application/json")
        .body(format!(
            r#"{{"name": "parcae-fake", "priority": "Spot", "location": "{location}", "zone": "{number}", "vmSize": "{size}"}}"#
        ))
}

/// The GCE preemption flag; 403 without `Metadata-Flavor: Google`, as GCE.
async fn gce_preempted(
    req: HttpRequest,
    deadline: web::Data<Mutex<Option<SystemTime>>>,
) -> HttpResponse {
    if !has_header(&req, "Metadata-Flavor", "Google") {
        return HttpResponse::Forbidden().finish();
    }
    let armed = deadline.lock().unwrap_or_else(|p| p.into_inner()).is_some();
    HttpResponse::Ok()
        .insert_header(("Metadata-Flavor", "Google"))
        .body(if armed { "TRUE" } else { "FALSE" })
}

/// Azure's description of the VM; 400 without `Metadata: true`, as Azure.
async fn azure_instance(req: HttpRequest) -> HttpResponse {
    if !has_header(&req, "Metadata", "true") {
        return HttpResponse::BadRequest().finish();
    }
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"compute": {"name": "parcae-fake", "priority": "Spot"}}"#)
}

/// Azure Scheduled Events: none until armed, then one `Preempt` with the deadline.
async fn azure_events(
    req: HttpRequest,
    deadline: web::Data<Mutex<Option<SystemTime>>>,
) -> HttpResponse {
    if !has_header(&req, "Metadata", "true") {
        return HttpResponse::BadRequest().finish();
    }
    let events = match *deadline.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(at) => format!(
            r#"[{{"EventId": "fake-1", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["parcae-fake"], "EventStatus": "Scheduled", "NotBefore": "{}"}}]"#,
            httpdate::fmt_http_date(at)
        ),
        None => "[]".into(),
    };
    HttpResponse::Ok()
        .content_type("application/json")
        .body(format!(
            r#"{{"DocumentIncarnation": 1, "Events": {events}}}"#
        ))
}

fn has_header(req: &HttpRequest, name: &str, value: &str) -> bool {
    req.headers()
        .get(name)
        .is_some_and(|v| v.as_bytes() == value.as_bytes())
}

/// `YYYY-MM-DDTHH:MM:SSZ` as AWS writes it, truncated to the whole second: the announced
/// deadline is never later than the SIGKILL the testnet enforces, so a node that trusts it is
/// never killed in the middle of its hand-off.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_matches_aws_and_truncates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_505_722_920);
        assert_eq!(rfc3339(t), "2017-09-18T08:22:00Z");
        assert_eq!(
            rfc3339(t + Duration::from_millis(999)),
            "2017-09-18T08:22:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn serves_404_until_armed_then_the_deadline() {
        let imds = FakeMetadata::aws().unwrap();
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build(),
        );
        let token = agent
            .put(&format!("{}/latest/api/token", imds.url()))
            .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
            .send_empty()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let action = || {
            let mut r = agent
                .get(&format!(
                    "{}/latest/meta-data/spot/instance-action",
                    imds.url()
                ))
                .header("X-aws-ec2-metadata-token", &token)
                .call()
                .unwrap();
            (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
        };
        assert_eq!(action().0, 404);
        imds.arm(UNIX_EPOCH + Duration::from_secs(1_505_722_920));
        let (code, body) = action();
        assert_eq!(code, 200);
        assert_eq!(
            body,
            r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#
        );
        let unauth = agent
            .get(&format!(
                "{}/latest/meta-data/spot/instance-action",
                imds.url()
            ))
            .call()
            .unwrap();
        assert_eq!(unauth.status().as_u16(), 401);
    }
}
