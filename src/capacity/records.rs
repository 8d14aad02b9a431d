//! How capacity aggregates are stored.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::access::TenantScope;
use crate::domain::capacity::{CapacityLease, LeaseState, Quota, WorkerPool};
use crate::domain::tenant::{Project, Tenant};
use crate::domain::{ProjectId, TenantId};
use crate::store::{Derived, Record, Store, StoreError, Table, time_value};

impl Record for Tenant {
    const TABLE: Table = Table::Tenants;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        TENANT_RECORD.to_string()
    }
}

/// The one id of a tenant's own record within its keys.
pub const TENANT_RECORD: &str = "tenant";

impl Record for Project {
    const TABLE: Table = Table::Projects;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.project_id.to_string()
    }
}

impl Record for WorkerPool {
    const TABLE: Table = Table::WorkerPools;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.pool_id.clone()
    }
}

crate::versioned!(WorkerPool, version);

impl Record for Quota {
    const TABLE: Table = Table::Quotas;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        // Quotas of editions belong to the platform tenant.
        match &self.scope {
            crate::domain::capacity::QuotaScope::Edition { .. } => platform(),
            crate::domain::capacity::QuotaScope::Tenant { tenant_id }
            | crate::domain::capacity::QuotaScope::Project { tenant_id, .. } => tenant_id,
        }
    }
    fn id(&self) -> String {
        self.scope.record_id()
    }
}

/// A tenant's leases not yet ended: its state index under the states that
/// are not final. (No appliance-wide index of them: it would be two more
/// keys in every lease's life for a read made at start and by the
/// console, which go through the tenants anyway.)
pub fn live_leases(store: &Store, scope: &TenantScope) -> Result<Vec<CapacityLease>, StoreError> {
    let mut out = Vec::new();
    for state in LeaseState::LIVE {
        let ids = store.index_ids(scope, index::STATE, &state.to_string())?;
        out.extend(store.get_many::<CapacityLease>(scope, &ids)?);
    }
    Ok(out)
}

/// Leases that held capacity at some point since `start`: the live ones
/// (each tenant's state index) and those that ended since (its end index).
pub fn recent_spans(
    store: &Store,
    start: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<CapacityLease>, StoreError> {
    use crate::domain::access::PlatformScope;
    let platform = PlatformScope::internal();
    let mut out = Vec::new();
    let from = time_value(start);
    for t in store.scan_all::<crate::domain::tenant::Tenant>(&platform)? {
        let scope = TenantScope::new(t.tenant_id);
        out.extend(live_leases(store, &scope)?);
        let ids: Vec<String> = store
            .index_range(&scope, index::ENDED, Some(&from), None, usize::MAX)?
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        out.extend(store.get_many(&scope, &ids)?);
    }
    Ok(out)
}

/// Whether the run holding a run slot has ended (or is gone): its slot is
/// free.
pub fn slot_run_ended(store: &Store, tenant: &TenantId, run_id: Uuid) -> Result<bool, StoreError> {
    let scope = TenantScope::new(tenant.clone());
    Ok(store
        .get::<crate::domain::run::Run>(&scope, &run_id.to_string())?
        .is_none_or(|run| run.state.is_terminal()))
}

/// The run slots recorded: those of live runs, and those whose run ended
/// without its slot being freed (a crash between the two), to remove.
pub fn recorded_slots(
    store: &Store,
    platform: &crate::domain::access::PlatformScope,
) -> Result<(Vec<RunSlot>, Vec<RunSlot>), StoreError> {
    let mut live = Vec::new();
    let mut ended = Vec::new();
    for slot in store.scan_all::<RunSlot>(platform)? {
        if slot_run_ended(store, &slot.tenant_id, slot.run_id)? {
            ended.push(slot);
        } else {
            live.push(slot);
        }
    }
    Ok((live, ended))
}

fn platform() -> &'static TenantId {
    static PLATFORM: std::sync::OnceLock<TenantId> = std::sync::OnceLock::new();
    PLATFORM.get_or_init(TenantId::platform)
}

/// Names of the indexes leases derive (see `store/derived.rs`).
pub mod index {
    /// Leases of a tenant by state.
    pub const STATE: &str = "lease-state";
    /// Ended leases of a tenant by end time.
    pub const ENDED: &str = "lease-ended";
}

impl Record for CapacityLease {
    const TABLE: Table = Table::CapacityLeases;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.lease_id.to_string()
    }
    fn derive(&self, d: &mut Derived) {
        d.index(index::STATE, self.state.to_string());
        if self.state.is_terminal() {
            d.index(
                index::ENDED,
                time_value(self.released_at.unwrap_or(self.requested_at)),
            );
        }
    }
}

crate::versioned!(
    CapacityLease,
    version,
    crate::domain::capacity::lease::StoredLease
);

/// A run slot held by a live run (`concurrentRuns`): taken with the first
/// lease granted to one of its attempts, in the same write, and freed when
/// the run ends. A waiting attempt gives its compute lease back; its run
/// keeps this.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSlot {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project whose `concurrentRuns` it counts in.
    pub project_id: ProjectId,
    /// The top-level run that holds it.
    pub run_id: Uuid,
    /// The lease whose grant took it.
    pub lease_id: Uuid,
    /// When.
    pub taken_at: DateTime<Utc>,
}

impl Record for RunSlot {
    const TABLE: Table = Table::RunSlots;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.run_id.to_string()
    }
}

/// Lease seconds charged to a tenant and its projects on one UTC day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionMinutes {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The UTC day.
    pub day: NaiveDate,
    /// Seconds of leases that ended, charged to this day, for the tenant.
    pub seconds: u64,
    /// The same, per project.
    pub projects: BTreeMap<ProjectId, u64>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl Record for ExecutionMinutes {
    const TABLE: Table = Table::ExecutionMinutes;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.day.to_string()
    }
}
