//! Proof of origin for proposals that travel between nodes.
//!
//! A node that does not lead sends its proposals (its `Join`, `Notice`, `Leave`, reports) to the
//! leader, directly or relayed by a member when it does not know the leader yet. Which node a
//! command may be about is [`authorize`](super::authorize)'s rule; this module makes sure the
//! leader applies that rule to the node the command really came from. The origin signs the
//! command with its libp2p identity (the key its peer id is made from), over a label, the
//! time of signing and the encoded command; the leader takes the origin from the verified key,
//! never from what a relay says, and refuses a proof older or newer than [`FRESHNESS`] (a
//! relay cannot keep a member's old `Leave` to play it back after the member rejoined). The age
//! is read on the signer's clock where the verifier has heard it, so nodes whose clocks are
//! minutes apart still trust each other's fresh proofs.

use std::time::Duration;

use libp2p::PeerId;
use libp2p::identity::{Keypair, PublicKey};

use crate::wire::SignedProposal;

/// Domain separation of the signature.
const LABEL: &[u8] = b"parcae-proposal/1";
/// How far a proof's time may be from the verifier's clock.
pub const FRESHNESS: Duration = Duration::from_secs(300);
/// Largest encoded public key accepted (an ed25519 key is 36 bytes).
const MAX_PUBLIC_KEY: usize = 256;
/// Largest signature accepted (ed25519: 64 bytes).
const MAX_SIGNATURE: usize = 256;

/// Why a proof was refused (the sender is disconnected).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The public key or the signature is oversized or does not decode.
    #[error("malformed proposal proof: {0}")]
    Malformed(&'static str),
    /// The signature does not verify: the command is not what its origin signed.
    #[error("proposal signature does not verify")]
    BadSignature,
    /// Signed too long ago (or in the future), on the signer's clock as the verifier knows it.
    #[error("proposal of {origin} signed {skew_ms} ms away from now")]
    Stale {
        /// The signer (the signature holds).
        origin: PeerId,
        /// Distance from now.
        skew_ms: u64,
    },
    /// The identity could not sign.
    #[error("cannot sign a proposal: {0}")]
    Signing(String),
}

fn message(signed_unix_ms: u64, command: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(LABEL.len() + 8 + command.len());
    m.extend_from_slice(LABEL);
    m.extend_from_slice(&signed_unix_ms.to_be_bytes());
    m.extend_from_slice(command);
    m
}

/// Signs the encoded `command` as `identity` at `now_ms`.
pub fn sign(
    identity: &Keypair,
    command: Vec<u8>,
    now_ms: u64,
) -> Result<SignedProposal, ProofError> {
    let signature = identity
        .sign(&message(now_ms, &command))
        .map_err(|e| ProofError::Signing(e.to_string()))?;
    Ok(SignedProposal {
        command,
        signed_unix_ms: now_ms,
        public_key: identity.public().encode_protobuf(),
        signature,
    })
}

/// Checks the proof; the origin's peer id when it holds. `signer_now_ms` reads the time now on
/// the signer's clock (as far as the verifier knows it, see
/// [`PeerClocks`](super::peer_clocks::PeerClocks)): the freshness bound is on the proof's age,
/// not on how far two clocks are apart.
pub fn verify(
    proposal: &SignedProposal,
    signer_now_ms: impl FnOnce(&PeerId) -> u64,
) -> Result<PeerId, ProofError> {
    if proposal.public_key.len() > MAX_PUBLIC_KEY {
        return Err(ProofError::Malformed("oversized public key"));
    }
    if proposal.signature.len() > MAX_SIGNATURE {
        return Err(ProofError::Malformed("oversized signature"));
    }
    let key = PublicKey::try_decode_protobuf(&proposal.public_key)
        .map_err(|_| ProofError::Malformed("undecodable public key"))?;
    if !key.verify(
        &message(proposal.signed_unix_ms, &proposal.command),
        &proposal.signature,
    ) {
        return Err(ProofError::BadSignature);
    }
    let origin = key.to_peer_id();
    let skew_ms = signer_now_ms(&origin).abs_diff(proposal.signed_unix_ms);
    if u128::from(skew_ms) > FRESHNESS.as_millis() {
        return Err(ProofError::Stale { origin, skew_ms });
    }
    Ok(origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn a_proof_names_its_signer_and_nothing_else() {
        let me = Keypair::generate_ed25519();
        let p = sign(&me, b"leave".to_vec(), NOW).unwrap();
        assert_eq!(verify(&p, |_| NOW + 1000), Ok(me.public().to_peer_id()));

        // A relay that changes the command, the time or the key is caught.
        let mut changed = p.clone();
        changed.command = b"join".to_vec();
        assert_eq!(verify(&changed, |_| NOW), Err(ProofError::BadSignature));
        let mut retimed = p.clone();
        retimed.signed_unix_ms += 1;
        assert_eq!(verify(&retimed, |_| NOW), Err(ProofError::BadSignature));
        let mut rekeyed = p.clone();
        rekeyed.public_key = Keypair::generate_ed25519().public().encode_protobuf();
        assert_eq!(verify(&rekeyed, |_| NOW), Err(ProofError::BadSignature));
    }

    #[test]
    fn old_future_and_malformed_proofs_are_refused() {
        let me = Keypair::generate_ed25519();
        let p = sign(&me, b"notice".to_vec(), NOW).unwrap();
        let late = NOW + FRESHNESS.as_millis() as u64 + 1;
        let origin = me.public().to_peer_id();
        assert_eq!(
            verify(&p, |_| late),
            Err(ProofError::Stale {
                origin,
                skew_ms: FRESHNESS.as_millis() as u64 + 1
            })
        );
        let early = NOW - FRESHNESS.as_millis() as u64 - 1;
        assert!(matches!(
            verify(&p, |_| early),
            Err(ProofError::Stale { .. })
        ));
        let mut junk = p.clone();
        junk.public_key = vec![1, 2, 3];
        assert!(matches!(
            verify(&junk, |_| NOW),
            Err(ProofError::Malformed(_))
        ));
        let mut huge = p;
        huge.signature = vec![0; MAX_SIGNATURE + 1];
        assert!(matches!(
            verify(&huge, |_| NOW),
            Err(ProofError::Malformed(_))
        ));
    }
}
