//! The status server's accept loop: every connection is accepted at once and either served or
//! closed by the [`Admission`] ledger, so the listen backlog never fills behind idle sockets
//! and a refused client learns it immediately. Each admitted connection is one task running
//! actix-http's HTTP/1 dispatcher (request-head timeout, keep-alive limit, at most 16
//! pipelined requests buffered) behind [`Backpressure`], which reads no request while an answer
//! waits for a client that does not read; a connection also ends when evicted or after [`MAX_CONNECTION_LIFE`], so a client
//! that stops reading holds its place for a bounded time.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_http::HttpService;
use actix_service::{Service, ServiceFactory, map_config};
use actix_web::App;
use actix_web::dev::AppConfig;
use futures::channel::oneshot;
use tokio::net::{TcpListener, TcpStream};

use super::admission::{Admission, ConnectionId, Decision};
use super::backpressure::Backpressure;
use super::routes::routes;
use crate::metrics::Metrics;
use crate::net::log_limit::LogLimit;
use crate::status::Published;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 256;
/// Connections one source address may hold.
pub const MAX_PER_SOURCE: usize = 16;
/// Time a client has to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time an idle keep-alive connection stays open.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Time a client has to read the end of a response before its connection is dropped.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest any connection is served: these endpoints answer at once, so only a client that
/// stopped reading gets near it.
pub const MAX_CONNECTION_LIFE: Duration = Duration::from_secs(30);
/// Pause after a failed accept (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

type Closers = Rc<RefCell<HashMap<ConnectionId, oneshot::Sender<()>>>>;

/// Serves the routes on `listener` until the process ends. Runs on an actix system of its own.
pub async fn serve(listener: std::net::TcpListener, json: Published, metrics: Arc<Metrics>) {
    let addr = listener.local_addr().ok();
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => return tracing::error!(?addr, "status server cannot listen: {e}"),
    };
    let app = App::new().configure(routes(json, metrics.clone()));
    let factory = HttpService::<Backpressure<TcpStream>, _, _>::build()
        .client_request_timeout(REQUEST_TIMEOUT)
        .client_disconnect_timeout(DISCONNECT_TIMEOUT)
        .keep_alive(KEEP_ALIVE)
        .h1(map_config(app, |_| AppConfig::default()));
    let handler = match factory.new_service(()).await {
        Ok(handler) => Rc::new(handler),
        Err(()) => return tracing::error!(?addr, "status server could not start its service"),
    };
    let ledger = Rc::new(RefCell::new(Admission::new(
        MAX_CONNECTIONS,
        MAX_PER_SOURCE,
    )));
    let closers: Closers = Rc::default();
    let mut accept_errors = LogLimit::<()>::new(Duration::from_secs(60));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(held) = accept_errors.allow(&(), Instant::now()) {
                    tracing::warn!(?addr, held_back = held, "status server cannot accept: {e}");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let id = match ledger.borrow_mut().arrive(peer.ip()) {
            Decision::Refuse => {
                metrics.http_refused_total.inc();
                continue;
            }
            Decision::Admit(id) => id,
            Decision::AdmitEvicting { id, evict } => {
                metrics.http_evicted_total.inc();
                if let Some(close) = closers.borrow_mut().remove(&evict) {
                    let _ = close.send(());
                }
                id
            }
        };
        metrics.http_connections.set(ledger.borrow().open() as u64);
        let (close, closed) = oneshot::channel();
        closers.borrow_mut().insert(id, close);
        let _ = stream.set_nodelay(true);
        let served = handler.call((Backpressure::new(stream), Some(peer)));
        let (ledger, closers, metrics) = (ledger.clone(), closers.clone(), metrics.clone());
        actix::spawn(async move {
            tokio::select! {
                _ = served => {}
                _ = closed => {}
                _ = tokio::time::sleep(MAX_CONNECTION_LIFE) => {}
            }
            ledger.borrow_mut().leave(peer.ip(), id);
            closers.borrow_mut().remove(&id);
            metrics.http_connections.set(ledger.borrow().open() as u64);
        });
    }
}

/// Binds `addr` (non-blocking, for tokio).
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}
