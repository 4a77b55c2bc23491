//! Length-prefixed raw frames for the control request-response protocol.
//!
//! A request is a 4-byte big-endian length and that many bytes; the length is checked against
//! the configured maximum *before* anything is allocated. An oversized frame is not an I/O error
//! (libp2p would drop the stream silently, without telling the behaviour who sent it): it is
//! returned as [`ControlRequest::Oversized`] so that the network actor can log it and disconnect
//! the sender. The response is a single status byte.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;

/// Protocol id of the control channel (raft messages and forwarded proposals).
pub const CONTROL_PROTOCOL: StreamProtocol = StreamProtocol::new("/parcae/control/1.0.0");

/// An inbound or outbound control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRequest {
    /// A frame within the size limit.
    Frame(Vec<u8>),
    /// A frame whose announced length exceeds the limit; its body was not read. Only produced
    /// when reading; writing it is refused.
    Oversized {
        /// The length the peer announced.
        len: u32,
    },
}

/// The single-byte answer to a control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlAck {
    /// The frame was received and handed to the node.
    Accepted,
    /// The frame was refused (oversized or unparsable).
    Rejected,
}

/// The codec; cloned per connection by libp2p.
#[derive(Debug, Clone)]
pub struct ControlCodec {
    max_frame: u32,
}

impl ControlCodec {
    /// A codec accepting frames up to `max_frame` bytes.
    pub fn new(max_frame: u32) -> Self {
        Self { max_frame }
    }
}

#[async_trait::async_trait]
impl libp2p::request_response::Codec for ControlCodec {
    type Protocol = StreamProtocol;
    type Request = ControlRequest;
    type Response = ControlAck;

    async fn read_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<ControlRequest>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut len = [0u8; 4];
        io.read_exact(&mut len).await?;
        let len = u32::from_be_bytes(len);
        if len > self.max_frame {
            return Ok(ControlRequest::Oversized { len });
        }
        let mut buf = vec![0u8; len as usize];
        io.read_exact(&mut buf).await?;
        Ok(ControlRequest::Frame(buf))
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<ControlAck>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut status = [0u8; 1];
        io.read_exact(&mut status).await?;
        match status[0] {
            0 => Ok(ControlAck::Accepted),
            1 => Ok(ControlAck::Rejected),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown control ack {other}"),
            )),
        }
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: ControlRequest,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let ControlRequest::Frame(bytes) = req else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an oversized marker cannot be sent",
            ));
        };
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|len| *len <= self.max_frame)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("frame of {} bytes exceeds {}", bytes.len(), self.max_frame),
                )
            })?;
        io.write_all(&len.to_be_bytes()).await?;
        io.write_all(&bytes).await?;
        io.close().await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: ControlAck,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let status = match res {
            ControlAck::Accepted => 0u8,
            ControlAck::Rejected => 1u8,
        };
        io.write_all(&[status]).await?;
        io.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;
    use libp2p::request_response::Codec;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn frame_round_trip_and_limit() {
        let mut codec = ControlCodec::new(8);
        let mut wire = Cursor::new(Vec::new());
        run(codec.write_request(
            &CONTROL_PROTOCOL,
            &mut wire,
            ControlRequest::Frame(b"hello".to_vec()),
        ))
        .unwrap();
        wire.set_position(0);
        let got = run(codec.read_request(&CONTROL_PROTOCOL, &mut wire)).unwrap();
        assert_eq!(got, ControlRequest::Frame(b"hello".to_vec()));

        let too_big = ControlRequest::Frame(vec![0; 9]);
        assert!(
            run(codec.write_request(&CONTROL_PROTOCOL, &mut Cursor::new(Vec::new()), too_big))
                .is_err()
        );

        let mut header = Cursor::new(u32::MAX.to_be_bytes().to_vec());
        let got = run(codec.read_request(&CONTROL_PROTOCOL, &mut header)).unwrap();
        assert_eq!(got, ControlRequest::Oversized { len: u32::MAX });
    }

    #[test]
    fn truncated_frame_and_bad_ack_are_errors() {
        let mut codec = ControlCodec::new(64);
        let mut wire = Cursor::new(vec![0, 0, 0, 10, 1, 2]);
        assert!(run(codec.read_request(&CONTROL_PROTOCOL, &mut wire)).is_err());
        let mut ack = Cursor::new(vec![7]);
        assert!(run(codec.read_response(&CONTROL_PROTOCOL, &mut ack)).is_err());
    }
}
