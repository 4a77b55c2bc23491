//! AES-256-GCM records over TCP, and messages made of records.
//!
//! The record layer is tokio-util's `LengthDelimitedCodec` (a 4-byte big-endian length, capped
//! at one sealed record before anything is allocated); each frame is one sealed record, its
//! nonce the record counter of its direction, so a dropped, repeated or reordered record fails
//! authentication. A message is one record holding its length, then its bytes in records of at
//! most [`MAX_RECORD`].

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use super::error::DataplaneError;

/// Largest record on the wire (plaintext), bytes.
pub const MAX_RECORD: usize = 1 << 20;

const TAG: usize = 16;

/// A keyed, authenticated connection to one peer.
pub struct SecureStream {
    reader: SecureReader,
    writer: SecureWriter,
}

/// Receiving half.
pub struct SecureReader {
    io: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    key: LessSafeKey,
    counter: u64,
}

/// Sending half.
pub struct SecureWriter {
    io: FramedWrite<OwnedWriteHalf, LengthDelimitedCodec>,
    key: LessSafeKey,
    counter: u64,
    /// The record being sealed (reused: no allocation per record).
    sealed: Vec<u8>,
    #[cfg(test)]
    corrupt: bool,
}

fn key(bytes: &[u8]) -> Result<LessSafeKey, DataplaneError> {
    UnboundKey::new(&AES_256_GCM, bytes)
        .map(LessSafeKey::new)
        .map_err(|_| DataplaneError::Handshake("bad key length"))
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The record framing: a sealed record is at most [`MAX_RECORD`] plus its tag.
fn records() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .max_frame_length(MAX_RECORD + TAG)
        .new_codec()
}

impl SecureStream {
    pub(crate) fn new(s: TcpStream, send: &[u8], recv: &[u8]) -> Result<Self, DataplaneError> {
        let (r, w) = s.into_split();
        Ok(Self {
            reader: SecureReader {
                io: FramedRead::with_capacity(r, records(), MAX_RECORD + TAG + 4),
                key: key(recv)?,
                counter: 0,
            },
            writer: SecureWriter {
                io: FramedWrite::new(w, records()),
                key: key(send)?,
                counter: 0,
                sealed: Vec::new(),
                #[cfg(test)]
                corrupt: false,
            },
        })
    }

    /// Send one message.
    pub async fn send(&mut self, payload: &[u8]) -> Result<(), DataplaneError> {
        self.writer.send(payload).await
    }

    /// Receive one message of at most `max` bytes.
    pub async fn recv(&mut self, max: u64) -> Result<Vec<u8>, DataplaneError> {
        self.reader.recv(max).await
    }

    /// Split into halves that can be used from two tasks.
    pub fn split(self) -> (SecureReader, SecureWriter) {
        (self.reader, self.writer)
    }
}

impl SecureWriter {
    /// Corrupt the next record on the wire (tests of tamper detection).
    #[cfg(test)]
    pub(crate) fn key_for_tests_flip_next(&mut self) {
        self.corrupt = true;
    }

    /// Seals `plain` as the next record and queues it (not flushed).
    async fn record(&mut self, plain: &[u8]) -> Result<(), DataplaneError> {
        self.sealed.clear();
        self.sealed.extend_from_slice(plain);
        self.key
            .seal_in_place_append_tag(nonce(self.counter), Aad::empty(), &mut self.sealed)
            .map_err(|_| DataplaneError::BadRecord)?;
        self.counter += 1;
        #[cfg(test)]
        if std::mem::take(&mut self.corrupt) {
            self.sealed[0] ^= 1;
        }
        self.io.feed(self.sealed.as_slice()).await?;
        Ok(())
    }

    /// Send one message: its length, then its bytes in records of at most [`MAX_RECORD`].
    pub async fn send(&mut self, payload: &[u8]) -> Result<(), DataplaneError> {
        self.record(&(payload.len() as u64).to_be_bytes()).await?;
        for chunk in payload.chunks(MAX_RECORD) {
            self.record(chunk).await?;
        }
        SinkExt::<&[u8]>::flush(&mut self.io).await?;
        Ok(())
    }
}

impl SecureReader {
    async fn record(&mut self) -> Result<BytesMut, DataplaneError> {
        let mut frame = match self.io.next().await {
            Some(Ok(frame)) => frame,
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(DataplaneError::BadRecord);
            }
            Some(Err(e)) => return Err(e.into()),
            None => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
        };
        let len = self
            .key
            .open_in_place(nonce(self.counter), Aad::empty(), &mut frame)
            .map_err(|_| DataplaneError::BadRecord)?
            .len();
        self.counter += 1;
        frame.truncate(len);
        Ok(frame)
    }

    /// Receive one message of at most `max` bytes.
    pub async fn recv(&mut self, max: u64) -> Result<Vec<u8>, DataplaneError> {
        let head = self.record().await?;
        let total = u64::from_be_bytes(
            head.as_ref()
                .try_into()
                .map_err(|_| DataplaneError::BadRecord)?,
        );
        if total > max {
            return Err(DataplaneError::TooLarge { got: total, max });
        }
        let mut out = Vec::with_capacity(total as usize);
        while (out.len() as u64) < total {
            let rec = self.record().await?;
            if out.len() as u64 + rec.len() as u64 > total {
                return Err(DataplaneError::BadRecord);
            }
            out.extend_from_slice(&rec);
        }
        Ok(out)
    }
}
