//! Probes and metrics.
//!
//! `/healthz` answers while the process serves (liveness). `/readyz` answers
//! 200 only when the store accepts durable writes, every worker is alive
//! and no shutdown is under way, and says which of those failed otherwise.
//! Both are unauthenticated and reveal nothing but that state. `/metrics`
//! needs a token with `agentbay.metrics.read`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::AppState;
use crate::api::error::{ApiError, ErrorCode};
use crate::api::extract::{Authorized, need};
use crate::telemetry::Gauge;
use crate::telemetry::names;
use crate::worker::WorkerStatus;

/// Liveness: always `ok` while the process serves.
#[derive(Serialize, ToSchema)]
pub struct Liveness {
    /// `ok`.
    pub status: &'static str,
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process serves", body = Liveness)))]
pub async fn healthz() -> Json<Liveness> {
    Json(Liveness { status: "ok" })
}

/// Readiness report.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// Whether every check passed.
    pub ready: bool,
    /// This appliance's version.
    pub version: &'static str,
    /// `active`: this appliance serves (a standby answers `/readyz` with
    /// `standby` and the active appliance).
    pub role: crate::domain::cluster::Role,
    /// The appliance holding the shared PostgreSQL store (this one) with
    /// its epoch; absent on sled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<crate::domain::cluster::Node>,
    /// The schema version its store runs at.
    pub schema_version: u32,
    /// `ok`, or why the store cannot confirm writes.
    pub store: String,
    /// Whether a shutdown is draining requests.
    pub shutting_down: bool,
    /// Every background worker.
    pub workers: Vec<WorkerStatus>,
    /// How the pools that run on this host fit it: what it has, what they
    /// promise, pools taken as remote, and warnings when they promise more
    /// than it has (absent when the host's resources could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::domain::capacity::HostFit>,
    /// Scheduled backups (absent when `backup.dir` is not set): the last
    /// one, its age and size, and the last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::domain::backup::BackupReport>,
    /// What this host enforces on tool processes: the mechanism, the
    /// network and the files.
    #[cfg(unix)]
    pub tools: crate::runtime::confine::HostReport,
    /// What this host enforces on tool processes: a Job Object's limits
    /// and kill-on-close, as a probe at start saw them.
    #[cfg(windows)]
    pub tools: crate::runtime::jobobject::HostReport,
}

/// Readiness: store, workers, shutdown.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness))
)]
pub async fn readyz(State(state): State<AppState>) -> Response {
    // An active appliance waiting for its database keeps its role, but
    // serves nothing that needs the store meanwhile.
    let store = state
        .store
        .healthy()
        .and_then(|()| state.store.reach().unreachable().map_or(Ok(()), Err));
    let shutting_down = *state.shutdown.borrow();
    let dead = state.workers.dead();
    let ready = store.is_ok() && !shutting_down && dead.is_empty();
    let body = Readiness {
        ready,
        version: env!("CARGO_PKG_VERSION"),
        role: crate::domain::cluster::Role::Active,
        leader: state.store.leadership(),
        schema_version: state.store.schema_version(),
        store: store.err().unwrap_or_else(|| "ok".into()),
        shutting_down,
        workers: state.workers.statuses(),
        host: state.capacity.host_fit(),
        backup: state.backups.as_ref().map(|b| b.report(state.clock.now())),
        #[cfg(any(unix, windows))]
        tools: state.runtime.confinement(),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The gauges read off the appliance's state at scrape time.
pub async fn state_gauges(state: &AppState, now: chrono::DateTime<chrono::Utc>) -> Vec<Gauge> {
    let mut out = state.capacity.queue_gauges(now).await;
    let tenants: Vec<_> = state
        .capacity
        .tenants()
        .into_iter()
        .map(|t| t.tenant_id)
        .collect();
    out.extend(state.runtime.waiting_gauges(&tenants, now));
    out.extend(state.workers.gauges(now));
    out.extend(state.webhooks.gauges(now));
    let mut free = Gauge::new(
        names::DISK_FREE,
        "Free bytes of a volume's file system (data, backups)",
    );
    let mut size = Gauge::new(
        names::DISK_SIZE,
        "Size in bytes of a volume's file system (data, backups)",
    );
    let mut volumes = vec![("data", state.config.data_dir.clone())];
    if let Some(dir) = &state.config.backup.dir {
        volumes.push(("backups", dir.clone()));
    }
    for (volume, path) in volumes {
        if let Some((f, t)) = crate::telemetry::disk_space(&path) {
            free.set(&[("volume", volume)], f as f64);
            size.set(&[("volume", volume)], t as f64);
        }
    }
    out.extend([free, size]);
    out
}

/// Prometheus metrics: the appliance's, which describe every tenant, so
/// scraping is for principals of the platform tenant holding
/// `agentbay.metrics.read` (a scope only the platform tenant's credentials
/// can hold).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
        (status = 403, description = "Not a principal of the platform tenant holding agentbay.metrics.read", content_type = "application/problem+json"),
    ),
    security(("bearer" = ["agentbay.metrics.read"]))
)]
pub async fn metrics(
    State(state): State<AppState>,
    auth: Authorized<need::MetricsRead>,
) -> Result<Response, ApiError> {
    if !auth.principal.tenant.is_platform() {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "the metrics describe every tenant: only principals of the platform tenant may scrape them, not {} of tenant {}",
                auth.principal.subject, auth.principal.tenant
            ),
        ));
    }
    let stats = state.store.commit_stats();
    metrics::counter!(names::STORE_COMMITS).absolute(stats.commits);
    metrics::counter!(names::STORE_FLUSHES).absolute(stats.flushes);
    let unanswered = state
        .store
        .reach()
        .down
        .map_or(0.0, |(since, _)| since.elapsed().as_secs_f64());
    metrics::gauge!(names::STORE_UNANSWERED_SECONDS).set(unanswered);
    if let Ok(bytes) = state.store.size_on_disk() {
        metrics::gauge!(names::STORE_DISK_BYTES).set(bytes as f64);
    }
    let now = state.clock.now();
    match &state.backups {
        Some(b) => {
            b.report(now);
        }
        None => metrics::gauge!(names::BACKUP_ENABLED).set(0.0),
    }
    let mut text = state.metrics.render();
    for gauge in state_gauges(&state, now).await {
        gauge.render(&mut text);
    }
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}
