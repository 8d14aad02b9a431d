//! Trusted publisher keys and the audit of release verdicts.
//!
//! Which publishers this appliance trusts is data, kept in the store (and
//! so in every backup): PlatformAdmins add and revoke keys at run time, and
//! the configuration's `[[releases.trusted_keys]]` only seeds them at start.
//! A release signed by a key that is not trusted (unknown, revoked, or not
//! allowed for its tenant) is `Untrusted`: kept with its contents, never
//! dispatched, and Verified again once its key is trusted. A release whose
//! contents do not match what was signed stays `Rejected`.
//!
//! Every verdict on a release (each import, and each re-verification that
//! changed its state) is kept as a [`ReleaseVerdict`], so a rejected import
//! stays visible after a later good import of the same release id.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::events::{EventPayload, NewEvent};
use super::release::LoadState;
use super::{DomainError, TenantId};

/// Whether a key is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyState {
    /// Releases it signs verify (for the tenants it may sign for).
    Trusted,
    /// No longer trusted: what it signed is Untrusted.
    Revoked,
}

impl KeyState {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Trusted => "Trusted",
            KeyState::Revoked => "Revoked",
        }
    }
}

/// Where a key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeySource {
    /// Seeded from `[[releases.trusted_keys]]`; the file keeps its name and
    /// tenants up to date while it is trusted.
    Configuration,
    /// Added by a PlatformAdmin through the API, the CLI or the console.
    Operator,
}

impl KeySource {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Configuration => "configuration",
            KeySource::Operator => "operator",
        }
    }
}

/// A publisher key this appliance knows (platform record, id = key id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublisherKey {
    /// Always the platform tenant: keys belong to the appliance.
    pub tenant_id: TenantId,
    /// `ed25519:<16 hex>` of the public key.
    pub key_id: String,
    /// A name for people.
    pub name: String,
    /// The raw Ed25519 public key, base64.
    pub public_key: String,
    /// Tenants it may sign for; any when empty.
    pub tenants: Vec<TenantId>,
    /// Trusted or revoked.
    pub state: KeyState,
    /// Where it came from.
    pub source: KeySource,
    /// When it was (last) trusted, and by whom.
    pub trusted_at: DateTime<Utc>,
    /// Who trusted it.
    pub trusted_by: String,
    /// When it was revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who revoked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoke_reason: Option<String>,
    /// The stored state this value was read from (0: new).
    #[serde(default)]
    pub version: u64,
}

/// What trusting a key asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct KeySpec {
    /// Its id, computed from the public key.
    pub key_id: String,
    /// Name.
    pub name: String,
    /// Public key, base64.
    pub public_key: String,
    /// Tenants it may sign for; any when empty.
    pub tenants: Vec<TenantId>,
    /// Where the request comes from.
    pub source: KeySource,
}

impl PublisherKey {
    /// Trusts a key: a new one, a revoked one again, or a trusted one with
    /// a new name or tenants. Returns the key and whether anything changed.
    /// The configuration never trusts again what an operator revoked.
    pub fn trust(
        existing: Option<PublisherKey>,
        spec: KeySpec,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<(PublisherKey, bool), DomainError> {
        let Some(mut key) = existing else {
            return Ok((
                PublisherKey {
                    tenant_id: TenantId::platform(),
                    key_id: spec.key_id,
                    name: spec.name,
                    public_key: spec.public_key,
                    tenants: spec.tenants,
                    state: KeyState::Trusted,
                    source: spec.source,
                    trusted_at: now,
                    trusted_by: by.to_string(),
                    revoked_at: None,
                    revoked_by: None,
                    revoke_reason: None,
                    version: 0,
                },
                true,
            ));
        };
        if key.public_key != spec.public_key {
            return Err(DomainError::FailedPrecondition(format!(
                "key {} is stored with another public key",
                key.key_id
            )));
        }
        match (key.state, spec.source) {
            (KeyState::Revoked, KeySource::Configuration) => return Ok((key, false)),
            // What an operator set is not undone by the file.
            (KeyState::Trusted, KeySource::Configuration) if key.source == KeySource::Operator => {
                return Ok((key, false));
            }
            _ => {}
        }
        let changed = key.state != KeyState::Trusted
            || key.name != spec.name
            || key.tenants != spec.tenants
            || key.source != spec.source;
        if !changed {
            return Ok((key, false));
        }
        if key.state == KeyState::Revoked {
            key.trusted_at = now;
            key.trusted_by = by.to_string();
        }
        key.state = KeyState::Trusted;
        key.name = spec.name;
        key.tenants = spec.tenants;
        key.source = spec.source;
        key.revoked_at = None;
        key.revoked_by = None;
        key.revoke_reason = None;
        Ok((key, true))
    }

    /// Revokes the key; a reason is required. Revoking a revoked key
    /// changes nothing (false).
    pub fn revoke(
        &mut self,
        by: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DomainError> {
        super::FieldError::require("reason", reason, "say why the key is revoked")?;
        if self.state == KeyState::Revoked {
            return Ok(false);
        }
        self.state = KeyState::Revoked;
        self.revoked_at = Some(now);
        self.revoked_by = Some(by.to_string());
        self.revoke_reason = Some(reason.trim().to_string());
        Ok(true)
    }

    /// Why what it signed is not trusted, when it is revoked.
    pub fn revocation(&self) -> Option<String> {
        (self.state == KeyState::Revoked).then(|| {
            format!(
                "publisher key {} ({}) was revoked by {} at {}: {}",
                self.key_id,
                self.name,
                self.revoked_by.as_deref().unwrap_or("?"),
                self.revoked_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                self.revoke_reason.as_deref().unwrap_or("")
            )
        })
    }

    /// The event of a change.
    pub fn changed_event(&self, by: &str, now: DateTime<Utc>) -> NewEvent {
        NewEvent::new(
            &self.tenant_id,
            now,
            &PublisherKeyChanged {
                key_id: &self.key_id,
                name: &self.name,
                state: self.state.as_str(),
                tenants: self.tenants.iter().map(TenantId::as_str).collect(),
                source: self.source.as_str(),
                by,
                reason: self.revoke_reason.as_deref(),
            },
        )
    }
}

/// Payload of `execution.releases.v1.publisher-key-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublisherKeyChanged<'a> {
    /// The key.
    pub key_id: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Trusted or Revoked.
    pub state: &'static str,
    /// Tenants it may sign for (any when empty).
    pub tenants: Vec<&'a str>,
    /// configuration or operator.
    pub source: &'static str,
    /// Who changed it.
    pub by: &'a str,
    /// Why it was revoked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
}

impl EventPayload for PublisherKeyChanged<'_> {
    const TOPIC: &'static str = "execution.releases.v1.publisher-key-changed";
}

/// What produced a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum VerdictCause {
    /// An import of a bundle.
    Import,
    /// A re-verification from the stored contents (trusted keys changed,
    /// or the appliance was upgraded).
    Reverification,
}

impl VerdictCause {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictCause::Import => "import",
            VerdictCause::Reverification => "re-verification",
        }
    }
}

/// One verdict on a release, kept as evidence (id `<releaseId>/<verdictId>`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseVerdict {
    /// The release's tenant.
    pub tenant_id: TenantId,
    /// The release id of the bundle.
    pub release_id: String,
    /// Time-ordered id.
    pub verdict_id: Uuid,
    /// The manifest hash judged.
    pub manifest_hash: String,
    /// Verified, Untrusted or Rejected.
    pub state: LoadState,
    /// Why, when not Verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The check that failed (`signature`, `untrusted`, `hash`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The key that signed, when it was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// What produced it.
    pub cause: VerdictCause,
    /// Who imported it, or what re-verified it.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
    /// What the stored release was after it (`unchanged`: an import that
    /// did not replace a verified release).
    pub outcome: String,
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn spec(source: KeySource, tenants: &[&str]) -> KeySpec {
        KeySpec {
            key_id: "ed25519:00112233aabbccdd".into(),
            name: "site".into(),
            public_key: "AAAA".into(),
            tenants: tenants
                .iter()
                .map(|t| TenantId::parse(t).unwrap())
                .collect(),
            source,
        }
    }

    #[test]
    fn an_operator_revocation_outlives_the_configuration_and_is_undone_only_by_an_operator() {
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 8, 0, 0).unwrap();
        let (mut key, changed) = PublisherKey::trust(
            None,
            spec(KeySource::Configuration, &["acme"]),
            "configuration",
            now,
        )
        .unwrap();
        assert!(changed);
        assert_eq!(key.state, KeyState::Trusted);
        assert!(key.revoke("admin", " ", now).is_err());
        assert!(key.revoke("admin", "leaked", now).unwrap());
        assert!(!key.revoke("admin", "again", now).unwrap());
        assert!(key.revocation().unwrap().contains("revoked by admin"));
        // The next start reads the same file: the key stays revoked.
        let (key, changed) = PublisherKey::trust(
            Some(key),
            spec(KeySource::Configuration, &["acme"]),
            "configuration",
            now,
        )
        .unwrap();
        assert!(!changed);
        assert_eq!(key.state, KeyState::Revoked);
        // An operator trusts it again.
        let (key, changed) =
            PublisherKey::trust(Some(key), spec(KeySource::Operator, &[]), "admin", now).unwrap();
        assert!(changed);
        assert_eq!(key.state, KeyState::Trusted);
        assert!(key.tenants.is_empty());
        assert_eq!(key.revoked_at, None);
        // The file does not narrow what an operator set.
        let (key, changed) = PublisherKey::trust(
            Some(key),
            spec(KeySource::Configuration, &["acme"]),
            "configuration",
            now,
        )
        .unwrap();
        assert!(!changed);
        assert!(key.tenants.is_empty());
        let mut other = spec(KeySource::Operator, &[]);
        other.public_key = "BBBB".into();
        assert!(PublisherKey::trust(Some(key), other, "admin", now).is_err());
    }
}
