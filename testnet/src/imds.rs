//! A local fake of the AWS instance metadata service (IMDSv2) for `--notice metadata`.
//!
//! One server per node: `PUT /latest/api/token` hands out a token, and
//! `GET /latest/meta-data/spot/instance-action` answers 404 until the testnet arms a deadline,
//! then `{"action": "terminate", "time": RFC 3339}` like AWS two minutes before a spot
//! interruption. The node's real metadata poller (`[notices] aws_base_url`) finds it there,
//! so the notice path under test is the one production uses.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use actix_web::{HttpRequest, HttpResponse, web};

use crate::background_http::BackgroundServer;

/// Token the fake hands out and requires.
const TOKEN: &str = "parcae-testnet-token";

/// The deadline the fake announces, once armed.
type Armed = Arc<Mutex<Option<SystemTime>>>;

/// A running fake metadata server; stopped when dropped.
pub struct FakeImds {
    server: BackgroundServer,
    deadline: Armed,
}

impl FakeImds {
    /// Starts a server on an ephemeral loopback port.
    pub fn start() -> std::io::Result<Self> {
        let deadline: Armed = Arc::default();
        let data = web::Data::from(deadline.clone());
        let server = BackgroundServer::start(move |cfg| {
            cfg.app_data(data.clone())
                .route("/latest/api/token", web::put().to(token))
                .route(
                    "/latest/meta-data/spot/instance-action",
                    web::get().to(instance_action),
                )
                .default_service(web::to(HttpResponse::BadRequest));
        })?;
        Ok(Self { server, deadline })
    }

    /// Base URL for the node's `aws_base_url`.
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
    let token = req.headers().get("X-aws-ec2-metadata-token");
    if token.is_none_or(|t| t.as_bytes() != TOKEN.as_bytes()) {
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
        let imds = FakeImds::start().unwrap();
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
