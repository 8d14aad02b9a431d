//! `agentbay.capacity.v1.Capacity`: AcquireLease, RenewLease, ReleaseLease.

use std::time::Duration;

use connectrpc::{RequestContext, Response, ServiceRequest, ServiceResult};

use super::{principal, time};
use crate::api::AppState;
use crate::api::error::{ApiError, rpc};
use crate::capacity::{AcquireRequest, LeaseView};
use crate::domain::amount::Amount;
use crate::domain::capacity::{HolderKind, LeaseRequest, LeaseState, parse_holder_id};
use crate::domain::ids::{optional_uuid, parse_uuid};
use crate::domain::{FieldError, ProjectId, TenantId};
use crate::proto::agentbay::capacity::v1 as pb;

/// The Capacity service.
pub struct CapacityService {
    state: AppState,
}

impl CapacityService {
    /// Serves the Capacity RPCs.
    pub fn new(state: AppState) -> Self {
        CapacityService { state }
    }
}

/// The wire form of a lease.
pub fn lease_message(view: &LeaseView) -> pb::Lease {
    let l = &view.lease;
    let state = match l.state {
        LeaseState::Requested => pb::LeaseState::REQUESTED,
        LeaseState::Granted => pb::LeaseState::GRANTED,
        LeaseState::Active => pb::LeaseState::ACTIVE,
        LeaseState::Released => pb::LeaseState::RELEASED,
        LeaseState::Expired => pb::LeaseState::EXPIRED,
        LeaseState::Denied => pb::LeaseState::DENIED,
    };
    pb::Lease {
        lease_id: l.lease_id.to_string(),
        tenant_id: l.tenant_id.to_string(),
        project_id: l.project_id.to_string(),
        run_id: l.run_id.map(|u| u.to_string()).unwrap_or_default(),
        attempt_id: l.attempt_id.map(|u| u.to_string()).unwrap_or_default(),
        holder_kind: l.holder_kind.as_str().to_string(),
        holder_id: l.holder_id.clone(),
        pool_id: l.pool_id.clone(),
        cpu: l.cpu.as_f64(),
        memory_gb: l.memory_gb.as_f64(),
        state: state.into(),
        requested_at: l.requested_at.to_rfc3339(),
        granted_at: time(l.granted_at),
        expires_at: time(l.expires_at),
        released_at: time(l.released_at),
        reason: view
            .limit
            .as_ref()
            .map(|limit| limit.to_string())
            .or_else(|| l.reason.clone())
            .unwrap_or_default(),
        queue_position: view.queue_position.unwrap_or(0) as u32,
        execution_seconds: l.execution_seconds,
        limiting_quota: view
            .limit
            .as_ref()
            .and_then(|limit| limit.quota_field())
            .map(str::to_string)
            .or_else(|| l.limiting_quota.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn positive(field: &str, v: f64) -> Result<Amount, FieldError> {
    let amount = Amount::parse(field, v)?;
    if amount == Amount::ZERO {
        return Err(FieldError::new(field, "must be greater than 0"));
    }
    Ok(amount)
}

#[allow(refining_impl_trait)]
impl pb::Capacity for CapacityService {
    async fn acquire_lease(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::AcquireLeaseRequest>,
    ) -> ServiceResult<pb::AcquireLeaseResponse> {
        let caller = principal(&ctx)?;
        let tenant = if request.tenant_id.is_empty() {
            caller.tenant.clone()
        } else {
            TenantId::parse_field("tenantId", request.tenant_id).map_err(rpc)?
        };
        caller.scope_for(&tenant).map_err(rpc)?;
        let lease_request = (|| -> Result<LeaseRequest, FieldError> {
            Ok(LeaseRequest {
                tenant_id: tenant.clone(),
                project_id: ProjectId::parse_field("projectId", request.project_id)?,
                run_id: optional_uuid("runId", request.run_id)?,
                attempt_id: optional_uuid("attemptId", request.attempt_id)?,
                run_slot: None,
                holder_kind: HolderKind::parse(request.holder_kind)?,
                holder_id: parse_holder_id(request.holder_id)?,
                cpu: positive("cpu", request.cpu)?,
                memory_gb: positive("memoryGb", request.memory_gb)?,
                internet_egress: request.internet_egress,
            })
        })()
        .map_err(rpc)?;
        // A lease names the run and attempt it is for: they are the
        // tenant's own, or the lease is refused as for any unknown id.
        let scope = crate::domain::access::TenantScope::new(tenant.clone());
        if let Some(id) = lease_request.run_id {
            self.state.runs.get(&scope, id).map_err(rpc)?;
        }
        if let Some(id) = lease_request.attempt_id {
            self.state.runtime.attempt(&scope, id).map_err(rpc)?;
        }
        let acquire = AcquireRequest {
            request: lease_request,
            pool_id: match request.pool_id {
                "" => None,
                p => {
                    crate::domain::ids::check_slug("poolId", p).map_err(rpc)?;
                    Some(p.to_string())
                }
            },
            wait: request.wait,
            wait_for: Duration::from_secs(u64::from(request.wait_seconds)),
        };
        let view = self.state.capacity.acquire(acquire).await.map_err(rpc)?;
        Response::ok(pb::AcquireLeaseResponse {
            lease: buffa::MessageField::some(lease_message(&view)),
            ..Default::default()
        })
    }

    async fn renew_lease(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RenewLeaseRequest>,
    ) -> ServiceResult<pb::RenewLeaseResponse> {
        let caller = principal(&ctx)?;
        let id = parse_uuid("leaseId", request.lease_id).map_err(rpc)?;
        let view = self
            .state
            .capacity
            .renew(&caller.tenant_scope(), id)
            .await
            .map_err(rpc)?;
        Response::ok(pb::RenewLeaseResponse {
            lease: buffa::MessageField::some(lease_message(&view)),
            ..Default::default()
        })
    }

    async fn release_lease(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ReleaseLeaseRequest>,
    ) -> ServiceResult<pb::ReleaseLeaseResponse> {
        let caller = principal(&ctx)?;
        let id = parse_uuid("leaseId", request.lease_id).map_err(rpc)?;
        let view = self
            .state
            .capacity
            .release(&caller.tenant_scope(), id)
            .await
            .map_err(|e| rpc(ApiError::from(e)))?;
        Response::ok(pb::ReleaseLeaseResponse {
            lease: buffa::MessageField::some(lease_message(&view)),
            ..Default::default()
        })
    }
}
