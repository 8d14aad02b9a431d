//! Capacity pages: pools with their utilisation and queue, quotas with their
//! source, leases with who waits and why; SetWorkerPool (PlatformAdmin) and
//! SetQuota (WorkspaceAdmin) forms.

use askama::Template;
use axum::extract::{Path, RawForm, RawQuery};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::table::{Cell, ListQuery, Table};
use super::{Console, Fields, Layout, PageError, render};
use crate::api::error::ApiError;
use crate::capacity::{LeaseFilter, LeaseView};
use crate::domain::access::Scope;
use crate::domain::capacity::quota::Effective;
use crate::domain::capacity::{PoolSpec, QuotaPatch, QuotaScope, SecurityBoundary, WorkerPool};

/// A pool as the overview and the pools page draw it.
pub struct PoolBar {
    /// Pool id.
    pub id: String,
    /// Kind, boundary, region and state in words.
    pub facts: String,
    /// Granted CPU as a share of the maximum size, 0 to 100.
    pub used: f64,
    /// Current size as a share of the maximum size, 0 to 100.
    pub size: f64,
    /// Minimum size as a share of the maximum size, 0 to 100.
    pub min: f64,
    /// The numbers behind the bars.
    pub text: String,
    /// Requests waiting.
    pub queued: usize,
}

fn visible(console: &Console, pool: &WorkerPool) -> bool {
    console.platform_admin()
        || pool.security_boundary == SecurityBoundary::Shared
        || pool.tenant_id == *console.viewing()
}

fn bar(pool: &WorkerPool, queued: usize) -> PoolBar {
    let max = pool.max_capacity();
    let cap = pool.capacity();
    let max_cpu = max.cpu.as_f64().max(f64::MIN_POSITIVE);
    let pct = |x: f64| (x / max_cpu * 100.0).clamp(0.0, 100.0);
    PoolBar {
        id: pool.pool_id.clone(),
        facts: format!(
            "{} · {} · {} · {:?}",
            pool.kind.as_str(),
            pool.security_boundary.as_str(),
            pool.region,
            pool.state
        ),
        used: pct(pool.granted_cpu.as_f64()),
        size: pct(cap.cpu.as_f64()),
        min: pct(pool.slot.cpu.as_f64() * f64::from(pool.min_size)),
        text: format!(
            "{} of {} CPU granted ({} GB of {} GB) · size {} of {}..{} slots · {} leases",
            pool.granted_cpu,
            cap.cpu,
            pool.granted_memory_gb,
            cap.memory_gb,
            pool.current_size,
            pool.min_size,
            pool.max_size,
            pool.active_leases
        ),
        queued,
    }
}

/// Bars of the pools the console's tenant may see.
pub async fn pool_bars(console: &Console) -> Vec<PoolBar> {
    console
        .state
        .capacity
        .pools()
        .iter()
        .filter(|s| visible(console, &s.pool))
        .map(|s| bar(&s.pool, s.queued))
        .collect()
}

// ---- pools ------------------------------------------------------------------

/// Requests of a pool's queue the pools page lists; the leases page lists
/// every waiting one.
const QUEUE_SHOWN: usize = 50;

/// Minutes of history the pools page draws.
const HISTORY_MINUTES: usize = 60;

/// Average granted CPU of each pool in each of the last
/// [`HISTORY_MINUTES`] minutes, from the lease records (so it survives a
/// restart and counts every tenant's leases, without naming them).
fn cpu_history(
    console: &Console,
) -> Result<std::collections::HashMap<String, Vec<f64>>, PageError> {
    let now = console.state.clock.now();
    let start = now - chrono::Duration::minutes(HISTORY_MINUTES as i64);
    let spans = console.state.capacity.recent_spans(start)?;
    let mut out: std::collections::HashMap<String, Vec<f64>> = std::collections::HashMap::new();
    for span in spans {
        let Some(from) = span.granted_at else {
            continue;
        };
        let until = span.released_at.unwrap_or(now).min(now);
        if until <= start || from >= until {
            continue;
        }
        let buckets = out
            .entry(span.pool_id)
            .or_insert_with(|| vec![0.0; HISTORY_MINUTES]);
        let cpu = span.cpu.as_f64();
        for (i, bucket) in buckets.iter_mut().enumerate() {
            let b0 = start + chrono::Duration::minutes(i as i64);
            let b1 = b0 + chrono::Duration::minutes(1);
            let overlap = (until.min(b1) - from.max(b0)).num_milliseconds();
            if overlap > 0 {
                *bucket += cpu * overlap as f64 / 60_000.0;
            }
        }
    }
    Ok(out)
}

/// The history as an SVG path over a 1000 x 60 box scaled to `max`.
fn history_path(history: &[f64], max: f64) -> String {
    let max = max.max(f64::MIN_POSITIVE);
    let step = 1000.0 / (history.len().max(2) - 1) as f64;
    let mut path = String::from("M0,60");
    for (i, v) in history.iter().enumerate() {
        let y = 60.0 - (v / max).clamp(0.0, 1.0) * 58.0;
        path.push_str(&format!(" L{:.1},{:.1}", i as f64 * step, y));
    }
    path.push_str(" L1000,60 Z");
    path
}

/// A pool with the head of its queue.
pub struct PoolPanel {
    bar: PoolBar,
    history: String,
    peak: String,
    pool: WorkerPool,
    queue: Vec<(usize, String, String, String)>,
    more: usize,
    held_back: String,
}

#[derive(Template)]
#[template(path = "console/pools.html")]
struct PoolsPage {
    l: Layout,
    live: PoolsLive,
    can_set: bool,
    profiles: Vec<String>,
    tenants: Vec<String>,
}

/// The part of the pools page that updates live.
#[derive(Template)]
#[template(path = "console/pools_live.html")]
pub struct PoolsLive {
    panels: Vec<PoolPanel>,
}

/// Builds the live part of the pools page.
pub async fn pools_live(console: &Console) -> Result<PoolsLive, PageError> {
    let mut panels = Vec::new();
    let mut histories = cpu_history(console)?;
    for snapshot in console.state.capacity.snapshots().await {
        if !visible(console, &snapshot.pool) {
            continue;
        }
        let queue = snapshot
            .queue
            .iter()
            .take(QUEUE_SHOWN)
            .map(|v| {
                let mine = console.platform_admin() || v.lease.tenant_id == *console.viewing();
                (
                    v.queue_position.unwrap_or(0),
                    if mine {
                        format!(
                            "{} {} ({})",
                            v.lease.holder_kind.as_str(),
                            v.lease.holder_id,
                            v.lease.tenant_id
                        )
                    } else {
                        "another tenant's request".to_string()
                    },
                    format!("{} CPU · {} GB", v.lease.cpu, v.lease.memory_gb),
                    v.limit
                        .as_ref()
                        .map(|l| l.to_string())
                        .unwrap_or_else(|| "waiting for the requests ahead".into()),
                )
            })
            .collect();
        let history = histories
            .remove(&snapshot.pool.pool_id)
            .unwrap_or_else(|| vec![0.0; HISTORY_MINUTES]);
        let max_cpu = snapshot.pool.max_capacity().cpu.as_f64();
        let peak = history.iter().copied().fold(0.0, f64::max);
        panels.push(PoolPanel {
            history: history_path(&history, max_cpu),
            peak: format!("peak {peak:.2} of {max_cpu} CPU, averaged per minute"),
            more: snapshot.queue.len().saturating_sub(QUEUE_SHOWN),
            bar: bar(&snapshot.pool, snapshot.queue.len()),
            held_back: format!(
                "{} CPU · {} GB held back for the head of the queue",
                snapshot.held_back.cpu, snapshot.held_back.memory_gb
            ),
            pool: snapshot.pool,
            queue,
        });
    }
    Ok(PoolsLive { panels })
}

/// `GET /pools`.
pub async fn pools(console: Console) -> Result<Response, PageError> {
    console.require(Scope::CapacityRead)?;
    let live = pools_live(&console).await?;
    let can_set = console.platform_admin() && console.can(Scope::CapacityAdmin);
    render(&PoolsPage {
        l: console.layout("Pools", "/pools"),
        live,
        can_set,
        profiles: console
            .state
            .capacity
            .node_profiles()
            .keys()
            .cloned()
            .collect(),
        tenants: console
            .state
            .capacity
            .tenants()
            .into_iter()
            .map(|t| t.tenant_id.to_string())
            .collect(),
    })
}

fn pool_spec(fields: &Fields) -> Result<PoolSpec, ApiError> {
    let number = |key: &str| -> Result<Value, ApiError> {
        let text = fields.need(key)?;
        text.parse::<u32>()
            .map(Value::from)
            .map_err(|_| ApiError::invalid(key, format!("{text:?} is not a whole number")))
    };
    let mut spec = json!({
        "kind": fields.need("kind")?,
        "securityBoundary": fields.need("securityBoundary")?,
        "region": fields.need("region")?,
        "nodeProfile": fields.need("nodeProfile")?,
        "minSize": number("minSize")?,
        "maxSize": number("maxSize")?,
        "internetEgress": fields.get("internetEgress") == Some("on"),
        "state": fields.get("state").unwrap_or("Active"),
    });
    if let Some(t) = fields.get("tenantId") {
        spec["tenantId"] = json!(t);
    }
    if let Some(target) = fields.get("targetUtilisation") {
        let target: f64 = target.parse().map_err(|_| {
            ApiError::invalid("targetUtilisation", format!("{target:?} is not a number"))
        })?;
        spec["autoscaling"] = json!({ "enabled": true, "targetUtilisation": target });
    }
    serde_json::from_value(spec).map_err(|e| ApiError::invalid("pool", e.to_string()))
}

/// `POST /pools/{id}`: SetWorkerPool, for PlatformAdmins.
pub async fn set_pool(
    console: Console,
    Path(pool_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::CapacityAdmin)?;
    console.require(Scope::Platform)?;
    let id = fields.get("poolId").unwrap_or(&pool_id).to_string();
    let result = match pool_spec(&fields) {
        Ok(spec) => console
            .state
            .capacity
            .set_pool(&id, spec)
            .await
            .map(|p| {
                tracing::info!(pool = %id, by = %console.by(), "SetWorkerPool");
                format!(
                    "pool {} saved: {} slots ({}..{})",
                    p.pool_id, p.current_size, p.min_size, p.max_size
                )
            })
            .map_err(ApiError::from),
        Err(e) => Err(e),
    };
    Ok(console.done("/pools", result))
}

// ---- quotas -----------------------------------------------------------------

/// One limit of one level, as the quotas page shows it.
pub struct LimitRow {
    field: &'static str,
    own: String,
    effective: String,
    source: String,
    usage: String,
}

/// One level: the tenant or a project.
pub struct QuotaLevel {
    title: String,
    scope: String,
    /// Who set it and when, in words.
    set_by: String,
    /// Whether the viewer may set this level.
    settable: bool,
    rows: Vec<LimitRow>,
}

#[derive(Template)]
#[template(path = "console/quotas.html")]
struct QuotasPage {
    l: Layout,
    edition: String,
    edition_limits: Vec<(&'static str, String)>,
    edition_set_by: String,
    levels: Vec<QuotaLevel>,
    can_set: bool,
}

fn set_by_words(by: Option<&str>, at: Option<&chrono::DateTime<chrono::Utc>>) -> String {
    match (by, at) {
        (Some(by), Some(at)) => format!("set by {by}, {}", at.format("%Y-%m-%d %H:%M UTC")),
        (Some(by), None) => format!("set by {by}"),
        _ => "sets nothing of its own".into(),
    }
}

fn show<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "—".into())
}

fn effective<T: std::fmt::Display>(e: &Effective<T>) -> (String, String) {
    (
        e.value
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_else(|| "unlimited".into()),
        e.source
            .as_ref()
            .map(source_words)
            .unwrap_or_else(|| "no level limits it".into()),
    )
}

fn source_words(scope: &QuotaScope) -> String {
    match scope {
        QuotaScope::Edition { edition } => format!("edition {edition}"),
        QuotaScope::Tenant { tenant_id } => format!("tenant {tenant_id}"),
        QuotaScope::Project {
            tenant_id,
            project_id,
        } => format!("project {tenant_id}/{project_id}"),
    }
}

fn level(set: &crate::capacity::QuotaSet, actor: &crate::domain::access::Actor) -> QuotaLevel {
    let e = &set.effective;
    let o = &set.own;
    let u = &set.usage;
    let row = |field, own: String, (effective, source): (String, String), usage: String| LimitRow {
        field,
        own,
        effective,
        source,
        usage,
    };
    let (title, scope, level) = match &set.project_id {
        Some(p) => (
            format!("Project {p}"),
            format!("project.{}.{p}", set.tenant_id),
            QuotaScope::Project {
                tenant_id: set.tenant_id.clone(),
                project_id: p.clone(),
            },
        ),
        None => (
            format!("Tenant {}", set.tenant_id),
            format!("tenant.{}", set.tenant_id),
            QuotaScope::Tenant {
                tenant_id: set.tenant_id.clone(),
            },
        ),
    };
    QuotaLevel {
        title,
        scope,
        set_by: set_by_words(set.set_by.as_deref(), set.set_at.as_ref()),
        settable: level.check_authority(actor).is_ok(),
        rows: vec![
            row(
                "concurrentRuns",
                show(&o.concurrent_runs),
                effective(&e.concurrent_runs),
                format!("{} run slot(s) held", u.concurrent_runs),
            ),
            row(
                "concurrentSandboxes",
                show(&o.concurrent_sandboxes),
                effective(&e.concurrent_sandboxes),
                u.concurrent_sandboxes.to_string(),
            ),
            row(
                "cpuPerAttempt",
                show(&o.cpu_per_attempt),
                effective(&e.cpu_per_attempt),
                format!("{} CPU held now", u.cpu_in_use),
            ),
            row(
                "memoryGbPerAttempt",
                show(&o.memory_gb_per_attempt),
                effective(&e.memory_gb_per_attempt),
                format!("{} GB held now", u.memory_gb_in_use),
            ),
            row(
                "executionMinutesPerDay",
                show(&o.execution_minutes_per_day),
                effective(&e.execution_minutes_per_day),
                format!("{} today", u.execution_minutes_today),
            ),
            row(
                "tokensPerDay",
                show(&o.tokens_per_day),
                effective(&e.tokens_per_day),
                format!("{} today", u.tokens_today),
            ),
        ],
    }
}

/// `GET /quotas`: edition, tenant and project limits with their source and
/// usage.
pub async fn quotas(console: Console) -> Result<Response, PageError> {
    console.require(Scope::CapacityRead)?;
    let scope = console.scope()?;
    let q = console.state.capacity.quotas(&scope)?;
    let el = &q.edition_limits;
    let edition_limits = vec![
        ("concurrentRuns", show(&el.concurrent_runs)),
        ("concurrentSandboxes", show(&el.concurrent_sandboxes)),
        ("cpuPerAttempt", show(&el.cpu_per_attempt)),
        ("memoryGbPerAttempt", show(&el.memory_gb_per_attempt)),
        (
            "executionMinutesPerDay",
            show(&el.execution_minutes_per_day),
        ),
        ("tokensPerDay", show(&el.tokens_per_day)),
    ];
    let actor = console.principal().actor();
    let mut levels = vec![level(&q.tenant, &actor)];
    levels.extend(q.projects.iter().map(|p| level(p, &actor)));
    render(&QuotasPage {
        l: console.layout("Quotas", "/quotas"),
        edition: q.edition.clone(),
        edition_limits,
        edition_set_by: set_by_words(Some(&q.edition_set_by), q.edition_set_at.as_ref()),
        can_set: levels.iter().any(|l| l.settable),
        levels,
    })
}

/// The limits of a quota.
const LIMIT_FIELDS: [&str; 6] = [
    "concurrentRuns",
    "concurrentSandboxes",
    "cpuPerAttempt",
    "memoryGbPerAttempt",
    "executionMinutesPerDay",
    "tokensPerDay",
];

fn quota_patch(fields: &Fields) -> Result<QuotaPatch, ApiError> {
    let mut patch = Map::new();
    for key in LIMIT_FIELDS {
        match fields.get(key) {
            None => {}
            Some("inherit") => {
                patch.insert(key.into(), Value::Null);
            }
            Some(text) => {
                // Whole numbers go as integers, so that the integer limits
                // (concurrentRuns, ...) accept them; serde names the field
                // and the type when a fraction is given to one of those.
                // A number that is not finite (NaN, inf, 1e400) would
                // become JSON null, which means "inherit": refused here.
                let value = match text.parse::<u64>() {
                    Ok(n) => json!(n),
                    Err(_) => json!(text.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(
                        || {
                            ApiError::invalid(
                                key,
                                format!(
                                    "{text:?} is not a finite number (leave it blank to keep it, or write inherit)"
                                ),
                            )
                        }
                    )?),
                };
                patch.insert(key.into(), value);
            }
        }
    }
    if patch.is_empty() {
        return Err(ApiError::invalid(
            "quota",
            "no limit given: fill in at least one field",
        ));
    }
    serde_path_to_error::deserialize(Value::Object(patch)).map_err(|e| {
        let field = e.path().to_string();
        ApiError::invalid(
            if field == "." { "quota".into() } else { field },
            e.into_inner().to_string(),
        )
    })
}

/// `POST /quotas`: SetQuota. A WorkspaceAdmin tightens its projects'
/// quotas, a PlatformAdmin also tenants' and editions'; a value that would
/// loosen the parent's limit is refused with the field, the value and the
/// bound.
pub async fn set_quota(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::CapacityAdmin)?;
    let result = async {
        let scope = QuotaScope::parse(fields.need("scope")?)?;
        let patch = quota_patch(&fields)?;
        console
            .state
            .capacity
            .set_quota(scope.clone(), patch, &console.principal().actor())
            .await?;
        Ok::<_, ApiError>(format!(
            "quota of {} saved; it applies to the next lease",
            source_words(&scope)
        ))
    }
    .await;
    Ok(console.done("/quotas", result))
}

// ---- leases -----------------------------------------------------------------

#[derive(Template)]
#[template(path = "console/leases.html")]
struct LeasesPage {
    l: Layout,
    live: LeasesLive,
}

/// The part of the leases page that updates live.
#[derive(Template)]
#[template(path = "console/leases_live.html")]
pub struct LeasesLive {
    l: LiveCsrf,
    t: Table,
}

/// The CSRF token of a live fragment's forms.
pub struct LiveCsrf {
    csrf: String,
}

fn lease_row(v: &LeaseView) -> Vec<Cell> {
    let l = &v.lease;
    let holder = match l.attempt_id {
        Some(a) => Cell::link(
            format!("{} {}", l.holder_kind.as_str(), super::short(&l.holder_id)),
            format!("/attempts/{a}"),
        ),
        None => Cell::text(format!("{} {}", l.holder_kind.as_str(), l.holder_id)),
    };
    let why = match (&v.limit, &l.reason) {
        (Some(limit), _) => limit.to_string(),
        (None, Some(r)) => r.clone(),
        _ => String::new(),
    };
    vec![
        Cell::code(l.lease_id.to_string()),
        holder,
        Cell::text(l.project_id.as_str()),
        Cell::text(&l.pool_id),
        Cell::State(format!("{:?}", l.state)),
        Cell::Num(l.cpu.as_f64(), l.cpu.to_string()),
        Cell::Num(l.memory_gb.as_f64(), l.memory_gb.to_string()),
        Cell::text(v.queue_position.map(|p| p.to_string()).unwrap_or_default()),
        Cell::text(why),
        Cell::text(super::when(&l.requested_at)),
        Cell::time_opt(&l.expires_at),
    ]
}

/// Builds the live part of the leases page.
pub async fn leases_live(console: &Console, q: &ListQuery) -> Result<LeasesLive, PageError> {
    let scope = console.scope()?;
    let mut filter = LeaseFilter::default();
    if let Some(s) = q.get("state")
        && let Some(state) = crate::domain::capacity::LeaseState::parse(s)
    {
        filter.states.push(state);
    }
    filter.pool_id = q.get("pool").map(str::to_string);
    let leases = console
        .state
        .capacity
        .leases(Some(&scope), &filter, 5000)
        .await?;
    let pools = console
        .state
        .capacity
        .pools()
        .into_iter()
        .filter(|s| visible(console, &s.pool))
        .map(|s| s.pool.pool_id)
        .collect();
    let states = [
        "Requested",
        "Granted",
        "Active",
        "Released",
        "Expired",
        "Denied",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let t = q.table(
        "leases",
        "/leases",
        &[
            "Lease",
            "Holder",
            "Project",
            "Pool",
            "State",
            "CPU",
            "GB",
            "Queue",
            "Why",
            "Requested",
            "Expires",
        ],
        leases.iter().map(lease_row).collect(),
        vec![
            q.filter("state", "state", states),
            q.filter("pool", "pool", pools),
        ],
        "No leases match.",
    );
    Ok(LeasesLive {
        l: LiveCsrf {
            csrf: console.session.csrf.clone(),
        },
        t,
    })
}

/// `GET /leases`: who uses what, who waits and why.
pub async fn leases(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::CapacityRead)?;
    let q = ListQuery::parse(&raw);
    let live = leases_live(&console, &q).await?;
    render(&LeasesPage {
        l: console.layout("Leases", "/leases"),
        live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_path_spans_the_box_and_clamps() {
        let path = history_path(&[0.0, 1.0, 4.0], 2.0);
        assert_eq!(path, "M0,60 L0.0,60.0 L500.0,31.0 L1000.0,2.0 L1000,60 Z");
    }

    #[test]
    fn a_limit_that_is_not_a_finite_number_is_refused_not_inherited() {
        for text in ["NaN", "inf", "-inf", "1e400", "five"] {
            let fields = Fields(vec![("cpuPerAttempt".into(), text.into())]);
            let e = quota_patch(&fields).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("cpuPerAttempt"), "{text}");
        }
        let fields = Fields(vec![("cpuPerAttempt".into(), "inherit".into())]);
        assert!(quota_patch(&fields).is_ok());
    }
}

#[derive(Template)]
#[template(path = "console/usage.html")]
struct UsagePage {
    l: Layout,
    report: crate::capacity::ledger::UsageReport,
    by: crate::capacity::ledger::Grouping,
    project: String,
    agent: String,
    csv_link: String,
}

/// The usage question of a console request: the same fields as
/// `GET /factory/usage`, groupings as checkboxes.
fn usage_query(
    console: &Console,
    q: &ListQuery,
) -> Result<crate::capacity::ledger::UsageQuery, PageError> {
    let by: Vec<&str> = crate::capacity::ledger::Grouping::NAMES
        .into_iter()
        .filter(|name| q.get(&format!("by-{name}")).is_some())
        .collect();
    Ok(crate::capacity::ledger::UsageQuery::parse(
        q.get("from"),
        q.get("to"),
        &by.join(","),
        q.get("projectId"),
        q.get("agentId"),
        console.state.clock.now().date_naive(),
    )
    .map_err(ApiError::from)?)
}

/// `GET /usage`: the tenant's model tokens, day by day (or by project,
/// agent, release), from the ledger, with a CSV export of the same rows.
pub async fn usage(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let query = usage_query(&console, &q)?;
    let report = console
        .state
        .capacity
        .token_usage(&scope, &query)
        .map_err(ApiError::from)?;
    let csv_link = format!(
        "/usage.csv?{}",
        raw.0.as_deref().unwrap_or_default().replace('"', "")
    );
    render(&UsagePage {
        l: console.layout("Usage", "/usage"),
        by: query.by,
        project: q.get("projectId").unwrap_or_default().to_string(),
        agent: q.get("agentId").unwrap_or_default().to_string(),
        report,
        csv_link,
    })
}

/// `GET /usage.csv`: the rows of the usage page as CSV.
pub async fn usage_csv(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let query = usage_query(&console, &q)?;
    let report = console
        .state
        .capacity
        .token_usage(&scope, &query)
        .map_err(ApiError::from)?;
    Ok(crate::api::capacity::usage_csv(&report, query.by))
}
