//! Client credentials: create, authenticate, list, revoke.
//!
//! Both the Admin RPC service and the offline CLI call these functions, so
//! a credential is made the same way whether or not the appliance runs.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use chrono::{DateTime, Utc};

use super::{Auth, AuthError};
use crate::capacity::records::TENANT_RECORD;
use crate::domain::access::{Actor, Scope};
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::credential::ClientCredential;
use crate::domain::tenant::Tenant;
use crate::domain::{DomainError, FieldError, TenantId};
use crate::store::{Record, Store, StoreError, Table, Tx};

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
pub(super) const SECRET_PREFIX: &str = "abs_";

/// The argon2id hash of a secret or password, computed off the executor
/// (argon2id takes tens of milliseconds by design) in a slot of the
/// hashing gate (it holds 19 MiB).
pub(super) async fn hash_secret(secret: &str) -> String {
    let secret = secret.to_string();
    let slot = super::limiter::HashSlot::wait().await;
    let hash = tokio::task::spawn_blocking(move || hash_now(&secret))
        .await
        .expect("hashing does not panic");
    drop(slot);
    hash
}

fn hash_now(secret: &str) -> String {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).expect("the OS random source works");
    let argon = Argon2::default();
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    compute(&argon, secret.as_bytes(), &salt, &mut out)
        .expect("argon2id with default parameters hashes any input");
    PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(argon.params()).expect("default parameters encode"),
        salt: Some(
            SaltString::encode_b64(&salt)
                .expect("16 bytes make a valid salt")
                .as_salt(),
        ),
        hash: Some(Output::new(&out).expect("32 bytes make a valid output")),
    }
    .to_string()
}

/// Largest argon2 memory cost a stored hash may ask for, in KiB.
const MAX_M_COST: u32 = 256 * 1024;

pub(super) fn verify_secret(secret: &str, hash: &str) -> bool {
    let check = || -> Option<bool> {
        let parsed = PasswordHash::new(hash).ok()?;
        let algorithm = Algorithm::try_from(parsed.algorithm).ok()?;
        let version = match parsed.version {
            Some(v) => Version::try_from(v).ok()?,
            None => Version::default(),
        };
        let params = Params::try_from(&parsed).ok()?;
        if params.m_cost() > MAX_M_COST {
            return None;
        }
        let expected = parsed.hash?;
        let mut salt = [0u8; 64];
        let salt = parsed.salt?.decode_b64(&mut salt).ok()?;
        let mut out = vec![0u8; expected.len()];
        compute(
            &Argon2::new(algorithm, version, params),
            secret.as_bytes(),
            salt,
            &mut out,
        )
        .ok()?;
        // Output's equality is constant-time.
        Some(Output::new(&out).ok()? == expected)
    };
    check().unwrap_or(false)
}

/// Runs argon2 in working memory mapped for this hash alone, so that its
/// 19 MiB go back to the system when the hash ends (an allocator would keep
/// them in the hashing thread's heap, a block per thread that ever hashed).
fn compute(argon: &Argon2, secret: &[u8], salt: &[u8], out: &mut [u8]) -> argon2::Result<()> {
    let blocks =
        MappedBlocks::new(argon.params().block_count()).ok_or(argon2::Error::MemoryTooLittle)?;
    argon.hash_password_into_with_memory(secret, salt, out, blocks)
}

/// Zeroed argon2 blocks in their own anonymous mapping (Unix), or from the
/// system allocator, which maps blocks this large on its own (Windows).
struct MappedBlocks {
    ptr: std::ptr::NonNull<Block>,
    len: usize,
}

// SAFETY: MappedBlocks owns its memory exclusively, like a Box<[Block]>.
unsafe impl Send for MappedBlocks {}

impl MappedBlocks {
    fn layout(len: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::array::<Block>(len)
            .ok()
            .filter(|l| l.size() > 0)
    }

    fn new(len: usize) -> Option<MappedBlocks> {
        let layout = Self::layout(len)?;
        #[cfg(unix)]
        // SAFETY: an anonymous private mapping of a non-zero size; the
        // kernel gives zeroed pages, aligned to the page size (more than a
        // Block's 64 bytes).
        let ptr = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else {
                p.cast::<u8>()
            }
        };
        #[cfg(not(unix))]
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::GlobalAlloc::alloc_zeroed(&std::alloc::System, layout) };
        Some(MappedBlocks {
            ptr: std::ptr::NonNull::new(ptr.cast::<Block>())?,
            len,
        })
    }
}

impl AsMut<[Block]> for MappedBlocks {
    fn as_mut(&mut self) -> &mut [Block] {
        // SAFETY: `ptr` holds `len` zeroed blocks (all-zero words are a valid
        // Block), owned by self, and the borrow is tied to `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedBlocks {
    fn drop(&mut self) {
        let layout = Self::layout(self.len).expect("mapped with it");
        #[cfg(unix)]
        // SAFETY: mapped in `new` with this size; nothing refers to it now.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), layout.size());
        }
        #[cfg(not(unix))]
        // SAFETY: allocated by System with this layout in `new`.
        unsafe {
            std::alloc::GlobalAlloc::dealloc(&std::alloc::System, self.ptr.as_ptr().cast(), layout)
        }
    }
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

/// Checks a client id and secret from `source`. Checks are throttled (see
/// [`super::limiter`]) and a failure does not say whether the id exists.
pub async fn authenticate(
    store: &Store,
    auth: &Auth,
    client_id: &str,
    secret: &str,
    source: IpAddr,
) -> Result<ClientCredential, AuthError> {
    let refused = || AuthError::Unauthenticated("unknown client or wrong secret".into());
    let key = format!("client:{client_id}");
    let turn = auth.throttle.turn(&key, source).await?;
    let found = ClientCredential::tenant_of(client_id)
        .map(TenantScope::new)
        .and_then(|scope| {
            store
                .get::<ClientCredential>(&scope, client_id)
                .ok()
                .flatten()
        });
    // Client ids are random: an unknown one costs no hash (a flood of
    // made-up ids takes no slot from real clients).
    let Some(credential) = found else {
        auth.throttle.failed(&key, source);
        return Err(refused());
    };
    let slot = turn.hash_slot().await?;
    let ok = {
        let secret = secret.to_string();
        let hash = credential.secret_hash.clone();
        tokio::task::spawn_blocking(move || verify_secret(&secret, &hash))
            .await
            .unwrap_or(false)
    };
    drop((slot, turn));
    if !ok {
        auth.throttle.failed(&key, source);
        return Err(refused());
    }
    if credential.revoked_at.is_some() {
        return Err(AuthError::Unauthenticated(format!(
            "client {client_id} has been revoked"
        )));
    }
    auth.bootstrap
        .client_used(store, client_id, auth.clock.now())
        .await;
    Ok(credential)
}

/// Credentials of one tenant.
pub fn list(store: &Store, tenant: &TenantScope) -> Result<Vec<ClientCredential>, DomainError> {
    Ok(store.list(tenant)?)
}

/// Credentials of every tenant.
pub fn list_all(
    store: &Store,
    platform: &PlatformScope,
) -> Result<Vec<ClientCredential>, DomainError> {
    Ok(store.scan_all(platform)?)
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
            if credential.tenant_id.is_platform() {
                let platform = tx.list::<ClientCredential>(&tenant)?;
                credential.check_revocable(&platform)?;
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
    Ok(store
        .scan_all::<ClientCredential>(&PlatformScope::internal())?
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

    #[test]
    fn hashes_are_standard_phc_strings_both_ways() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        // Stored by an earlier version with the library's own hasher.
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let stored = Argon2::default()
            .hash_password(b"hunter2", &salt)
            .unwrap()
            .to_string();
        assert!(verify_secret("hunter2", &stored));
        assert!(!verify_secret("hunter3", &stored));
        // Ours verify with the library's verifier.
        let ours = hash_now("hunter2");
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(
            Argon2::default()
                .verify_password(b"hunter2", &parsed)
                .is_ok()
        );
        // A stored hash asking for absurd memory is refused, not computed.
        let greedy = stored.replace("m=19456", "m=4194304");
        assert!(!verify_secret("hunter2", &greedy));
    }
}
