//! Client credentials: how local agents and tools authenticate.
//!
//! A credential belongs to one tenant and carries a fixed set of scopes. Its
//! id embeds the tenant (`<tenant>.<uuid>`) so that the token endpoint finds
//! the record under its tenant's keys without a global index. The secret is
//! never stored, only its argon2id hash.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::access::Scope;
use super::error::{DomainError, FieldError};
use super::events::{EventPayload, NewEvent};
use super::ids::{TenantId, new_id};

/// A client credential as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCredential {
    /// `<tenant>.<uuid>`.
    pub client_id: String,
    /// The tenant the client acts for.
    pub tenant_id: TenantId,
    /// What the client may do.
    pub scopes: BTreeSet<Scope>,
    /// What the client is for, as its creator wrote it.
    pub description: String,
    /// argon2id PHC string of the secret.
    pub secret_hash: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked; a revoked credential never works again.
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Payload of `agentbay.admin.v1.client-created`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCreated<'a> {
    /// The new client.
    pub client_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Its scopes.
    pub scopes: &'a BTreeSet<Scope>,
}

impl EventPayload for ClientCreated<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.client-created";
}

/// Payload of `agentbay.admin.v1.client-revoked`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientRevoked<'a> {
    /// The revoked client.
    pub client_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
}

impl EventPayload for ClientRevoked<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.client-revoked";
}

/// Longest description accepted.
pub const MAX_DESCRIPTION_LEN: usize = 200;

impl ClientCredential {
    /// A new credential. Only the platform tenant may hold the platform
    /// scope, so that no tenant can mint itself a way into another.
    pub fn create(
        tenant_id: TenantId,
        scopes: BTreeSet<Scope>,
        description: &str,
        secret_hash: String,
        now: DateTime<Utc>,
    ) -> Result<(ClientCredential, NewEvent), DomainError> {
        if scopes.is_empty() {
            return Err(FieldError::new("scopes", "at least one scope is required").into());
        }
        if scopes.contains(&Scope::Platform) && !tenant_id.is_platform() {
            return Err(FieldError::new(
                "scopes",
                format!(
                    "{} can only be granted to the platform tenant, not to {tenant_id}",
                    Scope::Platform
                ),
            )
            .into());
        }
        if description.chars().count() > MAX_DESCRIPTION_LEN {
            return Err(FieldError::new(
                "description",
                format!("is longer than {MAX_DESCRIPTION_LEN} characters"),
            )
            .into());
        }
        let client_id = format!("{tenant_id}.{}", new_id().simple());
        let credential = ClientCredential {
            client_id,
            tenant_id,
            scopes,
            description: description.trim().to_string(),
            secret_hash,
            created_at: now,
            revoked_at: None,
        };
        let event = NewEvent::new(
            &credential.tenant_id,
            now,
            &ClientCreated {
                client_id: &credential.client_id,
                tenant_id: &credential.tenant_id,
                scopes: &credential.scopes,
            },
        );
        Ok((credential, event))
    }

    /// Revokes the credential. Revoking twice changes nothing and emits
    /// nothing the second time.
    pub fn revoke(&mut self, now: DateTime<Utc>) -> Option<NewEvent> {
        if self.revoked_at.is_some() {
            return None;
        }
        self.revoked_at = Some(now);
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &ClientRevoked {
                client_id: &self.client_id,
                tenant_id: &self.tenant_id,
            },
        ))
    }

    /// The tenant named by a client id, if it is well formed.
    pub fn tenant_of(client_id: &str) -> Option<TenantId> {
        let (tenant, rest) = client_id.split_once('.')?;
        if rest.len() != 32 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        TenantId::parse(tenant).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        Utc::now()
    }

    #[test]
    fn client_ids_carry_their_tenant() {
        let tenant = TenantId::parse("acme").unwrap();
        let (cred, event) = ClientCredential::create(
            tenant.clone(),
            [Scope::CapacityRead].into(),
            "ci runner",
            "hash".into(),
            now(),
        )
        .unwrap();
        assert_eq!(ClientCredential::tenant_of(&cred.client_id), Some(tenant));
        assert_eq!(event.topic, "agentbay.admin.v1.client-created");
        assert_eq!(event.payload["clientId"], cred.client_id.as_str());
        assert_eq!(ClientCredential::tenant_of("acme"), None);
        assert_eq!(ClientCredential::tenant_of("acme.xyz"), None);
    }

    #[test]
    fn platform_scope_stays_in_the_platform_tenant() {
        let err = ClientCredential::create(
            TenantId::parse("acme").unwrap(),
            [Scope::Platform].into(),
            "",
            "hash".into(),
            now(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("agentbay.platform"), "{err}");
        assert!(
            ClientCredential::create(
                TenantId::platform(),
                [Scope::Platform].into(),
                "",
                "h".into(),
                now()
            )
            .is_ok()
        );
    }

    #[test]
    fn revoking_twice_emits_once() {
        let (mut cred, _) = ClientCredential::create(
            TenantId::parse("acme").unwrap(),
            [Scope::RunsRead].into(),
            "",
            "h".into(),
            now(),
        )
        .unwrap();
        assert!(cred.revoke(now()).is_some());
        let first = cred.revoked_at;
        assert!(cred.revoke(now()).is_none());
        assert_eq!(cred.revoked_at, first);
    }
}
