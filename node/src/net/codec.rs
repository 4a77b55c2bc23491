//! Length-prefixed frames of the control protocol (raft messages and forwarded proposals).
//!
//! A frame is a 4-byte big-endian length and that many bytes; a control stream carries one
//! frame after another. The length is checked against the configured maximum *before* anything
//! is allocated. An oversized frame is not an I/O error: it is returned as
//! [`Inbound::Oversized`] so that the network actor can log it and disconnect the sender.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;

/// Protocol id of the control channel: one long-lived stream per peer and direction, frames
/// back to back (version 1 was a request-response exchange per frame).
pub const CONTROL_PROTOCOL: StreamProtocol = StreamProtocol::new("/parcae/control/2.0.0");

/// What the next frame on a control stream turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A frame within the size limit.
    Frame(Vec<u8>),
    /// A frame whose announced length exceeds the limit; its body was not read.
    Oversized {
        /// The length the peer announced.
        len: u32,
    },
}

/// Reads the next frame of at most `max_frame` bytes; a stream that ends between frames or
/// within one is an error (`UnexpectedEof`).
pub async fn read_frame<T>(io: &mut T, max_frame: u32) -> io::Result<Inbound>
where
    T: AsyncRead + Unpin,
{
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len);
    if len > max_frame {
        return Ok(Inbound::Oversized { len });
    }
    let mut buf = vec![0u8; len as usize];
    io.read_exact(&mut buf).await?;
    Ok(Inbound::Frame(buf))
}

/// Writes one frame (not flushed); a frame over `max_frame` bytes is refused before anything
/// is written.
pub async fn write_frame<T>(io: &mut T, frame: &[u8], max_frame: u32) -> io::Result<()>
where
    T: AsyncWrite + Unpin,
{
    let len = u32::try_from(frame.len())
        .ok()
        .filter(|len| *len <= max_frame)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("frame of {} bytes exceeds {max_frame}", frame.len()),
            )
        })?;
    io.write_all(&len.to_be_bytes()).await?;
    io.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn frames_follow_one_another_and_the_limit_holds() {
        let mut wire = Cursor::new(Vec::new());
        run(write_frame(&mut wire, b"hello", 8)).unwrap();
        run(write_frame(&mut wire, b"", 8)).unwrap();
        run(write_frame(&mut wire, b"world!", 8)).unwrap();
        assert!(run(write_frame(&mut wire, &[0; 9], 8)).is_err());
        wire.set_position(0);
        for want in [&b"hello"[..], b"", b"world!"] {
            assert_eq!(
                run(read_frame(&mut wire, 8)).unwrap(),
                Inbound::Frame(want.to_vec())
            );
        }
        let end = run(read_frame(&mut wire, 8)).unwrap_err();
        assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);

        let mut header = Cursor::new(u32::MAX.to_be_bytes().to_vec());
        assert_eq!(
            run(read_frame(&mut header, 8)).unwrap(),
            Inbound::Oversized { len: u32::MAX }
        );
    }

    #[test]
    fn a_truncated_frame_is_an_error() {
        let mut wire = Cursor::new(vec![0, 0, 0, 10, 1, 2]);
        let err = run(read_frame(&mut wire, 64)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
