//! The site's model profiles in the store (see
//! [`crate::domain::model_profile`]): set, list and remove them, and
//! resolve the one a model call of a tenant uses.

use crate::domain::audit::Change;
use chrono::{DateTime, Utc};

use super::RuntimeError;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::model_profile::{ProfileSpec, SiteModelProfile};
use crate::domain::{DomainError, TenantId};
use crate::store::{Record, Store, StoreError, Table, Tx};

impl Record for SiteModelProfile {
    const TABLE: Table = Table::ModelProfiles;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.profile_id.clone()
    }
}

crate::versioned!(SiteModelProfile, version);

/// Sets (creates or re-points) a profile for `owner` (the platform: every
/// tenant). The next model call of the profile goes where it says.
pub async fn put(
    store: &Store,
    owner: TenantId,
    spec: ProfileSpec,
    known_key: impl Fn(&str) -> bool,
    by: &str,
    now: DateTime<Utc>,
) -> Result<SiteModelProfile, RuntimeError> {
    let profile =
        SiteModelProfile::new(owner, spec, known_key, by, now).map_err(DomainError::from)?;
    let scope = TenantScope::new(profile.tenant_id.clone());
    let saved = store
        .transact(move |tx: &mut Tx| -> Result<SiteModelProfile, StoreError> {
            let mut next = profile;
            let existing = tx.get::<SiteModelProfile>(&scope, &next.profile_id)?;
            if let Some(existing) = &existing {
                next.version = existing.version;
            }
            tx.save(&scope, &mut next)?;
            let change = Change::new(scope.tenant(), "model-profile.set", &next.profile_id)
                .before(existing.as_ref().map(SiteModelProfile::settings))
                .after(next.settings());
            tx.audit(now, change)?;
            Ok(next)
        })
        .await?;
    tracing::info!(profile = %saved.profile_id, applies_to = %saved.scope_text(), endpoint = %saved.endpoint, by, "model profile set");
    Ok(saved)
}

/// Removes a profile of `owner`; calls fall back to the platform's, then
/// to the release's own endpoint.
pub async fn remove(
    store: &Store,
    owner: TenantId,
    profile_id: &str,
    now: DateTime<Utc>,
) -> Result<SiteModelProfile, RuntimeError> {
    let scope = TenantScope::new(owner);
    let id = profile_id.to_string();
    store
        .transact(
            move |tx: &mut Tx| -> Result<SiteModelProfile, RuntimeError> {
                let existing: SiteModelProfile = tx
                    .get(&scope, &id)?
                    .ok_or_else(|| DomainError::not_found("model profile", &id))?;
                tx.delete::<SiteModelProfile>(&scope, &id)?;
                let change = Change::new(scope.tenant(), "model-profile.delete", &id)
                    .before(existing.settings());
                tx.audit(now, change)?;
                Ok(existing)
            },
        )
        .await
}

/// Every profile of the site, platform-wide and per tenant.
pub fn list(store: &Store) -> Result<Vec<SiteModelProfile>, DomainError> {
    let mut all: Vec<SiteModelProfile> = store.scan_all(&PlatformScope::internal())?;
    all.sort_by(|a, b| (&a.profile_id, &a.tenant_id).cmp(&(&b.profile_id, &b.tenant_id)));
    Ok(all)
}

/// The profile a model call of `tenant` uses for `profile_id`: the
/// tenant's, else the platform's; none means the release's own.
pub fn resolve(
    store: &Store,
    tenant: &TenantId,
    profile_id: &str,
) -> Result<Option<SiteModelProfile>, StoreError> {
    if let Some(p) = store.get(&TenantScope::new(tenant.clone()), profile_id)? {
        return Ok(Some(p));
    }
    store.get(&TenantScope::new(TenantId::platform()), profile_id)
}
