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
    /// Set the name and tenants exactly as given. Otherwise trusting a
    /// key already trusted adds the tenants to its scope under the same
    /// name, and never widens a limited key to every tenant. The
    /// configuration always replaces what it seeded.
    pub replace: bool,
}

/// What trusting a key did, in words: `None` when nothing changed.
pub type KeyChange = Option<String>;

/// Tenants as people read them: "any tenant" or "tenants a, b".
pub fn tenants_in_words(tenants: &[TenantId]) -> String {
    if tenants.is_empty() {
        "any tenant".into()
    } else {
        let names: Vec<&str> = tenants.iter().map(TenantId::as_str).collect();
        format!("tenants {}", names.join(", "))
    }
}

impl PublisherKey {
    /// Refuses a new key under the name of another trusted key: a name
    /// names one key, so a second `trust add` of a new key under an
    /// existing name is a mistake to stop, not a second key to keep.
    pub fn check_name(trusted: &[PublisherKey], spec: &KeySpec) -> Result<(), DomainError> {
        match trusted.iter().find(|k| {
            k.name == spec.name && k.key_id != spec.key_id && k.state == KeyState::Trusted
        }) {
            Some(other) => Err(DomainError::AlreadyExists {
                kind: "publisher key named",
                id: format!(
                    "{:?} (key {}); choose another name, or revoke that key first (agentbay trust revoke)",
                    spec.name, other.key_id
                ),
            }),
            None => Ok(()),
        }
    }

    /// Trusts a key: a new one, a revoked one again, or a trusted one with
    /// more tenants (or, with [`KeySpec::replace`], a new name and exactly
    /// the tenants given). Returns the key and what changed, in words. The
    /// configuration never trusts again what an operator revoked.
    pub fn trust(
        existing: Option<PublisherKey>,
        spec: KeySpec,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<(PublisherKey, KeyChange), DomainError> {
        let Some(mut key) = existing else {
            let change = format!(
                "trusted `{}` for {}",
                spec.name,
                tenants_in_words(&spec.tenants)
            );
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
                Some(change),
            ));
        };
        if key.public_key != spec.public_key {
            return Err(DomainError::FailedPrecondition(format!(
                "key {} is stored with another public key",
                key.key_id
            )));
        }
        match (key.state, spec.source) {
            (KeyState::Revoked, KeySource::Configuration) => return Ok((key, None)),
            // What an operator set is not undone by the file.
            (KeyState::Trusted, KeySource::Configuration) if key.source == KeySource::Operator => {
                return Ok((key, None));
            }
            _ => {}
        }
        let replace = spec.replace
            || spec.source == KeySource::Configuration
            || key.state == KeyState::Revoked;
        let (name, tenants) = if replace {
            (spec.name, spec.tenants)
        } else {
            if key.name != spec.name {
                return Err(DomainError::FailedPrecondition(format!(
                    "publisher key {} is trusted as `{}` for {}: trusting it again adds tenants under that name; \
                     to rename it (and set its tenants to exactly those given) replace it",
                    key.key_id,
                    key.name,
                    tenants_in_words(&key.tenants)
                )));
            }
            if spec.tenants.is_empty() && !key.tenants.is_empty() {
                return Err(DomainError::FailedPrecondition(format!(
                    "publisher key {} (`{}`) may sign for {}: name the tenants to add, \
                     or replace it to let it sign for any tenant",
                    key.key_id,
                    key.name,
                    tenants_in_words(&key.tenants)
                )));
            }
            let mut tenants = key.tenants.clone();
            if !tenants.is_empty() {
                for t in spec.tenants {
                    if !tenants.contains(&t) {
                        tenants.push(t);
                    }
                }
                tenants.sort();
            }
            (key.name.clone(), tenants)
        };
        let mut words = Vec::new();
        if key.state == KeyState::Revoked {
            words.push("trusted again".to_string());
        }
        if key.name != name {
            words.push(format!("renamed from `{}`", key.name));
        }
        if key.tenants != tenants {
            let added: Vec<&str> = tenants
                .iter()
                .filter(|t| !key.tenants.contains(t))
                .map(TenantId::as_str)
                .collect();
            let removed: Vec<&str> = key
                .tenants
                .iter()
                .filter(|t| !tenants.contains(t))
                .map(TenantId::as_str)
                .collect();
            if tenants.is_empty() {
                words.push("now signs for any tenant".into());
            } else if key.tenants.is_empty() {
                words.push(format!("now only for {}", tenants_in_words(&tenants)));
            } else {
                if !added.is_empty() {
                    words.push(format!("added {}", added.join(", ")));
                }
                if !removed.is_empty() {
                    words.push(format!("removed {}", removed.join(", ")));
                }
            }
        }
        if key.source != spec.source {
            words.push(format!("now kept by the {}", spec.source.as_str()));
        }
        if words.is_empty() {
            return Ok((key, None));
        }
        let change = format!(
            "`{name}`: {}; it may sign for {}",
            words.join(", "),
            tenants_in_words(&tenants)
        );
        if key.state == KeyState::Revoked {
            key.trusted_at = now;
            key.trusted_by = by.to_string();
        }
        key.state = KeyState::Trusted;
        key.name = name;
        key.tenants = tenants;
        key.source = spec.source;
        key.revoked_at = None;
        key.revoked_by = None;
        key.revoke_reason = None;
        Ok((key, Some(change)))
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
    pub fn changed_event(&self, by: &str, change: &str, now: DateTime<Utc>) -> NewEvent {
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
                change,
                reason: self.revoke_reason.as_deref(),
            },
        )
    }

    /// What a revocation does, in words.
    pub fn revoked_words(&self) -> String {
        format!(
            "`{}` revoked ({}): it no longer signs for {}; what it signed is Untrusted",
            self.name,
            self.revoke_reason.as_deref().unwrap_or(""),
            tenants_in_words(&self.tenants)
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
    /// What changed, in words (tenants added or removed, a rename, a
    /// revocation).
    pub change: &'a str,
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
            replace: false,
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
        assert!(changed.is_some());
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
        assert!(changed.is_none());
        assert_eq!(key.state, KeyState::Revoked);
        // An operator trusts it again.
        let (key, changed) =
            PublisherKey::trust(Some(key), spec(KeySource::Operator, &[]), "admin", now).unwrap();
        assert!(changed.is_some());
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
        assert!(changed.is_none());
        assert!(key.tenants.is_empty());
        let mut other = spec(KeySource::Operator, &[]);
        other.public_key = "BBBB".into();
        assert!(PublisherKey::trust(Some(key), other, "admin", now).is_err());
    }

    #[test]
    fn trusting_a_key_again_adds_tenants_and_replacing_needs_asking() {
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 8, 0, 0).unwrap();
        let (key, change) =
            PublisherKey::trust(None, spec(KeySource::Operator, &["demo"]), "admin", now).unwrap();
        assert_eq!(change.unwrap(), "trusted `site` for tenants demo");
        // Another tenant is added to the scope, the name kept.
        let (key, change) = PublisherKey::trust(
            Some(key),
            spec(KeySource::Operator, &["acme"]),
            "admin",
            now,
        )
        .unwrap();
        let tenants: Vec<&str> = key.tenants.iter().map(TenantId::as_str).collect();
        assert_eq!(tenants, ["acme", "demo"]);
        assert_eq!(
            change.unwrap(),
            "`site`: added acme; it may sign for tenants acme, demo"
        );
        // The same again changes nothing.
        let (key, change) = PublisherKey::trust(
            Some(key),
            spec(KeySource::Operator, &["demo"]),
            "admin",
            now,
        )
        .unwrap();
        assert_eq!(change, None);
        // Another name, or any tenant, is a replacement: refused unless asked.
        let mut renamed = spec(KeySource::Operator, &["demo"]);
        renamed.name = "ci".into();
        let refused = PublisherKey::trust(Some(key.clone()), renamed.clone(), "admin", now)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("is trusted as `site`"), "{refused}");
        let refused = PublisherKey::trust(
            Some(key.clone()),
            spec(KeySource::Operator, &[]),
            "admin",
            now,
        )
        .unwrap_err()
        .to_string();
        assert!(refused.contains("name the tenants to add"), "{refused}");
        renamed.replace = true;
        let (key, change) = PublisherKey::trust(Some(key), renamed, "admin", now).unwrap();
        assert_eq!(key.name, "ci");
        assert_eq!(
            change.unwrap(),
            "`ci`: renamed from `site`, removed acme; it may sign for tenants demo"
        );
    }
}
