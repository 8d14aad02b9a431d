//! Client credentials: create, authenticate, list, revoke.
//!
//! Both the Admin RPC service and the offline CLI call these functions, so
//! a credential is made the same way whether or not the appliance runs.

use std::collections::{BTreeSet, HashSet};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use chrono::{DateTime, Utc};

use super::{Auth, AuthError};
use crate::capacity::records::TENANT_RECORD;
use crate::domain::access::{Actor, Scope};
use crate::domain::credential::ClientCredential;
use crate::domain::tenant::Tenant;
use crate::domain::{DomainError, FieldError, TenantId};
use crate::store::{PlatformScope, Record, Store, StoreError, Table, TenantScope, Tx};

impl Record for ClientCredential {
    const TABLE: Table = Table::Clients;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.client_id.clone()
    }
}

/// Errors of credential management.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A rule of the domain.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<super::users::UserError> for ClientError {
    fn from(e: super::users::UserError) -> Self {
        match e {
            super::users::UserError::Domain(d) => ClientError::Domain(d),
            super::users::UserError::Store(s) => ClientError::Store(s),
        }
    }
}

/// Prefix of client secrets, so that a leaked one is recognisable.
const SECRET_PREFIX: &str = "abs_";

/// The argon2id hash of a secret or password, computed off the executor:
/// argon2id takes tens of milliseconds by design.
pub(super) async fn hash_secret(secret: &str) -> String {
    let secret = secret.to_string();
    tokio::task::spawn_blocking(move || hash_now(&secret))
        .await
        .expect("hashing does not panic")
}

fn hash_now(secret: &str) -> String {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).expect("the OS random source works");
    let salt = SaltString::encode_b64(&salt).expect("16 bytes make a valid salt");
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .expect("argon2id with default parameters hashes any input")
        .to_string()
}

pub(super) fn verify_secret(secret: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(secret.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// Creates a credential, refusing scopes beyond the actor's authority;
/// returns it with its secret, which is shown once.
pub async fn create(
    store: &Store,
    actor: &Actor,
    tenant: TenantScope,
    scopes: BTreeSet<Scope>,
    description: &str,
    now: DateTime<Utc>,
) -> Result<(ClientCredential, String), ClientError> {
    let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    actor.may_manage(
        &scopes,
        &format!("create a credential with the scopes {}", names.join(", ")),
    )?;
    let secret = format!("{SECRET_PREFIX}{}", super::token::random_token());
    let hash = hash_secret(&secret).await;
    let (credential, event) = ClientCredential::create(
        tenant.tenant().clone(),
        scopes,
        description,
        hash,
        &actor.name,
        now,
    )?;
    let stored = credential.clone();
    store
        .transact(move |tx: &mut Tx| {
            // Credentials refer to registered tenants only.
            if tx.get::<Tenant>(&tenant, TENANT_RECORD)?.is_none() {
                return Err(ClientError::Domain(
                    FieldError::new(
                        "tenantId",
                        format!(
                            "tenant {} is not registered; register it first (PUT /platform/tenants/{0} or `agentbay tenant put {0}`)",
                            tenant.tenant()
                        ),
                    )
                    .into(),
                ));
            }
            tx.put(&tenant, &stored)?;
            tx.emit(event)?;
            Ok::<_, ClientError>(())
        })
        .await?;
    Ok((credential, secret))
}

/// Meta key set once the bootstrap credential exists.
const BOOTSTRAPPED: &str = "auth.bootstrapped_at";

/// Creates the PlatformAdmin bootstrap credential, once per store: the
/// credential and the flag that says it was made commit together, so a
/// crash can neither lose it nor make a second one.
pub async fn bootstrap(
    store: &Store,
    now: DateTime<Utc>,
) -> Result<Option<Bootstrapped>, ClientError> {
    let secret = format!("{SECRET_PREFIX}{}", super::token::random_token());
    let hash = hash_secret(&secret).await;
    let (credential, event) = ClientCredential::create(
        TenantId::platform(),
        Scope::ALL.iter().copied().collect(),
        "bootstrap PlatformAdmin credential",
        hash,
        "bootstrap",
        now,
    )?;
    let password = super::users::generate_password();
    let user = super::users::bootstrap_user(&password, now).await?;
    let stored = credential.clone();
    let created = store
        .transact(move |tx: &mut Tx| {
            if tx.meta_get(BOOTSTRAPPED)?.is_some() {
                return Ok::<_, ClientError>(false);
            }
            let scope = TenantScope::new(TenantId::platform());
            tx.put(&scope, &stored)?;
            tx.emit(event)?;
            super::users::insert(tx, &scope, &user)?;
            tx.meta_put(BOOTSTRAPPED, now.to_rfc3339().as_bytes());
            Ok(true)
        })
        .await?;
    Ok(created.then_some(Bootstrapped {
        credential,
        secret,
        username: super::users::BOOTSTRAP_USER.to_string(),
        password,
    }))
}

/// What the first start made, to show once.
pub struct Bootstrapped {
    /// The PlatformAdmin client credential.
    pub credential: ClientCredential,
    /// Its secret, never stored.
    pub secret: String,
    /// The console's PlatformAdmin user.
    pub username: String,
    /// Its password, never stored.
    pub password: String,
}

/// Checks a client id and secret. Failures are rate-limited per client id
/// and reported without saying whether the id exists.
pub async fn authenticate(
    store: &Store,
    auth: &Auth,
    client_id: &str,
    secret: &str,
) -> Result<ClientCredential, AuthError> {
    let refused = || AuthError::Unauthenticated("unknown client or wrong secret".into());
    if let Some(seconds) = auth.limiter.retry_after(client_id) {
        return Err(AuthError::RateLimited(format!(
            "too many failed attempts for this client; try again in {seconds} s"
        )));
    }
    let found = ClientCredential::tenant_of(client_id)
        .map(TenantScope::new)
        .and_then(|scope| {
            store
                .get::<ClientCredential>(&scope, client_id)
                .ok()
                .flatten()
        });
    let Some(credential) = found else {
        auth.limiter.record_failure(client_id);
        return Err(refused());
    };
    let ok = {
        let secret = secret.to_string();
        let hash = credential.secret_hash.clone();
        tokio::task::spawn_blocking(move || verify_secret(&secret, &hash))
            .await
            .unwrap_or(false)
    };
    if !ok {
        auth.limiter.record_failure(client_id);
        return Err(refused());
    }
    if credential.revoked_at.is_some() {
        return Err(AuthError::Unauthenticated(format!(
            "client {client_id} has been revoked"
        )));
    }
    Ok(credential)
}

/// Credentials of one tenant.
pub fn list(store: &Store, tenant: &TenantScope) -> Result<Vec<ClientCredential>, StoreError> {
    store.list(tenant)
}

/// Credentials of every tenant.
pub fn list_all(
    store: &Store,
    platform: &PlatformScope,
) -> Result<Vec<ClientCredential>, StoreError> {
    store.scan_all(platform)
}

/// Revokes a credential of the scope's tenant, if the actor may manage it;
/// the last active PlatformAdmin credential cannot be revoked. Idempotent.
pub async fn revoke(
    store: &Store,
    auth: Option<&Auth>,
    actor: &Actor,
    tenant: TenantScope,
    client_id: &str,
    now: DateTime<Utc>,
) -> Result<ClientCredential, ClientError> {
    let id = client_id.to_string();
    let actor = actor.clone();
    let revoked = store
        .transact(move |tx: &mut Tx| {
            let mut credential: ClientCredential = tx
                .get(&tenant, &id)?
                .ok_or_else(|| DomainError::not_found("client", &id))?;
            actor.may_manage(&credential.scopes, &format!("revoke client {id}"))?;
            if credential.is_active_platform_admin() {
                let others = tx
                    .list::<ClientCredential>(&TenantScope::new(TenantId::platform()))?
                    .into_iter()
                    .filter(|c| c.client_id != id && c.is_active_platform_admin())
                    .count();
                if others == 0 {
                    return Err(DomainError::FailedPrecondition(format!(
                        "client {id} is the last active PlatformAdmin credential; create another one first (agentbay client create --tenant platform --scope agentbay.platform ...)"
                    ))
                    .into());
                }
            }
            if let Some(event) = credential.revoke(&actor.name, now) {
                tx.put(&tenant, &credential)?;
                tx.emit(event)?;
            }
            Ok::<_, ClientError>(credential)
        })
        .await?;
    if let Some(auth) = auth {
        auth.mark_revoked(&revoked.client_id);
    }
    Ok(revoked)
}

/// Ids of every revoked credential, to refuse their tokens.
pub(super) fn revoked_ids(store: &Store) -> Result<HashSet<String>, StoreError> {
    Ok(list_all(store, &PlatformScope::internal())?
        .into_iter()
        .filter(|c| c.revoked_at.is_some())
        .map(|c| c.client_id)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_verify_only_against_their_hash() {
        let hash = hash_now("abs_right");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_secret("abs_right", &hash));
        assert!(!verify_secret("abs_wrong", &hash));
        assert!(!verify_secret("abs_right", "not a hash"));
    }
}
