//! An actix-web server on a thread of its own on 127.0.0.1, for the fake services that a
//! harness or a test runs beside the nodes (cloud metadata): started on an ephemeral port,
//! stopped and joined when dropped.

use std::net::TcpListener;
use std::thread::JoinHandle;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer, web};

/// A running server; stopped when dropped.
pub struct BackgroundServer {
    handle: ServerHandle,
    url: String,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundServer {
    /// Serves the routes that `configure` adds, with one worker, on an ephemeral loopback port.
    pub fn start(
        configure: impl Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let (started, handle) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || App::new().configure(configure.clone()))
                    .workers(1)
                    .disable_signals()
                    .shutdown_timeout(0)
                    .listen(listener);
                match server {
                    Ok(server) => {
                        let running = server.run();
                        let _ = started.send(Ok(running.handle()));
                        let _ = running.await;
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                    }
                }
            });
        });
        let handle = handle
            .recv()
            .map_err(|_| std::io::Error::other("the server thread ended before it started"))??;
        Ok(Self {
            handle,
            url,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        // The stop command is sent by the call; its future only waits for completion, which
        // joining the thread does.
        drop(self.handle.stop(false));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
