//! Execution capacity: worker pools, quotas and capacity leases
//! (the ExecutionCapacityService specification), pure.

pub mod decide;
pub mod host;
pub mod lease;
pub mod pool;
pub mod quota;

pub use decide::{Level, Limit, QuotaContext, Usage, Verdict, decide, placement, token_quota};
pub use host::{HostBudget, HostFit, HostResources};
pub use lease::{CapacityLease, HolderKind, LeaseRequest, LeaseState, parse_holder_id};
pub use pool::{PoolKind, PoolSpec, PoolState, SecurityBoundary, SlotSize, WorkerPool};
pub use quota::{EffectiveLimits, Quota, QuotaLimits, QuotaPatch, QuotaScope};
