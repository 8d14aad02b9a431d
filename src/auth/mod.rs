//! Who is calling, for which tenant, with which scopes.
//!
//! Agents authenticate with client credentials (`POST /oauth/token` ->
//! a short-lived signed bearer token holding tenant and scopes). The CLI on
//! the appliance's own machine uses the local administration token written
//! to `run/admin.token` at each start (reading it requires access to the
//! data directory, which already grants everything). Every request resolves
//! to a [`Principal`]; the principal is the only source of the
//! [`TenantScope`] the store needs, so tenant isolation follows from
//! authentication rather than from each handler remembering to check.

pub mod bootstrap;
pub mod clients;
pub mod limiter;
pub mod refusals;
pub mod session;
pub mod token;
pub mod users;

use std::collections::{BTreeSet, HashSet};

use parking_lot::RwLock;
use sha2::{Digest, Sha256};

use crate::clock::SharedClock;
use crate::domain::TenantId;
use crate::domain::access::{Actor, Scope};
use crate::domain::access::{PlatformScope, TenantScope};
use crate::store::{Store, StoreError};

pub use token::IssuedToken;

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A client credential.
    Client(String),
    /// The local administration token of the CLI.
    LocalAdmin,
    /// A console user, signed in.
    User(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Client(id) => write!(f, "client {id}"),
            Subject::LocalAdmin => f.write_str("local administrator"),
            Subject::User(name) => write!(f, "user {name}"),
        }
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Who.
    pub subject: Subject,
    /// The tenant it acts for.
    pub tenant: TenantId,
    /// What it may do.
    pub scopes: BTreeSet<Scope>,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No usable credential: 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// Authenticated, but not allowed: 403.
    #[error("{0}")]
    Forbidden(String),
    /// Too many failed attempts, or too many checks at once: 429.
    #[error("{message}")]
    RateLimited {
        /// What to tell the caller.
        message: String,
        /// Seconds until trying again can succeed.
        retry_after: u64,
    },
}

impl Principal {
    /// Whether the principal holds `scope`.
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }

    /// Refuses unless the principal holds `scope`, naming it.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(AuthError::Forbidden(format!(
                "this operation requires the scope {scope}; the token of {} has {}",
                self.subject,
                if self.scopes.is_empty() {
                    "none".to_string()
                } else {
                    self.scopes
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )))
        }
    }

    /// The principal as the actor of a change to users or credentials.
    pub fn actor(&self) -> Actor {
        Actor {
            name: self.subject.to_string(),
            tenant: self.tenant.clone(),
            scopes: self.scopes.clone(),
        }
    }

    /// Whether the principal may act across tenants.
    pub fn is_platform_admin(&self) -> bool {
        self.tenant.is_platform() && self.has(Scope::Platform)
    }

    /// The store scope of the principal's own tenant.
    pub fn tenant_scope(&self) -> TenantScope {
        TenantScope::new(self.tenant.clone())
    }

    /// The store scope of `tenant`: the principal's own, or any tenant for a
    /// PlatformAdmin. Another tenant's data is refused by name.
    pub fn scope_for(&self, tenant: &TenantId) -> Result<TenantScope, AuthError> {
        if *tenant == self.tenant || self.is_platform_admin() {
            Ok(TenantScope::new(tenant.clone()))
        } else {
            Err(AuthError::Forbidden(format!(
                "{} acts for tenant {} and cannot access tenant {tenant}",
                self.subject, self.tenant
            )))
        }
    }

    /// Cross-tenant read access, for PlatformAdmins only.
    pub fn platform_scope(&self) -> Result<PlatformScope, AuthError> {
        if self.is_platform_admin() {
            Ok(PlatformScope::internal())
        } else {
            Err(AuthError::Forbidden(format!(
                "this operation spans tenants and requires a PlatformAdmin; {} acts for tenant {}",
                self.subject, self.tenant
            )))
        }
    }
}

/// Token verification and the appliance's credentials state.
pub struct Auth {
    tokens: token::TokenKeys,
    clock: SharedClock,
    /// Revoked client ids. Revocation is permanent, so a set that only grows
    /// (loaded at start, extended on revoke) decides without a store read.
    revoked: RwLock<HashSet<String>>,
    /// SHA-256 of the local administration token, when one was issued.
    local_admin: RwLock<Option<[u8; 32]>>,
    /// Failed secret checks and the hashing gate.
    pub throttle: limiter::Throttle,
    /// Refused console sign-ins, counted per source and minute.
    pub refusals: refusals::Refusals,
    /// `[auth]` as in force now (token lifetime, failure limits).
    config: crate::config::Live<crate::config::AuthConfig>,
    /// The first use of the bootstrap secrets, once printed.
    pub bootstrap: bootstrap::Watch,
}

impl Auth {
    /// Loads (or creates) the token signing key and the revoked clients.
    pub async fn open(
        store: &Store,
        clock: SharedClock,
        config: crate::config::Live<crate::config::AuthConfig>,
    ) -> Result<Auth, StoreError> {
        let tokens = token::TokenKeys::load_or_create(store).await?;
        let revoked = clients::revoked_ids(store)?;
        Ok(Auth {
            tokens,
            throttle: limiter::Throttle::new(clock.clone(), config.clone()),
            refusals: refusals::Refusals::default(),
            config,
            clock,
            revoked: RwLock::new(revoked),
            local_admin: RwLock::new(None),
            bootstrap: bootstrap::Watch::default(),
        })
    }

    /// Issues a fresh local administration token and returns it.
    pub fn issue_local_admin_token(&self) -> String {
        let token = format!("aba_{}", token::random_token());
        *self.local_admin.write() = Some(Sha256::digest(token.as_bytes()).into());
        token
    }

    /// Records a revocation so that tokens already issued stop working.
    pub fn mark_revoked(&self, client_id: &str) {
        self.revoked.write().insert(client_id.to_string());
    }

    /// Issues a bearer token for an authenticated client credential.
    pub fn issue(
        &self,
        credential: &crate::domain::credential::ClientCredential,
        scopes: BTreeSet<Scope>,
    ) -> IssuedToken {
        let ttl = self.config.get().token_ttl_seconds;
        self.tokens.issue(credential, scopes, self.clock.now(), ttl)
    }

    /// Resolves an `Authorization` header value to a principal.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        let principal = self.principal_of(authorization)?;
        // Whatever the request changes is audited as done by this principal.
        crate::acting::set_actor(&principal.subject.to_string());
        Ok(principal)
    }

    fn principal_of(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        let header = authorization.ok_or_else(|| {
            AuthError::Unauthenticated(
                "missing Authorization header; send `Authorization: Bearer <token>` with a token from POST /oauth/token"
                    .into(),
            )
        })?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                AuthError::Unauthenticated(
                    "the Authorization header must be `Bearer <token>`".into(),
                )
            })?;
        if token.starts_with("aba_") {
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            return match *self.local_admin.read() {
                Some(expected) if expected == digest => Ok(Principal {
                    subject: Subject::LocalAdmin,
                    tenant: TenantId::platform(),
                    scopes: Scope::ALL.iter().copied().collect(),
                }),
                _ => Err(AuthError::Unauthenticated(
                    "the local administration token is not the current one; the appliance issues a new one at each start"
                        .into(),
                )),
            };
        }
        let principal = self.tokens.verify(token, self.clock.now())?;
        if let Subject::Client(id) = &principal.subject
            && self.revoked.read().contains(id)
        {
            return Err(AuthError::Unauthenticated(format!(
                "client {id} has been revoked; its tokens are no longer accepted"
            )));
        }
        Ok(principal)
    }
}
