//! The data-plane handshake: Noise `XXpsk3_25519_AESGCM_SHA256` through `snow`, the cluster key
//! as the pre-shared key, each side's static Noise key signed by its libp2p identity.
//!
//! * Ephemeral Diffie-Hellman: the record keys come from key exchanges whose secrets never
//!   leave the two processes, so a recorded session cannot be decrypted later, not even with
//!   the cluster key (the handshake this replaced derived them from the key and nonces sent in
//!   clear).
//! * The pre-shared key is mixed into the third message: only a holder of the cluster key
//!   completes a handshake. While a key rotation is under way a node holds two keys
//!   ([`crate::keyring`]): the initiator first offers the fingerprints of its keys, the
//!   responder answers with the first one it holds, and the offer is the Noise prologue, so a
//!   changed offer fails the handshake.
//! * Identity binding, as libp2p-noise does it: each side's payload carries its libp2p public
//!   key and a signature over its static Noise key, which the Noise transcript authenticates.
//!   A relay that holds the cluster key can forward the handshake but not read or change what
//!   follows, and it cannot offer its own static key under another member's identity.
//!
//! After the three messages the responder sends one record, a confirmation under the new keys,
//! so the initiator learns the verdict (refused key, refused identity) within the handshake.
//! The records themselves stay the channel's AES-256-GCM with counters ([`SecureStream`]),
//! keyed with Noise's split: bulk transfers keep hardware AES and large records.

use libp2p::PeerId;
use libp2p::identity::{Keypair, PublicKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::DataplaneError;
use super::channel::SecureStream;
use crate::key::ClusterKey;
use parcae_consensus::state::KeyId;
use parcae_consensus::state::limits::MAX_KEYS;

/// Bytes of a key fingerprint in the offer.
const KEY_ID_LEN: usize = std::mem::size_of::<KeyId>();

const MAGIC: &[u8; 8] = b"PRCDP/3\n";
const NOISE: &str = "Noise_XXpsk3_25519_AESGCM_SHA256";
/// Domain separation of the identity signature over the static Noise key.
const STATIC_LABEL: &[u8] = b"parcae-dataplane-static-key:";
/// The responder's confirmation, the first record under the new keys.
const CONFIRM: &[u8] = b"parcae-dataplane/3 ok";
/// Largest Noise handshake message (the Noise limit).
const MAX_NOISE: usize = 65535;
/// Largest encoded public key or signature accepted in a handshake payload.
const MAX_FIELD: usize = 256;
/// The responder's answer to an offer when it holds none of the offered keys.
const NO_SHARED_KEY: u8 = u8::MAX;

fn noise_error(_: snow::Error) -> DataplaneError {
    DataplaneError::Handshake("noise handshake failed")
}

/// The initiator's key offer, in its order of preference: the count, then each key's
/// fingerprint ([`ClusterKey::id`]). Both sides mix it into the transcript as the prologue.
fn offer(keys: &[ClusterKey]) -> Result<Vec<u8>, DataplaneError> {
    let count = u8::try_from(keys.len())
        .ok()
        .filter(|c| (1..=MAX_KEYS).contains(&usize::from(*c)))
        .ok_or(DataplaneError::Handshake("no cluster key to offer"))?;
    let mut out = vec![count];
    for key in keys {
        out.extend_from_slice(&key.id());
    }
    Ok(out)
}

/// A fresh static Noise key pair and a handshake state for it, bound to `prologue`; the
/// pre-shared key is the `psk` (the responder knows it from the offer; the initiator sets it
/// from the responder's choice).
fn start(
    prologue: &[u8],
    psk: Option<&ClusterKey>,
    initiator: bool,
) -> Result<(snow::HandshakeState, Vec<u8>), DataplaneError> {
    let params = NOISE
        .parse()
        .map_err(|_| DataplaneError::Handshake("noise parameters"))?;
    let builder = snow::Builder::new(params);
    let keys = builder.generate_keypair().map_err(noise_error)?;
    let mut builder = builder.local_private_key(&keys.private).prologue(prologue);
    if let Some(psk) = psk {
        builder = builder.psk(3, psk.as_bytes());
    }
    let state = if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    }
    .map_err(noise_error)?;
    Ok((state, keys.public))
}

/// Open a channel to `expected` at `addr`, offering `keys` (the ring's, the key in force first).
pub async fn connect(
    addr: std::net::SocketAddr,
    local: &Keypair,
    expected: PeerId,
    keys: &[ClusterKey],
) -> Result<SecureStream, DataplaneError> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let offered = offer(keys)?;
    let mut prologue = MAGIC.to_vec();
    prologue.extend_from_slice(&offered);
    let (mut hs, static_key) = start(&prologue, None, true)?;
    let mut buf = vec![0u8; MAX_NOISE];
    let n = hs.write_message(&[], &mut buf).map_err(noise_error)?;
    s.write_all(&prologue).await?;
    send_frame(&mut s, &buf[..n]).await?;
    let choice = s.read_u8().await?;
    if choice == NO_SHARED_KEY {
        return Err(DataplaneError::WrongClusterKey);
    }
    let psk = keys
        .get(usize::from(choice))
        .ok_or(DataplaneError::Handshake("key choice not offered"))?;
    hs.set_psk(3, psk.as_bytes()).map_err(noise_error)?;
    let msg = recv_frame(&mut s).await?;
    let mut payload = vec![0u8; MAX_NOISE];
    let n = hs.read_message(&msg, &mut payload).map_err(noise_error)?;
    let peer = check_proof(&payload[..n], hs.get_remote_static())?;
    if peer != expected {
        return Err(DataplaneError::NotAdmitted(peer.to_string()));
    }
    let proof = identity_proof(local, &static_key)?;
    let n = hs.write_message(&proof, &mut buf).map_err(noise_error)?;
    send_frame(&mut s, &buf[..n]).await?;
    let (send, recv) = hs.dangerously_get_raw_split();
    let mut stream = SecureStream::new(s, &send, &recv)?;
    if stream.recv(CONFIRM.len() as u64).await? != CONFIRM {
        return Err(DataplaneError::Handshake("no confirmation"));
    }
    Ok(stream)
}

/// Accept a channel on `s` with the first offered key that is among `keys`, admitting only
/// peers for which `admit` is true.
pub async fn accept<F: Future<Output = bool>>(
    mut s: TcpStream,
    local: &Keypair,
    keys: &[ClusterKey],
    admit: impl FnOnce(PeerId) -> F,
) -> Result<(PeerId, SecureStream), DataplaneError> {
    s.set_nodelay(true)?;
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).await?;
    if &magic != MAGIC {
        return Err(DataplaneError::Handshake("not a data-plane peer"));
    }
    let count = s.read_u8().await?;
    if !(1..=MAX_KEYS).contains(&usize::from(count)) {
        return Err(DataplaneError::Handshake("bad key offer"));
    }
    let mut prologue = MAGIC.to_vec();
    prologue.push(count);
    let mut ids = vec![0u8; usize::from(count) * KEY_ID_LEN];
    s.read_exact(&mut ids).await?;
    prologue.extend_from_slice(&ids);
    let chosen = ids
        .chunks_exact(KEY_ID_LEN)
        .enumerate()
        .find_map(|(i, id)| keys.iter().find(|k| k.id() == id).map(|k| (i as u8, k)));
    let msg = recv_frame(&mut s).await?;
    let Some((choice, psk)) = chosen else {
        s.write_u8(NO_SHARED_KEY).await?;
        return Err(DataplaneError::WrongClusterKey);
    };
    let (mut hs, static_key) = start(&prologue, Some(psk), false)?;
    let mut payload = vec![0u8; MAX_NOISE];
    hs.read_message(&msg, &mut payload).map_err(noise_error)?;
    let proof = identity_proof(local, &static_key)?;
    let mut buf = vec![0u8; MAX_NOISE];
    let n = hs.write_message(&proof, &mut buf).map_err(noise_error)?;
    s.write_u8(choice).await?;
    send_frame(&mut s, &buf[..n]).await?;
    let msg = recv_frame(&mut s).await?;
    // The pre-shared key enters here: a peer that named a key it does not hold fails this
    // message's authentication.
    let n = hs
        .read_message(&msg, &mut payload)
        .map_err(|_| DataplaneError::WrongClusterKey)?;
    let peer = check_proof(&payload[..n], hs.get_remote_static())?;
    if !admit(peer).await {
        return Err(DataplaneError::NotAdmitted(peer.to_string()));
    }
    let (initiator_to_responder, responder_to_initiator) = hs.dangerously_get_raw_split();
    let mut stream = SecureStream::new(s, &responder_to_initiator, &initiator_to_responder)?;
    stream.send(CONFIRM).await?;
    Ok((peer, stream))
}

/// This node's libp2p public key and its signature over `static_key`.
fn identity_proof(local: &Keypair, static_key: &[u8]) -> Result<Vec<u8>, DataplaneError> {
    let mut signed = STATIC_LABEL.to_vec();
    signed.extend_from_slice(static_key);
    let signature = local
        .sign(&signed)
        .map_err(|_| DataplaneError::Handshake("signing"))?;
    let mut out = Vec::with_capacity(160);
    put_field(&mut out, &local.public().encode_protobuf());
    put_field(&mut out, &signature);
    Ok(out)
}

/// The peer whose identity signed the remote static key `remote`, per `payload`.
fn check_proof(payload: &[u8], remote: Option<&[u8]>) -> Result<PeerId, DataplaneError> {
    let remote = remote.ok_or(DataplaneError::Handshake("no remote static key"))?;
    let (key, rest) = take_field(payload)?;
    let (signature, rest) = take_field(rest)?;
    if !rest.is_empty() {
        return Err(DataplaneError::Handshake("trailing handshake payload"));
    }
    let public = PublicKey::try_decode_protobuf(key)
        .map_err(|_| DataplaneError::Handshake("bad public key"))?;
    let mut signed = STATIC_LABEL.to_vec();
    signed.extend_from_slice(remote);
    if !public.verify(&signed, signature) {
        return Err(DataplaneError::Handshake("bad identity signature"));
    }
    Ok(public.to_peer_id())
}

fn put_field(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    buf.extend_from_slice(bytes);
}

fn take_field(buf: &[u8]) -> Result<(&[u8], &[u8]), DataplaneError> {
    let short = DataplaneError::Handshake("truncated handshake payload");
    let len: [u8; 2] = buf.get(..2).and_then(|b| b.try_into().ok()).ok_or(short)?;
    let len = usize::from(u16::from_be_bytes(len));
    if len > MAX_FIELD {
        return Err(DataplaneError::Handshake("oversized handshake field"));
    }
    let field = buf
        .get(2..2 + len)
        .ok_or(DataplaneError::Handshake("truncated handshake payload"))?;
    Ok((field, &buf[2 + len..]))
}

async fn send_frame(s: &mut TcpStream, bytes: &[u8]) -> Result<(), DataplaneError> {
    let mut out = Vec::with_capacity(2 + bytes.len());
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
    s.write_all(&out).await?;
    Ok(())
}

async fn recv_frame(s: &mut TcpStream) -> Result<Vec<u8>, DataplaneError> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let mut v = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut v).await?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    struct Pair {
        client: Result<SecureStream, DataplaneError>,
        server: Result<(PeerId, SecureStream), DataplaneError>,
    }

    /// Connect `a` (holding `ka`) to `b` (holding `kb`), the dialer expecting `expect`.
    async fn pair(
        ka: impl Into<Vec<ClusterKey>>,
        kb: impl Into<Vec<ClusterKey>>,
        expect: Option<PeerId>,
        admit: bool,
    ) -> Pair {
        let (ka, kb) = (ka.into(), kb.into());
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
        let p = pair([k.clone()], [k], None, true).await;
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
            [ClusterKey::from_bytes([1; 32])],
            [ClusterKey::from_bytes([2; 32])],
            None,
            true,
        )
        .await;
        assert!(matches!(p.client, Err(DataplaneError::WrongClusterKey)));
        assert!(matches!(p.server, Err(DataplaneError::WrongClusterKey)));
    }

    #[tokio::test]
    async fn during_a_rotation_the_first_offered_key_both_hold_is_used() {
        let (old, new) = (
            ClusterKey::from_bytes([1; 32]),
            ClusterKey::from_bytes([2; 32]),
        );
        for (a, b) in [
            (vec![old.clone(), new.clone()], vec![new.clone()]),
            (vec![new.clone()], vec![old.clone(), new.clone()]),
            (vec![old.clone()], vec![new.clone(), old.clone()]),
        ] {
            let p = pair(a, b, None, true).await;
            let mut c = p.client.unwrap();
            let (_, mut s) = p.server.unwrap();
            c.send(b"rotating").await.unwrap();
            assert_eq!(s.recv(64).await.unwrap(), b"rotating");
        }
        let p = pair([old], [new], None, true).await;
        assert!(matches!(p.client, Err(DataplaneError::WrongClusterKey)));
    }

    #[tokio::test]
    async fn a_changed_key_offer_fails_the_handshake() {
        // A relay that rewrites the offer (here: its count, to name only the first key)
        // changes the prologue the two sides bind, so no session comes up.
        let (old, new) = (
            ClusterKey::from_bytes([1; 32]),
            ClusterKey::from_bytes([2; 32]),
        );
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        let b = Keypair::generate_ed25519();
        let b_id = b.public().to_peer_id();
        let keys = vec![old.clone(), new.clone()];
        let responder = tokio::spawn(async move {
            let (s, _) = server.accept().await.unwrap();
            accept(s, &b, &keys, |_| async { true }).await.map(|_| ())
        });
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(async move {
            let (inbound, _) = relay.accept().await.unwrap();
            let outbound = TcpStream::connect(server_addr).await.unwrap();
            let (mut ir, mut iw) = inbound.into_split();
            let (mut or, mut ow) = outbound.into_split();
            let mut head = vec![0u8; MAGIC.len() + 1 + 2 * KEY_ID_LEN];
            ir.read_exact(&mut head).await.unwrap();
            head[MAGIC.len()] = 1;
            head.truncate(MAGIC.len() + 1 + KEY_ID_LEN);
            ow.write_all(&head).await.unwrap();
            // Each direction closes its far side when its near side closes.
            let a_to_b = async move {
                let _ = tokio::io::copy(&mut ir, &mut ow).await;
                let _ = ow.shutdown().await;
            };
            let b_to_a = async move {
                let _ = tokio::io::copy(&mut or, &mut iw).await;
                let _ = iw.shutdown().await;
            };
            tokio::join!(a_to_b, b_to_a);
        });
        let a = Keypair::generate_ed25519();
        assert!(connect(relay_addr, &a, b_id, &[old, new]).await.is_err());
        assert!(responder.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn unexpected_or_unadmitted_peers_are_refused() {
        let k = ClusterKey::from_bytes([3; 32]);
        let stranger = Keypair::generate_ed25519().public().to_peer_id();
        let p = pair([k.clone()], [k.clone()], Some(stranger), true).await;
        assert!(matches!(p.client, Err(DataplaneError::NotAdmitted(_))));
        let p = pair([k.clone()], [k], None, false).await;
        assert!(matches!(p.server, Err(DataplaneError::NotAdmitted(_))));
        assert!(p.client.is_err());
    }

    /// Splits a recorded stream of 2-byte-length frames.
    fn frames(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while bytes.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([bytes[0], bytes[1]]));
            if bytes.len() < 2 + len {
                break;
            }
            out.push(bytes[2..2 + len].to_vec());
            bytes = &bytes[2 + len..];
        }
        out
    }

    #[tokio::test]
    async fn a_recorded_session_cannot_be_decrypted_with_the_cluster_key() {
        use std::sync::{Arc, Mutex};
        let k = ClusterKey::from_bytes([6; 32]);
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let b_id = b.public().to_peer_id();
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        let kb = k.clone();
        let receiver = tokio::spawn(async move {
            let (s, _) = server.accept().await.unwrap();
            let (_, mut stream) = accept(s, &b, &[kb], |_| async { true }).await.unwrap();
            stream.recv(1 << 20).await.unwrap()
        });
        // A recording relay between the two: every byte, both ways.
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        let tape: Arc<Mutex<[Vec<u8>; 2]>> = Arc::default();
        let recorder = tape.clone();
        tokio::spawn(async move {
            let (inbound, _) = relay.accept().await.unwrap();
            let outbound = TcpStream::connect(server_addr).await.unwrap();
            let (mut ir, mut iw) = inbound.into_split();
            let (mut or, mut ow) = outbound.into_split();
            let copy = |dir: usize| {
                let recorder = recorder.clone();
                move |chunk: &[u8]| recorder.lock().unwrap()[dir].extend_from_slice(chunk)
            };
            let (up, down) = (copy(0), copy(1));
            let a_to_b = async move {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n) = ir.read(&mut buf).await {
                    if n == 0 || ow.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    up(&buf[..n]);
                }
            };
            let b_to_a = async move {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n) = or.read(&mut buf).await {
                    if n == 0 || iw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    down(&buf[..n]);
                }
            };
            tokio::join!(a_to_b, b_to_a);
        });
        let secret_payload = b"the weights of stage 3, step 4096".repeat(8);
        let mut stream = connect(relay_addr, &a, b_id, std::slice::from_ref(&k))
            .await
            .unwrap();
        stream.send(&secret_payload).await.unwrap();
        assert_eq!(receiver.await.unwrap(), secret_payload);

        let [up, _] = tape.lock().unwrap().clone();
        assert!(
            !up.windows(16)
                .any(|w| secret_payload.windows(16).any(|p| p == w)),
            "plaintext on the wire"
        );
        // Holding the cluster key, replay the initiator's messages to a responder of one's own:
        // the third message was keyed for B's Diffie-Hellman secrets, not the cluster key's.
        let prologue = [MAGIC.as_slice(), &offer(std::slice::from_ref(&k)).unwrap()].concat();
        assert_eq!(&up[..prologue.len()], prologue);
        let recorded = frames(&up[prologue.len()..]);
        let (mut eve, _) = start(&prologue, Some(&k), false).unwrap();
        let mut payload = vec![0u8; MAX_NOISE];
        let mut out = vec![0u8; MAX_NOISE];
        eve.read_message(&recorded[0], &mut payload).unwrap();
        eve.write_message(&[], &mut out).unwrap();
        assert!(eve.read_message(&recorded[1], &mut payload).is_err());
    }

    #[test]
    fn an_identity_proof_holds_only_for_the_static_key_it_signed() {
        let me = Keypair::generate_ed25519();
        let proof = identity_proof(&me, &[1; 32]).unwrap();
        assert_eq!(
            check_proof(&proof, Some(&[1; 32])).unwrap(),
            me.public().to_peer_id()
        );
        // A relay offering its own static key under this identity is caught.
        assert!(matches!(
            check_proof(&proof, Some(&[2; 32])),
            Err(DataplaneError::Handshake("bad identity signature"))
        ));
        assert!(check_proof(&proof[..10], Some(&[1; 32])).is_err());
        assert!(check_proof(&proof, None).is_err());
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
            accept(s, &b, &[k2], |_| async { true }).await.map(|_| ())
        });
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            server.await.unwrap(),
            Err(DataplaneError::Handshake(_))
        ));

        // A flipped ciphertext bit fails authentication.
        let (mut r, mut w) = {
            let p = pair([k.clone()], [k], None, true).await;
            let (_, s) = p.server.unwrap();
            (s.split().0, p.client.unwrap().split().1)
        };
        w.key_for_tests_flip_next();
        w.send(b"payload").await.unwrap();
        assert!(matches!(r.recv(1024).await, Err(DataplaneError::BadRecord)));
    }
}
