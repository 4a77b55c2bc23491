//! The data-plane handshake: mutual proof of the cluster key, identity binding, key derivation.

use libp2p::PeerId;
use libp2p::identity::{Keypair, PublicKey};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::DataplaneError;
use super::channel::SecureStream;
use crate::key::ClusterKey;

const MAGIC: &[u8; 8] = b"PRCDP/1\n";
const LABEL: &[u8] = b"parcae-dataplane/1";
/// Largest encoded public key or signature accepted in a handshake.
const MAX_FIELD: usize = 256;

struct Hello {
    public: PublicKey,
    nonce: [u8; 32],
}

/// Open a channel to `expected` at `addr`.
pub async fn connect(
    addr: std::net::SocketAddr,
    local: &Keypair,
    expected: PeerId,
    secret: &ClusterKey,
) -> Result<SecureStream, DataplaneError> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mine = send_hello(&mut s, local).await?;
    let theirs = read_hello(&mut s).await?;
    let peer = theirs.public.to_peer_id();
    if peer != expected {
        return Err(DataplaneError::NotAdmitted(peer.to_string()));
    }
    finish(
        s,
        local,
        secret,
        (&mine, local.public().to_peer_id()),
        (&theirs, peer),
        true,
    )
    .await
}

/// Accept a channel on `s`, admitting only peers for which `admit` is true.
pub async fn accept<F: Future<Output = bool>>(
    mut s: TcpStream,
    local: &Keypair,
    secret: &ClusterKey,
    admit: impl FnOnce(PeerId) -> F,
) -> Result<(PeerId, SecureStream), DataplaneError> {
    s.set_nodelay(true)?;
    let theirs = read_hello(&mut s).await?;
    let peer = theirs.public.to_peer_id();
    if !admit(peer).await {
        return Err(DataplaneError::NotAdmitted(peer.to_string()));
    }
    let mine = send_hello(&mut s, local).await?;
    let stream = finish(
        s,
        local,
        secret,
        (&theirs, peer),
        (&mine, local.public().to_peer_id()),
        false,
    )
    .await?;
    Ok((peer, stream))
}

async fn send_hello(s: &mut TcpStream, local: &Keypair) -> Result<Hello, DataplaneError> {
    let mut nonce = [0u8; 32];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| DataplaneError::Handshake("no randomness"))?;
    let public = local.public();
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(MAGIC);
    put_field(&mut buf, &public.encode_protobuf());
    buf.extend_from_slice(&nonce);
    s.write_all(&buf).await?;
    Ok(Hello { public, nonce })
}

async fn read_hello(s: &mut TcpStream) -> Result<Hello, DataplaneError> {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).await?;
    if &magic != MAGIC {
        return Err(DataplaneError::Handshake("not a data-plane peer"));
    }
    let key = read_field(s).await?;
    let public = PublicKey::try_decode_protobuf(&key)
        .map_err(|_| DataplaneError::Handshake("bad public key"))?;
    let mut nonce = [0u8; 32];
    s.read_exact(&mut nonce).await?;
    Ok(Hello { public, nonce })
}

fn put_field(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    buf.extend_from_slice(bytes);
}

async fn read_field(s: &mut TcpStream) -> Result<Vec<u8>, DataplaneError> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let len = usize::from(u16::from_be_bytes(len));
    if len > MAX_FIELD {
        return Err(DataplaneError::Handshake("oversized handshake field"));
    }
    let mut v = vec![0u8; len];
    s.read_exact(&mut v).await?;
    Ok(v)
}

/// 96 bytes of key material: confirmation key, then one AEAD key per direction.
struct Okm(usize);

impl hkdf::KeyType for Okm {
    fn len(&self) -> usize {
        self.0
    }
}

async fn finish(
    mut s: TcpStream,
    local: &Keypair,
    secret: &ClusterKey,
    initiator: (&Hello, PeerId),
    responder: (&Hello, PeerId),
    i_am_initiator: bool,
) -> Result<SecureStream, DataplaneError> {
    let mut transcript = Vec::with_capacity(256);
    transcript.extend_from_slice(LABEL);
    transcript.extend_from_slice(&initiator.1.to_bytes());
    transcript.extend_from_slice(&responder.1.to_bytes());
    transcript.extend_from_slice(&initiator.0.nonce);
    transcript.extend_from_slice(&responder.0.nonce);
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(&initiator.0.nonce);
    salt[32..].copy_from_slice(&responder.0.nonce);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(secret.as_bytes());
    let info = [transcript.as_slice()];
    let mut okm = [0u8; 96];
    prk.expand(&info, Okm(96))
        .and_then(|o| o.fill(&mut okm))
        .map_err(|_| DataplaneError::Handshake("key derivation"))?;
    let confirm = hmac::Key::new(hmac::HMAC_SHA256, &okm[..32]);
    let role = |initiator: bool| {
        if initiator {
            b"initiator" as &[u8]
        } else {
            b"responder"
        }
    };
    let proof = |initiator: bool| {
        let mut m = transcript.clone();
        m.extend_from_slice(role(initiator));
        m
    };
    let my_msg = proof(i_am_initiator);
    let tag = hmac::sign(&confirm, &my_msg);
    let sig = local
        .sign(&my_msg)
        .map_err(|_| DataplaneError::Handshake("signing"))?;
    let mut out = Vec::with_capacity(32 + 2 + sig.len());
    out.extend_from_slice(tag.as_ref());
    put_field(&mut out, &sig);
    s.write_all(&out).await?;

    let mut their_tag = [0u8; 32];
    s.read_exact(&mut their_tag).await?;
    let their_sig = read_field(&mut s).await?;
    let their_msg = proof(!i_am_initiator);
    hmac::verify(&confirm, &their_msg, &their_tag).map_err(|_| DataplaneError::WrongClusterKey)?;
    let their_key = if i_am_initiator {
        &responder.0.public
    } else {
        &initiator.0.public
    };
    if !their_key.verify(&their_msg, &their_sig) {
        return Err(DataplaneError::Handshake("bad identity signature"));
    }
    let (ir, ri) = (&okm[32..64], &okm[64..96]);
    let (send, recv) = if i_am_initiator { (ir, ri) } else { (ri, ir) };
    SecureStream::new(s, send, recv)
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    struct Pair {
        client: Result<SecureStream, DataplaneError>,
        server: Result<(PeerId, SecureStream), DataplaneError>,
    }

    /// Connect `a` (holding `ka`) to `b` (holding `kb`), the dialer expecting `expect`.
    async fn pair(ka: ClusterKey, kb: ClusterKey, expect: Option<PeerId>, admit: bool) -> Pair {
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let expected = expect.unwrap_or_else(|| b.public().to_peer_id());
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            accept(s, &b, &kb, |_| async move { admit }).await
        });
        let client = connect(addr, &a, expected, &ka).await;
        let server = server.await.unwrap();
        Pair { client, server }
    }

    #[tokio::test]
    async fn same_key_exchanges_messages_both_ways() {
        let k = ClusterKey::from_bytes([5; 32]);
        let p = pair(k.clone(), k, None, true).await;
        let mut c = p.client.unwrap();
        let (_, mut s) = p.server.unwrap();
        let big: Vec<u8> = (0..3 * super::super::MAX_RECORD + 17)
            .map(|i| i as u8)
            .collect();
        c.send(&big).await.unwrap();
        assert_eq!(s.recv(u64::MAX).await.unwrap(), big);
        s.send(b"ack").await.unwrap();
        assert_eq!(c.recv(16).await.unwrap(), b"ack");
        s.send(&[0u8; 100]).await.unwrap();
        assert!(matches!(
            c.recv(10).await,
            Err(DataplaneError::TooLarge { got: 100, max: 10 })
        ));
    }

    #[tokio::test]
    async fn another_cluster_key_is_refused_by_both_sides() {
        let p = pair(
            ClusterKey::from_bytes([1; 32]),
            ClusterKey::from_bytes([2; 32]),
            None,
            true,
        )
        .await;
        assert!(p.client.is_err());
        assert!(matches!(
            p.server,
            Err(DataplaneError::WrongClusterKey) | Err(DataplaneError::Io(_))
        ));
    }

    #[tokio::test]
    async fn unexpected_or_unadmitted_peers_are_refused() {
        let k = ClusterKey::from_bytes([3; 32]);
        let stranger = Keypair::generate_ed25519().public().to_peer_id();
        let p = pair(k.clone(), k.clone(), Some(stranger), true).await;
        assert!(matches!(p.client, Err(DataplaneError::NotAdmitted(_))));
        let p = pair(k.clone(), k, None, false).await;
        assert!(matches!(p.server, Err(DataplaneError::NotAdmitted(_))));
        assert!(p.client.is_err());
    }

    #[tokio::test]
    async fn garbage_and_tampering_are_detected() {
        let k = ClusterKey::from_bytes([4; 32]);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let b = Keypair::generate_ed25519();
        let k2 = k.clone();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            accept(s, &b, &k2, |_| async { true }).await.map(|_| ())
        });
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            server.await.unwrap(),
            Err(DataplaneError::Handshake(_))
        ));

        // A flipped ciphertext bit fails authentication.
        let (mut r, mut w) = {
            let p = pair(k.clone(), k, None, true).await;
            let (_, s) = p.server.unwrap();
            (s.split().0, p.client.unwrap().split().1)
        };
        w.key_for_tests_flip_next();
        w.send(b"payload").await.unwrap();
        assert!(matches!(r.recv(1024).await, Err(DataplaneError::BadRecord)));
    }
}
