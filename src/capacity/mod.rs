//! Execution capacity: the ExecutionCapacityService of the specification.
//!
//! [`Capacity`] is the service the API and the attempt engine call. It owns
//! one [`grain::PoolGrain`] per pool (exact per-pool accounting), the quota
//! [`book::Book`] (exact per-tenant and per-project usage), the tenant and
//! project registry that stands in for the commercial and residency
//! services, and placement: which pool may serve a request.
//!
//! Crash safety: pools, quotas, leases and waiting requests are in the
//! store; at start the book is rebuilt from the live leases and each grain
//! checks its pool's counters against its leases, logging and repairing any
//! difference. The AccountingReconciler repeats that check periodically.

pub mod book;
pub mod grain;
pub mod holders;
pub mod host;
pub mod ledger;
pub mod records;
pub mod workers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use self::book::Book;
use self::grain::{
    AcquireOutcome, GrainHandle, Mode, Msg, PoolGrain, PoolSnapshot, PoolStatus, Shared,
};
use self::holders::{Claim, HolderKey, Holders};
use self::records::{ExecutionMinutes, RunSlot, TENANT_RECORD};
use crate::clock::SharedClock;
use crate::config::CapacityConfig;
use crate::domain::access::Actor;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::amount::Amount;
use crate::domain::capacity::quota::quota_changed;
use crate::domain::capacity::{
    CapacityLease, EffectiveLimits, HostBudget, HostFit, LeaseRequest, LeaseState, Limit, PoolKind,
    PoolSpec, PoolState, Quota, QuotaLimits, QuotaPatch, QuotaScope, SecurityBoundary, SlotSize,
    Usage, WorkerPool, placement, token_quota,
};
use crate::domain::events::NewEvent;
use crate::domain::ids::new_id;
use crate::domain::tenant::{Project, Tenant, TenantSpec};
use crate::domain::{DomainError, FieldError, ProjectId, TenantId};
use crate::store::{Store, StoreError, Tx};

/// A lease with what the queue knows of it.
#[derive(Clone, Debug)]
pub struct LeaseView {
    /// The lease.
    pub lease: CapacityLease,
    /// 1-based position in its pool's queue while it waits.
    pub queue_position: Option<usize>,
    /// Why it waits (or was denied), structured.
    pub limit: Option<Limit>,
}

/// Errors of the capacity service.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CapacityError {
    /// A rule of the domain, or bad input.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The lease was denied; the limit says why.
    #[error("{limit}")]
    Denied {
        /// The denied lease.
        lease: Box<LeaseView>,
        /// Why.
        limit: Limit,
    },
    /// The store could not make the change durable, or the service stops.
    #[error("{0}")]
    Unavailable(String),
    /// Internal: the grain asked does not hold that lease (any more).
    #[error("the lease is not held by this pool")]
    NotHere,
}

impl From<FieldError> for CapacityError {
    fn from(e: FieldError) -> Self {
        CapacityError::Domain(e.into())
    }
}

impl From<StoreError> for CapacityError {
    fn from(e: StoreError) -> Self {
        CapacityError::Unavailable(e.to_string())
    }
}

/// An AcquireLease call.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// What is asked for.
    pub request: LeaseRequest,
    /// A specific pool, or any eligible one.
    pub pool_id: Option<String>,
    /// Queue if it cannot be granted now (else deny at once).
    pub wait: bool,
    /// How long this call waits for the grant before answering with the
    /// queued lease.
    pub wait_for: Duration,
}

/// Which leases a listing returns.
#[derive(Clone, Debug, Default)]
pub struct LeaseFilter {
    /// Only this holder id.
    pub holder_id: Option<String>,
    /// Only this pool.
    pub pool_id: Option<String>,
    /// Only these states.
    pub states: Vec<LeaseState>,
    /// Only this project.
    pub project_id: Option<ProjectId>,
    /// Only leases older than this one (the paging cursor: the last lease
    /// of the previous page).
    pub before: Option<Uuid>,
}

impl LeaseFilter {
    fn admits(
        &self,
        holder_id: &str,
        pool_id: &str,
        state: LeaseState,
        project: &ProjectId,
    ) -> bool {
        self.holder_id.as_ref().is_none_or(|h| h == holder_id)
            && self.pool_id.as_ref().is_none_or(|p| p == pool_id)
            && (self.states.is_empty() || self.states.contains(&state))
            && self.project_id.as_ref().is_none_or(|p| p == project)
    }
}

/// A page of a tenant's leases, newest first: through the state index when
/// the filter names states (several states merge a page of each), else the
/// lease table itself; pool, holder and project are row filters.
fn tenant_leases(
    store: &Store,
    scope: &TenantScope,
    filter: &LeaseFilter,
    limit: usize,
) -> Result<Vec<CapacityLease>, StoreError> {
    let before = filter.before.map(|id| id.to_string());
    let keep = |l: &CapacityLease| filter.admits(&l.holder_id, &l.pool_id, l.state, &l.project_id);
    if filter.states.len() > 1 {
        let mut all = Vec::new();
        for st in &filter.states {
            let value = st.to_string();
            all.extend(store.page(
                scope,
                Some((records::index::STATE, &value)),
                before.as_deref(),
                limit,
                keep,
            )?);
        }
        all.sort_by_key(|l| std::cmp::Reverse(l.lease_id));
        all.truncate(limit);
        return Ok(all);
    }
    let state = filter.states.first().map(ToString::to_string);
    store.page(
        scope,
        state.as_deref().map(|v| (records::index::STATE, v)),
        before.as_deref(),
        limit,
        keep,
    )
}

/// Effective quotas of a tenant or a project, with their levels.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaSet {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project, for a project's quotas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<ProjectId>,
    /// The id of the quota set at this level, if one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_id: Option<Uuid>,
    /// What this level sets itself.
    pub own: QuotaLimits,
    /// Who set this level last (absent while it sets nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    /// When.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_at: Option<DateTime<Utc>>,
    /// What applies, each with the level it comes from.
    pub effective: EffectiveLimits,
    /// Leases holding capacity now and minutes used today.
    pub usage: UsageView,
}

/// Usage, for views.
#[derive(Clone, Copy, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    /// Run slots held by live runs: from the grant of a run's first lease
    /// to its end, whatever it waits for (a delegated child run counts in
    /// its top-level run's slot).
    pub concurrent_runs: u32,
    /// Sandbox and browser-session leases holding capacity.
    pub concurrent_sandboxes: u32,
    /// CPU held by leases now: an attempt waiting for a human, a child
    /// run or a renewal gives its back after
    /// `runtime.return_capacity_after_seconds`.
    pub cpu_in_use: Amount,
    /// Memory held by leases now, GB.
    pub memory_gb_in_use: Amount,
    /// Lease minutes used today (UTC): time leases held CPU and memory,
    /// not time a run held only its run slot.
    pub execution_minutes_today: u64,
    /// Model tokens (input and output) charged today (UTC).
    pub tokens_today: u64,
}

impl From<Usage> for UsageView {
    fn from(u: Usage) -> Self {
        UsageView {
            concurrent_runs: u.runs,
            concurrent_sandboxes: u.sandboxes,
            cpu_in_use: u.cpu,
            memory_gb_in_use: u.memory_gb,
            execution_minutes_today: u.seconds_today / 60,
            tokens_today: u.tokens_today,
        }
    }
}

/// A tenant's quotas: edition, tenant and every project.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantQuotas {
    /// The tenant's edition.
    pub edition: String,
    /// What the edition sets.
    pub edition_limits: QuotaLimits,
    /// Who set the edition's limits: `configuration` for the configured
    /// defaults, else the PlatformAdmin who changed them.
    pub edition_set_by: String,
    /// When, for a change made through the API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edition_set_at: Option<DateTime<Utc>>,
    /// The tenant level.
    pub tenant: QuotaSet,
    /// Each registered project.
    pub projects: Vec<QuotaSet>,
}

/// The capacity service.
pub struct Capacity {
    shared: Arc<Shared>,
    profiles: BTreeMap<String, SlotSize>,
    max_wait: Duration,
    /// What the pools of this host may promise (`None`: the host's
    /// resources could not be read).
    budget: Option<HostBudget>,
    /// This host's region: its pools count against it.
    local_region: String,
    /// Serialises registry and quota changes: they validate against the
    /// book and then write, and two of them interleaving could each validate
    /// against a state the other is replacing.
    admin: tokio::sync::Mutex<()>,
}

const DEFAULTS_CREATED: &str = "capacity.defaults_created";

fn slot_of(profiles: &BTreeMap<String, SlotSize>, name: &str) -> Result<SlotSize, DomainError> {
    profiles.get(name).copied().ok_or_else(|| {
        FieldError::new(
            "nodeProfile",
            format!(
                "unknown node profile {name:?}; configured profiles: {}",
                profiles.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
        .into()
    })
}

impl Capacity {
    /// Loads everything from the store, repairs what needs repair and
    /// starts one grain per pool.
    pub async fn start(
        store: Store,
        clock: SharedClock,
        config: &CapacityConfig,
        nudge_autoscaler: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Arc<Capacity>, StoreError> {
        let now = clock.now();
        let profiles: BTreeMap<String, SlotSize> = config
            .node_profiles
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    SlotSize {
                        cpu: Amount::parse("cpu", p.cpu).unwrap_or(Amount::ZERO),
                        memory_gb: Amount::parse("memoryGb", p.memory_gb).unwrap_or(Amount::ZERO),
                    },
                )
            })
            .collect();
        let mut book = Book::new(&config.edition_defaults, now);
        let platform = PlatformScope::internal();

        ensure_platform_tenant(&store, &book.edition_names(), now).await?;
        let budget = host::probe().map(|host| HostBudget {
            host,
            reserve_cpu: config.reserve_cpu,
            reserve_memory_gb: config.reserve_memory_gb,
            cpu_overcommit: config.cpu_overcommit,
        });
        if config.default_pools {
            create_default_pools(&store, &profiles, &config.default_region, budget, now).await?;
        }

        let (tenants, projects, quotas, pools, leases, minutes, slots, tokens) = {
            let store = store.clone();
            let platform = platform.clone();
            // Configuration-sized tables whole; of the leases and minutes
            // only what is live: the leases not yet ended (their state
            // index) and today's minutes of each tenant.
            let today = now.date_naive().to_string();
            tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
                let tenants = store.scan_all::<Tenant>(&platform)?;
                let mut leases = Vec::new();
                let mut minutes = Vec::new();
                let mut tokens = Vec::new();
                for t in &tenants {
                    let scope = TenantScope::new(t.tenant_id.clone());
                    leases.extend(records::live_leases(&store, &scope)?);
                    minutes.extend(store.get::<ExecutionMinutes>(&scope, &today)?);
                    tokens.extend(store.get::<ledger::TokenDay>(&scope, &today)?);
                }
                Ok((
                    tenants,
                    store.scan_all::<Project>(&platform)?,
                    store.scan_all::<Quota>(&platform)?,
                    store.scan_all::<WorkerPool>(&platform)?,
                    leases,
                    minutes,
                    records::recorded_slots(&store, &platform)?,
                    tokens,
                ))
            })
            .await
            .map_err(|e| StoreError::Backup(format!("loading capacity state: {e}")))??
        };
        for t in tenants {
            book.put_tenant(t);
        }
        for p in projects {
            book.put_project(p.tenant_id, p.project_id);
        }
        for q in quotas {
            book.put_quota(q);
        }
        let today = now.date_naive();
        for m in minutes.into_iter().filter(|m| m.day == today) {
            book.add_closed(&m.tenant_id, None, m.seconds);
            for (project, seconds) in &m.projects {
                book.add_closed(&m.tenant_id, Some(project), *seconds);
            }
        }
        for day in &tokens {
            for line in &day.lines {
                book.add_tokens(
                    &day.tenant_id,
                    &line.project_id,
                    day.day,
                    line.usage.total(),
                );
            }
        }
        let (slots, ended_slots) = slots;
        for slot in &slots {
            book.take_slot(slot.run_id, &slot.tenant_id, &slot.project_id);
        }
        let mut by_pool: HashMap<String, Vec<CapacityLease>> = HashMap::new();
        let mut holders = Holders::default();
        let mut unrecorded = Vec::new();
        for lease in leases.into_iter().filter(|l| !l.state.is_terminal()) {
            if lease.state.holds_capacity()
                && let Some(run) = book.reserve(&lease)
            {
                // A lease granted before run slots were recorded: its run
                // holds the slot from now on.
                unrecorded.push(RunSlot {
                    tenant_id: lease.tenant_id.clone(),
                    project_id: lease.project_id.clone(),
                    run_id: run,
                    lease_id: lease.lease_id,
                    taken_at: now,
                });
            }
            holders.note(&lease);
            by_pool
                .entry(lease.pool_id.clone())
                .or_default()
                .push(lease);
        }
        if !unrecorded.is_empty() || !ended_slots.is_empty() {
            store
                .transact(move |tx: &mut Tx| {
                    for slot in &unrecorded {
                        tx.put(&TenantScope::new(slot.tenant_id.clone()), slot)?;
                    }
                    for slot in &ended_slots {
                        tx.delete::<RunSlot>(
                            &TenantScope::new(slot.tenant_id.clone()),
                            &slot.run_id.to_string(),
                        )?;
                    }
                    Ok::<_, StoreError>(())
                })
                .await?;
        }
        let shared = Arc::new(Shared {
            store,
            clock,
            book: Mutex::new(book),
            grains: RwLock::new(HashMap::new()),
            holders: Mutex::new(holders),
            ttl_seconds: std::sync::atomic::AtomicI64::new(config.lease_ttl_seconds as i64),
            max_pass_over: config.max_pass_over,
            nudge_autoscaler,
        });
        for pool in pools {
            let leases = by_pool.remove(&pool.pool_id).unwrap_or_default();
            let id = pool.pool_id.clone();
            let handle = PoolGrain::spawn(pool, leases, shared.clone());
            shared.grains.write().insert(id, handle);
        }
        for (pool, leases) in by_pool {
            tracing::error!(%pool, leases = leases.len(), "leases refer to a pool that does not exist; they are left as they are");
        }
        Ok(Arc::new(Capacity {
            shared,
            profiles,
            max_wait: Duration::from_secs(config.max_wait_seconds),
            budget,
            local_region: config.default_region.clone(),
            admin: tokio::sync::Mutex::new(()),
        }))
    }

    /// How the pools fit the host they run on (those of its region), with
    /// warnings when they promise more than it has; `None` when the host's
    /// resources could not be read.
    pub fn host_fit(&self) -> Option<HostFit> {
        let pools = self.pools();
        self.budget
            .map(|b| b.fit(pools.iter().map(|p| &p.pool), &self.local_region))
    }

    fn store(&self) -> &Store {
        &self.shared.store
    }

    /// A tenant's model tokens by day (or project, agent, release), from
    /// the ledger's day records: GetUsage and the usage pages.
    pub fn token_usage(
        &self,
        scope: &TenantScope,
        query: &ledger::UsageQuery,
    ) -> Result<ledger::UsageReport, DomainError> {
        Ok(ledger::usage(self.store(), scope, query)?)
    }

    /// Every tenant's leases that held capacity at some point since
    /// `start`: the live ones and those that ended since (the pools page's
    /// history).
    pub fn recent_spans(&self, start: DateTime<Utc>) -> Result<Vec<CapacityLease>, DomainError> {
        Ok(records::recent_spans(self.store(), start)?)
    }

    fn now(&self) -> chrono::DateTime<Utc> {
        self.shared.clock.now()
    }

    fn grain(&self, pool_id: &str) -> Option<GrainHandle> {
        self.shared.grains.read().get(pool_id).cloned()
    }

    async fn ask<T>(
        &self,
        pool_id: &str,
        msg: impl FnOnce(oneshot::Sender<T>) -> Msg,
    ) -> Result<T, CapacityError> {
        let grain = self
            .grain(pool_id)
            .ok_or_else(|| DomainError::not_found("pool", pool_id))?;
        let (tx, rx) = oneshot::channel();
        grain
            .tx
            .send(msg(tx))
            .map_err(|_| CapacityError::Unavailable(format!("pool {pool_id} is not running")))?;
        rx.await
            .map_err(|_| CapacityError::Unavailable(format!("pool {pool_id} stopped answering")))
    }

    /// Edition names.
    pub fn editions(&self) -> Vec<String> {
        self.shared.book.lock().edition_names()
    }

    /// Node profile names and slot sizes.
    pub fn node_profiles(&self) -> &BTreeMap<String, SlotSize> {
        &self.profiles
    }

    // ---- tenants and projects -------------------------------------------

    /// A registered tenant.
    pub fn tenant(&self, id: &TenantId) -> Option<Tenant> {
        self.shared.book.lock().tenant(id).cloned()
    }

    /// Every registered tenant.
    pub fn tenants(&self) -> Vec<Tenant> {
        let mut all: Vec<Tenant> = self.shared.book.lock().tenants().cloned().collect();
        all.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
        all
    }

    /// Projects of a tenant.
    pub fn projects(&self, tenant: &TenantScope) -> Result<Vec<Project>, DomainError> {
        Ok(self.store().list(tenant)?)
    }

    /// Registers or changes a tenant.
    pub async fn put_tenant(
        &self,
        tenant_id: TenantId,
        spec: TenantSpec,
    ) -> Result<Tenant, CapacityError> {
        let _serial = self.admin.lock().await;
        let now = self.now();
        let (existing, editions) = {
            let book = self.shared.book.lock();
            (book.tenant(&tenant_id).cloned(), book.edition_names())
        };
        let (tenant, event) =
            Tenant::put(existing.as_ref(), tenant_id.clone(), spec, &editions, now)?;
        let mut events = vec![event];
        let edition_changed = existing
            .as_ref()
            .is_none_or(|e| e.edition != tenant.edition);
        let stored = tenant.clone();
        // The effective quotas follow the edition: say so when it changed.
        if edition_changed && existing.is_some() {
            let book = self.shared.book.lock();
            if let Some(limits) = book.edition(&tenant.edition) {
                let scope = QuotaScope::Edition {
                    edition: tenant.edition.clone(),
                };
                let mut effective = EffectiveLimits::resolve(&[(&scope, &limits)]);
                if let Some(q) = book.quota(&QuotaScope::Tenant {
                    tenant_id: tenant_id.clone(),
                }) {
                    effective = effective.tighten(&q.limits, &q.scope);
                }
                let quota_id = book
                    .quota(&QuotaScope::Tenant {
                        tenant_id: tenant_id.clone(),
                    })
                    .map_or(Uuid::nil(), |q| q.quota_id);
                events.push(quota_changed(quota_id, &tenant_id, None, &effective, now));
            }
        }
        self.store()
            .transact(move |tx: &mut Tx| {
                tx.put(&TenantScope::new(stored.tenant_id.clone()), &stored)?;
                tx.emit_all(events)
            })
            .await?;
        let to_wake = {
            let mut book = self.shared.book.lock();
            book.put_tenant(tenant.clone());
            book.blocked_pools(Some(&tenant_id))
        };
        self.shared.wake(&to_wake, "");
        tracing::info!(tenant = %tenant.tenant_id, edition = %tenant.edition, "tenant registered");
        Ok(tenant)
    }

    /// Registers or renames a project of a registered tenant.
    pub async fn put_project(
        &self,
        tenant_id: TenantId,
        project_id: ProjectId,
        display_name: Option<String>,
    ) -> Result<Project, CapacityError> {
        let _serial = self.admin.lock().await;
        if self.tenant(&tenant_id).is_none() {
            return Err(DomainError::not_found("tenant", &tenant_id).into());
        }
        let scope = TenantScope::new(tenant_id.clone());
        let existing: Option<Project> = self.store().get(&scope, project_id.as_str())?;
        let (project, event) = Project::put(
            existing.as_ref(),
            tenant_id.clone(),
            project_id.clone(),
            display_name,
            self.now(),
        )?;
        let stored = project.clone();
        self.store()
            .transact(move |tx: &mut Tx| {
                tx.put(&scope, &stored)?;
                tx.emit(event)
            })
            .await?;
        self.shared.book.lock().put_project(tenant_id, project_id);
        Ok(project)
    }

    // ---- pools ------------------------------------------------------------

    /// Every pool, as of its last change.
    pub fn pools(&self) -> Vec<PoolStatus> {
        let mut all: Vec<PoolStatus> = self
            .shared
            .grains
            .read()
            .values()
            .map(|g| g.status.read().clone())
            .collect();
        all.sort_by(|a, b| a.pool.pool_id.cmp(&b.pool.pool_id));
        all
    }

    /// One pool, as of its last change.
    pub fn pool(&self, pool_id: &str) -> Option<PoolStatus> {
        self.grain(pool_id).map(|g| g.status.read().clone())
    }

    /// `SetWorkerPool`: creates a pool or changes it through its grain.
    pub async fn set_pool(
        &self,
        pool_id: &str,
        spec: PoolSpec,
    ) -> Result<WorkerPool, CapacityError> {
        let _serial = self.admin.lock().await;
        let slot = slot_of(&self.profiles, &spec.node_profile)?;
        let owner = spec.tenant_id.clone().unwrap_or_else(TenantId::platform);
        if self.tenant(&owner).is_none() {
            return Err(
                FieldError::new("tenantId", format!("tenant {owner} is not registered")).into(),
            );
        }
        if self.grain(pool_id).is_some() {
            let result = self
                .ask(pool_id, |reply| Msg::Update {
                    spec,
                    slot,
                    origin: crate::acting::current(),
                    reply,
                })
                .await?;
            return result;
        }
        let now = self.now();
        let (mut pool, events) = WorkerPool::set(None, pool_id, spec, slot, now)?;
        let pool = self
            .store()
            .transact(move |tx: &mut Tx| {
                tx.save(&TenantScope::new(pool.tenant_id.clone()), &mut pool)?;
                tx.emit_all(events)?;
                let change =
                    crate::domain::audit::Change::new(&pool.tenant_id, "pool.set", &pool.pool_id)
                        .after(pool.settings());
                tx.audit(now, change)?;
                Ok::<_, StoreError>(pool)
            })
            .await?;
        let handle = PoolGrain::spawn(pool.clone(), Vec::new(), self.shared.clone());
        self.shared
            .grains
            .write()
            .insert(pool_id.to_string(), handle);
        tracing::info!(pool = %pool_id, kind = pool.kind.as_str(), "pool created");
        // Requests waiting elsewhere on quotas are not affected; new ones will
        // consider this pool.
        Ok(pool)
    }

    /// A consistent picture of one pool: counters, leases and queue.
    pub async fn snapshot(&self, pool_id: &str) -> Result<PoolSnapshot, CapacityError> {
        self.ask(pool_id, |reply| Msg::Snapshot { reply }).await
    }

    /// Snapshots of every pool.
    pub async fn snapshots(&self) -> Vec<PoolSnapshot> {
        let ids: Vec<String> = self.shared.grains.read().keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            if let Ok(s) = self.snapshot(&id).await {
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.pool.pool_id.cmp(&b.pool.pool_id));
        out
    }

    /// The queue gauges at `now`: lease requests waiting per pool and
    /// limiting reason, and how long the oldest of them has waited.
    pub async fn queue_gauges(&self, now: DateTime<Utc>) -> Vec<crate::telemetry::Gauge> {
        use crate::telemetry::{Gauge, names};
        let mut depth = Gauge::new(
            names::QUEUE_DEPTH,
            "Lease requests waiting in a pool's queue, by the limit that holds them",
        );
        let mut oldest = Gauge::new(
            names::QUEUE_OLDEST_WAIT,
            "Seconds the oldest waiting lease request has waited, by pool and limit",
        );
        for snapshot in self.snapshots().await {
            let mut by_limit: BTreeMap<&'static str, (u32, DateTime<Utc>)> = BTreeMap::new();
            for waiter in &snapshot.queue {
                let limit = waiter.limit.as_ref().map_or("pool", Limit::label);
                let e = by_limit
                    .entry(limit)
                    .or_insert((0, waiter.lease.requested_at));
                e.0 += 1;
                e.1 = e.1.min(waiter.lease.requested_at);
            }
            for (limit, (n, since)) in by_limit {
                let labels = [("pool", snapshot.pool.pool_id.as_str()), ("limit", limit)];
                depth.set(&labels, f64::from(n));
                oldest.set(
                    &labels,
                    (now - since).num_milliseconds().max(0) as f64 / 1000.0,
                );
            }
        }
        vec![depth, oldest]
    }

    // ---- quotas -----------------------------------------------------------

    /// `SetQuota`: sets an edition's defaults or a tenant's limits
    /// (PlatformAdmins), or tightens a project's (its tenant's
    /// administrators); see [`QuotaScope::check_authority`].
    pub async fn set_quota(
        &self,
        scope: QuotaScope,
        patch: QuotaPatch,
        actor: &Actor,
    ) -> Result<Quota, CapacityError> {
        scope.check_authority(actor)?;
        let by = actor.name.as_str();
        let _serial = self.admin.lock().await;
        let now = self.now();
        let (existing, parent, affected) = {
            let book = self.shared.book.lock();
            match &scope {
                QuotaScope::Edition { edition } if book.edition(edition).is_none() => {
                    return Err(FieldError::new(
                        "scope",
                        format!(
                            "unknown edition {edition:?}; editions are declared in capacity.edition_defaults ({})",
                            book.edition_names().join(", ")
                        ),
                    )
                    .into());
                }
                QuotaScope::Tenant { tenant_id } if book.tenant(tenant_id).is_none() => {
                    return Err(DomainError::not_found("tenant", tenant_id).into());
                }
                QuotaScope::Project {
                    tenant_id,
                    project_id,
                } if !book.has_project(tenant_id, project_id) => {
                    return Err(DomainError::not_found(
                        "project",
                        format!("{tenant_id}/{project_id}"),
                    )
                    .into());
                }
                _ => {}
            }
            let affected: Vec<TenantId> = match &scope {
                QuotaScope::Edition { edition } => book
                    .tenants()
                    .filter(|t| t.edition == *edition)
                    .map(|t| t.tenant_id.clone())
                    .collect(),
                other => vec![other.tenant()],
            };
            let existing = match &scope {
                // An edition without an override starts from its configured
                // defaults.
                QuotaScope::Edition { edition } => book.quota(&scope).cloned().or_else(|| {
                    book.edition(edition).map(|limits| Quota {
                        quota_id: new_id(),
                        scope: scope.clone(),
                        limits,
                        updated_by: "configuration".into(),
                        updated_at: now,
                    })
                }),
                _ => book.quota(&scope).cloned(),
            };
            (
                existing,
                book.parent_limits(&scope)
                    .unwrap_or_else(EffectiveLimits::unlimited),
                affected,
            )
        };
        let quota = Quota::set(existing.as_ref(), scope.clone(), &patch, &parent, by, now)?;
        // What the change does to each affected tenant (or the project).
        let events: Vec<NewEvent> = {
            let mut book = self.shared.book.lock();
            let mut probe = Vec::new();
            let previous = book.quota(&scope).cloned();
            book.put_quota(quota.clone());
            for tenant in &affected {
                match &scope {
                    QuotaScope::Project { project_id, .. } => {
                        if let Some(l) = book.limits(tenant, project_id) {
                            probe.push(quota_changed(
                                quota.quota_id,
                                tenant,
                                Some(project_id),
                                &l.1,
                                now,
                            ));
                        }
                    }
                    _ => {
                        if let Some(l) = book.tenant_limits(tenant) {
                            probe.push(quota_changed(quota.quota_id, tenant, None, &l, now));
                        }
                    }
                }
            }
            // Nothing is applied until it is durable.
            match previous {
                Some(p) => book.put_quota(p),
                None => book.remove_quota(&scope),
            }
            probe
        };
        let stored = quota.clone();
        let record_scope = TenantScope::new(scope.tenant());
        self.store()
            .transact(move |tx: &mut Tx| {
                tx.put(&record_scope, &stored)?;
                tx.emit_all(events)
            })
            .await?;
        let to_wake = {
            let mut book = self.shared.book.lock();
            book.put_quota(quota.clone());
            let mut pools = BTreeSet::new();
            for t in &affected {
                pools.extend(book.blocked_pools(Some(t)));
            }
            pools
        };
        self.shared.wake(&to_wake, "");
        tracing::info!(%scope, by, "quota set");
        Ok(quota)
    }

    /// Effective quotas of a tenant and its projects, with usage.
    pub fn quotas(&self, tenant: &TenantScope) -> Result<TenantQuotas, CapacityError> {
        let tenant_id = tenant.tenant().clone();
        let projects: Vec<Project> = self.store().list(tenant)?;
        let now = self.now();
        let mut book = self.shared.book.lock();
        book.roll(now);
        let record = book
            .tenant(&tenant_id)
            .cloned()
            .ok_or_else(|| DomainError::not_found("tenant", &tenant_id))?;
        let tenant_scope = QuotaScope::Tenant {
            tenant_id: tenant_id.clone(),
        };
        let tenant_quota = book.quota(&tenant_scope).cloned();
        let tenant_limits = book
            .tenant_limits(&tenant_id)
            .unwrap_or_else(EffectiveLimits::unlimited);
        let usage: HashMap<Option<ProjectId>, Usage> = book
            .usage_report(now)
            .into_iter()
            .filter(|(t, _, _)| *t == tenant_id)
            .map(|(_, p, u)| (p, u))
            .collect();
        let mut project_sets = Vec::new();
        for p in projects {
            let scope = QuotaScope::Project {
                tenant_id: tenant_id.clone(),
                project_id: p.project_id.clone(),
            };
            let quota = book.quota(&scope).cloned();
            let effective = book
                .limits(&tenant_id, &p.project_id)
                .map(|l| l.1.clone())
                .unwrap_or_else(EffectiveLimits::unlimited);
            project_sets.push(QuotaSet {
                tenant_id: tenant_id.clone(),
                project_id: Some(p.project_id.clone()),
                quota_id: quota.as_ref().map(|q| q.quota_id),
                set_by: quota.as_ref().map(|q| q.updated_by.clone()),
                set_at: quota.as_ref().map(|q| q.updated_at),
                own: quota.map(|q| q.limits).unwrap_or_default(),
                effective,
                usage: usage
                    .get(&Some(p.project_id))
                    .copied()
                    .unwrap_or_default()
                    .into(),
            });
        }
        let edition_quota = book
            .quota(&QuotaScope::Edition {
                edition: record.edition.clone(),
            })
            .cloned();
        Ok(TenantQuotas {
            edition_limits: book.edition(&record.edition).unwrap_or_default(),
            edition_set_by: edition_quota
                .as_ref()
                .map_or_else(|| "configuration".to_string(), |q| q.updated_by.clone()),
            edition_set_at: edition_quota.map(|q| q.updated_at),
            edition: record.edition,
            tenant: QuotaSet {
                tenant_id: tenant_id.clone(),
                project_id: None,
                quota_id: tenant_quota.as_ref().map(|q| q.quota_id),
                set_by: tenant_quota.as_ref().map(|q| q.updated_by.clone()),
                set_at: tenant_quota.as_ref().map(|q| q.updated_at),
                own: tenant_quota.map(|q| q.limits).unwrap_or_default(),
                effective: tenant_limits,
                usage: usage.get(&None).copied().unwrap_or_default().into(),
            },
            projects: project_sets,
        })
    }

    // ---- leases -----------------------------------------------------------

    fn validate(&self, request: &LeaseRequest) -> Result<Tenant, CapacityError> {
        let book = self.shared.book.lock();
        let tenant = book.tenant(&request.tenant_id).cloned().ok_or_else(|| {
            FieldError::new(
                "tenantId",
                format!("tenant {} is not registered", request.tenant_id),
            )
        })?;
        if !book.has_project(&request.tenant_id, &request.project_id) {
            return Err(DomainError::not_found("project", &request.project_id).into());
        }
        Ok(tenant)
    }

    /// `AcquireLease`: grants, queues or denies, naming the limit.
    pub async fn acquire(&self, acquire: AcquireRequest) -> Result<LeaseView, CapacityError> {
        let request = &acquire.request;
        let tenant = self.validate(request)?;
        let wait_for = acquire.wait_for.min(self.max_wait);
        let key: HolderKey = (
            request.tenant_id.clone(),
            request.holder_kind,
            request.holder_id.clone(),
        );

        // One live lease per holder: asking again is asking after it.
        let lease_id = new_id();
        let claim = self.shared.holders.lock().claim(&key, lease_id);
        match claim {
            Claim::New => {}
            Claim::InProgress => {
                return Err(DomainError::Aborted(format!(
                    "an AcquireLease for {} {} is already in progress",
                    request.holder_kind.as_str(),
                    request.holder_id
                ))
                .into());
            }
            Claim::Existing(existing_id, pool_id) => {
                let listen = acquire.wait && !wait_for.is_zero();
                return self
                    .follow(existing_id, &pool_id, Some(request), listen, wait_for)
                    .await;
            }
        }
        let outcome = self.place(&acquire, &tenant, lease_id, wait_for).await;
        if !matches!(outcome, Ok(ref v) if !v.lease.state.is_terminal()) {
            self.shared.holders.lock().unclaim(&key, lease_id);
        }
        outcome
    }

    async fn place(
        &self,
        acquire: &AcquireRequest,
        tenant: &Tenant,
        lease_id: Uuid,
        wait_for: Duration,
    ) -> Result<LeaseView, CapacityError> {
        let request = &acquire.request;
        let mut candidates: Vec<PoolStatus> = Vec::new();
        let mut refusals = Vec::new();
        let mut named_pool_seen = false;
        for status in self.pools() {
            if acquire
                .pool_id
                .as_ref()
                .is_some_and(|p| *p != status.pool.pool_id)
                || !status.pool.visible_to(&request.tenant_id)
            {
                continue;
            }
            named_pool_seen = true;
            match placement(request, tenant, &status.pool) {
                Ok(()) if status.pool.state == PoolState::Active => candidates.push(status),
                Ok(()) => refusals.push(format!(
                    "pool {} is {}",
                    status.pool.pool_id, status.pool.state
                )),
                Err(why) => refusals.push(why),
            }
        }
        if let Some(pool_id) = &acquire.pool_id
            && candidates.is_empty()
        {
            if !named_pool_seen {
                return Err(DomainError::not_found("pool", pool_id).into());
            }
            return Err(DomainError::FailedPrecondition(refusals.join("; ")).into());
        }
        if candidates.is_empty() {
            let kind = request.holder_kind.pool_kind();
            let of_kind = self
                .pools()
                .iter()
                .any(|s| s.pool.kind == kind && s.pool.visible_to(&request.tenant_id));
            let why = if of_kind {
                // Only the pools that could have served it are worth naming.
                let relevant: Vec<String> = refusals
                    .into_iter()
                    .filter(|r| !r.contains(" needs a "))
                    .collect();
                format!("no pool can serve this request: {}", relevant.join("; "))
            } else {
                format!("no {} pool exists", kind.as_str())
            };
            return Err(DomainError::FailedPrecondition(why).into());
        }
        // The tenant's own pools first, then the one with the most room.
        candidates.sort_by(|a, b| {
            let own = |s: &PoolStatus| s.pool.tenant_id != request.tenant_id;
            let free = |s: &PoolStatus| s.pool.capacity().cpu.saturating_sub(s.pool.granted_cpu);
            (own(a), std::cmp::Reverse(free(a)), &a.pool.pool_id).cmp(&(
                own(b),
                std::cmp::Reverse(free(b)),
                &b.pool.pool_id,
            ))
        });
        // Probe every candidate for room now; the first with room grants.
        let mut final_pool = None;
        if candidates.len() > 1 {
            for candidate in &candidates {
                let id = &candidate.pool.pool_id;
                let outcome = self
                    .ask(id, |reply| Msg::Acquire {
                        lease_id,
                        request: request.clone(),
                        mode: Mode::TryNow,
                        reply,
                    })
                    .await??;
                match outcome {
                    AcquireOutcome::Granted(view) => {
                        self.note_holder(&view);
                        return Ok(view);
                    }
                    AcquireOutcome::WouldWait(limit) => {
                        let never = matches!(limit, Limit::PoolTooSmall { .. });
                        if !never && final_pool.is_none() {
                            final_pool = Some(id.clone());
                        }
                        // A quota stops it in every pool alike.
                        if limit.quota_field().is_some() {
                            break;
                        }
                    }
                    AcquireOutcome::Queued(_) | AcquireOutcome::Denied(..) => {
                        return Err(CapacityError::Unavailable("a probe changed a queue".into()));
                    }
                }
            }
        }
        let pool_id = final_pool.unwrap_or_else(|| candidates[0].pool.pool_id.clone());
        let mode = if acquire.wait {
            Mode::Queue
        } else {
            Mode::NoWait
        };
        let outcome = self
            .ask(&pool_id, |reply| Msg::Acquire {
                lease_id,
                request: request.clone(),
                mode,
                reply,
            })
            .await??;
        match outcome {
            AcquireOutcome::Granted(view) => {
                self.note_holder(&view);
                Ok(view)
            }
            AcquireOutcome::Queued(view) => {
                self.note_holder(&view);
                if wait_for.is_zero() {
                    Ok(view)
                } else {
                    self.follow(
                        view.lease.lease_id,
                        &view.lease.pool_id,
                        None,
                        true,
                        wait_for,
                    )
                    .await
                }
            }
            AcquireOutcome::Denied(view, limit) => Err(CapacityError::Denied {
                lease: Box::new(view),
                limit,
            }),
            AcquireOutcome::WouldWait(limit) => Err(CapacityError::Unavailable(limit.to_string())),
        }
    }

    fn note_holder(&self, view: &LeaseView) {
        self.shared.holders.lock().note(&view.lease);
    }

    /// The state of an existing lease, waiting up to `wait_for` for a grant
    /// when it is queued.
    async fn follow(
        &self,
        lease_id: Uuid,
        pool_id: &str,
        asked: Option<&LeaseRequest>,
        listen: bool,
        wait_for: Duration,
    ) -> Result<LeaseView, CapacityError> {
        let current = self
            .ask(pool_id, |reply| Msg::Poll {
                lease_id,
                listen: false,
                reply,
            })
            .await?;
        // The lease can leave its pool between two polls (released,
        // expired, denied): the caller asks again.
        let ended = |e: CapacityError| match e {
            CapacityError::NotHere => DomainError::Aborted(format!(
                "lease {lease_id} ended while it was being looked up; ask again"
            ))
            .into(),
            e => e,
        };
        let view = current.map_err(ended)?;
        if let Some(asked) = asked
            && (asked.cpu != view.lease.cpu
                || asked.memory_gb != view.lease.memory_gb
                || asked.project_id != view.lease.project_id)
        {
            return Err(DomainError::FailedPrecondition(format!(
                "{} {} already holds lease {} (cpu {}, memoryGb {}, project {}); release it before asking for different capacity",
                view.lease.holder_kind.as_str(),
                view.lease.holder_id,
                view.lease.lease_id,
                view.lease.cpu,
                view.lease.memory_gb,
                view.lease.project_id
            ))
            .into());
        }
        if view.lease.state != LeaseState::Requested || !listen {
            return Ok(view);
        }
        let waited = tokio::time::timeout(
            wait_for,
            self.ask(pool_id, |reply| Msg::Poll {
                lease_id,
                listen: true,
                reply,
            }),
        )
        .await;
        match waited {
            Ok(Ok(Ok(view))) => {
                if view.lease.state == LeaseState::Denied {
                    let limit = view.limit.clone().unwrap_or(Limit::NoPool {
                        why: view.lease.reason.clone().unwrap_or_default(),
                    });
                    return Err(CapacityError::Denied {
                        lease: Box::new(view),
                        limit,
                    });
                }
                Ok(view)
            }
            Ok(Ok(Err(e))) | Ok(Err(e)) => Err(ended(e)),
            // Still waiting: the current position and reason.
            Err(_) => self
                .ask(pool_id, |reply| Msg::Poll {
                    lease_id,
                    listen: false,
                    reply,
                })
                .await?
                .map_err(ended),
        }
    }

    /// A lease of the scope's tenant, from the store.
    pub fn lease(
        &self,
        scope: &TenantScope,
        lease_id: Uuid,
    ) -> Result<CapacityLease, CapacityError> {
        self.store()
            .get::<CapacityLease>(scope, &lease_id.to_string())?
            .ok_or_else(|| DomainError::not_found("lease", lease_id).into())
    }

    /// `RenewLease`: heartbeat. Granted becomes Active on the first one.
    /// Renewing an ended lease says how it ended.
    pub async fn renew(
        &self,
        scope: &TenantScope,
        lease_id: Uuid,
    ) -> Result<LeaseView, CapacityError> {
        // A live lease goes straight to its pool; the store is read only for
        // one that ended (or was never here).
        let live = self.shared.holders.lock().pool_of(lease_id, scope.tenant());
        if let Some(pool) = live {
            match self
                .ask(&pool, |reply| Msg::Renew { lease_id, reply })
                .await?
            {
                Err(CapacityError::NotHere) => {}
                other => return other,
            }
        }
        let mut lease = self.lease(scope, lease_id)?;
        if !lease.state.is_terminal() {
            match self
                .ask(&lease.pool_id, |reply| Msg::Renew { lease_id, reply })
                .await?
            {
                Err(CapacityError::NotHere) => lease = self.lease(scope, lease_id)?,
                other => return other,
            }
        }
        // Ended: the state machine says why it cannot be renewed.
        let now = self.now();
        let ttl = self.shared.ttl();
        lease
            .renew(now, ttl)
            .map_err(|e| CapacityError::Domain(e.into()))?;
        Err(DomainError::FailedPrecondition(format!("lease {lease_id} cannot be renewed")).into())
    }

    /// Records on a live lease what binds the processes that run under it
    /// (`cgroup-v2`, `cgroup-v1`, `rlimit`).
    pub async fn bind(
        &self,
        scope: &TenantScope,
        lease_id: Uuid,
        mechanism: &str,
    ) -> Result<LeaseView, CapacityError> {
        let pool = match self.shared.holders.lock().pool_of(lease_id, scope.tenant()) {
            Some(pool) => pool,
            None => self.lease(scope, lease_id)?.pool_id,
        };
        let mechanism = mechanism.to_string();
        self.ask(&pool, |reply| Msg::Bind {
            lease_id,
            mechanism,
            reply,
        })
        .await?
    }

    /// Sets how long leases granted or renewed from now on last without
    /// renewal (a reload of `capacity.lease_ttl_seconds`).
    pub fn set_lease_ttl(&self, seconds: u64) {
        self.shared
            .ttl_seconds
            .store(seconds as i64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Replaces the configured edition defaults (a reload of
    /// `capacity.edition_defaults`): every tenant whose effective limits
    /// change gets a `QuotaChanged` event, and requests waiting on its
    /// quotas are looked at again. A PlatformAdmin's edition quota still
    /// wins over the configured defaults; leases already granted stay.
    pub async fn set_edition_defaults(
        &self,
        editions: &BTreeMap<String, crate::config::EditionLimits>,
    ) -> Result<(), CapacityError> {
        let _serial = self.admin.lock().await;
        let now = self.now();
        let (events, to_wake) = {
            let mut book = self.shared.book.lock();
            let changed = book.set_config_editions(editions)?;
            let mut events = Vec::new();
            let mut pools = BTreeSet::new();
            for tenant in &changed {
                if let Some(limits) = book.tenant_limits(tenant) {
                    events.push(quota_changed(new_id(), tenant, None, &limits, now));
                }
                pools.extend(book.blocked_pools(Some(tenant)));
            }
            (events, pools)
        };
        if !events.is_empty() {
            self.store()
                .transact(move |tx: &mut Tx| tx.emit_all(events))
                .await?;
        }
        self.shared.wake(&to_wake, "");
        tracing::info!("edition defaults reloaded");
        Ok(())
    }

    /// `ReleaseLease`: idempotent; releasing an ended lease returns it as is.
    pub async fn release(
        &self,
        scope: &TenantScope,
        lease_id: Uuid,
    ) -> Result<LeaseView, CapacityError> {
        let live = self.shared.holders.lock().pool_of(lease_id, scope.tenant());
        if let Some(pool) = live {
            match self
                .ask(&pool, |reply| Msg::Release { lease_id, reply })
                .await?
            {
                Err(CapacityError::NotHere) => {}
                other => return other,
            }
        }
        let lease = self.lease(scope, lease_id)?;
        if !lease.state.is_terminal() {
            match self
                .ask(&lease.pool_id, |reply| Msg::Release { lease_id, reply })
                .await?
            {
                Err(CapacityError::NotHere) => {}
                other => return other,
            }
        }
        Ok(LeaseView {
            lease: self.lease(scope, lease_id)?,
            queue_position: None,
            limit: None,
        })
    }

    /// Leases of a tenant (or of every tenant), newest first, with the
    /// queue position and current reason of those that wait.
    pub async fn leases(
        &self,
        scope: Option<&TenantScope>,
        filter: &LeaseFilter,
        limit: usize,
    ) -> Result<Vec<LeaseView>, CapacityError> {
        let store = self.store().clone();
        let scope_owned = scope.cloned();
        let filter_owned = filter.clone();
        let leases: Vec<CapacityLease> = tokio::task::spawn_blocking(move || {
            let filter = filter_owned;
            match scope_owned {
                Some(s) => tenant_leases(&store, &s, &filter, limit),
                None => {
                    // Every tenant's newest page, merged: tenants are few.
                    let mut all = Vec::new();
                    for t in store.scan_all::<Tenant>(&PlatformScope::internal())? {
                        let s = TenantScope::new(t.tenant_id);
                        all.extend(tenant_leases(&store, &s, &filter, limit)?);
                    }
                    all.sort_by_key(|l| std::cmp::Reverse(l.lease_id));
                    all.truncate(limit);
                    Ok(all)
                }
            }
        })
        .await
        .map_err(|e| CapacityError::Unavailable(e.to_string()))??;
        let waiting_pools: BTreeSet<String> = leases
            .iter()
            .filter(|l| l.state == LeaseState::Requested)
            .map(|l| l.pool_id.clone())
            .collect();
        let mut queue_info: HashMap<Uuid, LeaseView> = HashMap::new();
        for pool in waiting_pools {
            if let Ok(snapshot) = self.snapshot(&pool).await {
                for v in snapshot.queue {
                    queue_info.insert(v.lease.lease_id, v);
                }
            }
        }
        Ok(leases
            .into_iter()
            .map(|lease| match queue_info.remove(&lease.lease_id) {
                Some(live) => live,
                None => LeaseView {
                    lease,
                    queue_position: None,
                    limit: None,
                },
            })
            .collect())
    }

    // ---- workers ----------------------------------------------------------

    async fn each_grain<T>(&self, msg: impl Fn(oneshot::Sender<T>) -> Msg) -> Vec<(String, T)> {
        let ids: Vec<String> = self.shared.grains.read().keys().cloned().collect();
        // Every pool is asked at once and answers in its own time: a pool
        // whose mailbox is long (one tenant's traffic) delays no other
        // pool's pass, only the pass's end.
        let msg = &msg;
        futures::future::join_all(
            ids.into_iter()
                .map(|id| async move { self.ask(&id, msg).await.ok().map(|v| (id, v)) }),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// Why expiring leases waits now: the store's database does not
    /// answer, or answered again less than a lease's time to live ago, so
    /// a holder told to come back has not had a chance to renew.
    pub fn expiry_waits(&self) -> Option<String> {
        let ttl = self.shared.ttl().to_std().unwrap_or_default();
        self.store().reach().settling(ttl)
    }

    /// LeaseExpirer pass: expires leases whose heartbeat stopped, gives up
    /// unattended requests, and lets every queue drain (a new UTC day may
    /// have freed minutes). Returns how many ended.
    pub async fn expire_due(&self, now: chrono::DateTime<Utc>) -> usize {
        self.each_grain(|reply| Msg::Expire { now, reply })
            .await
            .into_iter()
            .map(|(_, n)| n)
            .sum()
    }

    /// Autoscaler pass: returns the pools that changed size.
    pub async fn autoscale(&self) -> Vec<(String, u32, u32)> {
        self.each_grain(|reply| Msg::Autoscale { reply })
            .await
            .into_iter()
            .filter_map(|(id, change)| change.map(|(from, to)| (id, from, to)))
            .collect()
    }

    /// Checks every pool's counters against its leases; returns the repairs.
    pub async fn reconcile(&self) -> Vec<(String, String)> {
        self.each_grain(|reply| Msg::Reconcile { reply })
            .await
            .into_iter()
            .filter_map(|(id, m)| m.map(|m| (id, m)))
            .collect()
    }

    /// Frees the run slot of `run_id` once its run has ended (idempotent;
    /// a child run holds no slot of its own). Queued requests waiting on
    /// `concurrentRuns` are woken.
    pub async fn end_run_slot(&self, scope: &TenantScope, run_id: Uuid) -> Result<(), StoreError> {
        let s = scope.clone();
        self.store()
            .transact(move |tx: &mut Tx| tx.delete::<RunSlot>(&s, &run_id.to_string()))
            .await?;
        let to_wake = self.shared.book.lock().end_slot(run_id);
        self.shared.wake(&to_wake, "");
        Ok(())
    }

    /// The accounting reconciler's pass over run slots: a slot whose run
    /// has ended (its end was written but the slot not freed, or a lease
    /// was granted to an attempt of a run that had just ended) is freed.
    /// Returns the runs whose slots it freed.
    pub async fn reconcile_slots(&self) -> Result<Vec<Uuid>, StoreError> {
        let held = self.shared.book.lock().run_slots();
        let mut freed = Vec::new();
        for (run_id, holder) in held {
            if records::slot_run_ended(self.store(), &holder.tenant, run_id)? {
                self.end_run_slot(&TenantScope::new(holder.tenant), run_id)
                    .await?;
                freed.push(run_id);
            }
        }
        Ok(freed)
    }

    /// The `tokensPerDay` quota that refuses a new model call of a
    /// project now, if one does.
    pub fn token_quota(&self, tenant: &TenantId, project: &ProjectId) -> Option<Limit> {
        let now = self.now();
        self.shared
            .book
            .lock()
            .with_context(tenant, project, None, now, token_quota)
            .flatten()
    }

    /// Mirrors a charge the ledger committed (see [`ledger::charge`]) in
    /// today's sums the `tokensPerDay` quota is checked against.
    pub fn tokens_charged(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        at: chrono::DateTime<Utc>,
        tokens: u64,
    ) {
        let mut book = self.shared.book.lock();
        book.roll(self.now());
        book.add_tokens(tenant, project, at.date_naive(), tokens);
    }

    /// Whether the run `run_id` holds a run slot now.
    pub fn holds_slot(&self, run_id: Uuid) -> bool {
        self.shared.book.lock().holds_slot(Some(run_id))
    }

    /// Run slots held by live runs now.
    pub fn slots_held(&self) -> usize {
        self.shared.book.lock().run_slots().len()
    }

    /// Usage per tenant and project, for the accounting view.
    pub fn usage(&self) -> Vec<(TenantId, Option<ProjectId>, Usage)> {
        let now = self.now();
        let mut book = self.shared.book.lock();
        book.roll(now);
        book.usage_report(now)
    }

    /// Effective limits of a tenant and a project.
    pub fn limits_of(
        &self,
        tenant: &TenantId,
        project: Option<&ProjectId>,
    ) -> Option<EffectiveLimits> {
        let mut book = self.shared.book.lock();
        match project {
            Some(p) => book.limits(tenant, p).map(|l| l.1.clone()),
            None => book.tenant_limits(tenant),
        }
    }
}

/// Registers the platform tenant if this store has none yet.
pub async fn ensure_platform_tenant(
    store: &Store,
    editions: &[String],
    now: chrono::DateTime<Utc>,
) -> Result<(), StoreError> {
    let scope = TenantScope::new(TenantId::platform());
    if store.get::<Tenant>(&scope, TENANT_RECORD)?.is_some() {
        return Ok(());
    }
    let (tenant, event) = Tenant::put(
        None,
        TenantId::platform(),
        TenantSpec {
            display_name: Some("Platform".into()),
            edition: "platform".into(),
            residency_regions: Vec::new(),
            retention: None,
        },
        editions,
        now,
    )
    .map_err(|e| StoreError::Backup(format!("registering the platform tenant: {e}")))?;
    store
        .transact(move |tx: &mut Tx| {
            if tx.get::<Tenant>(&scope, TENANT_RECORD)?.is_none() {
                tx.put(&scope, &tenant)?;
                tx.emit(event)?;
            }
            Ok::<_, StoreError>(())
        })
        .await
}

/// The shared pools of a first start, `agents` and `sandboxes`, sized from
/// the host ([`HostBudget::default_pool_slots`]), in slots of the `small`
/// node profile, else the smallest.
async fn create_default_pools(
    store: &Store,
    profiles: &BTreeMap<String, SlotSize>,
    region: &str,
    budget: Option<HostBudget>,
    now: chrono::DateTime<Utc>,
) -> Result<(), StoreError> {
    let Some((profile, slot)) = profiles
        .get_key_value("small")
        .or_else(|| {
            profiles
                .iter()
                .min_by_key(|(name, s)| (s.cpu, s.memory_gb, name.as_str()))
        })
        .map(|(k, v)| (k.clone(), *v))
    else {
        return Ok(());
    };
    let max_size = HostBudget::default_pool_slots(budget.as_ref(), slot);
    let mut made = Vec::new();
    for (id, kind) in [
        ("agents", PoolKind::AgentRuntime),
        ("sandboxes", PoolKind::Sandbox),
    ] {
        let spec = PoolSpec {
            tenant_id: None,
            kind,
            security_boundary: SecurityBoundary::Shared,
            region: region.to_string(),
            node_profile: profile.clone(),
            min_size: 1,
            max_size,
            internet_egress: false,
            autoscaling: None,
            state: None,
        };
        if let Ok(made_pool) = WorkerPool::set(None, id, spec, slot, now) {
            made.push(made_pool);
        }
    }
    store
        .transact(move |tx: &mut Tx| {
            if tx.meta_get(DEFAULTS_CREATED)?.is_some() {
                return Ok::<_, StoreError>(());
            }
            let scope = TenantScope::new(TenantId::platform());
            for (mut pool, events) in made {
                if tx.get::<WorkerPool>(&scope, &pool.pool_id)?.is_none() {
                    tx.save(&scope, &mut pool)?;
                    tx.emit_all(events)?;
                }
            }
            tx.meta_put(DEFAULTS_CREATED, now.to_rfc3339().as_bytes());
            Ok(())
        })
        .await
}
