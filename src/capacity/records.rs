//! How capacity aggregates are stored.

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
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.pool_id.clone()
    }
}

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
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.lease_id.to_string()
    }
}

/// Lease seconds charged to a tenant (and a project) on one UTC day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionMinutes {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project; `None` for the tenant's total.
    pub project_id: Option<ProjectId>,
    /// The UTC day.
    pub day: NaiveDate,
    /// Seconds of leases that ended, charged to this day.
    pub seconds: u64,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl ExecutionMinutes {
    /// The record id for a day and an optional project.
    pub fn record_id(day: NaiveDate, project: Option<&ProjectId>) -> String {
        match project {
            Some(p) => format!("{day}.{p}"),
            None => format!("{day}"),
        }
    }
}

impl Record for ExecutionMinutes {
    const TABLE: Table = Table::ExecutionMinutes;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        ExecutionMinutes::record_id(self.day, self.project_id.as_ref())
    }
}
