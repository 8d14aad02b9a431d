//! Client credentials: how local agents and tools authenticate.
//!
//! A credential belongs to one tenant and carries a fixed set of scopes. Its
//! id embeds the tenant (`<tenant>.<uuid>`) so that the token endpoint finds
//! the record under its tenant's keys without a global index. The secret is
//! never stored, only its argon2id hash.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::access::{Role, Scope};
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
    /// Who created it.
    #[serde(default)]
    pub created_by: String,
    /// When it was revoked; a revoked credential never works again.
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who revoked it.
    #[serde(default)]
    pub revoked_by: Option<String>,
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
    /// Who created it.
    pub by: &'a str,
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
    /// Who revoked it.
    pub by: &'a str,
}

impl EventPayload for ClientRevoked<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.client-revoked";
}

/// Longest description accepted.
pub const MAX_DESCRIPTION_LEN: usize = 200;

impl ClientCredential {
    /// A new credential. Only the platform tenant may hold the scopes that
    /// reach beyond one tenant ([`Scope::platform_only`]), so that no tenant
    /// can mint itself a way into another or a view of every tenant.
    pub fn create(
        tenant_id: TenantId,
        scopes: BTreeSet<Scope>,
        description: &str,
        secret_hash: String,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<(ClientCredential, NewEvent), DomainError> {
        if scopes.is_empty() {
            return Err(FieldError::new("scopes", "at least one scope is required").into());
        }
        if let Some(scope) = scopes.iter().find(|s| s.platform_only())
            && !tenant_id.is_platform()
        {
            return Err(FieldError::new(
                "scopes",
                format!("{scope} can only be granted to the platform tenant, not to {tenant_id}"),
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
            created_by: by.to_string(),
            revoked_at: None,
            revoked_by: None,
        };
        let event = NewEvent::new(
            &credential.tenant_id,
            now,
            &ClientCreated {
                client_id: &credential.client_id,
                tenant_id: &credential.tenant_id,
                scopes: &credential.scopes,
                by,
            },
        );
        Ok((credential, event))
    }

    /// Whether it is an active PlatformAdmin credential: one of the
    /// platform tenant holding every scope of the PlatformAdmin role (a
    /// credential with `agentbay.platform` alone cannot manage anything,
    /// so it does not keep the appliance manageable).
    pub fn is_active_platform_admin(&self) -> bool {
        self.revoked_at.is_none()
            && self.tenant_id.is_platform()
            && Role::PlatformAdmin.scopes().is_subset(&self.scopes)
    }

    /// Refuses to revoke the last active PlatformAdmin credential, so that
    /// the appliance stays manageable. `platform` holds the credentials of
    /// the platform tenant.
    pub fn check_revocable(&self, platform: &[ClientCredential]) -> Result<(), DomainError> {
        let others = platform
            .iter()
            .filter(|c| c.client_id != self.client_id && c.is_active_platform_admin())
            .count();
        if self.is_active_platform_admin() && others == 0 {
            return Err(DomainError::FailedPrecondition(format!(
                "client {} is the last active PlatformAdmin credential (of tenant platform, with every scope); create another one first (agentbay client create --tenant platform with every --scope that --help lists)",
                self.client_id
            )));
        }
        Ok(())
    }

    /// Revokes the credential. Revoking twice changes nothing and emits
    /// nothing the second time.
    pub fn revoke(&mut self, by: &str, now: DateTime<Utc>) -> Option<NewEvent> {
        if self.revoked_at.is_some() {
            return None;
        }
        self.revoked_at = Some(now);
        self.revoked_by = Some(by.to_string());
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &ClientRevoked {
                client_id: &self.client_id,
                tenant_id: &self.tenant_id,
                by,
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
            "user rita",
            now(),
        )
        .unwrap();
        assert_eq!(ClientCredential::tenant_of(&cred.client_id), Some(tenant));
        assert_eq!(event.topic, "agentbay.admin.v1.client-created");
        assert_eq!(event.payload["clientId"], cred.client_id.as_str());
        assert_eq!(event.payload["by"], "user rita");
        assert_eq!(ClientCredential::tenant_of("acme"), None);
        assert_eq!(ClientCredential::tenant_of("acme.xyz"), None);
    }

    #[test]
    fn platform_only_scopes_stay_in_the_platform_tenant() {
        for scope in [Scope::Platform, Scope::MetricsRead] {
            let err = ClientCredential::create(
                TenantId::parse("acme").unwrap(),
                [scope].into(),
                "",
                "hash".into(),
                "t",
                now(),
            )
            .unwrap_err();
            assert!(err.to_string().contains(scope.as_str()), "{err}");
            assert!(
                ClientCredential::create(
                    TenantId::platform(),
                    [scope].into(),
                    "",
                    "h".into(),
                    "t",
                    now()
                )
                .is_ok()
            );
        }
    }

    #[test]
    fn revoking_twice_emits_once() {
        let (mut cred, _) = ClientCredential::create(
            TenantId::parse("acme").unwrap(),
            [Scope::RunsRead].into(),
            "",
            "h".into(),
            "t",
            now(),
        )
        .unwrap();
        let event = cred.revoke("user wes", now()).unwrap();
        assert_eq!(event.payload["by"], "user wes");
        assert_eq!(cred.revoked_by.as_deref(), Some("user wes"));
        let first = cred.revoked_at;
        assert!(cred.revoke("user wes", now()).is_none());
        assert_eq!(cred.revoked_at, first);
    }
}
