//! The audit trail over the API: records by time range, actor, action and
//! target, as JSON or CSV, and a check of the whole chain.
//!
//! A tenant's administrators (`agentbay.admin`) read their tenant's
//! records; a PlatformAdmin reads every tenant's, or one with `?tenant=`.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::capacity::query_pairs;
use super::error::ApiError;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::auth::Principal;
use crate::domain::TenantId;
use crate::domain::audit::TrailReport;
use crate::domain::audit::{AuditQuery, AuditRecord, CSV_HEADER};

/// A page of the trail.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    /// Newest first.
    pub records: Vec<AuditRecord>,
    /// Ask again with `olderThan` set to this for the next page; absent
    /// on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_older_than: Option<u64>,
}

/// Reads a query of the trail as `principal` may ask it: its own tenant,
/// or (a PlatformAdmin) every tenant or the one named by `tenant`.
pub fn query_of(principal: &Principal, pairs: &[(String, String)]) -> Result<AuditQuery, ApiError> {
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let mut query = AuditQuery::parse(get)?;
    query.filter.tenant = match get("tenant") {
        Some(t) => Some(
            principal
                .scope_for(&TenantId::parse_field("tenant", t)?)?
                .tenant()
                .clone(),
        ),
        None if principal.is_platform_admin() => None,
        None => Some(principal.tenant.clone()),
    };
    Ok(query)
}

/// The page a query answers, with the cursor of the next.
pub fn page_of(state: &AppState, query: &AuditQuery) -> Result<AuditPage, ApiError> {
    let mut records = state
        .store
        .audit_page(&query.filter, query.before, query.limit + 1)
        .map_err(ApiError::internal)?;
    let next_older_than = (records.len() > query.limit).then(|| {
        records.truncate(query.limit);
        records.last().map(|r| r.sequence).unwrap_or_default()
    });
    Ok(AuditPage {
        records,
        next_older_than,
    })
}

/// The records as CSV, header first.
pub fn csv_of(records: &[AuditRecord]) -> String {
    let mut out = String::with_capacity(records.len() * 256 + CSV_HEADER.len() + 2);
    out.push_str(CSV_HEADER);
    out.push_str("\r\n");
    for r in records {
        out.push_str(&r.csv_line());
        out.push_str("\r\n");
    }
    out
}

/// The audit trail: who did what, to what, from where, and what it changed.
#[utoipa::path(get, path = "/factory/audit", tag = "audit",
    params(
        ("from" = Option<String>, Query, format = Date, description = "At or after: a day (YYYY-MM-DD); an RFC 3339 time is taken too"),
        ("to" = Option<String>, Query, format = Date, description = "Up to the end of this day (YYYY-MM-DD), which it includes; an RFC 3339 time is taken too. A range that ends before it starts holds no record"),
        ("actor" = Option<String>, Query, description = "The actor contains this (`user wes`, `client c-1`)", max_length = 200),
        ("action" = Option<String>, Query, description = "The action (`quota.set`) or its noun (`user` for every `user.*`)", max_length = 200),
        ("target" = Option<String>, Query, description = "The target contains this (an id, a name)", max_length = 200),
        ("olderThan" = Option<u64>, Query, description = "Only records older than this sequence: the `nextOlderThan` of the page before", minimum = 1, maximum = 9223372036854775807_u64),
        ("limit" = Option<u32>, Query, description = "At most this many records (default 100)", minimum = 1, maximum = 5000),
        ("format" = Option<String>, Query, description = "`json` (default) or `csv`", pattern = "^(json|csv)$"),
        ("tenant" = Option<String>, Query, description = "One tenant's records (PlatformAdmin; without it a PlatformAdmin reads every tenant's)", pattern = "^[a-z0-9][a-z0-9-]{0,62}$"),
    ),
    responses(
        (status = 200, description = "The records, newest first", content(
            (AuditPage = "application/json"),
            (String = "text/csv"),
        )),
        (status = 400, description = "A bad parameter, named", content_type = "application/problem+json"),
    ),
    security(("bearer" = ["agentbay.admin"])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Authorized<need::Admin>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let mut keys = AuditQuery::PARAMS.to_vec();
    keys.extend(["format", "tenant"]);
    let pairs = query_pairs(raw.as_deref(), &keys)?;
    let csv = match pairs
        .iter()
        .find(|(k, _)| k == "format")
        .map(|(_, v)| v.as_str())
    {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "format",
                format!("{other:?} is not a format here: json or csv"),
            ));
        }
    };
    let query = query_of(&auth.principal, &pairs)?;
    let page = page_of(&state, &query)?;
    if csv {
        return Ok((
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"agentbay-audit.csv\"",
                ),
            ],
            csv_of(&page.records),
        )
            .into_response());
    }
    Ok(Json(page).into_response())
}

/// Checks the whole audit chain: how many records, where it is broken if
/// it is, and the head hash to keep elsewhere.
#[utoipa::path(get, path = "/factory/audit/verify", tag = "audit",
    params(
        ("expectFirst" = Option<u64>, Query, description = "The first record's sequence as noted elsewhere: a kept chain that starts later is reported in `unmet`", minimum = 1),
        ("expectHead" = Option<String>, Query, description = "A head hash noted elsewhere (`sha256:…`): a kept record must have it, else `unmet` says so", pattern = "^sha256:[0-9a-fA-F]{64}$"),
    ),
    responses(
        (status = 200, description = "What the check found; `broken` names the first record that does not follow, `unmet` what was expected and not found", body = TrailReport),
        (status = 400, description = "A bad parameter, named", content_type = "application/problem+json"),
    ),
    security(("bearer" = ["agentbay.platform"])))]
pub async fn verify(
    State(state): State<AppState>,
    auth: Authorized<need::Platform>,
    RawQuery(raw): RawQuery,
) -> Result<Json<TrailReport>, ApiError> {
    auth.principal.platform_scope()?;
    let pairs = query_pairs(raw.as_deref(), &["expectFirst", "expectHead"])?;
    let value = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let first = value("expectFirst")
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::invalid("expectFirst", format!("{v:?} is not a record sequence"))
            })
        })
        .transpose()?;
    let expect = crate::domain::audit::Expect::new(first, value("expectHead"))?;
    let report = tokio::task::spawn_blocking(move || state.store.verify_audit(&expect))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    Ok(Json(report))
}
