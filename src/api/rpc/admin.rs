//! `agentbay.admin.v1.Admin`: version, client credentials, backup and the
//! event stream.

use std::path::PathBuf;

use connectrpc::{
    ConnectError, RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream,
};
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use super::principal;
use crate::api::AppState;
use crate::api::error::{ApiError, ErrorCode, rpc};
use crate::api::events::{check_until, filter_for};
use crate::auth::{clients, users};
use crate::domain::access::parse_scopes;
use crate::domain::credential::ClientCredential;
use crate::domain::tenant::{Tenant, TenantSpec};
use crate::domain::user::{User, parse_roles};
use crate::domain::{DomainError, ProjectId, TenantId};
use crate::proto::agentbay::admin::v1 as pb;

/// The Admin service.
pub struct AdminService {
    state: AppState,
}

impl AdminService {
    /// Serves the Admin RPCs from the appliance's state.
    pub fn new(state: AppState) -> Self {
        AdminService { state }
    }
}

/// The wire form of a credential (never its secret).
pub fn client_message(c: &ClientCredential) -> pb::Client {
    pb::Client {
        client_id: c.client_id.clone(),
        tenant_id: c.tenant_id.to_string(),
        scopes: c.scopes.iter().map(|s| s.to_string()).collect(),
        description: c.description.clone(),
        created_at: c.created_at.to_rfc3339(),
        revoked_at: c.revoked_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
        ..Default::default()
    }
}

/// The wire form of a publisher key.
/// A publisher key as the API shows it; `demo` is this appliance's demo
/// key's id, when it is trusted.
pub fn key_message(k: &crate::domain::trust::PublisherKey, demo: Option<&str>) -> pb::PublisherKey {
    pb::PublisherKey {
        key_id: k.key_id.clone(),
        name: k.name.clone(),
        public_key: k.public_key.clone(),
        tenants: k.tenants.iter().map(|t| t.to_string()).collect(),
        state: k.state.as_str().into(),
        source: k.source.as_str().into(),
        trusted_at: k.trusted_at.to_rfc3339(),
        trusted_by: k.trusted_by.clone(),
        revoked_at: k.revoked_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
        revoked_by: k.revoked_by.clone().unwrap_or_default(),
        revoke_reason: k.revoke_reason.clone().unwrap_or_default(),
        demo: demo == Some(k.key_id.as_str()),
        ..Default::default()
    }
}

pub fn reverified_message(r: crate::releases::Reverified) -> pb::Reverified {
    pb::Reverified {
        verified: r.verified as u32,
        untrusted: r.untrusted as u32,
        rejected: r.rejected as u32,
        changed: r.changed as u32,
        failed: r.failed as u32,
        ..Default::default()
    }
}

/// Whose a model profile is: the platform (empty) or a tenant.
fn profile_owner(tenant: &str) -> Result<TenantId, crate::domain::DomainError> {
    if tenant.is_empty() {
        Ok(TenantId::platform())
    } else {
        Ok(TenantId::parse_field("tenantId", tenant)?)
    }
}

/// The wire form of a site model profile.
pub fn profile_message(p: &crate::domain::model_profile::SiteModelProfile) -> pb::ModelProfile {
    pb::ModelProfile {
        profile_id: p.profile_id.clone(),
        tenant_id: if p.tenant_id == TenantId::platform() {
            String::new()
        } else {
            p.tenant_id.to_string()
        },
        endpoint: p.endpoint.clone(),
        fallback_endpoints: p.fallback_endpoints.clone(),
        model: p.model.clone(),
        api_key_ref: p.api_key_ref.clone().unwrap_or_default(),
        timeout_seconds: p.timeout_seconds,
        max_concurrent: p.limits.max_concurrent.unwrap_or(0),
        requests_per_minute: p.limits.requests_per_minute.unwrap_or(0),
        tokens_per_minute: p.limits.tokens_per_minute.unwrap_or(0),
        updated_at: p.updated_at.to_rfc3339(),
        updated_by: p.updated_by.clone(),
        ..Default::default()
    }
}

/// The wire form of a console user.
pub fn user_message(u: &User) -> pb::User {
    pb::User {
        username: u.username.clone(),
        tenant_id: u.tenant_id.to_string(),
        roles: u.roles.iter().map(|r| r.to_string()).collect(),
        display_name: u.display_name.clone(),
        created_at: u.created_at.to_rfc3339(),
        created_by: u.created_by.clone(),
        disabled_at: u.disabled_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
        email: u.email.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The wire form of a tenant.
pub fn tenant_message(t: &Tenant) -> pb::Tenant {
    pb::Tenant {
        tenant_id: t.tenant_id.to_string(),
        display_name: t.display_name.clone(),
        edition: t.edition.clone(),
        residency_regions: t.residency_regions.clone(),
        created_at: t.created_at.to_rfc3339(),
        updated_at: t.updated_at.to_rfc3339(),
        payload_retention_days: t.retention.payload_days,
        history_retention_days: t.retention.history_days,
        ..Default::default()
    }
}

/// Chunks of a backup file.
const BACKUP_CHUNK: usize = 256 * 1024;

/// Deletes the temporary backup file when the stream ends or is dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

// Concrete return types instead of the trait's `impl Encodable`: clearer,
// and what the generated trait expects us to refine.
#[allow(refining_impl_trait)]
impl pb::Admin for AdminService {
    async fn get_version(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::GetVersionRequest>,
    ) -> ServiceResult<pb::GetVersionResponse> {
        let caller = principal(&ctx)?;
        Response::ok(pb::GetVersionResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            schema_version: self.state.store.schema_version(),
            certificate_fingerprint: self.state.tls.fingerprint.clone(),
            caller_tenant_id: caller.tenant.to_string(),
            caller_scopes: caller.scopes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
    }

    async fn create_client(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CreateClientRequest>,
    ) -> ServiceResult<pb::CreateClientResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let names: Vec<&str> = request.scopes.iter().copied().collect();
        let scopes = parse_scopes(&names).map_err(rpc)?;
        let description = request.description.to_string();
        let (credential, secret) = clients::create(
            &self.state.store,
            &caller.actor(),
            scope,
            scopes,
            &description,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        tracing::info!(client = %credential.client_id, tenant = %credential.tenant_id, by = %caller.subject, "created a client credential");
        Response::ok(pb::CreateClientResponse {
            client: buffa::MessageField::some(client_message(&credential)),
            client_secret: secret,
            ..Default::default()
        })
    }

    async fn list_clients(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::ListClientsRequest>,
    ) -> ServiceResult<pb::ListClientsResponse> {
        let caller = principal(&ctx)?;
        let store = self.state.store.clone();
        let credentials = tokio::task::spawn_blocking(move || {
            if caller.is_platform_admin() {
                clients::list_all(&store, &caller.platform_scope().expect("platform admin"))
            } else {
                clients::list(&store, &caller.tenant_scope())
            }
        })
        .await
        .map_err(|e| rpc(ApiError::internal(e)))?
        .map_err(rpc)?;
        Response::ok(pb::ListClientsResponse {
            clients: credentials.iter().map(client_message).collect(),
            ..Default::default()
        })
    }

    async fn revoke_client(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RevokeClientRequest>,
    ) -> ServiceResult<pb::RevokeClientResponse> {
        let caller = principal(&ctx)?;
        let client_id = request.client_id.to_string();
        let tenant = ClientCredential::tenant_of(&client_id).ok_or_else(|| {
            rpc(ApiError::invalid(
                "clientId",
                format!("{client_id:?} is not a client id"),
            ))
        })?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let revoked = clients::revoke(
            &self.state.store,
            Some(&self.state.auth),
            &caller.actor(),
            scope,
            &client_id,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        tracing::info!(client = %revoked.client_id, by = %caller.subject, "revoked a client credential");
        Response::ok(pb::RevokeClientResponse {
            client: buffa::MessageField::some(client_message(&revoked)),
            ..Default::default()
        })
    }

    async fn create_user(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CreateUserRequest>,
    ) -> ServiceResult<pb::CreateUserResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let names: Vec<&str> = request.roles.iter().copied().collect();
        let roles = parse_roles(&names).map_err(rpc)?;
        let (user, generated) = users::create(
            &self.state.store,
            &caller.actor(),
            users::NewUser {
                tenant: scope,
                username: request.username,
                display_name: request.display_name,
                roles,
                password: (!request.password.is_empty()).then_some(request.password),
                email: request.email,
            },
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        tracing::info!(user = %user.username, tenant = %user.tenant_id, by = %caller.subject, "created a console user");
        Response::ok(pb::CreateUserResponse {
            user: buffa::MessageField::some(user_message(&user)),
            generated_password: generated.unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn list_users(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ListUsersRequest>,
    ) -> ServiceResult<pb::ListUsersResponse> {
        let caller = principal(&ctx)?;
        let list = if request.tenant_id.is_empty() && caller.is_platform_admin() {
            users::list_all(&self.state.store, &caller.platform_scope().map_err(rpc)?)
        } else {
            let tenant = if request.tenant_id.is_empty() {
                caller.tenant.clone()
            } else {
                TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?
            };
            users::list(&self.state.store, &caller.scope_for(&tenant).map_err(rpc)?)
        }
        .map_err(rpc)?;
        Response::ok(pb::ListUsersResponse {
            users: list.iter().map(user_message).collect(),
            ..Default::default()
        })
    }

    async fn disable_user(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::DisableUserRequest>,
    ) -> ServiceResult<pb::DisableUserResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let user = users::disable(
            &self.state.store,
            &caller.actor(),
            scope,
            request.username,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        self.state.sessions.end_user(&user.username);
        tracing::info!(user = %user.username, by = %caller.subject, "disabled a console user");
        Response::ok(pb::DisableUserResponse {
            user: buffa::MessageField::some(user_message(&user)),
            ..Default::default()
        })
    }

    async fn enable_user(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::EnableUserRequest>,
    ) -> ServiceResult<pb::EnableUserResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let user = users::enable(
            &self.state.store,
            &caller.actor(),
            scope,
            request.username,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        tracing::info!(user = %user.username, by = %caller.subject, "enabled a console user");
        Response::ok(pb::EnableUserResponse {
            user: buffa::MessageField::some(user_message(&user)),
            ..Default::default()
        })
    }

    async fn reset_user_password(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ResetUserPasswordRequest>,
    ) -> ServiceResult<pb::ResetUserPasswordResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let generated = request.password.is_empty().then(users::generate_password);
        let password = generated.as_deref().unwrap_or(request.password);
        let user = users::set_password(
            &self.state.store,
            &caller.actor(),
            scope,
            request.username,
            password,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        self.state.sessions.end_user(&user.username);
        tracing::info!(user = %user.username, by = %caller.subject, "reset a console user's password");
        Response::ok(pb::ResetUserPasswordResponse {
            user: buffa::MessageField::some(user_message(&user)),
            generated_password: generated.unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn set_user_email(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::SetUserEmailRequest>,
    ) -> ServiceResult<pb::SetUserEmailResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let scope = caller.scope_for(&tenant).map_err(rpc)?;
        let user = users::set_email(
            &self.state.store,
            &caller.actor(),
            scope,
            request.username,
            request.email,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        Response::ok(pb::SetUserEmailResponse {
            user: buffa::MessageField::some(user_message(&user)),
            ..Default::default()
        })
    }

    async fn backup(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::BackupRequest>,
    ) -> ServiceResult<ServiceStream<pb::BackupChunk>> {
        let caller = principal(&ctx)?;
        caller.platform_scope().map_err(rpc)?;
        // Snapshot to a private file beside the store first: the store's
        // writer pauses only for the local copy, never for the network.
        let run_dir = self.state.config.data_dir.join("run");
        let path = run_dir.join(format!(
            "backup-{}.partial",
            crate::domain::ids::new_id().simple()
        ));
        let guard = TempFile(path.clone());
        let files = crate::store::datadir::backup_files(&self.state.config.data_dir);
        let summary = self
            .state
            .store
            .backup_file(&path, files)
            .await
            .map_err(|e| rpc(DomainError::from(e)))?;
        tracing::info!(records = summary.records, by = %caller.subject, "backup taken");
        let change = crate::domain::audit::Change::new(
            &crate::domain::TenantId::platform(),
            "backup.create",
            "the store",
        )
        .detail(format!(
            "{} records, sent to the caller (Admin/Backup)",
            summary.records
        ));
        self.state
            .store
            .record_action(self.state.clock.now(), change)
            .await
            .map_err(|e| rpc(DomainError::from(e)))?;
        let file = tokio::fs::File::open(&path).await.map_err(|e| {
            rpc(ApiError::internal(format!(
                "reading {}: {e}",
                path.display()
            )))
        })?;
        let chunks = futures::stream::unfold((file, guard), |(mut file, guard)| async move {
            let mut buf = vec![0u8; BACKUP_CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((
                        Ok(pb::BackupChunk {
                            data: buf,
                            ..Default::default()
                        }),
                        (file, guard),
                    ))
                }
                Err(e) => Some((
                    Err(ConnectError::internal(format!("reading the backup: {e}"))),
                    (file, guard),
                )),
            }
        });
        Ok(Response::new(
            Box::pin(chunks) as ServiceStream<pb::BackupChunk>
        ))
    }

    async fn get_events_head(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, pb::GetEventsHeadRequest>,
    ) -> ServiceResult<pb::GetEventsHeadResponse> {
        Ok(Response::new(pb::GetEventsHeadResponse {
            sequence: self.state.store.events_head(),
            ..Default::default()
        }))
    }

    async fn watch_events(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::WatchEventsRequest>,
    ) -> ServiceResult<ServiceStream<pb::Event>> {
        let caller = principal(&ctx)?;
        let topics: Vec<String> = request.topics.iter().map(|t| t.to_string()).collect();
        let filter = filter_for(&caller, None, topics).map_err(rpc)?;
        let until = (request.until_sequence > 0).then_some(request.until_sequence);
        check_until(self.state.store.events_head(), "untilSequence", until).map_err(rpc)?;
        let stream = self
            .state
            .store
            .event_stream(
                filter,
                request.after_sequence,
                until,
                self.state.shutdown.clone(),
            )
            .map(|event| {
                let payload = serde_json::from_value(event.payload.clone()).unwrap_or_default();
                Ok(pb::Event {
                    sequence: event.sequence,
                    topic: event.topic.clone(),
                    tenant_id: event.tenant_id.to_string(),
                    occurred_at: event.occurred_at.to_rfc3339(),
                    payload: buffa::MessageField::some(payload),
                    ..Default::default()
                })
            });
        Ok(Response::new(Box::pin(stream) as ServiceStream<pb::Event>))
    }

    async fn trust_publisher_key(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::TrustPublisherKeyRequest>,
    ) -> ServiceResult<pb::TrustPublisherKeyResponse> {
        let caller = principal(&ctx)?;
        caller.platform_scope().map_err(rpc)?;
        let tenants: Vec<String> = request.tenants.iter().map(|t| t.to_string()).collect();
        let (key, change, done) = self
            .state
            .releases
            .trust_key(
                request.name,
                request.public_key,
                &tenants,
                request.replace,
                &caller.subject.to_string(),
            )
            .await
            .map_err(rpc)?;
        Response::ok(pb::TrustPublisherKeyResponse {
            key: buffa::MessageField::some(key_message(&key, self.state.releases.demo_key_id())),
            reverified: buffa::MessageField::some(reverified_message(done)),
            change: change.unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn list_publisher_keys(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::ListPublisherKeysRequest>,
    ) -> ServiceResult<pb::ListPublisherKeysResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let keys = self.state.releases.keys().map_err(rpc)?;
        Response::ok(pb::ListPublisherKeysResponse {
            keys: keys
                .iter()
                .map(|k| key_message(k, self.state.releases.demo_key_id()))
                .collect(),
            ..Default::default()
        })
    }

    async fn revoke_publisher_key(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RevokePublisherKeyRequest>,
    ) -> ServiceResult<pb::RevokePublisherKeyResponse> {
        let caller = principal(&ctx)?;
        caller.platform_scope().map_err(rpc)?;
        crate::domain::FieldError::require("keyId", request.key_id, "").map_err(rpc)?;
        let (key, done) = self
            .state
            .releases
            .revoke_key(request.key_id, request.reason, &caller.subject.to_string())
            .await
            .map_err(rpc)?;
        Response::ok(pb::RevokePublisherKeyResponse {
            key: buffa::MessageField::some(key_message(&key, self.state.releases.demo_key_id())),
            reverified: buffa::MessageField::some(reverified_message(done)),
            ..Default::default()
        })
    }

    async fn put_model_profile(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::PutModelProfileRequest>,
    ) -> ServiceResult<pb::PutModelProfileResponse> {
        let caller = principal(&ctx)?;
        caller.platform_scope().map_err(rpc)?;
        let owner = profile_owner(request.tenant_id).map_err(rpc)?;
        if owner != TenantId::platform() && self.state.capacity.tenant(&owner).is_none() {
            return Err(rpc(crate::domain::DomainError::from(
                crate::domain::FieldError::new(
                    "tenantId",
                    format!("{owner} is not a registered tenant"),
                ),
            )));
        }
        let limits = crate::domain::model_profile::ServerLimits::of(
            request.max_concurrent,
            request.requests_per_minute,
            request.tokens_per_minute,
        )
        .map_err(|e| rpc(crate::domain::DomainError::from(e)))?;
        let profile = crate::runtime::profiles::put(
            &self.state.store,
            owner,
            crate::domain::model_profile::ProfileSpec {
                profile_id: request.profile_id.to_string(),
                endpoint: request.endpoint.to_string(),
                fallback_endpoints: request
                    .fallback_endpoints
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
                model: request.model.to_string(),
                api_key_ref: Some(request.api_key_ref.to_string()),
                timeout_seconds: Some(request.timeout_seconds),
                limits,
            },
            |k| self.state.runtime.model_api_key(k).is_some(),
            &caller.subject.to_string(),
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        Response::ok(pb::PutModelProfileResponse {
            profile: buffa::MessageField::some(profile_message(&profile)),
            ..Default::default()
        })
    }

    async fn list_model_profiles(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::ListModelProfilesRequest>,
    ) -> ServiceResult<pb::ListModelProfilesResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let all = crate::runtime::profiles::list(&self.state.store).map_err(rpc)?;
        Response::ok(pb::ListModelProfilesResponse {
            profiles: all.iter().map(profile_message).collect(),
            ..Default::default()
        })
    }

    async fn delete_model_profile(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::DeleteModelProfileRequest>,
    ) -> ServiceResult<pb::DeleteModelProfileResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let owner = profile_owner(request.tenant_id).map_err(rpc)?;
        let removed = crate::runtime::profiles::remove(
            &self.state.store,
            owner,
            request.profile_id,
            self.state.clock.now(),
        )
        .await
        .map_err(rpc)?;
        Response::ok(pb::DeleteModelProfileResponse {
            profile: buffa::MessageField::some(profile_message(&removed)),
            ..Default::default()
        })
    }

    async fn reload_configuration(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::ReloadConfigurationRequest>,
    ) -> ServiceResult<pb::ReloadConfigurationResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let done = self.state.reloader.reload().await.map_err(|e| {
            rpc(crate::domain::DomainError::from(
                crate::domain::FieldError::new(
                    e.key.clone(),
                    format!("{}; the running configuration stays", e),
                ),
            ))
        })?;
        Response::ok(pb::ReloadConfigurationResponse {
            applied: done.applied,
            restart_needed: done.restart_needed,
            loaded_at: done.loaded_at.to_rfc3339(),
            loaded_from: done.from,
            ..Default::default()
        })
    }

    async fn put_tenant(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::PutTenantRequest>,
    ) -> ServiceResult<pb::PutTenantResponse> {
        let caller = principal(&ctx)?;
        caller.platform_scope().map_err(rpc)?;
        let id = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        let spec = TenantSpec {
            display_name: (!request.display_name.is_empty())
                .then(|| request.display_name.to_string()),
            edition: request.edition.to_string(),
            residency_regions: request
                .residency_regions
                .iter()
                .map(|r| r.to_string())
                .collect(),
            retention: (request.payload_retention_days.is_some()
                || request.history_retention_days.is_some())
            .then(|| crate::domain::retention::RetentionOverride {
                payload_days: request.payload_retention_days.filter(|d| *d > 0),
                history_days: request.history_retention_days.filter(|d| *d > 0),
            }),
        };
        let tenant = self
            .state
            .capacity
            .put_tenant(id, spec)
            .await
            .map_err(rpc)?;
        Response::ok(pb::PutTenantResponse {
            tenant: buffa::MessageField::some(tenant_message(&tenant)),
            ..Default::default()
        })
    }

    async fn list_tenants(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, pb::ListTenantsRequest>,
    ) -> ServiceResult<pb::ListTenantsResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        Response::ok(pb::ListTenantsResponse {
            tenants: self
                .state
                .capacity
                .tenants()
                .iter()
                .map(tenant_message)
                .collect(),
            ..Default::default()
        })
    }

    async fn put_project(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::PutProjectRequest>,
    ) -> ServiceResult<pb::PutProjectResponse> {
        let caller = principal(&ctx)?;
        let tenant = TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?;
        caller.scope_for(&tenant).map_err(rpc)?;
        let project = ProjectId::parse_field("projectId", request.project_id).map_err(rpc)?;
        let display = (!request.display_name.is_empty()).then(|| request.display_name.to_string());
        let project = self
            .state
            .capacity
            .put_project(tenant, project, display)
            .await
            .map_err(rpc)?;
        Response::ok(pb::PutProjectResponse {
            tenant_id: project.tenant_id.to_string(),
            project_id: project.project_id.to_string(),
            display_name: project.display_name,
            ..Default::default()
        })
    }

    async fn run_worker(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RunWorkerRequest>,
    ) -> ServiceResult<pb::RunWorkerResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let name = request.name.to_string();
        let status = self.state.workers.run_now(&name).await.ok_or_else(|| {
            let known: Vec<&str> = self
                .state
                .workers
                .statuses()
                .iter()
                .map(|s| s.name)
                .collect();
            rpc(ApiError::invalid(
                "name",
                format!("no worker {name:?}; workers: {}", known.join(", ")),
            ))
        })?;
        let mut change = crate::domain::audit::Change::new(
            &crate::domain::TenantId::platform(),
            "worker.run",
            name.clone(),
        );
        change.detail = status.last_message.clone();
        self.state
            .store
            .record_action(self.state.clock.now(), change)
            .await
            .map_err(|e| rpc(DomainError::from(e)))?;
        Response::ok(pb::RunWorkerResponse {
            name,
            ok: status.last_ok,
            message: status.last_message.unwrap_or_default(),
            runs: status.runs,
            ..Default::default()
        })
    }

    async fn advance_clock(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::AdvanceClockRequest>,
    ) -> ServiceResult<pb::AdvanceClockResponse> {
        principal(&ctx)?.platform_scope().map_err(rpc)?;
        let clock = self.state.manual_clock.as_ref().ok_or_else(|| {
            rpc(ApiError::new(
                ErrorCode::FailedPrecondition,
                "this appliance runs on the system clock; only one started with --manual-clock can be moved",
            ))
        })?;
        clock.advance(std::time::Duration::from_secs(request.seconds));
        Response::ok(pb::AdvanceClockResponse {
            now: self.state.clock.now().to_rfc3339(),
            ..Default::default()
        })
    }
}
