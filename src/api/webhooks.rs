//! Webhook endpoints and their deliveries: a tenant's administrators
//! (`agentbay.admin`) manage their tenant's; a PlatformAdmin's endpoints
//! (in the platform tenant) receive every tenant's messages, and a
//! PlatformAdmin may manage any tenant's with `?tenant=`.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::error::ApiError;
use super::json::ApiJson;
use super::runtime::scope_of;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::domain::TenantId;
use crate::domain::webhook::{Delivery, EndpointSpec, WebhookEndpoint};

/// An endpoint as the API shows it: never its secret, except once.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointBody {
    /// Its id.
    pub endpoint_id: Uuid,
    /// Its tenant (the platform tenant: it receives every tenant's).
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// Its settings.
    pub spec: EndpointSpec,
    /// The signing secret: only in the answer that made it (creation or
    /// rotation); store it then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Who registered it.
    pub created_by: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl EndpointBody {
    fn of(e: WebhookEndpoint, with_secret: bool) -> EndpointBody {
        EndpointBody {
            endpoint_id: e.endpoint_id,
            tenant_id: e.tenant_id,
            spec: e.spec.shown(),
            secret: with_secret.then_some(e.secret),
            created_by: e.created_by,
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// The tenant's endpoints.
#[derive(Serialize, ToSchema)]
pub struct EndpointList {
    /// Oldest first.
    pub endpoints: Vec<EndpointBody>,
}

/// An endpoint's deliveries.
#[derive(Serialize, ToSchema)]
pub struct DeliveryList {
    /// Newest first, at most 200, each with its tries.
    pub deliveries: Vec<Delivery>,
    /// Why its pending deliveries wait, when the endpoint is paused after
    /// failing tries in a row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

fn endpoint_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| ApiError::invalid("endpointId", "is not a UUID"))
}

/// The tenant's webhook endpoints.
#[utoipa::path(get, path = "/factory/webhooks", tag = "webhooks",
    params(("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "The endpoints, without their secrets", body = EndpointList)),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    RawQuery(raw): RawQuery,
) -> Result<Json<EndpointList>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let endpoints = state
        .webhooks
        .list(&scope)?
        .into_iter()
        .map(|e| EndpointBody::of(e, false))
        .collect();
    Ok(Json(EndpointList { endpoints }))
}

/// Registers an endpoint; the answer holds its signing secret, once.
#[utoipa::path(post, path = "/factory/webhooks", tag = "webhooks",
    params(("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    request_body(content = EndpointSpec),
    responses((status = 201, description = "Registered, with its secret", body = EndpointBody),
        (status = 400, description = "A bad field, or a URL the site's network allowlist does not allow", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    RawQuery(raw): RawQuery,
    ApiJson(spec): ApiJson<EndpointSpec>,
) -> Result<(StatusCode, Json<EndpointBody>), ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let e = state
        .webhooks
        .create(&scope, spec, &auth.principal.subject.to_string())
        .await?;
    Ok((StatusCode::CREATED, Json(EndpointBody::of(e, true))))
}

/// One endpoint.
#[utoipa::path(get, path = "/factory/webhooks/{endpointId}", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "The endpoint", body = EndpointBody),
        (status = 404, description = "No such endpoint in the tenant", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<EndpointBody>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let e = state.webhooks.get(&scope, endpoint_id(&id)?)?;
    Ok(Json(EndpointBody::of(e, false)))
}

/// Changes an endpoint's settings (its secret stays).
#[utoipa::path(put, path = "/factory/webhooks/{endpointId}", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    request_body(content = EndpointSpec),
    responses((status = 200, description = "The endpoint", body = EndpointBody),
        (status = 400, description = "A bad field", content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint in the tenant", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    ApiJson(spec): ApiJson<EndpointSpec>,
) -> Result<Json<EndpointBody>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let e = state
        .webhooks
        .update(&scope, endpoint_id(&id)?, spec)
        .await?;
    Ok(Json(EndpointBody::of(e, false)))
}

/// Removes an endpoint and its deliveries.
#[utoipa::path(delete, path = "/factory/webhooks/{endpointId}", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 204, description = "Removed"),
        (status = 404, description = "No such endpoint in the tenant", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    state.webhooks.delete(&scope, endpoint_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new signing secret; the old one stops signing at once.
#[utoipa::path(post, path = "/factory/webhooks/{endpointId}/rotate-secret", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "The endpoint with its new secret", body = EndpointBody),
        (status = 404, description = "No such endpoint in the tenant", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn rotate(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<EndpointBody>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let e = state.webhooks.rotate(&scope, endpoint_id(&id)?).await?;
    Ok(Json(EndpointBody::of(e, true)))
}

/// An endpoint's deliveries with every try.
#[utoipa::path(get, path = "/factory/webhooks/{endpointId}/deliveries", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "Newest first", body = DeliveryList),
        (status = 404, description = "No such endpoint in the tenant", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn deliveries(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<DeliveryList>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let endpoint = endpoint_id(&id)?;
    let deliveries = state.webhooks.deliveries(&scope, endpoint, 200)?;
    Ok(Json(DeliveryList {
        deliveries,
        paused: state.webhooks.paused(endpoint),
    }))
}

/// Sends a delivery again now (also one given up).
#[utoipa::path(post, path = "/factory/webhooks/{endpointId}/deliveries/{messageId}/redeliver", tag = "webhooks",
    params(("endpointId" = String, Path, description = "The endpoint", format = "uuid"),
        ("messageId" = String, Path, description = "The delivery's webhook-id", pattern = "^[a-z]+_[0-9a-f-]+$"),
        ("tenant" = Option<String>, Query, description = "Another tenant (PlatformAdmin)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "Pending again, due now", body = Delivery),
        (status = 404, description = "No such delivery", content_type = "application/problem+json")),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn redeliver(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    Path((id, message_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Delivery>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let d = state
        .webhooks
        .redeliver(&scope, endpoint_id(&id)?, &message_id)
        .await?;
    state.workers.trigger("WebhookDispatcher");
    Ok(Json(d))
}
