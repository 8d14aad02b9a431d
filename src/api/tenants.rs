//! The tenant and project registry (PlatformAdmins; WorkspaceAdmins register
//! projects of their own tenant).

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ApiError;
use super::json::ApiJson;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::domain::access::Scope;
use crate::domain::tenant::{Project, Tenant, TenantSpec};
use crate::domain::{ProjectId, TenantId};

/// Every tenant.
#[derive(Serialize, ToSchema)]
pub struct TenantList {
    /// Registered tenants with edition and residency.
    pub tenants: Vec<Tenant>,
}

/// A tenant, with its projects when it is read.
#[derive(Serialize, ToSchema)]
pub struct TenantBody {
    /// The tenant.
    pub tenant: Tenant,
    /// Its projects (reads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<Project>>,
}

/// A project.
#[derive(Serialize, ToSchema)]
pub struct ProjectBody {
    /// The project.
    pub project: Project,
}

/// Every tenant (PlatformAdmin).
#[utoipa::path(get, path = "/platform/tenants", tag = "tenants",
    responses((status = 200, description = "Registered tenants with edition and residency", body = TenantList)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Authorized<need::Platform>,
) -> Result<Json<TenantList>, ApiError> {
    auth.principal.platform_scope()?;
    Ok(Json(TenantList {
        tenants: state.capacity.tenants(),
    }))
}

/// One tenant: the caller's own, or any for a PlatformAdmin.
#[utoipa::path(get, path = "/platform/tenants/{tenantId}", tag = "tenants",
    params(("tenantId" = String, Path, description = "Tenant id")),
    responses((status = 200, description = "The tenant and its projects", body = TenantBody), (status = 404, description = "Not registered")),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    Path(tenant_id): Path<String>,
) -> Result<Json<TenantBody>, ApiError> {
    let id = TenantId::parse_field("tenantId", &tenant_id)?;
    let scope = auth.principal.scope_for(&id)?;
    let tenant = state.capacity.tenant(&id).ok_or_else(|| {
        ApiError::new(
            super::error::ErrorCode::NotFound,
            format!("tenant {id} is not registered"),
        )
    })?;
    let projects = state.capacity.projects(&scope)?;
    Ok(Json(TenantBody {
        tenant,
        projects: Some(projects),
    }))
}

/// Registers or changes a tenant (PlatformAdmin).
#[utoipa::path(put, path = "/platform/tenants/{tenantId}", tag = "tenants",
    params(("tenantId" = String, Path, description = "Tenant id (a-z, 0-9, '-')")),
    request_body(content = TenantSpec),
    responses((status = 200, description = "The tenant", body = TenantBody), (status = 400, description = "Unknown edition or bad region")),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Authorized<need::Platform>,
    Path(tenant_id): Path<String>,
    ApiJson(spec): ApiJson<TenantSpec>,
) -> Result<Json<TenantBody>, ApiError> {
    auth.principal.platform_scope()?;
    let id = TenantId::parse_field("tenantId", &tenant_id)?;
    let tenant = state.capacity.put_tenant(id, spec).await?;
    Ok(Json(TenantBody {
        tenant,
        projects: None,
    }))
}

/// Body of `PUT /platform/tenants/{tenantId}/projects/{projectId}`.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectSpec {
    /// Name shown to people.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// Registers a project: PlatformAdmins anywhere, WorkspaceAdmins
/// (`agentbay.admin`) in their own tenant.
#[utoipa::path(put, path = "/platform/tenants/{tenantId}/projects/{projectId}", tag = "tenants",
    params(("tenantId" = String, Path, description = "Tenant id"), ("projectId" = String, Path, description = "Project id")),
    request_body(content = Option<ProjectSpec>, description = "Optional: an empty body registers the project under its id"),
    responses((status = 200, description = "The project", body = ProjectBody)),
    security(("bearer" = [])))]
pub async fn put_project(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path((tenant_id, project_id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<ProjectBody>, ApiError> {
    let tenant = TenantId::parse_field("tenantId", &tenant_id)?;
    auth.principal.scope_for(&tenant)?;
    auth.principal.require(Scope::Admin)?;
    let project = ProjectId::parse_field("projectId", &project_id)?;
    // An empty body (or null) is fine: the display name defaults to the id.
    let text = body.trim_ascii();
    let spec: ProjectSpec = if text.is_empty() || text == b"null" {
        ProjectSpec::default()
    } else {
        super::json::parse(&body)?
    };
    let project = state
        .capacity
        .put_project(tenant, project, spec.display_name)
        .await?;
    Ok(Json(ProjectBody { project }))
}
