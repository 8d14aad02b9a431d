//! Console users: create, authenticate, list, disable, set a password.
//!
//! The console, the Admin RPC service and the offline CLI call these
//! functions. User names are unique across the appliance: a platform-tenant
//! index `user/<username>` names the tenant that holds the record, so signing
//! in needs only a name and a password.

use std::collections::BTreeSet;
use std::net::IpAddr;

use chrono::{DateTime, Utc};

use super::clients::{hash_secret, verify_secret};
use super::{Auth, AuthError};
use crate::capacity::records::TENANT_RECORD;
use crate::domain::access::{Actor, Role, Scope};
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::tenant::Tenant;
use crate::domain::user::{
    User, check_password, parse_email, parse_username, sign_in_name, tried_name,
};
use crate::domain::{DomainError, FieldError, TenantId};
use crate::store::{Record, Store, StoreError, Table, Tx};

impl Record for User {
    const TABLE: Table = Table::Users;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.username.clone()
    }
}

/// The platform-tenant index from user name to tenant.
const LOGIN_INDEX: &str = "user";

/// Errors of user management.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// A rule of the domain.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<FieldError> for UserError {
    fn from(e: FieldError) -> Self {
        UserError::Domain(e.into())
    }
}

/// A generated password: 24 characters of base64url (144 bits).
pub fn generate_password() -> String {
    let mut bytes = [0u8; 18];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What a new user is.
pub struct NewUser<'a> {
    /// Its tenant.
    pub tenant: TenantScope,
    /// Sign-in name.
    pub username: &'a str,
    /// Name shown to people.
    pub display_name: &'a str,
    /// Roles in the tenant.
    pub roles: BTreeSet<Role>,
    /// The password, checked for length; generated when `None`.
    pub password: Option<&'a str>,
    /// Where mail reaches the user (empty: none).
    pub email: &'a str,
}

/// The scopes a set of roles stands for.
fn scopes_of(roles: &BTreeSet<Role>) -> BTreeSet<Scope> {
    roles.iter().flat_map(|r| r.scopes()).collect()
}

/// Creates a user in a registered tenant, refusing a name already taken in
/// any tenant and roles beyond the actor's authority. Returns the user and
/// the password when it was generated (to show once).
pub async fn create(
    store: &Store,
    actor: &Actor,
    new: NewUser<'_>,
    now: DateTime<Utc>,
) -> Result<(User, Option<String>), UserError> {
    let roles: Vec<&str> = new.roles.iter().map(|r| r.as_str()).collect();
    actor.may_manage(
        &scopes_of(&new.roles),
        &format!("create a user with the roles {}", roles.join(", ")),
    )?;
    let email = parse_email("email", new.email)?;
    let generated = new.password.is_none().then(generate_password);
    let password = new.password.or(generated.as_deref()).unwrap_or_default();
    check_password(password)?;
    let password_hash = hash_secret(password).await;
    let (mut user, event) = User::create(
        new.tenant.tenant().clone(),
        new.username,
        new.display_name,
        new.roles,
        password_hash,
        &actor.name,
        now,
    )?;
    user.email = email;
    let stored = user.clone();
    let tenant = new.tenant;
    store
        .transact(move |tx: &mut Tx| {
            if tx.get::<Tenant>(&tenant, TENANT_RECORD)?.is_none() {
                return Err(UserError::Domain(
                    FieldError::new(
                        "tenantId",
                        format!("tenant {} is not registered", tenant.tenant()),
                    )
                    .into(),
                ));
            }
            insert(tx, &tenant, &stored)?;
            tx.emit(event)?;
            Ok(())
        })
        .await?;
    Ok((user, generated))
}

/// Writes a new user and its name in the login index, refusing a taken name.
pub(super) fn insert(tx: &mut Tx, tenant: &TenantScope, user: &User) -> Result<(), UserError> {
    let platform = TenantScope::new(TenantId::platform());
    // The owner's tenant is not named: the caller may not see that tenant.
    if !tx
        .index_ids(&platform, LOGIN_INDEX, &user.username)?
        .is_empty()
    {
        // User names are unique across the appliance.
        return Err(DomainError::AlreadyExists {
            kind: "user",
            id: user.username.clone(),
        }
        .into());
    }
    tx.put(tenant, user)?;
    tx.index_put(
        &platform,
        LOGIN_INDEX,
        &user.username,
        tenant.tenant().as_str(),
    )?;
    Ok(())
}

/// Finds a user by name in whichever tenant holds it.
pub fn find(store: &Store, username: &str) -> Result<Option<User>, StoreError> {
    let Ok(name) = parse_username(&sign_in_name(username)) else {
        return Ok(None);
    };
    let platform = TenantScope::new(TenantId::platform());
    let Some(tenant) = store
        .index_ids(&platform, LOGIN_INDEX, &name)?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let Ok(tenant) = TenantId::parse(&tenant) else {
        return Ok(None);
    };
    store.get(&TenantScope::new(tenant), &name)
}

/// Checks a user name and password from `source`. Checks are throttled
/// (see [`super::limiter`]) and a failure does not say whether the name
/// exists.
pub async fn authenticate(
    store: &Store,
    auth: &Auth,
    username: &str,
    password: &str,
    source: IpAddr,
) -> Result<User, AuthError> {
    // Bounded whatever was sent: no account's name is longer.
    let key = format!("user:{}", tried_name(username));
    let turn = auth.throttle.turn(&key, source).await?;
    let refused = || AuthError::Unauthenticated("unknown user name or wrong password".into());
    let found = find(store, username).ok().flatten();
    // Without a user, a dummy check keeps the timing of both answers alike.
    let hash_of = found.as_ref().map(|u| u.password_hash.clone());
    let found_name = found.as_ref().map(|u| u.username.clone());
    let slot = turn.hash_slot().await?;
    let ok = {
        let password = password.to_string();
        tokio::task::spawn_blocking(move || match hash_of {
            Some(h) => verify_secret(&password, &h),
            None => {
                verify_secret(&password, DUMMY_HASH);
                false
            }
        })
        .await
        .unwrap_or(false)
    };
    drop((slot, turn));
    let Some(user) = found.filter(|_| ok) else {
        auth.throttle.failed(&key, source);
        // The name typed is logged only when it is an account's: a
        // password typed into the user field stays out of the log.
        let known = found_name.as_deref().unwrap_or("(no such user)");
        tracing::info!(user = %known, %source, "sign-in refused");
        return Err(refused());
    };
    if user.disabled_at.is_some() {
        return Err(AuthError::Unauthenticated(format!(
            "user {} is disabled",
            user.username
        )));
    }
    auth.bootstrap
        .user_used(store, &user.username, auth.clock.now())
        .await;
    Ok(user)
}

/// An argon2id hash of a random string, for timing-equal refusals.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$K0n8tTnCpzm8kjTH0qGb0bnQx9uAg5o0PZ1h3mYAr5w";

/// Users of one tenant.
pub fn list(store: &Store, tenant: &TenantScope) -> Result<Vec<User>, DomainError> {
    Ok(store.list(tenant)?)
}

/// Users of every tenant.
pub fn list_all(store: &Store, platform: &PlatformScope) -> Result<Vec<User>, DomainError> {
    Ok(store.scan_all(platform)?)
}

/// Reads a user of the scope's tenant inside a transaction and checks that
/// the actor may manage it (see [`Actor::may_manage`]).
fn managed(
    tx: &Tx,
    actor: &Actor,
    tenant: &TenantScope,
    name: &str,
    what: &str,
) -> Result<User, UserError> {
    let user: User = tx
        .get(tenant, name)?
        .ok_or_else(|| DomainError::not_found("user", name))?;
    actor.may_manage(&user.scopes(), &format!("{what} user {name}"))?;
    Ok(user)
}

/// Disables a user of the scope's tenant; the last active PlatformAdmin
/// user cannot be disabled. Idempotent.
pub async fn disable(
    store: &Store,
    actor: &Actor,
    tenant: TenantScope,
    username: &str,
    now: DateTime<Utc>,
) -> Result<User, UserError> {
    let name = parse_username(username)?;
    let actor = actor.clone();
    store
        .transact(move |tx: &mut Tx| {
            let mut user = managed(tx, &actor, &tenant, &name, "disable")?;
            if user.tenant_id.is_platform() {
                let platform = tx.list::<User>(&tenant)?;
                user.check_disablable(&platform)?;
            }
            if let Some(event) = user.disable(&actor.name, now) {
                tx.put(&tenant, &user)?;
                tx.emit(event)?;
            }
            Ok::<_, UserError>(user)
        })
        .await
}

/// Enables a disabled user of the scope's tenant again. Idempotent.
pub async fn enable(
    store: &Store,
    actor: &Actor,
    tenant: TenantScope,
    username: &str,
    now: DateTime<Utc>,
) -> Result<User, UserError> {
    let name = parse_username(username)?;
    let actor = actor.clone();
    store
        .transact(move |tx: &mut Tx| {
            let mut user = managed(tx, &actor, &tenant, &name, "enable")?;
            if let Some(event) = user.enable(&actor.name, now) {
                tx.put(&tenant, &user)?;
                tx.emit(event)?;
            }
            Ok::<_, UserError>(user)
        })
        .await
}

/// Sets or clears a user's mail address: the user's own, or an
/// administrator's change.
pub async fn set_email(
    store: &Store,
    actor: &Actor,
    tenant: TenantScope,
    username: &str,
    email: &str,
    now: DateTime<Utc>,
) -> Result<User, UserError> {
    let name = parse_username(username)?;
    let email = parse_email("email", email)?;
    let actor = actor.clone();
    store
        .transact(move |tx: &mut Tx| {
            // A user's own scopes are within its own authority: the
            // same rule lets a user set its own address.
            let mut user = managed(tx, &actor, &tenant, &name, "set the mail address of")?;
            if let Some(event) = user.set_email(email, &actor.name, now) {
                tx.put(&tenant, &user)?;
                tx.emit(event)?;
            }
            Ok::<_, UserError>(user)
        })
        .await
}

/// Sets a user's password (its own change, or an administrator's reset).
pub async fn set_password(
    store: &Store,
    actor: &Actor,
    tenant: TenantScope,
    username: &str,
    password: &str,
    now: DateTime<Utc>,
) -> Result<User, UserError> {
    let name = parse_username(username)?;
    check_password(password)?;
    // Refused before the costly hash when the actor may not.
    let target = store
        .get::<User>(&tenant, &name)?
        .ok_or_else(|| DomainError::not_found("user", &name))?;
    actor.may_manage(
        &target.scopes(),
        &format!("set the password of user {name}"),
    )?;
    let password_hash = hash_secret(password).await;
    let actor = actor.clone();
    store
        .transact(move |tx: &mut Tx| {
            let mut user = managed(tx, &actor, &tenant, &name, "set the password of")?;
            let event = user.set_password(password_hash, &actor.name, now);
            tx.put(&tenant, &user)?;
            tx.emit(event)?;
            Ok::<_, UserError>(user)
        })
        .await
}

/// The console's bootstrap PlatformAdmin, made with the bootstrap credential.
pub(super) async fn bootstrap_user(password: &str, now: DateTime<Utc>) -> Result<User, UserError> {
    let (user, _) = User::create(
        TenantId::platform(),
        BOOTSTRAP_USER,
        "Platform administrator",
        [Role::PlatformAdmin].into(),
        hash_secret(password).await,
        "bootstrap",
        now,
    )?;
    Ok(user)
}

/// Name of the bootstrap console user.
pub const BOOTSTRAP_USER: &str = "admin";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dummy_hash_is_a_valid_argon2id_hash() {
        assert!(argon2::password_hash::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!verify_secret("anything", DUMMY_HASH));
        assert_eq!(generate_password().len(), 24);
    }
}
