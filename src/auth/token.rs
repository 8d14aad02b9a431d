//! Signed bearer tokens (JWT, HS256).
//!
//! The signing key is 32 random bytes kept in the store's `meta` tree, made
//! on first start. Expiry is checked against the appliance's [`Clock`]
//! rather than the library's wall clock, so token lifetimes are testable
//! like every other duration.
//!
//! [`Clock`]: crate::clock::Clock

use std::collections::BTreeSet;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::{AuthError, Principal, Subject};
use crate::domain::TenantId;
use crate::domain::access::Scope;
use crate::domain::credential::ClientCredential;
use crate::domain::ids::new_id;
use crate::store::{Store, StoreError, Tx};

const SIGNING_KEY: &str = "auth.signing_key";
const ISSUER: &str = "agentbay";

#[derive(Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    tenant: String,
    scope: String,
    iat: i64,
    exp: i64,
    jti: String,
}

/// A token handed to a client.
#[derive(Clone, Debug, Serialize)]
pub struct IssuedToken {
    /// The bearer token.
    pub access_token: String,
    /// Seconds until it expires.
    pub expires_in: u64,
    /// Space-separated scopes it carries.
    pub scope: String,
    /// When it expires.
    #[serde(skip)]
    pub expires_at: DateTime<Utc>,
}

/// 32 random bytes, base64url without padding.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub(crate) struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl TokenKeys {
    /// Replaces the signing key with a new random one: every token issued
    /// before stops verifying. Clients ask for a new token with their
    /// unchanged credentials. Only while the appliance is stopped (the
    /// running one holds its key in memory).
    pub async fn rotate(store: &Store) -> Result<(), StoreError> {
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).expect("the OS random source works");
        store
            .transact(move |tx: &mut Tx| {
                tx.meta_put(SIGNING_KEY, &fresh);
                Ok::<_, StoreError>(())
            })
            .await
    }

    pub(super) async fn load_or_create(store: &Store) -> Result<TokenKeys, StoreError> {
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).expect("the OS random source works");
        let key = store
            .transact(move |tx: &mut Tx| match tx.meta_get(SIGNING_KEY)? {
                Some(existing) => Ok::<_, StoreError>(existing),
                None => {
                    tx.meta_put(SIGNING_KEY, &fresh);
                    Ok(fresh.to_vec())
                }
            })
            .await?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        // Expiry is checked against the injectable clock below.
        validation.validate_exp = false;
        Ok(TokenKeys {
            encoding: EncodingKey::from_secret(&key),
            decoding: DecodingKey::from_secret(&key),
            validation,
        })
    }

    pub(super) fn issue(
        &self,
        credential: &ClientCredential,
        scopes: BTreeSet<Scope>,
        now: DateTime<Utc>,
        ttl_seconds: u64,
    ) -> IssuedToken {
        let scope = scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        let expires_at = now + chrono::Duration::seconds(ttl_seconds as i64);
        let claims = Claims {
            iss: ISSUER.into(),
            sub: credential.client_id.clone(),
            tenant: credential.tenant_id.to_string(),
            scope: scope.clone(),
            iat: now.timestamp(),
            exp: expires_at.timestamp(),
            jti: new_id().to_string(),
        };
        let access_token =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
                .expect("HS256 signing cannot fail");
        IssuedToken {
            access_token,
            expires_in: ttl_seconds,
            scope,
            expires_at,
        }
    }

    pub(super) fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<Principal, AuthError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| {
                AuthError::Unauthenticated(format!(
                    "the bearer token is not valid here ({e}); request a new one"
                ))
            })?;
        let claims = data.claims;
        if claims.exp <= now.timestamp() {
            return Err(AuthError::Unauthenticated(
                "the bearer token has expired; request a new one from POST /oauth/token".into(),
            ));
        }
        let tenant = TenantId::parse(&claims.tenant).map_err(|_| {
            AuthError::Unauthenticated("the bearer token names no valid tenant".into())
        })?;
        let scopes = claims
            .scope
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        Ok(Principal {
            subject: Subject::Client(claims.sub),
            tenant,
            scopes,
        })
    }
}
