//! The grant decision: placement, quotas and pool bounds, and the reason.
//!
//! [`decide`] looks at one request, one pool and the quota situation of the
//! request's tenant and project, and answers Grant, Wait (it could fit
//! later) or Deny (it can never fit as things are configured). Every Wait
//! and Deny carries a [`Limit`] that says, in the specification's words,
//! which quota or bound stops it: the same text reaches the RPC error, the
//! QuotaExceeded event, the lease list and the console.

use std::fmt;

use crate::domain::amount::Amount;
use crate::domain::ids::{ProjectId, TenantId};
use crate::domain::tenant::Tenant;

use super::lease::{HolderKind, LeaseRequest};
use super::pool::{PoolState, SecurityBoundary, SlotSize, WorkerPool};
use super::quota::{Effective, EffectiveLimits, QuotaScope};

/// The level a quota limit is counted at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Level {
    /// All of a tenant's leases.
    Tenant(TenantId),
    /// One project's leases.
    Project(ProjectId),
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Tenant(t) => write!(f, "tenant {t}"),
            Level::Project(p) => write!(f, "project {p}"),
        }
    }
}

/// Which quota or bound stops a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Limit {
    /// `concurrentRuns` or `concurrentSandboxes` is used up.
    Concurrent {
        /// `concurrentRuns` or `concurrentSandboxes`.
        field: &'static str,
        /// Where it is counted.
        level: Level,
        /// Leases holding capacity now.
        in_use: u32,
        /// The limit.
        limit: u32,
        /// The level that set the limit, when not `level` itself.
        source: Option<QuotaScope>,
    },
    /// The request is larger than `cpuPerAttempt` or `memoryGbPerAttempt`.
    PerAttempt {
        /// `cpuPerAttempt` or `memoryGbPerAttempt`.
        field: &'static str,
        /// Where it applies.
        level: Level,
        /// What was asked.
        requested: Amount,
        /// The limit.
        limit: Amount,
    },
    /// `executionMinutesPerDay` is used up for the UTC day.
    Minutes {
        /// Where it is counted.
        level: Level,
        /// Minutes used today.
        used: u64,
        /// The limit.
        limit: u32,
    },
    /// The pool has no room now but could grow.
    PoolFull {
        /// The pool.
        pool_id: String,
        /// `cpu` or `memoryGb`.
        resource: &'static str,
        /// Granted now.
        taken: Amount,
        /// Held back for waiting requests passed over too often.
        held_back: Amount,
        /// Capacity at the current size.
        capacity: Amount,
        /// Asked.
        requested: Amount,
        /// Size now.
        current_size: u32,
        /// Upper bound.
        max_size: u32,
    },
    /// The pool is at its maximum size and full.
    PoolMaxSize {
        /// The pool.
        pool_id: String,
        /// Its maximum size.
        max_size: u32,
        /// `cpu` or `memoryGb`.
        resource: &'static str,
        /// Granted now.
        taken: Amount,
        /// Held back for waiting requests passed over too often.
        held_back: Amount,
        /// Capacity at the maximum size.
        capacity: Amount,
        /// Asked.
        requested: Amount,
    },
    /// Even the whole pool at its maximum size is too small.
    PoolTooSmall {
        /// The pool.
        pool_id: String,
        /// `cpu` or `memoryGb`.
        resource: &'static str,
        /// Asked.
        requested: Amount,
        /// Capacity at the maximum size.
        most: Amount,
    },
    /// `tokensPerDay` is used up for the UTC day: no new model call.
    Tokens {
        /// Where it is counted.
        level: Level,
        /// Tokens charged today.
        used: u64,
        /// The limit.
        limit: u64,
        /// The level that set the limit, when not `level` itself.
        source: Option<QuotaScope>,
    },
    /// The pool is not granting.
    PoolNotActive {
        /// The pool.
        pool_id: String,
        /// Its state.
        state: PoolState,
    },
    /// No pool can serve the request at all.
    NoPool {
        /// Why each candidate was rejected, or that there is none.
        why: String,
    },
}

impl Limit {
    /// The quota field, when a quota (not a pool) is the limit.
    pub fn quota_field(&self) -> Option<&'static str> {
        match self {
            Limit::Concurrent { field, .. } | Limit::PerAttempt { field, .. } => Some(field),
            Limit::Minutes { .. } => Some("executionMinutesPerDay"),
            Limit::Tokens { .. } => Some("tokensPerDay"),
            _ => None,
        }
    }

    /// Its name among a fixed set, for metric labels and alerts: the quota
    /// field, `pool` (the pool's capacity), `poolState` or `noPool`.
    pub fn label(&self) -> &'static str {
        match self {
            Limit::PoolFull { .. } | Limit::PoolMaxSize { .. } | Limit::PoolTooSmall { .. } => {
                "pool"
            }
            Limit::PoolNotActive { .. } => "poolState",
            Limit::NoPool { .. } => "noPool",
            other => other.quota_field().unwrap_or("other"),
        }
    }

    /// Whether the pool's own capacity (not a quota, not its state) is the
    /// limit: such waiters count as demand for the autoscaler and can starve.
    pub fn is_pool_capacity(&self) -> bool {
        matches!(self, Limit::PoolFull { .. } | Limit::PoolMaxSize { .. })
    }
}

fn held(amount: Amount) -> String {
    if amount == Amount::ZERO {
        String::new()
    } else {
        format!(", {amount} held back for a waiting request passed over too often")
    }
}

fn source_note(level: &Level, source: &Option<QuotaScope>) -> String {
    let same = match (level, source) {
        (Level::Tenant(t), Some(QuotaScope::Tenant { tenant_id })) => t == tenant_id,
        (Level::Project(p), Some(QuotaScope::Project { project_id, .. })) => p == project_id,
        (_, None) => true,
        _ => false,
    };
    match source {
        Some(s) if !same => format!(" (set by {s})"),
        _ => String::new(),
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Concurrent {
                field,
                level,
                in_use,
                limit,
                source,
            } => write!(
                f,
                "{field} of {level}: {in_use} in use, limit {limit}{}",
                source_note(level, source)
            ),
            Limit::PerAttempt {
                field,
                level,
                requested,
                limit,
            } => write!(
                f,
                "{field} of {level}: requested {requested}, limit {limit}"
            ),
            Limit::Minutes { level, used, limit } => {
                write!(
                    f,
                    "executionMinutesPerDay of {level}: {used} of {limit} used"
                )
            }
            Limit::PoolFull {
                pool_id,
                resource,
                taken,
                held_back,
                capacity,
                requested,
                current_size,
                max_size,
            } => write!(
                f,
                "pool {pool_id}: {resource} {taken} of {capacity} taken{}, requested {requested} (size {current_size} of maxSize {max_size}; waiting for capacity or a scale-up)",
                held(*held_back)
            ),
            Limit::PoolMaxSize {
                pool_id,
                max_size,
                resource,
                taken,
                held_back,
                capacity,
                requested,
            } => write!(
                f,
                "pool {pool_id}: maxSize {max_size} reached ({resource} {taken} of {capacity} taken{}, requested {requested})",
                held(*held_back)
            ),
            Limit::PoolTooSmall {
                pool_id,
                resource,
                requested,
                most,
            } => write!(
                f,
                "pool {pool_id}: requested {resource} {requested}, but the whole pool at maxSize offers {most}"
            ),
            Limit::Tokens {
                level,
                used,
                limit,
                source,
            } => write!(
                f,
                "tokensPerDay of {level}: {used} of {limit} used today (UTC){}",
                source_note(level, source)
            ),
            Limit::PoolNotActive { pool_id, state } => {
                write!(f, "pool {pool_id} is {state} and grants no leases")
            }
            Limit::NoPool { why } => f.write_str(why),
        }
    }
}

/// What the decision says.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Grant it now.
    Grant,
    /// It could fit later: queue it (or deny it if the caller won't wait).
    Wait(Limit),
    /// It can never fit as configured.
    Deny(Limit),
}

/// Run slots, leases holding capacity and minutes used, at one level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Run slots held: a run holds one from the grant of its first lease
    /// to its end, whatever it waits for; a delegated child run counts in
    /// its top-level run's slot.
    pub runs: u32,
    /// Sandbox and browser-session leases holding capacity.
    pub sandboxes: u32,
    /// CPU held by leases now (a waiting attempt gives its back).
    pub cpu: Amount,
    /// Memory held by leases now, GB.
    pub memory_gb: Amount,
    /// Lease seconds today (UTC), closed and running.
    pub seconds_today: u64,
    /// Model tokens (input and output) charged today (UTC).
    pub tokens_today: u64,
}

/// The quota situation of one request.
pub struct QuotaContext<'a> {
    /// Whether the request's run already holds a run slot (its run goes
    /// on after a wait, or a child run runs in its top-level run's slot):
    /// `concurrentRuns` is then not asked again.
    pub holds_slot: bool,
    /// The tenant.
    pub tenant: &'a TenantId,
    /// The project.
    pub project: &'a ProjectId,
    /// Effective limits at the tenant level (edition + tenant).
    pub tenant_limits: &'a EffectiveLimits,
    /// Effective limits at the project level (edition + tenant + project).
    pub project_limits: &'a EffectiveLimits,
    /// Usage of the whole tenant.
    pub tenant_usage: Usage,
    /// Usage of the project.
    pub project_usage: Usage,
}

/// Whether the project level sets something stricter than the tenant's.
fn project_binds<T: PartialEq>(project: &Effective<T>) -> bool {
    matches!(project.source, Some(QuotaScope::Project { .. }))
}

fn check_quota(request: &LeaseRequest, q: &QuotaContext<'_>) -> Result<(), Verdict> {
    let tenant = Level::Tenant(q.tenant.clone());
    let project = Level::Project(q.project.clone());
    // Per-attempt sizes: the tightest level applies; too big is never.
    for (field, requested, eff) in [
        (
            "cpuPerAttempt",
            request.cpu,
            &q.project_limits.cpu_per_attempt,
        ),
        (
            "memoryGbPerAttempt",
            request.memory_gb,
            &q.project_limits.memory_gb_per_attempt,
        ),
    ] {
        if let Some(limit) = eff.value
            && requested > limit
        {
            let level = if project_binds(eff) {
                project.clone()
            } else {
                tenant.clone()
            };
            return Err(Verdict::Deny(Limit::PerAttempt {
                field,
                level,
                requested,
                limit,
            }));
        }
    }
    // Concurrency, project first when it sets its own limit. A run that
    // holds its slot only asks for compute.
    let slot_held = request.holder_kind.counts_as_run() && q.holds_slot;
    let (field, tenant_eff, project_eff, tenant_used, project_used) =
        if request.holder_kind.counts_as_run() {
            (
                "concurrentRuns",
                &q.tenant_limits.concurrent_runs,
                &q.project_limits.concurrent_runs,
                q.tenant_usage.runs,
                q.project_usage.runs,
            )
        } else {
            (
                "concurrentSandboxes",
                &q.tenant_limits.concurrent_sandboxes,
                &q.project_limits.concurrent_sandboxes,
                q.tenant_usage.sandboxes,
                q.project_usage.sandboxes,
            )
        };
    let mut checks = Vec::new();
    if project_binds(project_eff) && !slot_held {
        checks.push((project.clone(), project_eff, project_used));
    }
    if !slot_held {
        checks.push((tenant.clone(), tenant_eff, tenant_used));
    }
    for (level, eff, used) in checks {
        if let Some(limit) = eff.value
            && used >= limit
        {
            let limit = Limit::Concurrent {
                field,
                level,
                in_use: used,
                limit,
                source: eff.source.clone(),
            };
            // A limit of zero allows nothing: waiting would be forever.
            return Err(if eff.value == Some(0) {
                Verdict::Deny(limit)
            } else {
                Verdict::Wait(limit)
            });
        }
    }
    // Minutes of the UTC day.
    let mut minute_checks = Vec::new();
    if project_binds(&q.project_limits.execution_minutes_per_day) {
        minute_checks.push((
            project,
            &q.project_limits.execution_minutes_per_day,
            q.project_usage.seconds_today,
        ));
    }
    minute_checks.push((
        tenant,
        &q.tenant_limits.execution_minutes_per_day,
        q.tenant_usage.seconds_today,
    ));
    for (level, eff, seconds) in minute_checks {
        if let Some(limit) = eff.value
            && seconds >= u64::from(limit) * 60
        {
            let limit_reason = Limit::Minutes {
                level,
                used: seconds / 60,
                limit,
            };
            return Err(if limit == 0 {
                Verdict::Deny(limit_reason)
            } else {
                Verdict::Wait(limit_reason)
            });
        }
    }
    Ok(())
}

/// Whether a new model call is refused by `tokensPerDay` (project first
/// when it sets its own limit): the tokens charged today have reached it.
pub fn token_quota(q: &QuotaContext<'_>) -> Option<Limit> {
    let mut checks = Vec::new();
    if project_binds(&q.project_limits.tokens_per_day) {
        checks.push((
            Level::Project(q.project.clone()),
            &q.project_limits.tokens_per_day,
            q.project_usage.tokens_today,
        ));
    }
    checks.push((
        Level::Tenant(q.tenant.clone()),
        &q.tenant_limits.tokens_per_day,
        q.tenant_usage.tokens_today,
    ));
    checks.into_iter().find_map(|(level, eff, used)| {
        let limit = eff.value?;
        (used >= limit).then(|| Limit::Tokens {
            level,
            used,
            limit,
            source: eff.source.clone(),
        })
    })
}

fn check_pool(
    request: &LeaseRequest,
    pool: &WorkerPool,
    held_back: SlotSize,
) -> Result<(), Verdict> {
    let most = pool.max_capacity();
    for (resource, requested, max) in [
        ("cpu", request.cpu, most.cpu),
        ("memoryGb", request.memory_gb, most.memory_gb),
    ] {
        if requested > max {
            return Err(Verdict::Deny(Limit::PoolTooSmall {
                pool_id: pool.pool_id.clone(),
                resource,
                requested,
                most: max,
            }));
        }
    }
    if pool.state != PoolState::Active {
        return Err(Verdict::Wait(Limit::PoolNotActive {
            pool_id: pool.pool_id.clone(),
            state: pool.state,
        }));
    }
    let capacity = pool.capacity();
    for (resource, requested, granted, reserved, cap, max) in [
        (
            "cpu",
            request.cpu,
            pool.granted_cpu,
            held_back.cpu,
            capacity.cpu,
            most.cpu,
        ),
        (
            "memoryGb",
            request.memory_gb,
            pool.granted_memory_gb,
            held_back.memory_gb,
            capacity.memory_gb,
            most.memory_gb,
        ),
    ] {
        if granted + reserved + requested > cap {
            let limit =
                if pool.current_size >= pool.max_size || granted + reserved + requested > max {
                    Limit::PoolMaxSize {
                        pool_id: pool.pool_id.clone(),
                        max_size: pool.max_size,
                        resource,
                        taken: granted,
                        held_back: reserved,
                        capacity: max,
                        requested,
                    }
                } else {
                    Limit::PoolFull {
                        pool_id: pool.pool_id.clone(),
                        resource,
                        taken: granted,
                        held_back: reserved,
                        capacity: cap,
                        requested,
                        current_size: pool.current_size,
                        max_size: pool.max_size,
                    }
                };
            return Err(Verdict::Wait(limit));
        }
    }
    Ok(())
}

/// Decides one request against one pool and its quotas. `held_back` is
/// capacity the pool keeps for requests that have been passed over too
/// often. Denials win over waits: what can never fit is said at once.
pub fn decide(
    request: &LeaseRequest,
    pool: &WorkerPool,
    held_back: SlotSize,
    quota: &QuotaContext<'_>,
) -> Verdict {
    let quota_result = check_quota(request, quota);
    let pool_result = check_pool(request, pool, held_back);
    match (quota_result, pool_result) {
        (Ok(()), Ok(())) => Verdict::Grant,
        (Err(deny @ Verdict::Deny(_)), _) | (_, Err(deny @ Verdict::Deny(_))) => deny,
        // While a quota blocks, the pool's room does not matter yet.
        (Err(wait), _) | (Ok(()), Err(wait)) => wait,
    }
}

/// Whether `pool` may serve `request` at all; the reason if not.
pub fn placement(request: &LeaseRequest, tenant: &Tenant, pool: &WorkerPool) -> Result<(), String> {
    let id = &pool.pool_id;
    let wanted = request.holder_kind.pool_kind();
    if pool.kind != wanted {
        return Err(format!(
            "pool {id} runs {}, a {} needs a {} pool",
            pool.kind.as_str(),
            request.holder_kind.as_str(),
            wanted.as_str()
        ));
    }
    if pool.security_boundary != SecurityBoundary::Shared && pool.tenant_id != request.tenant_id {
        return Err(format!(
            "pool {id} is {} to tenant {}",
            if pool.security_boundary == SecurityBoundary::TenantDedicated {
                "dedicated"
            } else {
                "hosted by and reserved"
            },
            pool.tenant_id
        ));
    }
    if !tenant.allows_region(&pool.region) {
        return Err(format!(
            "pool {id} is in region {}, outside the residency of tenant {} ({})",
            pool.region,
            tenant.tenant_id,
            tenant.residency_regions.join(", ")
        ));
    }
    let needs_internet =
        request.internet_egress || request.holder_kind == HolderKind::BrowserSession;
    if needs_internet && !pool.internet_egress {
        return Err(format!(
            "pool {id} ({}) allows no internet egress; sandboxes with internet egress and browser sessions run only in pools that allow it",
            pool.security_boundary.as_str()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::domain::capacity::pool::{PoolKind, PoolSpec};
    use crate::domain::capacity::quota::QuotaLimits;
    use crate::domain::tenant::TenantSpec;

    fn pool(max: u32) -> WorkerPool {
        let spec = PoolSpec {
            tenant_id: None,
            kind: PoolKind::AgentRuntime,
            security_boundary: SecurityBoundary::Shared,
            region: "local".into(),
            node_profile: "small".into(),
            min_size: 1,
            max_size: max,
            internet_egress: false,
            autoscaling: None,
            state: None,
        };
        let slot = SlotSize {
            cpu: Amount::units(2),
            memory_gb: Amount::units(4),
        };
        WorkerPool::set(None, "p", spec, slot, Utc::now())
            .unwrap()
            .0
    }

    fn request(cpu: u64, mem: u64) -> LeaseRequest {
        LeaseRequest {
            tenant_id: TenantId::parse("t").unwrap(),
            project_id: ProjectId::parse("web").unwrap(),
            run_id: None,
            attempt_id: None,
            run_slot: None,
            holder_kind: HolderKind::Attempt,
            holder_id: "a".into(),
            cpu: Amount::units(cpu),
            memory_gb: Amount::units(mem),
            internet_egress: false,
        }
    }

    struct Q {
        tenant: TenantId,
        project: ProjectId,
        tenant_limits: EffectiveLimits,
        project_limits: EffectiveLimits,
    }

    impl Q {
        fn new(edition: QuotaLimits, tenant: QuotaLimits, project: QuotaLimits) -> Q {
            let t = TenantId::parse("t").unwrap();
            let p = ProjectId::parse("web").unwrap();
            let e = QuotaScope::Edition {
                edition: "starter".into(),
            };
            let ts = QuotaScope::Tenant {
                tenant_id: t.clone(),
            };
            let ps = QuotaScope::Project {
                tenant_id: t.clone(),
                project_id: p.clone(),
            };
            Q {
                tenant_limits: EffectiveLimits::resolve(&[(&e, &edition), (&ts, &tenant)]),
                project_limits: EffectiveLimits::resolve(&[
                    (&e, &edition),
                    (&ts, &tenant),
                    (&ps, &project),
                ]),
                tenant: t,
                project: p,
            }
        }

        fn ctx(&self, tenant: Usage, project: Usage) -> QuotaContext<'_> {
            QuotaContext {
                holds_slot: false,
                tenant: &self.tenant,
                project: &self.project,
                tenant_limits: &self.tenant_limits,
                project_limits: &self.project_limits,
                tenant_usage: tenant,
                project_usage: project,
            }
        }
    }

    fn nothing() -> SlotSize {
        SlotSize {
            cpu: Amount::ZERO,
            memory_gb: Amount::ZERO,
        }
    }

    #[test]
    fn every_reason_reads_as_the_specification_writes_it() {
        let starter = QuotaLimits {
            concurrent_runs: Some(5),
            execution_minutes_per_day: Some(600),
            ..QuotaLimits::default()
        };
        let project = QuotaLimits {
            concurrent_runs: Some(5),
            ..QuotaLimits::default()
        };
        let tenant = QuotaLimits {
            memory_gb_per_attempt: Some(Amount::units(4)),
            ..QuotaLimits::default()
        };
        let q = Q::new(starter.clone(), tenant, project);
        let busy = Usage {
            runs: 5,
            ..Usage::default()
        };
        let Verdict::Wait(limit) = decide(&request(1, 1), &pool(8), nothing(), &q.ctx(busy, busy))
        else {
            panic!()
        };
        assert_eq!(
            limit.to_string(),
            "concurrentRuns of project web: 5 in use, limit 5"
        );
        assert_eq!(limit.quota_field(), Some("concurrentRuns"));

        let Verdict::Deny(limit) = decide(
            &request(1, 8),
            &pool(8),
            nothing(),
            &q.ctx(Usage::default(), Usage::default()),
        ) else {
            panic!()
        };
        assert_eq!(
            limit.to_string(),
            "memoryGbPerAttempt of tenant t: requested 8, limit 4"
        );

        let q = Q::new(starter, QuotaLimits::default(), QuotaLimits::default());
        let spent = Usage {
            seconds_today: 600 * 60,
            ..Usage::default()
        };
        let Verdict::Wait(limit) = decide(
            &request(1, 1),
            &pool(8),
            nothing(),
            &q.ctx(spent, Usage::default()),
        ) else {
            panic!()
        };
        assert_eq!(
            limit.to_string(),
            "executionMinutesPerDay of tenant t: 600 of 600 used"
        );

        let busy = Usage {
            runs: 5,
            ..Usage::default()
        };
        let Verdict::Wait(limit) = decide(
            &request(1, 1),
            &pool(8),
            nothing(),
            &q.ctx(busy, Usage::default()),
        ) else {
            panic!()
        };
        assert_eq!(
            limit.to_string(),
            "concurrentRuns of tenant t: 5 in use, limit 5 (set by edition starter)"
        );
    }

    #[test]
    fn pool_bounds_wait_or_deny() {
        let q = Q::new(
            QuotaLimits::default(),
            QuotaLimits::default(),
            QuotaLimits::default(),
        );
        let free = q.ctx(Usage::default(), Usage::default());
        // One 2-cpu slot now, eight at most.
        assert_eq!(
            decide(&request(2, 1), &pool(8), nothing(), &free),
            Verdict::Grant
        );
        let Verdict::Wait(limit) = decide(&request(3, 1), &pool(8), nothing(), &free) else {
            panic!()
        };
        assert!(limit.is_pool_capacity());
        assert!(
            limit
                .to_string()
                .starts_with("pool p: cpu 0 of 2 taken, requested 3"),
            "{limit}"
        );
        let mut full = pool(8);
        full.resize(8, Utc::now());
        full.take(Amount::units(16), Amount::units(1));
        let Verdict::Wait(limit) = decide(&request(1, 1), &full, nothing(), &free) else {
            panic!()
        };
        assert!(
            limit.to_string().starts_with("pool p: maxSize 8 reached"),
            "{limit}"
        );
        let Verdict::Deny(limit) = decide(&request(17, 1), &pool(8), nothing(), &free) else {
            panic!()
        };
        assert_eq!(
            limit.to_string(),
            "pool p: requested cpu 17, but the whole pool at maxSize offers 16"
        );
        // Held-back capacity counts as taken.
        let held = SlotSize {
            cpu: Amount::units(1),
            memory_gb: Amount::ZERO,
        };
        assert!(matches!(
            decide(&request(2, 1), &pool(8), held, &free),
            Verdict::Wait(_)
        ));
    }

    #[test]
    fn placement_keeps_boundaries_and_residency() {
        let editions = vec!["starter".to_string()];
        let (tenant, _) = Tenant::put(
            None,
            TenantId::parse("t").unwrap(),
            TenantSpec {
                edition: "starter".into(),
                residency_regions: vec!["eu-west".into()],
                ..TenantSpec::default()
            },
            &editions,
            Utc::now(),
        )
        .unwrap();
        let p = pool(8);
        let err = placement(&request(1, 1), &tenant, &p).unwrap_err();
        assert!(
            err.contains("outside the residency of tenant t (eu-west)"),
            "{err}"
        );
        let mut sandbox = request(1, 1);
        sandbox.holder_kind = HolderKind::Sandbox;
        assert!(
            placement(&sandbox, &tenant, &p)
                .unwrap_err()
                .contains("needs a sandbox pool")
        );
        let mut browser = request(1, 1);
        browser.holder_kind = HolderKind::BrowserSession;
        let mut bp = pool(8);
        bp.kind = PoolKind::BrowserSession;
        bp.region = "eu-west".into();
        assert!(
            placement(&browser, &tenant, &bp)
                .unwrap_err()
                .contains("no internet egress")
        );
    }
}

#[cfg(test)]
mod properties {
    use chrono::Utc;
    use proptest::prelude::*;

    use super::*;
    use crate::domain::capacity::pool::{PoolKind, PoolSpec};
    use crate::domain::capacity::quota::QuotaLimits;

    #[derive(Clone, Debug)]
    enum Step {
        Ask { cpu: u64, project: bool },
        Free(usize),
        Resize(u32),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u64..6, any::<bool>()).prop_map(|(cpu, project)| Step::Ask { cpu, project }),
            (0usize..50).prop_map(Step::Free),
            (0u32..6).prop_map(Step::Resize),
        ]
    }

    proptest! {
        /// Whatever happens, granting only on `Grant` never takes a pool
        /// past its capacity nor a tenant or project past its limit, and the
        /// counters equal the sum of what is held.
        #[test]
        fn grants_respect_every_bound(steps in proptest::collection::vec(step(), 1..80)) {
            let spec = PoolSpec {
                tenant_id: None,
                kind: PoolKind::AgentRuntime,
                security_boundary: SecurityBoundary::Shared,
                region: "local".into(),
                node_profile: "small".into(),
                min_size: 1,
                max_size: 4,
                internet_egress: false,
                autoscaling: None,
                state: None,
            };
            let slot = SlotSize { cpu: Amount::units(2), memory_gb: Amount::units(4) };
            let (mut pool, _) = WorkerPool::set(None, "p", spec, slot, Utc::now()).unwrap();
            let tenant = TenantId::parse("t").unwrap();
            let projects = [ProjectId::parse("a").unwrap(), ProjectId::parse("b").unwrap()];
            let e = QuotaScope::Edition { edition: "e".into() };
            let ts = QuotaScope::Tenant { tenant_id: tenant.clone() };
            let edition = QuotaLimits { concurrent_runs: Some(5), ..QuotaLimits::default() };
            let tenant_limits = EffectiveLimits::resolve(&[(&e, &edition)]);
            let project_quota = QuotaLimits { concurrent_runs: Some(2), ..QuotaLimits::default() };
            let ps = QuotaScope::Project { tenant_id: tenant.clone(), project_id: projects[0].clone() };
            let limits_a = EffectiveLimits::resolve(&[(&e, &edition), (&ts, &QuotaLimits::default()), (&ps, &project_quota)]);
            let mut held: Vec<(usize, Amount)> = Vec::new();
            for s in steps {
                match s {
                    Step::Ask { cpu, project } => {
                        let p = usize::from(project);
                        let request = LeaseRequest {
                            tenant_id: tenant.clone(),
                            project_id: projects[p].clone(),
                            run_id: None,
                            attempt_id: None,
                            run_slot: None,
                            holder_kind: HolderKind::Attempt,
                            holder_id: "h".into(),
                            cpu: Amount::units(cpu),
                            memory_gb: Amount::units(1),
                            internet_egress: false,
                        };
                        let count = |pr: Option<usize>| held.iter().filter(|(q, _)| pr.is_none_or(|x| x == *q)).count() as u32;
                        let ctx = QuotaContext {
                            holds_slot: false,
                            tenant: &tenant,
                            project: &projects[p],
                            tenant_limits: &tenant_limits,
                            project_limits: if p == 0 { &limits_a } else { &tenant_limits },
                            tenant_usage: Usage { runs: count(None), ..Usage::default() },
                            project_usage: Usage { runs: count(Some(p)), ..Usage::default() },
                        };
                        let none = SlotSize { cpu: Amount::ZERO, memory_gb: Amount::ZERO };
                        if decide(&request, &pool, none, &ctx) == Verdict::Grant {
                            pool.take(request.cpu, request.memory_gb);
                            held.push((p, request.cpu));
                        }
                    }
                    Step::Free(i) => {
                        if !held.is_empty() {
                            let (_, cpu) = held.remove(i % held.len());
                            pool.give_back(cpu, Amount::units(1));
                        }
                    }
                    Step::Resize(n) => {
                        pool.resize(n, Utc::now());
                    }
                }
                let sum: Amount = held.iter().map(|(_, c)| *c).sum();
                prop_assert_eq!(pool.granted_cpu, sum);
                prop_assert_eq!(pool.active_leases as usize, held.len());
                prop_assert!(pool.granted_cpu <= pool.capacity().cpu, "over capacity");
                prop_assert!(held.len() <= 5, "over the tenant's concurrentRuns");
                prop_assert!(held.iter().filter(|(p, _)| *p == 0).count() <= 2, "over project a's concurrentRuns");
            }
        }
    }
}
