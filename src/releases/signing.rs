//! Publisher keys and signatures (Ed25519, ring).
//!
//! A publisher signs the canonical bytes of a bundle's manifest and writes
//! `signature.json` beside it:
//!
//! ```json
//! {"algorithm": "ed25519", "keyId": "ed25519:1f2e…", "signature": "<base64>"}
//! ```
//!
//! The key id is `ed25519:` and the first 16 hex digits of the SHA-256 of
//! the raw public key. Private keys are PKCS#8 in PEM (`PRIVATE KEY`), the
//! format `openssl genpkey -algorithm ed25519` writes; public keys are the
//! raw 32 bytes in base64, which is what `[[releases.trusted_keys]]` holds.

use base64::Engine as _;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::TenantId;

/// Where a data directory keeps its demo publisher key (the private half,
/// owner-only).
pub const DEMO_KEY_FILE: &str = "demo/publisher.key";

/// This appliance's own demo publisher key, trusted for the `demo` tenant
/// only while `releases.trust_demo_key` is on: made at the first start of
/// a data directory (`<data dir>/demo/publisher.key`, owner-only; a key
/// already there is kept), so no published key signs for anyone here. The
/// demo's example releases are signed with it when they are seeded; a
/// developer signs their own demo releases with it.
pub fn instance_demo_key(data_dir: &std::path::Path) -> Result<TrustedKey, KeyError> {
    let pair = instance_demo_pair(data_dir)?;
    let public = base64::engine::general_purpose::STANDARD.encode(pair.public_key().as_ref());
    TrustedKey::new(
        "this appliance's demo publisher (DEMO ONLY)",
        &public,
        vec![TenantId::parse(DEMO_TENANT).expect("valid tenant")],
    )
}

/// The key pair of [`instance_demo_key`], made if missing.
pub fn instance_demo_pair(data_dir: &std::path::Path) -> Result<Ed25519KeyPair, KeyError> {
    let path = data_dir.join(DEMO_KEY_FILE);
    if !path.exists() {
        let (pem, _, _) = generate();
        if let Some(dir) = path.parent() {
            crate::store::datadir::create_private_dir(dir)
                .map_err(|e| KeyError(format!("the demo key's directory: {e}")))?;
        }
        crate::store::datadir::write_private(&path, pem.as_bytes())
            .map_err(|e| KeyError(format!("writing the demo key {}: {e}", path.display())))?;
    }
    let pem = std::fs::read_to_string(&path)
        .map_err(|e| KeyError(format!("reading the demo key {}: {e}", path.display())))?;
    read_private_key(&pem)
}

/// The tenant the demo key may sign for.
pub const DEMO_TENANT: &str = "demo";

/// `signature.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignatureFile {
    /// Always `ed25519`.
    pub algorithm: String,
    /// Which key signed.
    pub key_id: String,
    /// The signature over the canonical manifest, base64.
    pub signature: String,
}

/// A publisher key this appliance trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedKey {
    /// A name for people.
    pub name: String,
    /// `ed25519:<16 hex>`.
    pub key_id: String,
    /// Raw public key.
    pub public_key: Vec<u8>,
    /// Tenants it may sign for; any when empty.
    pub tenants: Vec<TenantId>,
}

/// A key that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyError(pub String);

/// The key id of a raw public key.
pub fn key_id(public_key: &[u8]) -> String {
    format!("ed25519:{}", &hex::encode(Sha256::digest(public_key))[..16])
}

impl TrustedKey {
    /// A trusted key from its base64 public key.
    pub fn new(
        name: &str,
        public_key_b64: &str,
        tenants: Vec<TenantId>,
    ) -> Result<TrustedKey, KeyError> {
        let public_key = base64::engine::general_purpose::STANDARD
            .decode(public_key_b64.trim())
            .map_err(|e| KeyError(format!("public key of {name} is not base64: {e}")))?;
        if public_key.len() != 32 {
            return Err(KeyError(format!(
                "public key of {name} is {} bytes; an Ed25519 public key is 32",
                public_key.len()
            )));
        }
        Ok(TrustedKey {
            name: name.to_string(),
            key_id: key_id(&public_key),
            public_key,
            tenants,
        })
    }

    /// Whether the key may sign for `tenant`.
    pub fn may_sign_for(&self, tenant: &TenantId) -> bool {
        self.tenants.is_empty() || self.tenants.contains(tenant)
    }

    /// Checks a signature over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.public_key)
            .verify(message, signature)
            .is_ok()
    }
}

/// What a verification trusts: the trusted keys, and the revoked ones
/// with why (so that a verdict can say so).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Trusted keys.
    pub keys: Vec<TrustedKey>,
    /// Revoked keys: key id -> why.
    pub revoked: std::collections::BTreeMap<String, String>,
}

impl Trust {
    /// Only these keys.
    pub fn of(keys: Vec<TrustedKey>) -> Trust {
        Trust {
            keys,
            revoked: Default::default(),
        }
    }

    /// Identifies what is trusted: a release verified under another set
    /// is verified again.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for k in &self.keys {
            h.update(k.key_id.as_bytes());
            for t in &k.tenants {
                h.update(t.as_str().as_bytes());
            }
            h.update(b";");
        }
        format!("sha256:{}", hex::encode(h.finalize()))
    }
}

/// A new key pair: (private key PEM, public key base64, key id).
pub fn generate() -> (String, String, String) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("the OS random source works");
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ring reads its own keys");
    let public = pair.public_key().as_ref().to_vec();
    let pem = pem_encode("PRIVATE KEY", pkcs8.as_ref());
    (
        pem,
        base64::engine::general_purpose::STANDARD.encode(&public),
        key_id(&public),
    )
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Reads a PKCS#8 Ed25519 private key from PEM.
pub fn read_private_key(pem: &str) -> Result<Ed25519KeyPair, KeyError> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----") && !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .map_err(|e| KeyError(format!("the private key is not PEM: {e}")))?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
        .map_err(|e| KeyError(format!("the private key is not an Ed25519 PKCS#8 key: {e}")))
}

/// Signs canonical manifest bytes.
pub fn sign(pair: &Ed25519KeyPair, canonical_manifest: &[u8]) -> SignatureFile {
    let signature = pair.sign(canonical_manifest);
    SignatureFile {
        algorithm: "ed25519".into(),
        key_id: key_id(pair.public_key().as_ref()),
        signature: base64::engine::general_purpose::STANDARD.encode(signature.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_and_verifies() {
        let (pem, public, id) = generate();
        let pair = read_private_key(&pem).unwrap();
        let sig = sign(&pair, b"canonical manifest");
        assert_eq!(sig.key_id, id);
        let trusted = TrustedKey::new("test", &public, vec![]).unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&sig.signature)
            .unwrap();
        assert!(trusted.verifies(b"canonical manifest", &raw));
        assert!(!trusted.verifies(b"canonical manifesto", &raw));
    }

    #[test]
    fn the_demo_key_is_the_data_dirs_own_and_signs_for_the_demo_tenant_only() {
        let dir = tempfile::tempdir().unwrap();
        let demo = instance_demo_key(dir.path()).unwrap();
        assert!(demo.may_sign_for(&TenantId::parse("demo").unwrap()));
        assert!(!demo.may_sign_for(&TenantId::parse("acme").unwrap()));
        assert!(demo.name.contains("DEMO ONLY"));
        // Made once, kept: the same key at the next start.
        assert_eq!(instance_demo_key(dir.path()).unwrap(), demo);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(instance_demo_key(other.path()).unwrap().key_id, demo.key_id);
    }
}
