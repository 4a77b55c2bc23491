//! A connection that reads no request while its answers cannot be written. actix-http's
//! HTTP/1 dispatcher answers pipelined requests into a write buffer that grows while the client
//! does not read; with this adapter a client that sends 200,000 requests and reads none holds
//! only the answers to what it sent before the socket filled, not all of them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `S` with reads held back while the last write found the socket full.
#[derive(Debug)]
pub struct Backpressure<S> {
    inner: S,
    write_blocked: bool,
}

impl<S> Backpressure<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            write_blocked: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Backpressure<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.write_blocked {
            // The pending write registered for the socket's writability; the write that
            // succeeds wakes this task to read again.
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Backpressure<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        match &written {
            Poll::Pending => self.write_blocked = true,
            Poll::Ready(_) if self.write_blocked => {
                self.write_blocked = false;
                cx.waker().wake_by_ref();
            }
            Poll::Ready(_) => {}
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_wait_while_the_peer_does_not_read_and_resume_when_it_does() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = Backpressure::new(ours);
        theirs.write_all(b"request").await.unwrap();
        // Fill the pipe towards them: the last write cannot complete.
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            ours.write_all(&[0u8; 256]),
        )
        .await;
        assert!(blocked.is_err(), "the write must block on a full pipe");
        let mut byte = [0u8; 1];
        let held = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            ours.read_exact(&mut byte),
        )
        .await;
        assert!(held.is_err(), "no read while the answers cannot be written");
        // They read: our next write goes through and reading resumes.
        let mut sink = vec![0u8; 256];
        theirs.read_exact(&mut sink[..64]).await.unwrap();
        ours.write_all(b"x").await.unwrap();
        ours.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"r");
    }
}
