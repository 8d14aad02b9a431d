//! REST routes of the ExecutionCapacityService: pools, quotas, leases and
//! queues.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::auth::Principal;
use crate::capacity::grain::{PoolSnapshot, PoolStatus};
use crate::capacity::{CapacityError, LeaseFilter, LeaseView, TenantQuotas};
use crate::domain::access::TenantScope;
use crate::domain::amount::Amount;
use crate::domain::capacity::{
    CapacityLease, EffectiveLimits, LeaseState, PoolSpec, Quota, QuotaPatch, QuotaScope,
    WorkerPool, parse_holder_id,
};
use crate::domain::ids::parse_uuid;
use crate::domain::{ProjectId, TenantId};

impl From<CapacityError> for ApiError {
    fn from(e: CapacityError) -> Self {
        match e {
            CapacityError::Domain(d) => d.into(),
            CapacityError::Denied { lease, limit } => {
                let mut err = ApiError::new(ErrorCode::ResourceExhausted, limit.to_string())
                    .with("leaseId", lease.lease.lease_id.to_string())
                    .with("reason", limit.to_string());
                if let Some(field) = limit.quota_field() {
                    err = err.with("limitingQuota", field);
                }
                err
            }
            CapacityError::Unavailable(m) => ApiError::new(ErrorCode::Unavailable, m),
            CapacityError::NotHere => {
                ApiError::internal("a lease was routed to a pool that does not hold it")
            }
        }
    }
}

/// Query parameters as pairs; `keys` lists the ones allowed.
pub fn query_pairs(raw: Option<&str>, keys: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw.unwrap_or("")).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                format!("the query string is malformed: {e}"),
            )
        })?;
    for (k, _) in &pairs {
        if !keys.contains(&k.as_str()) {
            return Err(ApiError::invalid(
                k.clone(),
                format!("is not a parameter here ({})", keys.join(", ")),
            ));
        }
    }
    Ok(pairs)
}

fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The tenant a request is about: `?tenant=` for a PlatformAdmin, else the
/// caller's own.
fn tenant_of(principal: &Principal, pairs: &[(String, String)]) -> Result<TenantScope, ApiError> {
    match first(pairs, "tenant") {
        Some(t) => Ok(principal.scope_for(&TenantId::parse_field("tenant", t)?)?),
        None => Ok(principal.tenant_scope()),
    }
}

/// Whether the caller may see a pool: shared pools and its own.
fn visible(principal: &Principal, pool: &WorkerPool) -> bool {
    principal.is_platform_admin() || pool.visible_to(&principal.tenant)
}

/// A pool as the API shows it: the record, its capacity now and at its
/// largest, and how many requests wait for it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolBody {
    /// The pool.
    #[serde(flatten)]
    pub pool: WorkerPool,
    /// CPUs of its current size.
    pub capacity_cpu: Amount,
    /// Memory of its current size, in GB.
    pub capacity_memory_gb: Amount,
    /// CPUs at its largest.
    pub max_capacity_cpu: Amount,
    /// Memory at its largest, in GB.
    pub max_capacity_memory_gb: Amount,
    /// Requests waiting for it.
    pub queued: usize,
}

impl PoolBody {
    fn of(status: &PoolStatus) -> PoolBody {
        let (cap, max) = (status.pool.capacity(), status.pool.max_capacity());
        PoolBody {
            pool: status.pool.clone(),
            capacity_cpu: cap.cpu,
            capacity_memory_gb: cap.memory_gb,
            max_capacity_cpu: max.cpu,
            max_capacity_memory_gb: max.memory_gb,
            queued: status.queued,
        }
    }
}

/// A lease as the API shows it: the record, its queue position while it
/// waits and the limiting quota (which then also gives the reason).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseBody {
    /// The lease.
    #[serde(flatten)]
    pub lease: CapacityLease,
    /// 1-based place in its pool's queue while it waits.
    pub queue_position: Option<usize>,
}

impl LeaseBody {
    fn of(view: &LeaseView) -> LeaseBody {
        let mut lease = view.lease.clone();
        if let Some(limit) = &view.limit {
            lease.reason = Some(limit.to_string());
            if let Some(field) = limit.quota_field() {
                lease.limiting_quota = Some(field.to_string());
            }
        }
        LeaseBody {
            lease,
            queue_position: view.queue_position,
        }
    }
}

/// Pools.
#[derive(Serialize, ToSchema)]
pub struct PoolList {
    /// Each pool.
    pub pools: Vec<PoolBody>,
}

/// A page of leases, newest first.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasePage {
    /// The leases.
    pub leases: Vec<LeaseBody>,
    /// The id to pass as `before` for the next page; null on the last.
    pub next_before: Option<String>,
}

/// Requests that wait.
#[derive(Serialize, ToSchema)]
pub struct Waiting {
    /// Each waiting request, in queue order.
    pub waiting: Vec<LeaseBody>,
}

/// `ListWorkerPools`: pools with kind, boundary, region, size and utilisation.
#[utoipa::path(get, path = "/factory/capacity/pools", tag = "capacity",
    responses((status = 200, description = "Pools the caller may use (every pool for a PlatformAdmin)", body = PoolList)),
    security(("bearer" = [])))]
pub async fn list_pools(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
) -> Json<PoolList> {
    let pools = state
        .capacity
        .pools()
        .iter()
        .filter(|s| visible(&auth.principal, &s.pool))
        .map(PoolBody::of)
        .collect();
    Json(PoolList { pools })
}

/// `SetWorkerPool`: create or change a pool (PlatformAdmin).
#[utoipa::path(put, path = "/factory/capacity/pools/{poolId}", tag = "capacity",
    params(("poolId" = String, Path, description = "Pool id (a-z, 0-9, '-')")),
    request_body(content = PoolSpec),
    responses((status = 200, description = "The pool", body = PoolBody), (status = 400, description = "A field is wrong"), (status = 403, description = "Not a PlatformAdmin"), (status = 409, description = "The pool has live leases")),
    security(("bearer" = [])))]
pub async fn set_pool(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityAdmin>,
    Path(pool_id): Path<String>,
    ApiJson(spec): ApiJson<PoolSpec>,
) -> Result<Json<PoolBody>, ApiError> {
    auth.principal.platform_scope()?;
    let pool = state.capacity.set_pool(&pool_id, spec).await?;
    tracing::info!(pool = %pool_id, by = %auth.principal.subject, "SetWorkerPool");
    let status = state
        .capacity
        .pool(&pool.pool_id)
        .unwrap_or(PoolStatus { pool, queued: 0 });
    Ok(Json(PoolBody::of(&status)))
}

/// A request in a pool's queue: the whole lease when it is the caller's
/// tenant's (or the caller is a PlatformAdmin), else only what tells the
/// caller why it waits behind it.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum QueueEntry {
    /// The caller's own request.
    Own(Box<LeaseBody>),
    /// Another tenant's request.
    Other(OtherRequest),
}

/// Another tenant's request in a pool's queue: its place, size and whether
/// it waits on the pool or on its own tenant's quota.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtherRequest {
    /// 1-based place in the queue.
    pub queue_position: Option<usize>,
    /// CPUs asked for.
    pub cpu: Amount,
    /// Memory asked for, in GB.
    pub memory_gb: Amount,
    /// `pool` when it waits for the pool's capacity, `quota` when for its
    /// own tenant's limit.
    pub waiting_on: WaitingOn,
}

/// What a queued request waits on.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum WaitingOn {
    /// The pool's free capacity.
    Pool,
    /// A quota of its own tenant.
    Quota,
}

/// A pool's queue.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolQueue {
    /// The pool.
    pub pool_id: String,
    /// CPUs held back for the head of the queue.
    pub held_back_cpu: Amount,
    /// Memory held back for the head of the queue, in GB.
    pub held_back_memory_gb: Amount,
    /// The waiting requests, in order.
    pub queue: Vec<QueueEntry>,
}

/// The waiting requests of a pool, in order, with their reasons.
#[utoipa::path(get, path = "/factory/capacity/pools/{poolId}/queue", tag = "capacity",
    params(("poolId" = String, Path, description = "Pool id")),
    responses((status = 200, description = "Queue in order; other tenants' requests show only their position, size and what they wait on", body = PoolQueue)),
    security(("bearer" = [])))]
pub async fn pool_queue(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    Path(pool_id): Path<String>,
) -> Result<Json<PoolQueue>, ApiError> {
    let status = state
        .capacity
        .pool(&pool_id)
        .filter(|s| visible(&auth.principal, &s.pool))
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("pool {pool_id} not found")))?;
    let snapshot = state.capacity.snapshot(&status.pool.pool_id).await?;
    let queue = snapshot
        .queue
        .iter()
        .map(|v| {
            if auth.principal.is_platform_admin() || v.lease.tenant_id == auth.principal.tenant {
                QueueEntry::Own(Box::new(LeaseBody::of(v)))
            } else {
                let on_quota = v.limit.as_ref().is_some_and(|l| l.quota_field().is_some());
                QueueEntry::Other(OtherRequest {
                    queue_position: v.queue_position,
                    cpu: v.lease.cpu,
                    memory_gb: v.lease.memory_gb,
                    waiting_on: if on_quota {
                        WaitingOn::Quota
                    } else {
                        WaitingOn::Pool
                    },
                })
            }
        })
        .collect();
    Ok(Json(PoolQueue {
        pool_id: status.pool.pool_id,
        held_back_cpu: snapshot.held_back.cpu,
        held_back_memory_gb: snapshot.held_back.memory_gb,
        queue,
    }))
}

/// `GetQuotas`: effective quotas of the tenant and its projects with their
/// source.
#[utoipa::path(get, path = "/factory/capacity/quotas", tag = "capacity",
    params(("tenant" = Option<String>, Query, description = "PlatformAdmins: another tenant")),
    responses((status = 200, description = "Edition, tenant and project levels with effective values, sources and usage", body = TenantQuotas)),
    security(("bearer" = [])))]
pub async fn get_quotas(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    RawQuery(raw): RawQuery,
) -> Result<Json<TenantQuotas>, ApiError> {
    let pairs = query_pairs(raw.as_deref(), &["tenant"])?;
    let scope = tenant_of(&auth.principal, &pairs)?;
    Ok(Json(state.capacity.quotas(&scope)?))
}

/// A quota as set, and the limits that now apply.
#[derive(Serialize, ToSchema)]
pub struct QuotaSetAnswer {
    /// The level's quota as stored.
    pub quota: Quota,
    /// The limits now in force at that level (null for an edition, which
    /// applies through its tenants).
    pub effective: Option<EffectiveLimits>,
}

/// `SetQuota`: set an edition's defaults or a tenant's limits
/// (PlatformAdmin), or tighten a project's (WorkspaceAdmin of its tenant).
#[utoipa::path(put, path = "/factory/capacity/quotas/{scope}", tag = "capacity",
    params(("scope" = String, Path, description = "edition.<name>, tenant.<tenantId> or project.<tenantId>.<projectId>")),
    request_body(content = QuotaPatch, description = "Each limit absent (unchanged), null (left to the parent) or a value"),
    responses((status = 200, description = "The quota and the effective limits now", body = QuotaSetAnswer), (status = 400, description = "A value would loosen the parent's limit: the field, the value and the bound are named"), (status = 403, description = "The caller may not set this level: tenant limits and editions are PlatformAdmins'")),
    security(("bearer" = [])))]
pub async fn set_quota(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityAdmin>,
    Path(scope): Path<String>,
    ApiJson(patch): ApiJson<QuotaPatch>,
) -> Result<Json<QuotaSetAnswer>, ApiError> {
    let scope = QuotaScope::parse(&scope)?;
    let quota = state
        .capacity
        .set_quota(scope.clone(), patch, &auth.principal.actor())
        .await?;
    let effective = match &scope {
        QuotaScope::Edition { .. } => None,
        QuotaScope::Tenant { tenant_id } => state.capacity.limits_of(tenant_id, None),
        QuotaScope::Project {
            tenant_id,
            project_id,
        } => state.capacity.limits_of(tenant_id, Some(project_id)),
    };
    Ok(Json(QuotaSetAnswer { quota, effective }))
}

/// `ListCapacityLeases`: active and recent leases by holder, pool and state.
#[utoipa::path(get, path = "/factory/capacity/leases", tag = "capacity",
    params(
        ("holderId" = Option<String>, Query, description = "Only this holder"),
        ("poolId" = Option<String>, Query, description = "Only this pool"),
        ("state" = Option<Vec<LeaseState>>, Query, description = "Only these states (repeatable)"),
        ("projectId" = Option<String>, Query, description = "Only this project"),
        ("limit" = Option<usize>, Query, description = "At most this many, newest first (default 200, at most 5000)"),
        ("before" = Option<String>, Query, description = "Only leases older than this lease id: the `nextBefore` of the previous page"),
        ("tenant" = Option<String>, Query, description = "PlatformAdmins: one tenant; all when absent"),
    ),
    responses((status = 200, description = "Leases, each waiting one with its reason and queue position; `nextBefore`, when the page is full, continues the list", body = LeasePage)),
    security(("bearer" = [])))]
pub async fn list_leases(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    RawQuery(raw): RawQuery,
) -> Result<Json<LeasePage>, ApiError> {
    let pairs = query_pairs(
        raw.as_deref(),
        &[
            "holderId",
            "poolId",
            "state",
            "projectId",
            "limit",
            "before",
            "tenant",
        ],
    )?;
    let mut filter = LeaseFilter {
        holder_id: first(&pairs, "holderId").map(parse_holder_id).transpose()?,
        pool_id: first(&pairs, "poolId")
            .map(|p| crate::domain::ids::check_slug("poolId", p).map(|()| p.to_string()))
            .transpose()?,
        ..LeaseFilter::default()
    };
    for (k, v) in &pairs {
        if k == "state" {
            filter.states.push(LeaseState::parse(v).ok_or_else(|| {
                ApiError::invalid(
                    "state",
                    format!(
                        "{v:?} is not one of Requested, Granted, Active, Released, Expired, Denied"
                    ),
                )
            })?);
        }
    }
    if let Some(p) = first(&pairs, "projectId") {
        filter.project_id = Some(ProjectId::parse(p)?);
    }
    if let Some(b) = first(&pairs, "before") {
        filter.before = Some(parse_uuid("before", b)?);
    }
    let limit = match first(&pairs, "limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=5000).contains(n))
            .ok_or_else(|| {
                ApiError::invalid("limit", format!("{l:?} is not a number from 1 to 5000"))
            })?,
        None => 200,
    };
    let scope = if auth.principal.is_platform_admin() && first(&pairs, "tenant").is_none() {
        None
    } else {
        Some(tenant_of(&auth.principal, &pairs)?)
    };
    let leases = state
        .capacity
        .leases(scope.as_ref(), &filter, limit)
        .await?;
    let next_before = (leases.len() == limit)
        .then(|| leases.last().map(|v| v.lease.lease_id.to_string()))
        .flatten();
    Ok(Json(LeasePage {
        leases: leases.iter().map(LeaseBody::of).collect(),
        next_before,
    }))
}

/// The caller's waiting requests across pools, with position and reason.
#[utoipa::path(get, path = "/factory/capacity/queue", tag = "capacity",
    params(("projectId" = Option<String>, Query, description = "Only this project"), ("tenant" = Option<String>, Query, description = "PlatformAdmins: another tenant")),
    responses((status = 200, description = "Waiting requests of the tenant (or project)", body = Waiting)),
    security(("bearer" = [])))]
pub async fn my_queue(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Waiting>, ApiError> {
    let pairs = query_pairs(raw.as_deref(), &["projectId", "tenant"])?;
    let scope = tenant_of(&auth.principal, &pairs)?;
    let filter = LeaseFilter {
        states: vec![LeaseState::Requested],
        project_id: first(&pairs, "projectId")
            .map(ProjectId::parse)
            .transpose()?,
        ..LeaseFilter::default()
    };
    let leases = state.capacity.leases(Some(&scope), &filter, 5000).await?;
    Ok(Json(Waiting {
        waiting: leases.iter().map(LeaseBody::of).collect(),
    }))
}

/// One pool's counters next to the sums of its leases.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAccounting {
    /// The pool.
    pub pool_id: String,
    /// Its nodes now.
    pub current_size: u32,
    /// CPUs of its current size.
    pub capacity_cpu: Amount,
    /// Memory of its current size, in GB.
    pub capacity_memory_gb: Amount,
    /// CPUs granted, by the pool's counter.
    pub granted_cpu: Amount,
    /// Memory granted, by the pool's counter, in GB.
    pub granted_memory_gb: Amount,
    /// Leases holding capacity, by the pool's counter.
    pub active_leases: u32,
    /// CPUs of the leases holding capacity, summed.
    pub leases_cpu: Amount,
    /// Memory of the leases holding capacity, summed, in GB.
    pub leases_memory_gb: Amount,
    /// Leases holding capacity, counted.
    pub lease_count: usize,
    /// Requests waiting.
    pub queued: usize,
    /// Whether the counters equal the sums and stay within the capacity.
    pub consistent: bool,
}

fn pool_accounting(s: &PoolSnapshot) -> PoolAccounting {
    let cap = s.pool.capacity();
    PoolAccounting {
        pool_id: s.pool.pool_id.clone(),
        current_size: s.pool.current_size,
        capacity_cpu: cap.cpu,
        capacity_memory_gb: cap.memory_gb,
        granted_cpu: s.pool.granted_cpu,
        granted_memory_gb: s.pool.granted_memory_gb,
        active_leases: s.pool.active_leases,
        leases_cpu: s.leases_cpu,
        leases_memory_gb: s.leases_memory_gb,
        lease_count: s.leases.len(),
        queued: s.queue.len(),
        consistent: s.pool.granted_cpu == s.leases_cpu
            && s.pool.granted_memory_gb == s.leases_memory_gb
            && s.pool.active_leases as usize == s.leases.len()
            && s.pool.granted_cpu <= cap.cpu
            && s.pool.granted_memory_gb <= cap.memory_gb,
    }
}

/// A tenant's or a project's usage against its limits.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageLine {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project; null for the tenant's own line.
    pub project_id: Option<ProjectId>,
    /// Run slots held by live runs (see `UsageView.concurrentRuns`).
    pub concurrent_runs: u32,
    /// Sandbox and browser-session leases holding capacity.
    pub concurrent_sandboxes: u32,
    /// CPU held by leases now.
    pub cpu_in_use: Amount,
    /// Memory held by leases now, GB.
    pub memory_gb_in_use: Amount,
    /// Lease seconds used today (UTC): time leases held CPU and memory.
    pub execution_seconds_today: u64,
    /// Model tokens (input and output) charged today (UTC).
    pub tokens_today: u64,
    /// The limits in force; null when the tenant is no longer registered.
    pub limits: Option<EffectiveLimits>,
}

/// The accounting of the appliance.
#[derive(Serialize, ToSchema)]
pub struct Accounting {
    /// Every pool.
    pub pools: Vec<PoolAccounting>,
    /// Every tenant and project that holds or held capacity today.
    pub usage: Vec<UsageLine>,
}

/// The accounting of every pool (each a consistent snapshot of its grain)
/// and the usage against the limits of every tenant and project
/// (PlatformAdmin): what an operator checks when numbers look wrong.
#[utoipa::path(get, path = "/factory/capacity/accounting", tag = "capacity",
    responses((status = 200, description = "Per pool: counters and the sums of its leases; per tenant and project: usage and effective limits", body = Accounting)),
    security(("bearer" = [])))]
pub async fn accounting(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
) -> Result<Json<Accounting>, ApiError> {
    auth.principal.platform_scope()?;
    let pools = state
        .capacity
        .snapshots()
        .await
        .iter()
        .map(pool_accounting)
        .collect();
    let usage = state
        .capacity
        .usage()
        .into_iter()
        .map(|(tenant, project, usage)| UsageLine {
            limits: state.capacity.limits_of(&tenant, project.as_ref()),
            tenant_id: tenant,
            project_id: project,
            concurrent_runs: usage.runs,
            concurrent_sandboxes: usage.sandboxes,
            cpu_in_use: usage.cpu,
            memory_gb_in_use: usage.memory_gb,
            execution_seconds_today: usage.seconds_today,
            tokens_today: usage.tokens_today,
        })
        .collect();
    Ok(Json(Accounting { pools, usage }))
}

/// A lease of the caller's tenant (or any, for a PlatformAdmin with `?tenant=`).
#[utoipa::path(get, path = "/factory/capacity/leases/{leaseId}", tag = "capacity",
    params(("leaseId" = String, Path, description = "Lease id")),
    responses((status = 200, description = "The lease, with its position and reason while it waits", body = LeaseBody)),
    security(("bearer" = [])))]
pub async fn get_lease(
    State(state): State<AppState>,
    auth: Authorized<need::CapacityRead>,
    Path(lease_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<LeaseBody>, ApiError> {
    let pairs = query_pairs(raw.as_deref(), &["tenant"])?;
    let scope = tenant_of(&auth.principal, &pairs)?;
    let id = parse_uuid("leaseId", &lease_id)?;
    let lease = state.capacity.lease(&scope, id)?;
    let filter = LeaseFilter {
        holder_id: Some(lease.holder_id.clone()),
        pool_id: Some(lease.pool_id.clone()),
        ..LeaseFilter::default()
    };
    let view = state
        .capacity
        .leases(Some(&scope), &filter, 5000)
        .await?
        .into_iter()
        .find(|v| v.lease.lease_id == id)
        .unwrap_or(LeaseView {
            lease,
            queue_position: None,
            limit: None,
        });
    Ok(Json(LeaseBody::of(&view)))
}

/// `GetUsage`: the tenant's model tokens from the ledger, per UTC day,
/// project, agent or release (any combination), as JSON or CSV.
#[utoipa::path(get, path = "/factory/usage", tag = "capacity",
    params(
        ("tenant" = Option<String>, Query, description = "PlatformAdmins: another tenant"),
        ("from" = Option<chrono::NaiveDate>, Query, description = "First UTC day (default: 29 days before to); a range of more than 366 days is cut to the 366 up to to"),
        ("to" = Option<chrono::NaiveDate>, Query, description = "Last UTC day (default: today)"),
        ("groupBy" = Option<String>, Query, description = "Comma-separated: day, project, agent, release (default: day)", pattern = "^((day|project|agent|release)(,(day|project|agent|release))*)?$"),
        ("projectId" = Option<String>, Query, description = "Only this project", pattern = "^[a-z0-9][a-z0-9-]{0,62}$"),
        ("agentId" = Option<String>, Query, description = "Only this agent", pattern = "^[A-Za-z0-9._-]{1,128}$"),
        ("format" = Option<String>, Query, description = "json (default) or csv", pattern = "^(json|csv)$"),
    ),
    responses(
        (status = 200, description = "Rows in key order with their input, output, cached and total tokens and model calls, and the total; as CSV (a header line, then one line per row) with format=csv", content(
            (crate::capacity::ledger::UsageReport = "application/json"),
            (String = "text/csv"),
        )),
        (status = 400, description = "A malformed day, grouping or range, named"),
    ),
    security(("bearer" = [])))]
pub async fn usage(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    RawQuery(raw): RawQuery,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let pairs = query_pairs(
        raw.as_deref(),
        &[
            "tenant",
            "from",
            "to",
            "groupBy",
            "projectId",
            "agentId",
            "format",
        ],
    )?;
    let scope = tenant_of(&auth.principal, &pairs)?;
    let query = crate::capacity::ledger::UsageQuery::parse(
        first(&pairs, "from"),
        first(&pairs, "to"),
        first(&pairs, "groupBy").unwrap_or(""),
        first(&pairs, "projectId"),
        first(&pairs, "agentId"),
        state.clock.now().date_naive(),
    )?;
    let report = state.capacity.token_usage(&scope, &query)?;
    match first(&pairs, "format") {
        None | Some("json") => Ok(Json(report).into_response()),
        Some("csv") => Ok(usage_csv(&report, query.by)),
        Some(other) => Err(ApiError::invalid(
            "format",
            format!("{other:?} is not a format; use json or csv"),
        )),
    }
}

/// A usage report as a CSV download named after its tenant and days (the
/// API's `format=csv` and the console's export).
pub fn usage_csv(
    report: &crate::capacity::ledger::UsageReport,
    by: crate::capacity::ledger::Grouping,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/csv; charset=utf-8".to_string(),
            ),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"usage-{}-{}-{}.csv\"",
                    report.tenant_id, report.from, report.to
                ),
            ),
        ],
        crate::capacity::ledger::csv(&report.rows, by),
    )
        .into_response()
}
