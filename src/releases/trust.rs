//! Trusted publisher keys as data.
//!
//! Keys live in the `publisher_keys` table of the platform (so they are in
//! every backup). At start the configuration's `[[releases.trusted_keys]]`
//! seeds them: a key the store does not know is added, a configured key's
//! name and tenants follow the file while it is trusted, and a key an
//! operator revoked stays revoked (the start warns). The demo key is
//! trusted while `releases.trust_demo_key` is on, unless it was revoked.
//!
//! Every change of the keys verifies the stored releases again at once
//! (`Releases::reverify_stale`): a revoked key's releases become Untrusted,
//! a key trusted again makes them Verified, tampered ones stay Rejected.

use std::sync::Arc;

use super::signing::{Trust, TrustedKey};
use super::{Current, ReleaseError, Releases, Reverified};
use crate::config::ReleasesConfig;
use crate::domain::access::TenantScope;
use crate::domain::trust::{KeyChange, KeySource, KeySpec, KeyState, PublisherKey};
use crate::domain::{DomainError, FieldError, TenantId};
use crate::store::{Record, StoreError, Table, Tx};

impl Record for PublisherKey {
    const TABLE: Table = Table::PublisherKeys;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.key_id.clone()
    }
}

crate::versioned!(PublisherKey, version);

fn platform() -> TenantScope {
    TenantScope::new(TenantId::platform())
}

/// The keys a configuration names (for `agentbay release verify`, which
/// checks a bundle on a publisher's machine without a store).
pub fn configured_keys(config: &ReleasesConfig) -> Vec<TrustedKey> {
    // A publisher's machine has no appliance's demo key to trust.
    let keys: Vec<TrustedKey> = config
        .trusted_keys
        .iter()
        .filter_map(|k| TrustedKey::new(&k.name, &k.public_key, tenants(&k.tenants).ok()?).ok())
        .collect();
    keys
}

fn tenants(names: &[String]) -> Result<Vec<TenantId>, DomainError> {
    names
        .iter()
        .map(|t| TenantId::parse_field("tenants", t).map_err(DomainError::from))
        .collect()
}

impl Releases {
    /// Seeds the configuration's keys, then trusts what the store holds.
    pub(crate) async fn seed(&self, config: &ReleasesConfig) -> Result<(), ReleaseError> {
        let now = self.clock.now();
        let mut specs = Vec::new();
        for k in &config.trusted_keys {
            let key = TrustedKey::new(&k.name, &k.public_key, tenants(&k.tenants)?)
                .map_err(|e| FieldError::new("releases.trusted_keys.public_key", e.0))
                .map_err(DomainError::from)?;
            specs.push(KeySpec {
                key_id: key.key_id,
                name: k.name.clone(),
                public_key: k.public_key.trim().to_string(),
                tenants: key.tenants,
                source: KeySource::Configuration,
                replace: true,
            });
        }
        let revoked = self
            .store
            .transact(
                move |tx: &mut Tx| -> Result<Vec<PublisherKey>, ReleaseError> {
                    let scope = platform();
                    let mut revoked = Vec::new();
                    for spec in specs {
                        let existing: Option<PublisherKey> = tx.get(&scope, &spec.key_id)?;
                        let (mut key, change) =
                            PublisherKey::trust(existing, spec, "configuration", now)?;
                        if let Some(change) = change {
                            tx.emit(key.changed_event("configuration", &change, now))?;
                            tx.save(&scope, &mut key)?;
                        } else if key.state == KeyState::Revoked {
                            revoked.push(key);
                        }
                    }
                    Ok(revoked)
                },
            )
            .await?;
        for key in revoked {
            tracing::warn!(
                key = %key.key_id,
                name = %key.name,
                "releases.trusted_keys names a key that was revoked; it stays revoked (`agentbay trust add` trusts it again)"
            );
        }
        self.load_trust()?;
        Ok(())
    }

    /// Reads the keys from the store into what verifications trust.
    fn load_trust(&self) -> Result<(), StoreError> {
        let stored: Vec<PublisherKey> = self.store.list(&platform())?;
        let mut trust = Trust::default();
        for k in &stored {
            match k.state {
                KeyState::Trusted => {
                    match TrustedKey::new(&k.name, &k.public_key, k.tenants.clone()) {
                        Ok(key) => trust.keys.push(key),
                        Err(e) => {
                            tracing::error!(key = %k.key_id, error = %e, "a stored publisher key cannot be used")
                        }
                    }
                }
                KeyState::Revoked => {
                    trust
                        .revoked
                        .insert(k.key_id.clone(), k.revocation().unwrap_or_default());
                }
            }
        }
        if let Some(demo) = &self.demo
            && !trust.revoked.contains_key(&demo.key_id)
            && !trust.keys.iter().any(|k| k.key_id == demo.key_id)
        {
            trust.keys.push(demo.clone());
        }
        let fingerprint = trust.fingerprint();
        *self.trust.write() = Arc::new(Current { trust, fingerprint });
        Ok(())
    }

    /// Every key known here: stored ones, and the demo key while the
    /// configuration trusts it.
    pub fn keys(&self) -> Result<Vec<PublisherKey>, DomainError> {
        let mut keys: Vec<PublisherKey> = self.store.list(&platform())?;
        if let Some(demo) = &self.demo
            && !keys.iter().any(|k| k.key_id == demo.key_id)
        {
            keys.push(demo_record(demo, self.clock.now()));
        }
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(keys)
    }

    /// Trusts a publisher key (new, revoked before, or trusted for more
    /// tenants; `replace` sets its name and tenants exactly), then
    /// verifies the stored releases again. Returns what changed, in words
    /// (`None`: nothing).
    pub async fn trust_key(
        &self,
        name: &str,
        public_key: &str,
        tenant_names: &[String],
        replace: bool,
        by: &str,
    ) -> Result<(PublisherKey, KeyChange, Reverified), ReleaseError> {
        if name.trim().is_empty() {
            return Err(DomainError::from(FieldError::new("name", "is required")).into());
        }
        let key = TrustedKey::new(name.trim(), public_key, tenants(tenant_names)?)
            .map_err(|e| DomainError::from(FieldError::new("publicKey", e.0)))?;
        let spec = KeySpec {
            key_id: key.key_id,
            name: name.trim().to_string(),
            public_key: public_key.trim().to_string(),
            tenants: key.tenants,
            source: KeySource::Operator,
            replace,
        };
        let now = self.clock.now();
        let by_owned = by.to_string();
        let (key, change) = self
            .store
            .transact(
                move |tx: &mut Tx| -> Result<(PublisherKey, KeyChange), ReleaseError> {
                    let scope = platform();
                    let existing: Option<PublisherKey> = tx.get(&scope, &spec.key_id)?;
                    PublisherKey::check_name(&tx.list::<PublisherKey>(&scope)?, &spec)?;
                    let (mut key, change) = PublisherKey::trust(existing, spec, &by_owned, now)?;
                    if let Some(change) = &change {
                        tx.emit(key.changed_event(&by_owned, change, now))?;
                        tx.save(&scope, &mut key)?;
                    }
                    Ok((key, change))
                },
            )
            .await?;
        tracing::info!(
            key = %key.key_id,
            name = %key.name,
            by,
            change = change.as_deref().unwrap_or("nothing changed"),
            "publisher key trusted"
        );
        self.load_trust()?;
        let done = self.reverify_stale().await?;
        Ok((key, change, done))
    }

    /// Revokes a publisher key (a reason is required), then verifies the
    /// stored releases again: what it signed becomes Untrusted.
    pub async fn revoke_key(
        &self,
        key_id: &str,
        reason: &str,
        by: &str,
    ) -> Result<(PublisherKey, Reverified), ReleaseError> {
        let now = self.clock.now();
        let demo_record = self
            .demo
            .as_ref()
            .filter(|d| d.key_id == key_id)
            .map(|d| demo_record(d, now));
        let (id, reason, by_owned) = (key_id.to_string(), reason.to_string(), by.to_string());
        let key =
            self.store
                .transact(move |tx: &mut Tx| -> Result<PublisherKey, ReleaseError> {
                    let scope = platform();
                    let mut key = match tx.get::<PublisherKey>(&scope, &id)? {
                        Some(k) => k,
                        None => demo_record
                            .ok_or_else(|| DomainError::not_found("publisher key", &id))?,
                    };
                    if key.revoke(&by_owned, &reason, now)? {
                        tx.emit(key.changed_event(&by_owned, &key.revoked_words(), now))?;
                        tx.save(&scope, &mut key)?;
                    }
                    Ok(key)
                })
                .await?;
        tracing::warn!(key = %key.key_id, name = %key.name, by, "publisher key revoked");
        self.load_trust()?;
        let done = self.reverify_stale().await?;
        Ok((key, done))
    }
}

/// The demo key as a record: trusted by the configuration switch.
fn demo_record(demo: &TrustedKey, now: chrono::DateTime<chrono::Utc>) -> PublisherKey {
    use base64::Engine as _;
    PublisherKey {
        tenant_id: TenantId::platform(),
        key_id: demo.key_id.clone(),
        name: demo.name.clone(),
        public_key: base64::engine::general_purpose::STANDARD.encode(&demo.public_key),
        tenants: demo.tenants.clone(),
        state: KeyState::Trusted,
        source: KeySource::Configuration,
        trusted_at: now,
        trusted_by: "releases.trust_demo_key".into(),
        revoked_at: None,
        revoked_by: None,
        revoke_reason: None,
        version: 0,
    }
}
