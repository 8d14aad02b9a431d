//! Appliances sharing one PostgreSQL store: which one is active.
//!
//! Exactly one appliance of a pair is active: it holds the store's leader
//! row with an epoch no other appliance has held, and every write it
//! commits checks that epoch, so a deposed appliance's late write is
//! refused by the database. The others stand by: they answer health and
//! readiness and forward every other request to the active one.

use serde::Serialize;
use utoipa::ToSchema;

/// An appliance as the leader row names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its name among the pair (`store.postgres.node_name`).
    pub node: String,
    /// Where clients reach it (`store.postgres.advertise_url`).
    pub url: String,
    /// SHA-256 fingerprint of its TLS certificate, which a standby pins
    /// when it forwards a request.
    pub fingerprint: String,
    /// The epoch it holds (or held) the store with.
    pub epoch: i64,
}

/// This appliance's part in the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It runs the grains, the workers and the event stream.
    Active,
    /// It waits to take over and forwards requests to the active one.
    Standby,
}

/// The secret the appliances of a pair share, kept outside the database
/// (`pair.key` in each data directory, made by `agentbay cluster init`
/// and copied to the others). Whoever can write the database but does not
/// hold it cannot make an appliance of the pair believe a leader row or
/// take a forwarded client address.
#[derive(Clone)]
pub struct PairKey {
    key: std::sync::Arc<ring::hmac::Key>,
    /// What operators compare between nodes: a hash of the key, not it.
    id: String,
}

/// The length of a pair key, in bytes.
pub const PAIR_KEY_BYTES: usize = 32;

/// How far apart the pair's clocks may be when a forwarded request's proof
/// is checked (and how long a proof can be replayed by the one who saw it:
/// only the pair, over TLS).
pub const FORWARD_SKEW_SECONDS: i64 = 120;

impl std::fmt::Debug for PairKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PairKey({})", self.id)
    }
}

/// Why a leader row is not believed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Untrusted {
    /// It carries no signature (written by hand, or by an agentbay before
    /// rows were signed).
    Unsigned,
    /// Its signature is not the pair key's over what it says.
    Mismatch,
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Untrusted::Unsigned => "it is not signed",
            Untrusted::Mismatch => "its signature is not this pair's key's over what it says",
        })
    }
}

impl PairKey {
    /// A key from its bytes.
    pub fn from_bytes(bytes: &[u8; PAIR_KEY_BYTES]) -> PairKey {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest([b"agentbay pair key id\n".as_slice(), bytes].concat());
        PairKey {
            key: std::sync::Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes)),
            id: hex::encode(&digest[..8]),
        }
    }

    /// A new key from the OS's random source, and its bytes.
    pub fn generate() -> ([u8; PAIR_KEY_BYTES], PairKey) {
        let mut bytes = [0u8; PAIR_KEY_BYTES];
        getrandom::fill(&mut bytes).expect("the OS random source works");
        let key = PairKey::from_bytes(&bytes);
        (bytes, key)
    }

    /// A key file's text: the key in hex on one line. `Err` says what is
    /// wrong with it, never the key.
    pub fn parse(text: &str) -> Result<PairKey, String> {
        let text = text.trim();
        let bytes = hex::decode(text).map_err(|_| {
            format!(
                "it must hold {} hexadecimal digits on one line, as `agentbay cluster init` writes it",
                PAIR_KEY_BYTES * 2
            )
        })?;
        let bytes: [u8; PAIR_KEY_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!("it holds {} bytes; a pair key is {PAIR_KEY_BYTES}", b.len())
        })?;
        Ok(PairKey::from_bytes(&bytes))
    }

    /// The key's file text.
    pub fn file_text(bytes: &[u8; PAIR_KEY_BYTES]) -> String {
        format!("{}\n", hex::encode(bytes))
    }

    /// What names the key among operators (`cluster init` prints it, a
    /// standby's readiness shows it): a hash, so equal ids mean equal keys.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn tag(&self, message: &str) -> String {
        hex::encode(ring::hmac::sign(&self.key, message.as_bytes()).as_ref())
    }

    fn verify(&self, message: &str, tag: &str) -> bool {
        hex::decode(tag)
            .is_ok_and(|t| ring::hmac::verify(&self.key, message.as_bytes(), &t).is_ok())
    }

    /// The signature of a leader row: over everything a standby acts on
    /// (where it forwards, the certificate it pins, who, which epoch).
    pub fn sign_leader(&self, node: &Node) -> String {
        self.tag(&leader_message(node))
    }

    /// Whether a leader row's `signature` is this key's over `node`.
    pub fn check_leader(&self, node: &Node, signature: &str) -> Result<(), Untrusted> {
        if signature.is_empty() {
            Err(Untrusted::Unsigned)
        } else if self.verify(&leader_message(node), signature) {
            Ok(())
        } else {
            Err(Untrusted::Mismatch)
        }
    }

    /// Whether a leader row found in place of the one an appliance holds
    /// with `epoch` is a takeover by its pair (a later epoch, signed with
    /// this key); anything else was written by someone else.
    pub fn is_takeover(&self, epoch: i64, found: &Node, signature: &str) -> bool {
        found.epoch > epoch && self.check_leader(found, signature).is_ok()
    }

    /// The proof a standby sends with a request it forwards: that a node
    /// of the pair (`by`), at `at` (Unix seconds), saw the request come
    /// from `client`.
    pub fn forward_proof(&self, at: i64, client: std::net::IpAddr, by: &str) -> String {
        format!("{at}.{}", self.tag(&forward_message(at, client, by)))
    }

    /// Whether `proof` is this key's for `client` and `by`, made within
    /// [`FORWARD_SKEW_SECONDS`] of `now`.
    pub fn check_forward(&self, proof: &str, client: std::net::IpAddr, by: &str, now: i64) -> bool {
        let Some((at, tag)) = proof.split_once('.') else {
            return false;
        };
        let Ok(at) = at.parse::<i64>() else {
            return false;
        };
        (now - at).abs() <= FORWARD_SKEW_SECONDS
            && self.verify(&forward_message(at, client, by), tag)
    }
}

fn leader_message(node: &Node) -> String {
    // Each field on its own line; none may hold a line break, so no two
    // rows share a message.
    let clean = |s: &str| s.replace(['\n', '\r'], " ");
    format!(
        "agentbay leader v1\n{}\n{}\n{}\n{}",
        clean(&node.node),
        clean(&node.url),
        clean(&node.fingerprint),
        node.epoch
    )
}

fn forward_message(at: i64, client: std::net::IpAddr, by: &str) -> String {
    format!(
        "agentbay forward v1\n{at}\n{}\n{}",
        client.to_canonical(),
        by.replace(['\n', '\r'], " ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        Node {
            node: "a".into(),
            url: "https://10.0.0.1:8443".into(),
            fingerprint: "ab".repeat(32),
            epoch: 7,
        }
    }

    #[test]
    fn a_leader_row_is_believed_only_as_the_pair_key_signed_it() {
        let key = PairKey::from_bytes(&[7; PAIR_KEY_BYTES]);
        let row = node();
        let signature = key.sign_leader(&row);
        assert_eq!(key.check_leader(&row, &signature), Ok(()));
        assert_eq!(key.check_leader(&row, ""), Err(Untrusted::Unsigned));
        let moved = Node {
            url: "https://10.0.0.66:8443".into(),
            ..row.clone()
        };
        assert_eq!(
            key.check_leader(&moved, &signature),
            Err(Untrusted::Mismatch)
        );
        let later = Node {
            epoch: 8,
            ..row.clone()
        };
        assert!(key.is_takeover(7, &later, &key.sign_leader(&later)));
        assert!(
            !key.is_takeover(7, &row, &signature),
            "the same epoch, changed"
        );
        assert!(
            !key.is_takeover(7, &later, &signature),
            "a later epoch, not signed"
        );
        let other = PairKey::from_bytes(&[8; PAIR_KEY_BYTES]);
        assert_eq!(
            other.check_leader(&row, &signature),
            Err(Untrusted::Mismatch)
        );
        assert_ne!(key.id(), other.id());
    }

    #[test]
    fn a_forward_proof_holds_for_its_client_its_node_and_a_short_while() {
        let key = PairKey::from_bytes(&[7; PAIR_KEY_BYTES]);
        let client: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let proof = key.forward_proof(1_000, client, "b");
        assert!(key.check_forward(&proof, client, "b", 1_000 + FORWARD_SKEW_SECONDS));
        assert!(!key.check_forward(&proof, client, "b", 1_000 + FORWARD_SKEW_SECONDS + 1));
        assert!(!key.check_forward(&proof, "192.0.2.8".parse().unwrap(), "b", 1_000));
        assert!(!key.check_forward(&proof, client, "c", 1_000));
        assert!(!key.check_forward("1000.00", client, "b", 1_000));
        assert!(!key.check_forward("garbage", client, "b", 1_000));
    }

    #[test]
    fn a_key_file_is_read_back_and_a_bad_one_is_refused_without_showing_it() {
        let text = PairKey::file_text(&[9; PAIR_KEY_BYTES]);
        let key = PairKey::parse(&text).unwrap();
        assert_eq!(key.id(), PairKey::from_bytes(&[9; PAIR_KEY_BYTES]).id());
        let short = PairKey::parse("abcd").unwrap_err();
        assert!(short.contains("holds 2 bytes"), "{short}");
        let bad = PairKey::parse("not hex at all").unwrap_err();
        assert!(bad.contains("hexadecimal"), "{bad}");
    }
}
