//! The bootstrap PlatformAdmin: a client credential for agents and scripts
//! and the console user `admin`, made at the first start.
//!
//! Their secrets are stored only as hashes, so the appliance cannot show
//! them again by itself. Until one of them is used, a sealed copy stays in
//! the data directory (`bootstrap.sealed`, owner-only, AES-256-GCM with a
//! key kept in the store, so the file alone reveals nothing) and every
//! start prints them again: a first start that fails after making them (a
//! port already taken) or output nobody kept does not lock the operator
//! out. The first token issued to the credential, or the first sign-in of
//! `admin`, deletes the copy and its key; so does a reset of the `admin`
//! password or a revocation of the credential, seen at the next start.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use super::clients::{ClientError, SECRET_PREFIX, hash_secret, verify_secret};
use crate::domain::TenantId;
use crate::domain::access::Scope;
use crate::domain::access::TenantScope;
use crate::domain::credential::ClientCredential;
use crate::store::{Store, StoreError, Tx};

/// Meta key set once the bootstrap credential exists.
const BOOTSTRAPPED: &str = "auth.bootstrapped_at";
/// Meta key of the sealing key, present while the secrets are unused.
const SEAL_KEY: &str = "auth.bootstrap_seal_key";
/// Meta key saying when and how the bootstrap secrets were first used.
const USED: &str = "auth.bootstrap_used";
/// The sealed copy, in the data directory.
pub const SEALED_FILE: &str = "bootstrap.sealed";
const MAGIC: &[u8] = b"agentbay-bootstrap-1\n";

/// The bootstrap secrets, to print.
#[derive(Clone, Serialize, Deserialize)]
pub struct Bootstrapped {
    /// The PlatformAdmin client credential's id.
    pub client_id: String,
    /// Its secret.
    pub client_secret: String,
    /// The console's PlatformAdmin user.
    pub username: String,
    /// Its password.
    pub password: String,
    /// Made at this start (false: made earlier, not used yet).
    #[serde(skip)]
    pub first_time: bool,
}

impl Bootstrapped {
    /// The stored credential (revoked or not), to issue tokens in-process.
    pub fn credential(&self, store: &Store) -> Result<Option<ClientCredential>, StoreError> {
        store.get(&TenantScope::new(TenantId::platform()), &self.client_id)
    }
}

fn sealed_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SEALED_FILE)
}

/// `None` when the stored key is not an AES-256 key.
fn cipher(key: &[u8]) -> Option<LessSafeKey> {
    UnboundKey::new(&AES_256_GCM, key)
        .ok()
        .map(LessSafeKey::new)
}

fn seal(key: &[u8; 32], secrets: &Bootstrapped) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).expect("the OS random source works");
    let mut body = serde_json::to_vec(secrets).expect("secrets serialise");
    cipher(key)
        .expect("a 32-byte key is an AES-256 key")
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut body)
        .expect("a few hundred bytes seal");
    [MAGIC, &nonce, &body].concat()
}

fn unseal(key: &[u8], bytes: &[u8]) -> Option<Bootstrapped> {
    let rest = bytes.strip_prefix(MAGIC)?;
    if rest.len() < NONCE_LEN {
        return None;
    }
    let (nonce, body) = rest.split_at(NONCE_LEN);
    let mut body = body.to_vec();
    let plain = cipher(key)?
        .open_in_place(
            Nonce::try_assume_unique_for_key(nonce).ok()?,
            Aad::empty(),
            &mut body,
        )
        .ok()?;
    serde_json::from_slice(plain).ok()
}

/// Makes the bootstrap credential and user if this store never had them,
/// or returns them again while neither has been used. `data_dir` is where
/// the sealed copy lives.
///
/// The sealed copy is written (and synced) before the transaction that
/// makes the credential commits: a crash in between leaves a copy of
/// secrets that do not exist, which the next start replaces; never
/// secrets that exist without a copy.
pub async fn ensure(
    store: &Store,
    data_dir: &Path,
    now: DateTime<Utc>,
) -> Result<Option<Bootstrapped>, ClientError> {
    let path = sealed_path(data_dir);
    if store.meta_get(BOOTSTRAPPED)?.is_some() {
        return again(store, &path, now).await;
    }
    let secret = format!("{SECRET_PREFIX}{}", super::token::random_token());
    let (credential, event) = ClientCredential::create(
        TenantId::platform(),
        Scope::ALL.iter().copied().collect(),
        "bootstrap PlatformAdmin credential",
        hash_secret(&secret).await,
        "bootstrap",
        now,
    )?;
    let password = super::users::generate_password();
    let user = super::users::bootstrap_user(&password, now).await?;
    let secrets = Bootstrapped {
        client_id: credential.client_id.clone(),
        client_secret: secret,
        username: user.username.clone(),
        password,
        first_time: true,
    };
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("the OS random source works");
    crate::store::datadir::write_private(&path, &seal(&key, &secrets))?;
    let created = store
        .transact(move |tx: &mut Tx| {
            if tx.meta_get(BOOTSTRAPPED)?.is_some() {
                return Ok::<_, ClientError>(false);
            }
            let scope = TenantScope::new(TenantId::platform());
            tx.put(&scope, &credential)?;
            tx.emit(event)?;
            super::users::insert(tx, &scope, &user)?;
            tx.meta_put(BOOTSTRAPPED, now.to_rfc3339().as_bytes());
            tx.meta_put(SEAL_KEY, &key);
            Ok(true)
        })
        .await?;
    Ok(created.then_some(secrets))
}

/// The secrets made at an earlier start, if they are still unused and
/// still work.
async fn again(
    store: &Store,
    path: &Path,
    now: DateTime<Utc>,
) -> Result<Option<Bootstrapped>, ClientError> {
    let Some(key) = store.meta_get(SEAL_KEY)? else {
        let _ = std::fs::remove_file(path);
        return Ok(None);
    };
    let Some(secrets) = std::fs::read(path)
        .ok()
        .and_then(|bytes| unseal(&key, &bytes))
    else {
        tracing::warn!(
            file = %path.display(),
            "the bootstrap secrets are unused but their sealed copy is missing or unreadable; \
             set a new password with `agentbay user reset-password --tenant platform admin`"
        );
        return Ok(None);
    };
    let platform = TenantScope::new(TenantId::platform());
    let credential_works = store
        .get::<ClientCredential>(&platform, &secrets.client_id)?
        .is_some_and(|c| c.revoked_at.is_none());
    let password_works = match super::users::find(store, &secrets.username)? {
        Some(user) => {
            let (password, hash) = (secrets.password.clone(), user.password_hash);
            tokio::task::spawn_blocking(move || verify_secret(&password, &hash))
                .await
                .unwrap_or(false)
        }
        None => false,
    };
    if !(credential_works && password_works) {
        let how = if credential_works {
            "the admin password was changed"
        } else {
            "the bootstrap credential was revoked"
        };
        used(store, path, how, now).await?;
        return Ok(None);
    }
    Ok(Some(secrets))
}

/// Records the first use and deletes the sealed copy and its key.
async fn used(store: &Store, path: &Path, how: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
    let record = format!("{} ({how})", now.to_rfc3339());
    store
        .transact(move |tx: &mut Tx| {
            if tx.meta_get(SEAL_KEY)?.is_some() {
                tx.meta_delete(SEAL_KEY);
                tx.meta_put(USED, record.as_bytes());
            }
            Ok::<_, StoreError>(())
        })
        .await?;
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(how = %how, "the bootstrap secrets were used; their sealed copy is deleted");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(format!("deleting {}", path.display()))(e)),
    }
}

/// What the running appliance watches for: the first use of the bootstrap
/// secrets it printed.
#[derive(Default)]
pub struct Watch(Mutex<Option<Pending>>);

struct Pending {
    client_id: String,
    username: String,
    file: PathBuf,
}

impl Watch {
    /// Starts watching for the use of `secrets`, whose sealed copy is in
    /// `data_dir`.
    pub fn arm(&self, secrets: &Bootstrapped, data_dir: &Path) {
        *self.0.lock() = Some(Pending {
            client_id: secrets.client_id.clone(),
            username: secrets.username.clone(),
            file: sealed_path(data_dir),
        });
    }

    /// A client credential got a token.
    pub(super) async fn client_used(&self, store: &Store, client_id: &str, now: DateTime<Utc>) {
        self.check(
            store,
            |p| p.client_id == client_id,
            "a token was issued to the credential",
            now,
        )
        .await
    }

    /// A user signed in.
    pub(super) async fn user_used(&self, store: &Store, username: &str, now: DateTime<Utc>) {
        self.check(store, |p| p.username == username, "admin signed in", now)
            .await
    }

    async fn check(
        &self,
        store: &Store,
        matches: impl Fn(&Pending) -> bool,
        how: &str,
        now: DateTime<Utc>,
    ) {
        let file = {
            let mut pending = self.0.lock();
            match pending.as_ref() {
                Some(p) if matches(p) => pending.take().map(|p| p.file),
                _ => None,
            }
        };
        if let Some(file) = file
            && let Err(e) = used(store, &file, how, now).await
        {
            tracing::warn!(error = %e, "recording the first use of the bootstrap secrets failed");
        }
    }
}
