//! AES-256-GCM records over TCP, and messages made of records.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::{DataplaneError, MAX_RECORD};

const TAG: usize = 16;

/// A keyed, authenticated connection to one peer.
pub struct SecureStream {
    reader: SecureReader,
    writer: SecureWriter,
}

/// Receiving half.
pub struct SecureReader {
    io: OwnedReadHalf,
    key: LessSafeKey,
    counter: u64,
    buf: Vec<u8>,
}

/// Sending half.
pub struct SecureWriter {
    io: OwnedWriteHalf,
    key: LessSafeKey,
    counter: u64,
    buf: Vec<u8>,
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

impl SecureStream {
    pub(crate) fn new(s: TcpStream, send: &[u8], recv: &[u8]) -> Result<Self, DataplaneError> {
        let (r, w) = s.into_split();
        Ok(Self {
            reader: SecureReader {
                io: r,
                key: key(recv)?,
                counter: 0,
                buf: Vec::new(),
            },
            writer: SecureWriter {
                io: w,
                key: key(send)?,
                counter: 0,
                buf: Vec::new(),
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

    async fn record(&mut self, plain: &[u8]) -> Result<(), DataplaneError> {
        self.buf.clear();
        self.buf
            .extend_from_slice(&((plain.len() + TAG) as u32).to_be_bytes());
        self.buf.extend_from_slice(plain);
        let mut body = self.buf.split_off(4);
        self.key
            .seal_in_place_append_tag(nonce(self.counter), Aad::empty(), &mut body)
            .map_err(|_| DataplaneError::BadRecord)?;
        self.counter += 1;
        #[cfg(test)]
        if std::mem::take(&mut self.corrupt) {
            body[0] ^= 1;
        }
        self.buf.append(&mut body);
        self.io.write_all(&self.buf).await?;
        Ok(())
    }

    /// Send one message: its length, then its bytes in records of at most [`MAX_RECORD`].
    pub async fn send(&mut self, payload: &[u8]) -> Result<(), DataplaneError> {
        self.record(&(payload.len() as u64).to_be_bytes()).await?;
        for chunk in payload.chunks(MAX_RECORD) {
            self.record(chunk).await?;
        }
        Ok(())
    }
}

impl SecureReader {
    async fn record(&mut self) -> Result<&[u8], DataplaneError> {
        let mut len = [0u8; 4];
        self.io.read_exact(&mut len).await?;
        let len = u32::from_be_bytes(len) as usize;
        if !(TAG..=MAX_RECORD + TAG).contains(&len) {
            return Err(DataplaneError::BadRecord);
        }
        self.buf.resize(len, 0);
        self.io.read_exact(&mut self.buf).await?;
        let plain = self
            .key
            .open_in_place(nonce(self.counter), Aad::empty(), &mut self.buf)
            .map_err(|_| DataplaneError::BadRecord)?;
        self.counter += 1;
        Ok(plain)
    }

    /// Receive one message of at most `max` bytes.
    pub async fn recv(&mut self, max: u64) -> Result<Vec<u8>, DataplaneError> {
        let head = self.record().await?;
        let total = u64::from_be_bytes(head.try_into().map_err(|_| DataplaneError::BadRecord)?);
        if total > max {
            return Err(DataplaneError::TooLarge { got: total, max });
        }
        let mut out = Vec::with_capacity(total as usize);
        while (out.len() as u64) < total {
            let rec = self.record().await?;
            if out.len() as u64 + rec.len() as u64 > total {
                return Err(DataplaneError::BadRecord);
            }
            out.extend_from_slice(rec);
        }
        Ok(out)
    }
}
