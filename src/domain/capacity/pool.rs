//! Worker pools: capacity of one kind, behind one security boundary, in one
//! region.
//!
//! On one node a pool's size is a number of slots; each slot offers its node
//! profile's CPU and memory, so a pool's capacity is `currentSize × profile`.
//! Leases take CPU and memory out of it. `currentSize` moves between
//! `minSize` and `maxSize` (autoscaling), never below what is granted.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::amount::Amount;
use crate::domain::error::{DomainError, FieldError};
use crate::domain::events::{EventPayload, NewEvent};
use crate::domain::ids::TenantId;
use crate::domain::tenant::check_region;
use utoipa::ToSchema;

/// What a pool runs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum PoolKind {
    /// Agent attempts.
    AgentRuntime,
    /// Tool sandboxes.
    Sandbox,
    /// Build runners.
    BuildRunner,
    /// Browser sessions.
    BrowserSession,
}

impl PoolKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::AgentRuntime => "agent-runtime",
            PoolKind::Sandbox => "sandbox",
            PoolKind::BuildRunner => "build-runner",
            PoolKind::BrowserSession => "browser-session",
        }
    }
}

/// Who may share a pool's machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SecurityBoundary {
    /// Every tenant; never reaches the internet.
    Shared,
    /// One tenant's own machines in the appliance.
    TenantDedicated,
    /// Machines the customer hosts and operates.
    CustomerHosted,
}

impl SecurityBoundary {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityBoundary::Shared => "shared",
            SecurityBoundary::TenantDedicated => "tenant-dedicated",
            SecurityBoundary::CustomerHosted => "customer-hosted",
        }
    }
}

/// Lifecycle of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum PoolState {
    /// Being set up; no grants yet.
    Provisioning,
    /// Grants leases.
    Active,
    /// Keeps its leases, grants no new ones.
    Draining,
    /// Grants nothing.
    Disabled,
}

impl fmt::Display for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The CPU and memory of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotSize {
    /// CPUs per slot.
    pub cpu: Amount,
    /// Memory per slot, in GB.
    pub memory_gb: Amount,
}

/// How the autoscaler sizes the pool.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Whether the autoscaler moves the size at all.
    pub enabled: bool,
    /// Fraction of capacity the autoscaler aims to keep in use (0.1 to 1).
    pub target_utilisation: f64,
}

impl Default for Autoscaling {
    fn default() -> Self {
        Autoscaling {
            enabled: true,
            target_utilisation: 0.8,
        }
    }
}

/// A pool as stored, with its accounting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPool {
    /// Globally unique slug.
    pub pool_id: String,
    /// The platform tenant for shared pools; the owner otherwise.
    pub tenant_id: TenantId,
    /// What it runs.
    pub kind: PoolKind,
    /// Who may share it.
    pub security_boundary: SecurityBoundary,
    /// Where it is.
    pub region: String,
    /// The node profile its slots have.
    pub node_profile: String,
    /// CPU and memory of one slot, fixed when the profile was chosen.
    pub slot: SlotSize,
    /// Whether work in the pool may reach the internet.
    pub internet_egress: bool,
    /// Lower size bound.
    pub min_size: u32,
    /// Upper size bound.
    pub max_size: u32,
    /// Slots provisioned now.
    pub current_size: u32,
    /// Autoscaling rule.
    pub autoscaling: Autoscaling,
    /// Lifecycle state.
    pub state: PoolState,
    /// CPU of granted and active leases.
    pub granted_cpu: Amount,
    /// Memory of granted and active leases.
    pub granted_memory_gb: Amount,
    /// Granted and active leases.
    pub active_leases: u32,
    /// Share of capacity in use (0 to 1): the larger of CPU and memory.
    pub utilisation: f64,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// The number of the stored state this value is (0: not stored yet);
    /// the store numbers every write and refuses one derived from an older
    /// state.
    #[serde(default = "crate::domain::stored_before_versions")]
    pub version: u64,
}

/// What `SetWorkerPool` carries.
#[derive(Clone, Debug, PartialEq, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// Owner: the platform tenant (default) for shared pools.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub tenant_id: Option<TenantId>,
    /// What it runs.
    pub kind: PoolKind,
    /// Who may share it.
    pub security_boundary: SecurityBoundary,
    /// Where it is.
    pub region: String,
    /// A node profile of the configuration.
    pub node_profile: String,
    /// Lower bound.
    pub min_size: u32,
    /// Upper bound.
    pub max_size: u32,
    /// Whether work may reach the internet (never on shared pools).
    #[serde(default)]
    pub internet_egress: bool,
    /// Autoscaling rule.
    #[serde(default)]
    pub autoscaling: Option<Autoscaling>,
    /// `Active` (default), `Draining` or `Disabled`.
    #[serde(default)]
    pub state: Option<PoolState>,
}

/// Payload of `capacity.pools.v1.worker-pool-state-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolStateChanged<'a> {
    /// The pool.
    pub pool_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Its kind.
    pub kind: PoolKind,
    /// Before.
    pub from_state: PoolState,
    /// After.
    pub to_state: PoolState,
    /// Slots after the change.
    pub current_size: u32,
}

impl EventPayload for WorkerPoolStateChanged<'_> {
    const TOPIC: &'static str = "capacity.pools.v1.worker-pool-state-changed";
}

/// Largest pool accepted.
pub const MAX_POOL_SIZE: u32 = 10_000;

impl WorkerPool {
    /// What an operator sets on the pool (not its live counters), as the
    /// audit trail shows a change of it.
    pub fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind,
            "securityBoundary": self.security_boundary,
            "region": self.region,
            "nodeProfile": self.node_profile,
            "internetEgress": self.internet_egress,
            "minSize": self.min_size,
            "maxSize": self.max_size,
            "autoscaling": self.autoscaling,
            "state": self.state,
        })
    }

    /// Whether `tenant` may know of this pool at all: shared pools and its
    /// own. Another tenant's dedicated pool does not exist for it (lists,
    /// lookups and placement answer as for an unknown pool).
    pub fn visible_to(&self, tenant: &TenantId) -> bool {
        self.security_boundary == SecurityBoundary::Shared || self.tenant_id == *tenant
    }

    /// Capacity at the current size.
    pub fn capacity(&self) -> SlotSize {
        SlotSize {
            cpu: self.slot.cpu.times(self.current_size),
            memory_gb: self.slot.memory_gb.times(self.current_size),
        }
    }

    /// Capacity at the maximum size.
    pub fn max_capacity(&self) -> SlotSize {
        SlotSize {
            cpu: self.slot.cpu.times(self.max_size),
            memory_gb: self.slot.memory_gb.times(self.max_size),
        }
    }

    /// Slots needed to hold what is granted now.
    pub fn slots_in_use(&self) -> u32 {
        let by_cpu = self.granted_cpu.div_ceil(self.slot.cpu);
        let by_mem = self.granted_memory_gb.div_ceil(self.slot.memory_gb);
        by_cpu.max(by_mem).min(u64::from(u32::MAX)) as u32
    }

    fn refresh_utilisation(&mut self) {
        let cap = self.capacity();
        self.utilisation = self
            .granted_cpu
            .ratio(cap.cpu)
            .max(self.granted_memory_gb.ratio(cap.memory_gb))
            .min(1.0);
    }

    fn event(&self, from: PoolState, now: DateTime<Utc>) -> NewEvent {
        NewEvent::new(
            &self.tenant_id,
            now,
            &WorkerPoolStateChanged {
                pool_id: &self.pool_id,
                tenant_id: &self.tenant_id,
                kind: self.kind,
                from_state: from,
                to_state: self.state,
                current_size: self.current_size,
            },
        )
    }

    /// `SetWorkerPool`: creates a pool or changes its bounds, rule and
    /// state. `slot` is the size of the named node profile. A pool with live
    /// leases cannot change what it is (kind, boundary, owner, profile), and
    /// its size never drops below what is granted.
    pub fn set(
        existing: Option<&WorkerPool>,
        pool_id: &str,
        spec: PoolSpec,
        slot: SlotSize,
        now: DateTime<Utc>,
    ) -> Result<(WorkerPool, Vec<NewEvent>), DomainError> {
        TenantId::parse_field("poolId", pool_id)?;
        check_region("region", &spec.region)?;
        let tenant = spec.tenant_id.clone().unwrap_or_else(TenantId::platform);
        match spec.security_boundary {
            SecurityBoundary::Shared if !tenant.is_platform() => {
                return Err(FieldError::new(
                    "tenantId",
                    format!("a shared pool belongs to the platform tenant, not to {tenant}"),
                )
                .into());
            }
            SecurityBoundary::TenantDedicated | SecurityBoundary::CustomerHosted
                if tenant.is_platform() =>
            {
                return Err(FieldError::new(
                    "tenantId",
                    format!(
                        "a {} pool needs the tenant it serves",
                        spec.security_boundary.as_str()
                    ),
                )
                .into());
            }
            _ => {}
        }
        if spec.internet_egress && spec.security_boundary == SecurityBoundary::Shared {
            return Err(FieldError::new(
                "internetEgress",
                "a shared pool cannot reach the internet; use a tenant-dedicated or customer-hosted pool",
            )
            .into());
        }
        if spec.min_size > spec.max_size {
            return Err(FieldError::new(
                "minSize",
                format!("{} is larger than maxSize {}", spec.min_size, spec.max_size),
            )
            .into());
        }
        if spec.max_size > MAX_POOL_SIZE {
            return Err(FieldError::new(
                "maxSize",
                format!("{} is larger than {MAX_POOL_SIZE}", spec.max_size),
            )
            .into());
        }
        if slot.cpu == Amount::ZERO || slot.memory_gb == Amount::ZERO {
            return Err(FieldError::new(
                "nodeProfile",
                format!("{} has no CPU or no memory", spec.node_profile),
            )
            .into());
        }
        let autoscaling = spec.autoscaling.unwrap_or_default();
        if !(0.1..=1.0).contains(&autoscaling.target_utilisation) {
            return Err(FieldError::new(
                "autoscaling.targetUtilisation",
                format!("{} is outside 0.1..=1", autoscaling.target_utilisation),
            )
            .into());
        }
        let state = spec.state.unwrap_or(PoolState::Active);
        if state == PoolState::Provisioning {
            return Err(FieldError::new(
                "state",
                "Provisioning is set by the appliance, not by a request",
            )
            .into());
        }

        let Some(old) = existing else {
            let mut pool = WorkerPool {
                pool_id: pool_id.to_string(),
                tenant_id: tenant,
                kind: spec.kind,
                security_boundary: spec.security_boundary,
                region: spec.region,
                node_profile: spec.node_profile,
                slot,
                internet_egress: spec.internet_egress,
                min_size: spec.min_size,
                max_size: spec.max_size,
                current_size: spec.min_size,
                autoscaling,
                state: PoolState::Provisioning,
                granted_cpu: Amount::ZERO,
                granted_memory_gb: Amount::ZERO,
                active_leases: 0,
                utilisation: 0.0,
                created_at: now,
                updated_at: now,
                version: 0,
            };
            // On one node provisioning the slots is immediate.
            pool.state = state;
            pool.refresh_utilisation();
            let event = pool.event(PoolState::Provisioning, now);
            return Ok((pool, vec![event]));
        };

        if old.tenant_id != tenant {
            // The owner is part of where the pool is stored and of every
            // lease record of it: another owner is another pool.
            return Err(FieldError::new(
                "tenantId",
                format!(
                    "pool {pool_id} belongs to {}; an owner cannot change: retire this pool and create one for the other owner",
                    old.tenant_id
                ),
            )
            .into());
        }
        let live = old.active_leases > 0;
        let changes_identity = old.kind != spec.kind
            || old.security_boundary != spec.security_boundary
            || old.node_profile != spec.node_profile;
        if live && changes_identity {
            return Err(DomainError::FailedPrecondition(format!(
                "pool {pool_id} has {} live leases; its kind, boundary and node profile can change only when it is empty (drain it first)",
                old.active_leases
            )));
        }
        let mut pool = old.clone();
        pool.tenant_id = tenant;
        pool.kind = spec.kind;
        pool.security_boundary = spec.security_boundary;
        pool.region = spec.region;
        pool.node_profile = spec.node_profile;
        pool.slot = slot;
        pool.internet_egress = spec.internet_egress;
        pool.min_size = spec.min_size;
        pool.max_size = spec.max_size;
        pool.autoscaling = autoscaling;
        pool.state = state;
        // Keep the size inside the new bounds, but never below what the live
        // leases hold: lowering a bound does not revoke anything.
        pool.current_size = old
            .current_size
            .clamp(spec.min_size, spec.max_size)
            .max(pool.slots_in_use());
        pool.updated_at = now;
        pool.refresh_utilisation();
        let events = if pool.state != old.state || pool.current_size != old.current_size {
            vec![pool.event(old.state, now)]
        } else {
            Vec::new()
        };
        Ok((pool, events))
    }

    /// Provisioning result: the pool now has `size` slots (within bounds and
    /// never below what is granted). Returns the event when it changed.
    pub fn resize(&mut self, size: u32, now: DateTime<Utc>) -> Option<NewEvent> {
        let size = size
            .clamp(self.min_size, self.max_size)
            .max(self.slots_in_use());
        if size == self.current_size {
            return None;
        }
        self.current_size = size;
        self.updated_at = now;
        self.refresh_utilisation();
        Some(self.event(self.state, now))
    }

    /// The size the autoscaler wants for what is granted plus `queued` (the
    /// demand of requests waiting for this pool's capacity, not for a quota).
    /// Scale-up goes straight to the need; scale-down one slot per pass, so a
    /// burst that just ended does not thrash the pool.
    pub fn desired_size(&self, queued: SlotSize) -> u32 {
        if !self.autoscaling.enabled {
            return self.current_size;
        }
        let target = self.autoscaling.target_utilisation;
        let need = |granted: Amount, queued: Amount, per: Amount| -> u64 {
            let total = (granted + queued).as_f64() / target;
            (total / per.as_f64()).ceil() as u64
        };
        let needed = need(self.granted_cpu, queued.cpu, self.slot.cpu)
            .max(need(
                self.granted_memory_gb,
                queued.memory_gb,
                self.slot.memory_gb,
            ))
            .min(u64::from(self.max_size)) as u32;
        let wanted = needed
            .clamp(self.min_size, self.max_size)
            .max(self.slots_in_use());
        if wanted >= self.current_size {
            wanted
        } else {
            self.current_size - 1
        }
    }

    /// Takes a lease's resources.
    pub fn take(&mut self, cpu: Amount, memory_gb: Amount) {
        self.granted_cpu = self.granted_cpu + cpu;
        self.granted_memory_gb = self.granted_memory_gb + memory_gb;
        self.active_leases += 1;
        self.refresh_utilisation();
    }

    /// Gives a lease's resources back.
    pub fn give_back(&mut self, cpu: Amount, memory_gb: Amount) {
        self.granted_cpu = self.granted_cpu - cpu;
        self.granted_memory_gb = self.granted_memory_gb - memory_gb;
        self.active_leases -= 1;
        self.refresh_utilisation();
    }

    /// Replaces the counters with values recomputed from the leases.
    pub fn set_counters(&mut self, cpu: Amount, memory_gb: Amount, leases: u32) {
        self.granted_cpu = cpu;
        self.granted_memory_gb = memory_gb;
        self.active_leases = leases;
        self.refresh_utilisation();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn small() -> SlotSize {
        SlotSize {
            cpu: Amount::units(2),
            memory_gb: Amount::units(4),
        }
    }

    fn spec() -> PoolSpec {
        PoolSpec {
            tenant_id: None,
            kind: PoolKind::AgentRuntime,
            security_boundary: SecurityBoundary::Shared,
            region: "local".into(),
            node_profile: "small".into(),
            min_size: 1,
            max_size: 8,
            internet_egress: false,
            autoscaling: None,
            state: None,
        }
    }

    #[test]
    fn a_new_pool_starts_at_its_minimum_and_says_so() {
        let (pool, events) = WorkerPool::set(None, "agents", spec(), small(), Utc::now()).unwrap();
        assert_eq!(pool.current_size, 1);
        assert_eq!(pool.state, PoolState::Active);
        assert_eq!(pool.capacity().cpu, Amount::units(2));
        assert_eq!(events[0].payload["fromState"], "Provisioning");
        assert_eq!(events[0].payload["toState"], "Active");
    }

    #[test]
    fn boundaries_and_owners_must_agree() {
        let mut s = spec();
        s.internet_egress = true;
        let err = WorkerPool::set(None, "p", s, small(), Utc::now()).unwrap_err();
        assert!(err.to_string().contains("internetEgress"), "{err}");
        let mut s = spec();
        s.security_boundary = SecurityBoundary::TenantDedicated;
        assert!(WorkerPool::set(None, "p", s, small(), Utc::now()).is_err());
        let mut s = spec();
        s.min_size = 9;
        let err = WorkerPool::set(None, "p", s, small(), Utc::now()).unwrap_err();
        assert!(err.to_string().contains("minSize"), "{err}");
    }

    #[test]
    fn lowering_bounds_never_cuts_below_what_is_granted() {
        let (mut pool, _) = WorkerPool::set(None, "agents", spec(), small(), Utc::now()).unwrap();
        pool.resize(4, Utc::now()).unwrap();
        pool.take(Amount::units(5), Amount::units(2));
        let mut s = spec();
        s.max_size = 1;
        s.min_size = 1;
        let (shrunk, _) = WorkerPool::set(Some(&pool), "agents", s, small(), Utc::now()).unwrap();
        assert_eq!(
            shrunk.current_size, 3,
            "5 cpu granted on 2-cpu slots need 3 slots"
        );
        let mut s = spec();
        s.kind = PoolKind::Sandbox;
        let err = WorkerPool::set(Some(&pool), "agents", s, small(), Utc::now()).unwrap_err();
        assert!(matches!(err, DomainError::FailedPrecondition(_)));
    }

    #[test]
    fn the_autoscaler_grows_to_demand_and_shrinks_slowly() {
        let (mut pool, _) = WorkerPool::set(None, "agents", spec(), small(), Utc::now()).unwrap();
        let queued = SlotSize {
            cpu: Amount::units(6),
            memory_gb: Amount::units(1),
        };
        // 6 cpu at 80 % target on 2-cpu slots: 4 slots.
        assert_eq!(pool.desired_size(queued), 4);
        pool.resize(4, Utc::now());
        let none = SlotSize {
            cpu: Amount::ZERO,
            memory_gb: Amount::ZERO,
        };
        assert_eq!(pool.desired_size(none), 3);
        // Never beyond the maximum.
        let huge = SlotSize {
            cpu: Amount::units(1000),
            memory_gb: Amount::ZERO,
        };
        assert_eq!(pool.desired_size(huge), 8);
    }
}
