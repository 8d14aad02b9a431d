//! How capacity aggregates are stored.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::capacity::{CapacityLease, Quota, WorkerPool};
use crate::domain::tenant::{Project, Tenant};
use crate::domain::{ProjectId, TenantId};
use crate::store::{Record, Table};

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

fn platform() -> &'static TenantId {
    static PLATFORM: std::sync::OnceLock<TenantId> = std::sync::OnceLock::new();
    PLATFORM.get_or_init(TenantId::platform)
}

impl Record for CapacityLease {
    const TABLE: Table = Table::CapacityLeases;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.lease_id.to_string()
    }
}

crate::versioned!(
    CapacityLease,
    version,
    crate::domain::capacity::lease::StoredLease
);

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
