//! LoadRelease's checks: manifest, signature, content hashes, compatibility.
//!
//! [`verify`] runs every check in order and stops at the first failure with
//! a reason that names what failed: the manifest field, the signer, the
//! file with its expected and actual hash, or the version this appliance
//! cannot run. It also returns the list of checks it passed, which
//! `agentbay release verify` prints as its report.
//!
//! A signer that is not trusted here (unknown, revoked, or not allowed for
//! the tenant) is not a failure of the bundle: the other checks still run,
//! and only when they all pass is the verdict `untrusted` (the release is
//! kept and verified again once its key is trusted). A bundle that fails a
//! content check, or whose signature does not verify with a trusted key,
//! is rejected.

use base64::Engine as _;
use serde_json::Value;

use super::bundle::{Bundle, MANIFEST, SIGNATURE};
use super::signing::{SignatureFile, Trust, TrustedKey};
use crate::domain::content::content_hash;
use crate::domain::reach::SiteReach;
use crate::domain::release::{Manifest, ModelKind, canonical_json, check_compatibility};

/// Why a bundle was rejected, with a short category for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// manifest | signature | untrusted | missing-file | extra-file | hash |
    /// content | adapter | site
    pub category: &'static str,
    /// The reason, naming what failed.
    pub reason: String,
}

fn reject(category: &'static str, reason: impl Into<String>) -> Rejection {
    Rejection {
        category,
        reason: reason.into(),
    }
}

/// A parsed manifest and its canonical form.
#[derive(Clone, Debug)]
pub struct ParsedManifest {
    /// The manifest.
    pub manifest: Manifest,
    /// Its canonical JSON bytes (what is signed).
    pub canonical: Vec<u8>,
    /// `sha256:` of the canonical bytes.
    pub manifest_hash: String,
}

/// What verification found.
#[derive(Clone, Debug)]
pub struct Report {
    /// Checks passed, in order, for people.
    pub passed: Vec<String>,
    /// The manifest, when it could be read.
    pub parsed: Option<ParsedManifest>,
    /// The trusted key that signed it, when the signature held.
    pub signer: Option<TrustedKey>,
    /// The first failure, if any.
    pub rejection: Option<Rejection>,
}

/// The category of a verdict whose only fault is its signer.
pub const UNTRUSTED: &str = "untrusted";

impl Report {
    /// Whether every check passed.
    pub fn verified(&self) -> bool {
        self.rejection.is_none()
    }

    /// Whether everything held but the signer is not trusted here.
    pub fn untrusted(&self) -> bool {
        self.rejection
            .as_ref()
            .is_some_and(|r| r.category == UNTRUSTED)
    }
}

/// Parses and validates `manifest.json`.
pub fn parse_manifest(bytes: &[u8]) -> Result<ParsedManifest, Rejection> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        reject(
            "manifest",
            format!(
                "{MANIFEST} is not valid JSON: {} (line {}, column {})",
                strip(&e.to_string()),
                e.line(),
                e.column()
            ),
        )
    })?;
    let manifest: Manifest = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let inner = strip(&e.into_inner().to_string());
        reject(
            "manifest",
            if path == "." {
                format!("{MANIFEST}: {inner}")
            } else {
                format!("{MANIFEST} field {path}: {inner}")
            },
        )
    })?;
    manifest.validate().map_err(|e| {
        reject(
            "manifest",
            format!("{MANIFEST} field {}: {}", e.field, e.reason),
        )
    })?;
    let canonical = canonical_json(&value);
    let manifest_hash = content_hash(&canonical);
    Ok(ParsedManifest {
        manifest,
        canonical,
        manifest_hash,
    })
}

fn strip(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Runs every check of LoadRelease on a bundle.
/// `site` gives the site's rules for a tenant's releases: what its tools
/// may read and connect to.
pub fn verify(bundle: &Bundle, trusted: &Trust, site: &dyn Fn(&str) -> SiteReach) -> Report {
    let mut report = Report {
        passed: Vec::new(),
        parsed: None,
        signer: None,
        rejection: None,
    };
    if let Err(r) = run(bundle, trusted, site, &mut report) {
        report.rejection = Some(r);
    }
    report
}

fn run(
    bundle: &Bundle,
    trust: &Trust,
    site: &dyn Fn(&str) -> SiteReach,
    report: &mut Report,
) -> Result<(), Rejection> {
    let manifest_bytes = bundle.manifest().map_err(|e| reject("manifest", e.0))?;
    let parsed = parse_manifest(manifest_bytes)?;
    report.passed.push(format!(
        "manifest: release {} of tenant {}, agent {} {} (schema {})",
        parsed.manifest.release_id,
        parsed.manifest.tenant_id,
        parsed.manifest.agent_id,
        parsed.manifest.version,
        parsed.manifest.schema
    ));
    report
        .passed
        .push(format!("manifest hash: {}", parsed.manifest_hash));
    report.parsed = Some(parsed.clone());
    let manifest = &parsed.manifest;

    // Signature.
    let sig_bytes = bundle.files.get(SIGNATURE).ok_or_else(|| {
        reject(
            "signature",
            format!("the bundle is not signed: it has no {SIGNATURE}"),
        )
    })?;
    let sig: SignatureFile = serde_json::from_slice(sig_bytes).map_err(|e| {
        reject(
            "signature",
            format!(
                "{SIGNATURE} is not a signature file: {}",
                strip(&e.to_string())
            ),
        )
    })?;
    if sig.algorithm != "ed25519" {
        return Err(reject(
            "signature",
            format!(
                "{SIGNATURE} uses algorithm {:?}; only ed25519 is accepted",
                sig.algorithm
            ),
        ));
    }
    let untrusted = match signer(trust, &sig, &manifest.tenant_id) {
        Ok(key) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(sig.signature.trim())
                .map_err(|e| {
                    reject(
                        "signature",
                        format!("{SIGNATURE}: the signature is not base64: {e}"),
                    )
                })?;
            if !key.verifies(&parsed.canonical, &raw) {
                return Err(reject(
                    "signature",
                    format!(
                        "the signature does not verify with publisher key {} ({}): the manifest was changed after signing, or another key signed it",
                        key.key_id, key.name
                    ),
                ));
            }
            report.passed.push(format!(
                "signature: ed25519 by {} ({})",
                key.key_id, key.name
            ));
            report.signer = Some(key.clone());
            None
        }
        Err(why) => Some(why),
    };

    // Content: every listed file present with its hash, nothing else.
    for (role, path, expected) in manifest.files() {
        let bytes = bundle.files.get(path).ok_or_else(|| {
            reject(
                "missing-file",
                format!("missing file {path} ({role}) listed in the manifest"),
            )
        })?;
        let actual = content_hash(bytes);
        if actual != expected {
            return Err(reject(
                "hash",
                format!("file {path} ({role}): expected {expected}, found {actual}"),
            ));
        }
    }
    let listed: Vec<&str> = manifest.files().iter().map(|(_, p, _)| *p).collect();
    if let Some(extra) = bundle.files.keys().find(|p| {
        p.as_str() != MANIFEST && p.as_str() != SIGNATURE && !listed.contains(&p.as_str())
    }) {
        return Err(reject(
            "extra-file",
            format!("extra file {extra} is not listed in the manifest"),
        ));
    }
    report.passed.push(format!(
        "content: {} files, every SHA-256 matches",
        listed.len()
    ));

    // Contents that must be JSON.
    let mut json_files = vec![
        ("outputContract", manifest.output_contract.path.as_str()),
        ("workflow", manifest.workflow.path.as_str()),
    ];
    if manifest.model_profile.kind == ModelKind::Scripted
        && let Some(r) = &manifest.model_profile.responses
    {
        json_files.push(("modelResponses", r.path.as_str()));
    }
    for (role, path) in json_files {
        let v: Value = serde_json::from_slice(&bundle.files[path]).map_err(|e| {
            reject(
                "content",
                format!(
                    "file {path} ({role}) is not valid JSON: {}",
                    strip(&e.to_string())
                ),
            )
        })?;
        let ok = match role {
            "modelResponses" => v.is_array() || v.get("responses").is_some_and(Value::is_array),
            _ => v.is_object(),
        };
        if !ok {
            return Err(reject(
                "content",
                format!(
                    "file {path} ({role}) must hold {}",
                    if role == "modelResponses" {
                        "an array of responses"
                    } else {
                        "a JSON object"
                    }
                ),
            ));
        }
    }
    std::str::from_utf8(&bundle.files[manifest.instructions.path.as_str()]).map_err(|_| {
        reject(
            "content",
            format!(
                "file {} (instructions) is not UTF-8 text",
                manifest.instructions.path
            ),
        )
    })?;

    // Compatibility with this appliance.
    check_compatibility(manifest).map_err(|r| reject("adapter", r))?;
    report.passed.push(format!(
        "compatible: adapter {} {}, checkpoint format {}",
        manifest.adapter.kind.as_str(),
        manifest.adapter.version,
        manifest.checkpoint_format
    ));
    // What it may reach on this site.
    if let Some(why) = site(manifest.tenant_id.as_str()).release_refusal(manifest) {
        return Err(reject("site", why));
    }
    report
        .passed
        .push("site: every path and network target it names is allowed here".to_string());
    match untrusted {
        Some(why) => Err(reject(UNTRUSTED, why)),
        None => Ok(()),
    }
}

/// The trusted key that may sign for `tenant` and that the signature
/// names, or why there is none.
fn signer<'a>(
    trust: &'a Trust,
    sig: &SignatureFile,
    tenant: &crate::domain::TenantId,
) -> Result<&'a TrustedKey, String> {
    let Some(key) = trust.keys.iter().find(|k| k.key_id == sig.key_id) else {
        if let Some(why) = trust.revoked.get(&sig.key_id) {
            return Err(format!(
                "signed by publisher key {}, which is not trusted: {why}; `agentbay trust add` trusts it again",
                sig.key_id
            ));
        }
        let known: Vec<String> = trust
            .keys
            .iter()
            .map(|k| format!("{} ({})", k.key_id, k.name))
            .collect();
        return Err(format!(
            "signed by unknown publisher key {}; trusted keys: {}; `agentbay trust add` trusts it",
            sig.key_id,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    if !key.may_sign_for(tenant) {
        return Err(format!(
            "publisher key {} ({}) may not sign releases for tenant {tenant}; it signs for {}",
            key.key_id,
            key.name,
            key.tenants
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(key)
}
