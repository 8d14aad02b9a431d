//! Release routes: import a bundle, read what was verified, deprecate and
//! revoke.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::capacity::query_pairs;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::auth::Principal;
use crate::domain::access::TenantScope;
use crate::domain::release::{
    InFlightPolicy, LoadState, LoadedRelease, adapter_version, parse_release_id,
};
use crate::domain::trust::ReleaseVerdict;
use crate::domain::{DomainError, TenantId};
use crate::releases::bundle::Bundle;
use crate::releases::{InFlightReport, ReleaseError};

impl From<ReleaseError> for ApiError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::Bundle(reason) => ApiError::new(
                ErrorCode::InvalidArgument,
                format!("the bundle cannot be read: {reason}"),
            )
            .with("reason", reason),
            ReleaseError::TooLarge(reason) => ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the bundle is too large: {reason}"),
            )
            .with("reason", reason),
            ReleaseError::Rejected(refusal) => {
                ApiError::new(ErrorCode::Unprocessable, refusal.words())
                    .with("reason", refusal.reason.clone())
                    // This copy's verdict, and what the store holds for the id:
                    // the copy itself, or a Verified release it did not replace.
                    .with(
                        "copy",
                        serde_json::json!({
                            "state": refusal.copy.as_str(),
                            "reason": refusal.reason,
                            "manifestHash": refusal.manifest_hash,
                            "stored": !refusal.kept_another(),
                        }),
                    )
                    .with(
                        "release",
                        serde_json::to_value(ReleaseBody::of(&refusal.stored))
                            .expect("releases serialise"),
                    )
            }
            ReleaseError::Domain(d) => d.into(),
            ReleaseError::Store(s) => DomainError::from(s).into(),
        }
    }
}

/// A release as the API shows it: the record, the adapter version this
/// appliance speaks, and whether it can be dispatched and why not.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseBody {
    /// The release.
    #[serde(flatten)]
    pub release: LoadedRelease,
    /// The adapter and checkpoint format this appliance speaks for the
    /// release's adapter.
    pub current_adapter_version: String,
    /// Whether new runs can be started with it.
    pub dispatchable: bool,
    /// Why not, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_dispatchable_because: Option<String>,
    /// Every verdict on this release id, oldest first (`GET` of one
    /// release): a rejected import stays visible after a later good one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<Vec<ReleaseVerdict>>,
    /// The JSON Schema a run's input must satisfy, when the manifest
    /// declares one (`GET` of one release).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<serde_json::Value>,
}

impl ReleaseBody {
    /// The release as the API shows it, without its verdicts.
    pub fn of(r: &LoadedRelease) -> ReleaseBody {
        let why_not = r.dispatchable().err().map(|e| e.to_string());
        ReleaseBody {
            release: r.clone(),
            current_adapter_version: adapter_version(r.adapter),
            dispatchable: why_not.is_none(),
            not_dispatchable_because: why_not,
            verdicts: None,
            input_schema: None,
        }
    }
}

/// One release.
#[derive(Serialize, ToSchema)]
pub struct ReleaseAnswer {
    /// The release.
    pub release: ReleaseBody,
}

/// Releases.
#[derive(Serialize, ToSchema)]
pub struct ReleaseList {
    /// Each release.
    pub releases: Vec<ReleaseBody>,
}

/// A deprecated or revoked release and what its in-flight policy did.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retired {
    /// The release now.
    pub release: ReleaseBody,
    /// Its attempts that were running, and how many were interrupted.
    pub in_flight: InFlightReport,
}

fn scope_of(principal: &Principal, raw: Option<&str>) -> Result<Option<TenantScope>, ApiError> {
    let pairs = query_pairs(raw, &["tenant"])?;
    match pairs.iter().find(|(k, _)| k == "tenant") {
        Some((_, t)) => Ok(Some(
            principal.scope_for(&TenantId::parse_field("tenant", t)?)?,
        )),
        None if principal.is_platform_admin() => Ok(None),
        None => Ok(Some(principal.tenant_scope())),
    }
}

/// Imports a release bundle (`.tar.gz`): verifies it and stores the verdict.
#[utoipa::path(post, path = "/runtime/releases", tag = "releases",
    request_body(content = String, content_type = "application/gzip", description = "The bundle: manifest.json, signature.json and the files the manifest lists, as a .tar.gz"),
    responses(
        (status = 201, description = "Verified: the LoadedRelease", body = ReleaseAnswer),
        (status = 200, description = "The same release was already verified", body = ReleaseAnswer),
        (status = 400, description = "The bundle cannot be read (nothing stored): the reason names the entry"),
        (status = 409, description = "A different release with this id exists"),
        (status = 413, description = "The bundle, decompressed, is larger than releases.max_bundle_bytes"),
        (status = 422, description = "Not verified: `copy` is this copy's verdict (Untrusted or Rejected, the reason naming the file and hashes, the signer or the version, and whether it was stored); `release` is what the store holds for the id, which stays Verified when a verified release was there"),
    ),
    security(("bearer" = [])))]
pub async fn import(
    State(state): State<AppState>,
    auth: Authorized<need::AssetsAdmin>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(super::json::body_error)?;
    let (release, already) = import_bundle(&state, &auth.principal, body).await?;
    let status = if already {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let release = ReleaseBody::of(&release);
    Ok((status, Json(ReleaseAnswer { release })).into_response())
}

/// Imports a bundle (`.tar.gz`) for `principal`, who must hold the
/// manifest's tenant: verifies it and stores the verdict (the API's import
/// and the console's upload). Returns the release and whether the same
/// one was already verified.
pub async fn import_bundle(
    state: &AppState,
    principal: &crate::auth::Principal,
    body: Bytes,
) -> Result<(LoadedRelease, bool), ApiError> {
    let releases = state.releases.clone();
    // Decompressing, hashing and checking the signature is CPU work.
    let (bundle, report) = tokio::task::spawn_blocking(move || {
        let bundle = Bundle::from_archive(&body, &releases.limits)?;
        let report = releases.check(&bundle);
        Ok::<_, crate::releases::bundle::BundleError>((bundle, report))
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| match e.1 {
        true => ReleaseError::TooLarge(e.0),
        false => ReleaseError::Bundle(e.0),
    })?;
    if let Some(parsed) = &report.parsed {
        principal.scope_for(&parsed.manifest.tenant_id)?;
    }
    let before = report.parsed.as_ref().and_then(|p| {
        state
            .releases
            .get(
                &TenantScope::new(p.manifest.tenant_id.clone()),
                &p.manifest.release_id,
            )
            .ok()
            .flatten()
    });
    let release = state
        .releases
        .record(bundle, report, &principal.subject.to_string())
        .await?;
    let already = before.is_some_and(|b| {
        b.state == LoadState::Verified && b.manifest_hash == release.manifest_hash
    });
    Ok((release, already))
}

/// Releases of the tenant (every tenant's for a PlatformAdmin).
#[utoipa::path(get, path = "/runtime/releases", tag = "releases",
    params(("tenant" = Option<String>, Query, description = "PlatformAdmins: one tenant")),
    responses((status = 200, description = "Verified, untrusted and rejected releases", body = ReleaseList)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Authorized<need::AssetsRead>,
    RawQuery(raw): RawQuery,
) -> Result<Json<ReleaseList>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let releases = state.releases.clone();
    let all = tokio::task::spawn_blocking(move || releases.list(scope.as_ref()))
        .await
        .map_err(ApiError::internal)??;
    Ok(Json(ReleaseList {
        releases: all.iter().map(ReleaseBody::of).collect(),
    }))
}

/// `GetLoadedRelease`: what this appliance verified for a release and
/// against which adapter version.
#[utoipa::path(get, path = "/runtime/releases/{releaseId}", tag = "releases",
    params(("releaseId" = String, Path, description = "Release id"), ("tenant" = Option<String>, Query, description = "PlatformAdmins: the tenant")),
    responses((status = 200, description = "The LoadedRelease with every verdict on its id", body = ReleaseBody), (status = 404, description = "Not here")),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Authorized<need::AssetsRead>,
    Path(release_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<ReleaseBody>, ApiError> {
    let id = parse_release_id(&release_id)?;
    let scope =
        scope_of(&auth.principal, raw.as_deref())?.unwrap_or_else(|| auth.principal.tenant_scope());
    let release = state
        .releases
        .get(&scope, &id)?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("release {id} not found")))?;
    let mut body = ReleaseBody::of(&release);
    body.verdicts = Some(state.releases.verdicts(&scope, &id)?);
    if release.state == LoadState::Verified {
        body.input_schema = state.releases.manifest(&scope, &release)?.input_schema;
    }
    Ok(Json(body))
}

/// Body of deprecate and revoke.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retire {
    /// finish | drain | interrupt.
    pub in_flight_policy: InFlightPolicy,
}

async fn retire(
    state: AppState,
    principal: &Principal,
    release_id: String,
    raw: Option<String>,
    revoke: bool,
    policy: InFlightPolicy,
) -> Result<Json<Retired>, ApiError> {
    let id = parse_release_id(&release_id)?;
    let scope = scope_of(principal, raw.as_deref())?.unwrap_or_else(|| principal.tenant_scope());
    let (release, report) = state.releases.retire(&scope, &id, revoke, policy).await?;
    Ok(Json(Retired {
        release: ReleaseBody::of(&release),
        in_flight: report,
    }))
}

/// Deprecates a release: `finish` keeps dispatching it, `drain` and
/// `interrupt` stop new runs; `interrupt` also stops the running ones.
#[utoipa::path(post, path = "/runtime/releases/{releaseId}/deprecate", tag = "releases",
    params(("releaseId" = String, Path, description = "Release id")),
    request_body(content = Retire),
    responses((status = 200, description = "The release and what happened to its running attempts", body = Retired)),
    security(("bearer" = [])))]
pub async fn deprecate(
    State(state): State<AppState>,
    auth: Authorized<need::AssetsAdmin>,
    Path(release_id): Path<String>,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Retire>,
) -> Result<Json<Retired>, ApiError> {
    retire(
        state,
        &auth.principal,
        release_id,
        raw,
        false,
        body.in_flight_policy,
    )
    .await
}

/// Revokes a release: it is never dispatched again; running attempts
/// finish, drain or are interrupted per the policy. Its contents stay.
#[utoipa::path(post, path = "/runtime/releases/{releaseId}/revoke", tag = "releases",
    params(("releaseId" = String, Path, description = "Release id")),
    request_body(content = Retire),
    responses((status = 200, description = "The release and what happened to its running attempts", body = Retired)),
    security(("bearer" = [])))]
pub async fn revoke(
    State(state): State<AppState>,
    auth: Authorized<need::AssetsAdmin>,
    Path(release_id): Path<String>,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Retire>,
) -> Result<Json<Retired>, ApiError> {
    retire(
        state,
        &auth.principal,
        release_id,
        raw,
        true,
        body.in_flight_policy,
    )
    .await
}
