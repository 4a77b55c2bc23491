//! A local fake of the AWS instance metadata service (IMDSv2) for `--notice metadata`.
//!
//! One server per node: `PUT /latest/api/token` hands out a token, and
//! `GET /latest/meta-data/spot/instance-action` answers 404 until the testnet arms a deadline,
//! then `{"action": "terminate", "time": RFC 3339}` like AWS two minutes before a spot
//! interruption. The node's real metadata poller (`[notices] aws_base_url`) finds it there,
//! so the notice path under test is the one production uses.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// Token the fake hands out and requires.
const TOKEN: &str = "parcae-testnet-token";

/// A running fake metadata server; stopped when dropped.
pub struct FakeImds {
    server: Arc<tiny_http::Server>,
    deadline: Arc<Mutex<Option<SystemTime>>>,
    url: String,
    thread: Option<JoinHandle<()>>,
}

impl FakeImds {
    /// Starts a server on an ephemeral loopback port.
    pub fn start() -> std::io::Result<Self> {
        let server = tiny_http::Server::http("127.0.0.1:0")
            .map(Arc::new)
            .map_err(std::io::Error::other)?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| std::io::Error::other("metadata server has no IP address"))?;
        let deadline = Arc::new(Mutex::new(None));
        let thread = {
            let server = server.clone();
            let deadline = deadline.clone();
            std::thread::spawn(move || serve(&server, &deadline))
        };
        Ok(Self {
            server,
            deadline,
            url: format!("http://{addr}"),
            thread: Some(thread),
        })
    }

    /// Base URL for the node's `aws_base_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// From now on, announce a termination at `deadline`.
    pub fn arm(&self, deadline: SystemTime) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
    }
}

impl Drop for FakeImds {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, deadline: &Mutex<Option<SystemTime>>) {
    for req in server.incoming_requests() {
        let header = |name: &str| {
            req.headers()
                .iter()
                .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
                .map(|h| h.value.as_str().to_string())
        };
        let armed = *deadline.lock().unwrap_or_else(|p| p.into_inner());
        let (code, body) = match (req.method(), req.url()) {
            (tiny_http::Method::Put, "/latest/api/token")
                if header("X-aws-ec2-metadata-token-ttl-seconds").is_some() =>
            {
                (200, TOKEN.to_string())
            }
            (tiny_http::Method::Get, "/latest/meta-data/spot/instance-action") => {
                match (header("X-aws-ec2-metadata-token").as_deref(), armed) {
                    (Some(TOKEN), Some(at)) => (
                        200,
                        format!(r#"{{"action": "terminate", "time": "{}"}}"#, rfc3339(at)),
                    ),
                    (Some(TOKEN), None) => (404, "Not Found".to_string()),
                    _ => (401, String::new()),
                }
            }
            _ => (400, String::new()),
        };
        let _ = req.respond(tiny_http::Response::from_string(body).with_status_code(code));
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
