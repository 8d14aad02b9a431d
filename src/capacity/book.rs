//! The quota book: what every pool needs to know about tenants, projects,
//! quotas and usage, in memory.
//!
//! Quotas span pools (a tenant's `concurrentRuns` counts its leases in every
//! pool), while each pool's accounting has one owner (its grain). The book
//! is the one place quota usage is counted: a grain takes its lock for the
//! length of one decision, checks quotas and its own bounds, and reserves
//! the usage before it lets go, so a grant is decided atomically against
//! both. The lock is never held across an await.
//!
//! The book is a mirror: tenants, projects and quotas are written to the
//! store first and then applied here; usage is rebuilt from the leases at
//! start.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use uuid::Uuid;

use crate::config::EditionLimits;
use crate::domain::amount::Amount;
use crate::domain::capacity::{
    CapacityLease, EffectiveLimits, HolderKind, Quota, QuotaContext, QuotaLimits, QuotaScope, Usage,
};
use crate::domain::tenant::Tenant;
use crate::domain::{FieldError, ProjectId, TenantId};
use crate::telemetry::names;

/// Running and closed lease time at one level, for the UTC day of the book.
#[derive(Clone, Copy, Debug, Default)]
struct Minutes {
    /// Seconds of leases that ended today.
    closed: u64,
    /// Leases holding capacity now.
    open: u32,
    /// Sum of their start times (clamped to today's midnight), in Unix
    /// seconds: `open × now − since_sum` is their time today.
    since_sum: i64,
}

impl Minutes {
    fn seconds(&self, now: DateTime<Utc>) -> u64 {
        let running = i64::from(self.open) * now.timestamp() - self.since_sum;
        self.closed + running.max(0) as u64
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    /// Run slots held.
    runs: u32,
    /// Sandbox and browser-session leases holding capacity.
    sandboxes: u32,
    /// CPU of the leases holding capacity.
    cpu: Amount,
    /// Memory of the leases holding capacity, GB.
    memory_gb: Amount,
}

impl Counts {
    fn add(&mut self, lease: &OpenLease) {
        if !lease.kind.counts_as_run() {
            self.sandboxes += 1;
        }
        self.cpu = self.cpu + lease.cpu;
        self.memory_gb = self.memory_gb + lease.memory_gb;
    }

    fn remove(&mut self, lease: &OpenLease) {
        if !lease.kind.counts_as_run() {
            self.sandboxes = self.sandboxes.saturating_sub(1);
        }
        self.cpu = self.cpu.saturating_sub(lease.cpu);
        self.memory_gb = self.memory_gb.saturating_sub(lease.memory_gb);
    }

    fn usage(&self, seconds_today: u64, tokens_today: u64) -> Usage {
        Usage {
            runs: self.runs,
            sandboxes: self.sandboxes,
            cpu: self.cpu,
            memory_gb: self.memory_gb,
            seconds_today,
            tokens_today,
        }
    }
}

struct OpenLease {
    tenant: TenantId,
    project: ProjectId,
    kind: HolderKind,
    since: i64,
    cpu: Amount,
    memory_gb: Amount,
    /// The run slot it took as its own (a run lease with no run slot).
    own_slot: bool,
}

/// Where a run slot is counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHolder {
    /// The tenant.
    pub tenant: TenantId,
    /// The project.
    pub project: ProjectId,
}

type ProjectKey = (TenantId, ProjectId);

/// Effective limits of a tenant and of one of its projects.
pub type Limits = Arc<(EffectiveLimits, EffectiveLimits)>;

/// The book. Guarded by one mutex in [`super::Capacity`].
pub struct Book {
    config_editions: BTreeMap<String, QuotaLimits>,
    edition_quotas: BTreeMap<String, Quota>,
    tenants: HashMap<TenantId, Tenant>,
    projects: HashSet<ProjectKey>,
    tenant_quotas: HashMap<TenantId, Quota>,
    project_quotas: HashMap<ProjectKey, Quota>,
    limits: HashMap<ProjectKey, Limits>,
    counts_tenant: HashMap<TenantId, Counts>,
    counts_project: HashMap<ProjectKey, Counts>,
    active_by_kind: HashMap<(TenantId, HolderKind), i64>,
    day: NaiveDate,
    minutes_tenant: HashMap<TenantId, Minutes>,
    minutes_project: HashMap<ProjectKey, Minutes>,
    /// Model tokens charged today (the ledger's day records mirrored).
    tokens_tenant: HashMap<TenantId, u64>,
    tokens_project: HashMap<ProjectKey, u64>,
    open: HashMap<Uuid, OpenLease>,
    /// Run slots held, by the run (or, for a run lease with no run slot,
    /// the lease) that holds each.
    slots: HashMap<Uuid, SlotHolder>,
    /// Pools that have requests waiting on a quota, by tenant: who to wake
    /// when that tenant's usage drops or its quotas change.
    quota_blocked: HashMap<TenantId, BTreeSet<String>>,
}

/// Converts configured edition limits.
pub fn edition_limits(config: &EditionLimits) -> QuotaLimits {
    let amount = |v: Option<f64>| v.and_then(|v| Amount::parse("edition", v).ok());
    QuotaLimits {
        concurrent_runs: config.concurrent_runs,
        concurrent_sandboxes: config.concurrent_sandboxes,
        cpu_per_attempt: amount(config.cpu_per_attempt),
        memory_gb_per_attempt: amount(config.memory_gb_per_attempt),
        execution_minutes_per_day: config.execution_minutes_per_day,
        tokens_per_day: config.tokens_per_day,
    }
}

fn midnight(day: NaiveDate) -> i64 {
    day.and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp()
}

impl Book {
    /// An empty book with the configured editions.
    pub fn new(editions: &BTreeMap<String, EditionLimits>, now: DateTime<Utc>) -> Book {
        Book {
            config_editions: editions
                .iter()
                .map(|(k, v)| (k.clone(), edition_limits(v)))
                .collect(),
            edition_quotas: BTreeMap::new(),
            tenants: HashMap::new(),
            projects: HashSet::new(),
            tenant_quotas: HashMap::new(),
            project_quotas: HashMap::new(),
            limits: HashMap::new(),
            counts_tenant: HashMap::new(),
            counts_project: HashMap::new(),
            active_by_kind: HashMap::new(),
            day: now.date_naive(),
            minutes_tenant: HashMap::new(),
            minutes_project: HashMap::new(),
            tokens_tenant: HashMap::new(),
            tokens_project: HashMap::new(),
            open: HashMap::new(),
            slots: HashMap::new(),
            quota_blocked: HashMap::new(),
        }
    }

    /// Replaces the configured edition defaults (a reload), and returns
    /// the tenants whose effective limits changed. An edition a tenant has
    /// cannot go away unless a PlatformAdmin's quota keeps it; then nothing
    /// changes.
    pub fn set_config_editions(
        &mut self,
        editions: &BTreeMap<String, EditionLimits>,
    ) -> Result<Vec<TenantId>, FieldError> {
        let mut orphaned: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for t in self.tenants.values() {
            if !editions.contains_key(&t.edition) && !self.edition_quotas.contains_key(&t.edition) {
                orphaned
                    .entry(t.edition.as_str())
                    .or_default()
                    .push(t.tenant_id.as_str());
            }
        }
        if let Some((edition, tenants)) = orphaned.into_iter().next() {
            return Err(FieldError::new(
                format!("capacity.edition_defaults.{edition}"),
                format!(
                    "cannot be removed: tenant(s) {} have this edition; give them another edition first",
                    tenants.join(", ")
                ),
            ));
        }
        let ids: Vec<TenantId> = self.tenants.keys().cloned().collect();
        let before: Vec<Option<EffectiveLimits>> =
            ids.iter().map(|t| self.tenant_limits(t)).collect();
        self.config_editions = editions
            .iter()
            .map(|(k, v)| (k.clone(), edition_limits(v)))
            .collect();
        self.limits.clear();
        Ok(ids
            .into_iter()
            .zip(before)
            .filter(|(t, before)| self.tenant_limits(t) != *before)
            .map(|(t, _)| t)
            .collect())
    }

    /// Edition names known to the appliance.
    pub fn edition_names(&self) -> Vec<String> {
        let mut names: BTreeSet<String> = self.config_editions.keys().cloned().collect();
        names.extend(self.edition_quotas.keys().cloned());
        names.into_iter().collect()
    }

    /// The limits an edition sets now: configured defaults, or the
    /// PlatformAdmin's override.
    pub fn edition(&self, name: &str) -> Option<QuotaLimits> {
        self.edition_quotas
            .get(name)
            .map(|q| q.limits.clone())
            .or_else(|| self.config_editions.get(name).cloned())
    }

    /// A registered tenant.
    pub fn tenant(&self, id: &TenantId) -> Option<&Tenant> {
        self.tenants.get(id)
    }

    /// Every registered tenant.
    pub fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }

    /// Whether the project is registered.
    pub fn has_project(&self, tenant: &TenantId, project: &ProjectId) -> bool {
        self.projects.contains(&(tenant.clone(), project.clone()))
    }

    /// The stored quota of a scope.
    pub fn quota(&self, scope: &QuotaScope) -> Option<&Quota> {
        match scope {
            QuotaScope::Edition { edition } => self.edition_quotas.get(edition),
            QuotaScope::Tenant { tenant_id } => self.tenant_quotas.get(tenant_id),
            QuotaScope::Project {
                tenant_id,
                project_id,
            } => self
                .project_quotas
                .get(&(tenant_id.clone(), project_id.clone())),
        }
    }

    /// Applies a stored tenant.
    pub fn put_tenant(&mut self, tenant: Tenant) {
        self.limits.retain(|(t, _), _| *t != tenant.tenant_id);
        self.tenants.insert(tenant.tenant_id.clone(), tenant);
    }

    /// Applies a stored project.
    pub fn put_project(&mut self, tenant: TenantId, project: ProjectId) {
        self.projects.insert((tenant, project));
    }

    /// Applies a stored quota.
    pub fn put_quota(&mut self, quota: Quota) {
        match &quota.scope {
            QuotaScope::Edition { edition } => {
                self.limits.clear();
                self.edition_quotas.insert(edition.clone(), quota);
            }
            QuotaScope::Tenant { tenant_id } => {
                self.limits.retain(|(t, _), _| t != tenant_id);
                self.tenant_quotas.insert(tenant_id.clone(), quota);
            }
            QuotaScope::Project {
                tenant_id,
                project_id,
            } => {
                let key = (tenant_id.clone(), project_id.clone());
                self.limits.remove(&key);
                self.project_quotas.insert(key, quota);
            }
        }
    }

    /// Forgets the quota of a scope (undoing a change that was not made
    /// durable).
    pub fn remove_quota(&mut self, scope: &QuotaScope) {
        match scope {
            QuotaScope::Edition { edition } => {
                self.limits.clear();
                self.edition_quotas.remove(edition);
            }
            QuotaScope::Tenant { tenant_id } => {
                self.limits.retain(|(t, _), _| t != tenant_id);
                self.tenant_quotas.remove(tenant_id);
            }
            QuotaScope::Project {
                tenant_id,
                project_id,
            } => {
                let key = (tenant_id.clone(), project_id.clone());
                self.limits.remove(&key);
                self.project_quotas.remove(&key);
            }
        }
    }

    /// The effective limits above a scope (what a `SetQuota` there may only
    /// tighten): unlimited for an edition.
    pub fn parent_limits(&self, scope: &QuotaScope) -> Option<EffectiveLimits> {
        match scope {
            QuotaScope::Edition { .. } => Some(EffectiveLimits::unlimited()),
            QuotaScope::Tenant { tenant_id } => {
                let tenant = self.tenants.get(tenant_id)?;
                let edition_scope = QuotaScope::Edition {
                    edition: tenant.edition.clone(),
                };
                let edition = self.edition(&tenant.edition).unwrap_or_default();
                Some(EffectiveLimits::resolve(&[(&edition_scope, &edition)]))
            }
            QuotaScope::Project { tenant_id, .. } => Some(self.tenant_limits(tenant_id)?),
        }
    }

    /// Effective limits of a tenant (edition + tenant).
    pub fn tenant_limits(&self, tenant_id: &TenantId) -> Option<EffectiveLimits> {
        let tenant = self.tenants.get(tenant_id)?;
        let edition_scope = QuotaScope::Edition {
            edition: tenant.edition.clone(),
        };
        let edition = self.edition(&tenant.edition).unwrap_or_default();
        let tenant_scope = QuotaScope::Tenant {
            tenant_id: tenant_id.clone(),
        };
        let mut levels: Vec<(&QuotaScope, &QuotaLimits)> = vec![(&edition_scope, &edition)];
        if let Some(q) = self.tenant_quotas.get(tenant_id) {
            levels.push((&tenant_scope, &q.limits));
        }
        Some(EffectiveLimits::resolve(&levels))
    }

    /// Effective limits of a tenant and one of its projects, cached until a
    /// quota, an edition or the tenant changes.
    pub fn limits(&mut self, tenant: &TenantId, project: &ProjectId) -> Option<Limits> {
        let key = (tenant.clone(), project.clone());
        if let Some(l) = self.limits.get(&key) {
            return Some(l.clone());
        }
        let tenant_limits = self.tenant_limits(tenant)?;
        let project_limits = match self.project_quotas.get(&key) {
            Some(q) => tenant_limits.clone().tighten(&q.limits, &q.scope),
            None => tenant_limits.clone(),
        };
        let limits = Arc::new((tenant_limits, project_limits));
        self.limits.insert(key, limits.clone());
        Some(limits)
    }

    /// Moves the book to the UTC day of `now`: yesterday's closed minutes
    /// are no longer today's, and running leases count from midnight.
    pub fn roll(&mut self, now: DateTime<Utc>) {
        let today = now.date_naive();
        if today <= self.day {
            return;
        }
        self.day = today;
        let start = midnight(today);
        self.minutes_tenant.clear();
        self.minutes_project.clear();
        self.tokens_tenant.clear();
        self.tokens_project.clear();
        for lease in self.open.values_mut() {
            lease.since = lease.since.max(start);
            let since = lease.since;
            let m = self.minutes_tenant.entry(lease.tenant.clone()).or_default();
            m.open += 1;
            m.since_sum += since;
            let m = self
                .minutes_project
                .entry((lease.tenant.clone(), lease.project.clone()))
                .or_default();
            m.open += 1;
            m.since_sum += since;
        }
    }

    /// The UTC day of the book.
    pub fn day(&self) -> NaiveDate {
        self.day
    }

    /// Usage of a tenant and one of its projects at `now`.
    pub fn usage(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        now: DateTime<Utc>,
    ) -> (Usage, Usage) {
        let key = (tenant.clone(), project.clone());
        let usage = |counts: Option<&Counts>, minutes: Option<&Minutes>, tokens: Option<&u64>| {
            counts.copied().unwrap_or_default().usage(
                minutes.map_or(0, |m| m.seconds(now)),
                tokens.copied().unwrap_or_default(),
            )
        };
        (
            usage(
                self.counts_tenant.get(tenant),
                self.minutes_tenant.get(tenant),
                self.tokens_tenant.get(tenant),
            ),
            usage(
                self.counts_project.get(&key),
                self.minutes_project.get(&key),
                self.tokens_project.get(&key),
            ),
        )
    }

    /// Whether `slot` (a run, see [`LeaseRequest::run_slot`]) holds a run
    /// slot.
    ///
    /// [`LeaseRequest::run_slot`]: crate::domain::capacity::LeaseRequest::run_slot
    pub fn holds_slot(&self, slot: Option<Uuid>) -> bool {
        slot.is_some_and(|s| self.slots.contains_key(&s))
    }

    /// Counts a run slot held by `run` (found in the store at start, or
    /// taken by a grant). Returns whether it was not counted yet.
    pub fn take_slot(&mut self, run: Uuid, tenant: &TenantId, project: &ProjectId) -> bool {
        if self.slots.contains_key(&run) {
            return false;
        }
        self.slots.insert(
            run,
            SlotHolder {
                tenant: tenant.clone(),
                project: project.clone(),
            },
        );
        self.counts_tenant.entry(tenant.clone()).or_default().runs += 1;
        self.counts_project
            .entry((tenant.clone(), project.clone()))
            .or_default()
            .runs += 1;
        true
    }

    /// Frees the run slot of `run`. Returns the pools waiting on this
    /// tenant's quotas, to wake (none when it held no slot).
    pub fn end_slot(&mut self, run: Uuid) -> BTreeSet<String> {
        let Some(holder) = self.slots.remove(&run) else {
            return BTreeSet::new();
        };
        if let Some(c) = self.counts_tenant.get_mut(&holder.tenant) {
            c.runs = c.runs.saturating_sub(1);
        }
        if let Some(c) = self
            .counts_project
            .get_mut(&(holder.tenant.clone(), holder.project.clone()))
        {
            c.runs = c.runs.saturating_sub(1);
        }
        self.quota_blocked
            .get(&holder.tenant)
            .cloned()
            .unwrap_or_default()
    }

    /// The run slots held by runs (not by run leases of their own).
    pub fn run_slots(&self) -> Vec<(Uuid, SlotHolder)> {
        self.slots
            .iter()
            .filter(|(id, _)| !self.open.get(id).is_some_and(|o| o.own_slot))
            .map(|(id, h)| (*id, h.clone()))
            .collect()
    }

    /// Runs `f` with the quota context of a request, or `None` when the
    /// tenant is not registered.
    pub fn with_context<R>(
        &mut self,
        tenant: &TenantId,
        project: &ProjectId,
        slot: Option<Uuid>,
        now: DateTime<Utc>,
        f: impl FnOnce(&QuotaContext<'_>) -> R,
    ) -> Option<R> {
        self.roll(now);
        let limits = self.limits(tenant, project)?;
        let (tenant_usage, project_usage) = self.usage(tenant, project, now);
        let holds_slot = self.holds_slot(slot);
        Some(f(&QuotaContext {
            holds_slot,
            tenant,
            project,
            tenant_limits: &limits.0,
            project_limits: &limits.1,
            tenant_usage,
            project_usage,
        }))
    }

    /// Counts a lease that holds capacity (granted now, or found at start).
    /// A run lease counts in its run slot, taken now if its run holds
    /// none; returns the run whose slot it took, for the store.
    pub fn reserve(&mut self, lease: &CapacityLease) -> Option<Uuid> {
        if self.open.contains_key(&lease.lease_id) {
            return None;
        }
        let key = (lease.tenant_id.clone(), lease.project_id.clone());
        let since = lease
            .granted_at
            .map_or(self.day_start(), |t| t.timestamp())
            .max(self.day_start());
        let own_slot = lease.holder_kind.counts_as_run() && lease.run_slot.is_none();
        let open = OpenLease {
            tenant: lease.tenant_id.clone(),
            project: lease.project_id.clone(),
            kind: lease.holder_kind,
            since,
            cpu: lease.cpu,
            memory_gb: lease.memory_gb,
            own_slot,
        };
        self.counts_tenant
            .entry(lease.tenant_id.clone())
            .or_default()
            .add(&open);
        self.counts_project
            .entry(key.clone())
            .or_default()
            .add(&open);
        let m = self
            .minutes_tenant
            .entry(lease.tenant_id.clone())
            .or_default();
        m.open += 1;
        m.since_sum += since;
        let m = self.minutes_project.entry(key).or_default();
        m.open += 1;
        m.since_sum += since;
        self.open.insert(lease.lease_id, open);
        self.gauge(&lease.tenant_id, lease.holder_kind, 1);
        if own_slot {
            self.take_slot(lease.lease_id, &lease.tenant_id, &lease.project_id);
            None
        } else {
            lease.run_slot.filter(|run| {
                lease.holder_kind.counts_as_run()
                    && self.take_slot(*run, &lease.tenant_id, &lease.project_id)
            })
        }
    }

    fn day_start(&self) -> i64 {
        midnight(self.day)
    }

    /// Stops counting a lease that ended at `ended`. Returns the pools
    /// waiting on this tenant's quotas, to wake.
    pub fn free(&mut self, lease: &CapacityLease, ended: DateTime<Utc>) -> BTreeSet<String> {
        self.roll(ended);
        let Some(open) = self.open.remove(&lease.lease_id) else {
            return BTreeSet::new();
        };
        let key = (open.tenant.clone(), open.project.clone());
        if let Some(c) = self.counts_tenant.get_mut(&open.tenant) {
            c.remove(&open);
        }
        if let Some(c) = self.counts_project.get_mut(&key) {
            c.remove(&open);
        }
        if open.own_slot {
            self.end_slot(lease.lease_id);
        }
        let today = (ended.timestamp() - open.since).max(0) as u64;
        let m = self.minutes_tenant.entry(open.tenant.clone()).or_default();
        m.open = m.open.saturating_sub(1);
        m.since_sum -= open.since;
        m.closed += today;
        let m = self.minutes_project.entry(key).or_default();
        m.open = m.open.saturating_sub(1);
        m.since_sum -= open.since;
        m.closed += today;
        self.gauge(&open.tenant, open.kind, -1);
        self.quota_blocked
            .get(&open.tenant)
            .cloned()
            .unwrap_or_default()
    }

    /// Counts model tokens charged on `day` (at start, from the ledger's
    /// day records; then as each call's usage is charged). Another day's
    /// tokens are not today's.
    pub fn add_tokens(
        &mut self,
        tenant: &TenantId,
        project: &ProjectId,
        day: NaiveDate,
        tokens: u64,
    ) {
        if day != self.day {
            return;
        }
        *self.tokens_tenant.entry(tenant.clone()).or_default() += tokens;
        *self
            .tokens_project
            .entry((tenant.clone(), project.clone()))
            .or_default() += tokens;
    }

    /// Adds closed seconds recorded in the store for today (at start).
    pub fn add_closed(&mut self, tenant: &TenantId, project: Option<&ProjectId>, seconds: u64) {
        match project {
            Some(p) => {
                self.minutes_project
                    .entry((tenant.clone(), p.clone()))
                    .or_default()
                    .closed += seconds;
            }
            None => {
                self.minutes_tenant
                    .entry(tenant.clone())
                    .or_default()
                    .closed += seconds
            }
        }
    }

    fn gauge(&mut self, tenant: &TenantId, kind: HolderKind, delta: i64) {
        let n = self
            .active_by_kind
            .entry((tenant.clone(), kind))
            .or_default();
        *n += delta;
        metrics::gauge!(names::LEASES_ACTIVE, "tenant" => tenant.to_string(), "holderKind" => kind.as_str())
            .set(*n as f64);
    }

    /// Records which tenants have requests in `pool` waiting on a quota.
    pub fn set_quota_blocked(&mut self, pool: &str, tenants: &BTreeSet<TenantId>) {
        for (tenant, pools) in self.quota_blocked.iter_mut() {
            if !tenants.contains(tenant) {
                pools.remove(pool);
            }
        }
        for tenant in tenants {
            self.quota_blocked
                .entry(tenant.clone())
                .or_default()
                .insert(pool.to_string());
        }
        self.quota_blocked.retain(|_, pools| !pools.is_empty());
    }

    /// Pools with requests waiting on a quota of `tenant`, or of any tenant
    /// when `None`.
    pub fn blocked_pools(&self, tenant: Option<&TenantId>) -> BTreeSet<String> {
        match tenant {
            Some(t) => self.quota_blocked.get(t).cloned().unwrap_or_default(),
            None => self.quota_blocked.values().flatten().cloned().collect(),
        }
    }

    /// Usage per tenant and project, for the accounting view.
    pub fn usage_report(&self, now: DateTime<Utc>) -> Vec<(TenantId, Option<ProjectId>, Usage)> {
        let mut out = Vec::new();
        let tenants: BTreeSet<&TenantId> = self
            .counts_tenant
            .keys()
            .chain(self.tokens_tenant.keys())
            .collect();
        for tenant in tenants {
            let c = self.counts_tenant.get(tenant).copied().unwrap_or_default();
            let seconds = self
                .minutes_tenant
                .get(tenant)
                .map_or(0, |m| m.seconds(now));
            let tokens = self.tokens_tenant.get(tenant).copied().unwrap_or_default();
            out.push((tenant.clone(), None, c.usage(seconds, tokens)));
        }
        let projects: BTreeSet<&ProjectKey> = self
            .counts_project
            .keys()
            .chain(self.tokens_project.keys())
            .collect();
        for key in projects {
            let c = self.counts_project.get(key).copied().unwrap_or_default();
            let seconds = self.minutes_project.get(key).map_or(0, |m| m.seconds(now));
            let tokens = self.tokens_project.get(key).copied().unwrap_or_default();
            out.push((key.0.clone(), Some(key.1.clone()), c.usage(seconds, tokens)));
        }
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

/// Splits `[from, to)` into whole seconds per UTC day.
pub fn seconds_by_day(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<(NaiveDate, u64)> {
    let mut out = Vec::new();
    let mut start = from;
    while start < to {
        let day = start.date_naive();
        let next = day
            .succ_opt()
            .expect("a next day")
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc();
        let end = to.min(next);
        out.push((day, (end - start).num_seconds().max(0) as u64));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_time_is_split_at_utc_midnight() {
        let from = DateTime::parse_from_rfc3339("2026-03-01T23:50:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let to = DateTime::parse_from_rfc3339("2026-03-02T00:20:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let days = seconds_by_day(from, to);
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].1, 600);
        assert_eq!(days[1].1, 1200);
        assert!(seconds_by_day(to, to).is_empty());
        // Sub-second ends terminate too.
        let odd = to + chrono::Duration::milliseconds(1500);
        assert_eq!(seconds_by_day(to, odd), vec![(to.date_naive(), 1)]);
    }
}
