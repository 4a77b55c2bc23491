//! The node's HTTP endpoints, on actix-web: `/status` and `/steps` (JSON, rendered by the
//! [`Status`](crate::status::Status) actor into shared cells), `/metrics` (OpenMetrics), and the
//! orchestrators' probes: `/healthz` (200 while the process serves) and `/readyz` (200 when the
//! node is a member of a cluster with a leader and trains or is ready to, else 503 and why; see
//! [`readiness`](crate::status::readiness)).
//!
//! The server reads only those cells and the metrics atomics, on a thread of its own, so no
//! client can block an actor. Clients are untrusted: connections are capped in all and per
//! source address, fairly ([`admission`]); a request head must arrive within 5 s, idle
//! keep-alive connections close after 5 s, no connection lives past
//! [`accept::MAX_CONNECTION_LIFE`], and only `GET` on these paths is served.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::status::Published;

mod accept;
mod admission;
mod backpressure;
mod routes;

pub use accept::{MAX_PER_SOURCE, REQUEST_TIMEOUT};

/// Why the HTTP server could not start.
#[derive(Debug, thiserror::Error)]
#[error("status server on {addr}: {source}")]
pub struct HttpError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Binds the server and serves it on a thread of its own (with its own actix system, so no
/// client can slow an actor); returns the bound address (useful with port 0).
pub fn serve_http(
    addr: SocketAddr,
    json: Published,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, HttpError> {
    let error = |source| HttpError { addr, source };
    let listener = accept::bind(addr).map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    std::thread::Builder::new()
        .name("status-http".into())
        .spawn(move || actix::System::new().block_on(accept::serve(listener, json, metrics)))
        .map_err(error)?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_server_serves_the_cells_and_refuses_slow_clients() {
        use std::io::{Read, Write};
        let json = Published::default();
        *json.status.write().unwrap() = r#"{"role":"leader"}"#.into();
        let addr = serve_http(
            "127.0.0.1:0".parse().unwrap(),
            json,
            Arc::new(Metrics::default()),
        )
        .unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client
            .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with(r#"{"role":"leader"}"#), "{answer}");
        // A client that never finishes its request head is dropped after the timeout.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /status HTTP/1.1\r\n").unwrap();
        slow.set_read_timeout(Some(accept::REQUEST_TIMEOUT * 3))
            .unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
        assert!(
            started.elapsed() < accept::REQUEST_TIMEOUT * 3,
            "the slow client was not dropped"
        );
        let head = String::from_utf8_lossy(&rest);
        assert!(
            head.is_empty() || head.starts_with("HTTP/1.1 408"),
            "{head}"
        );
    }
}
