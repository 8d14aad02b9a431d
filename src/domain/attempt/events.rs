//! The events an attempt emits, with the specification's topics.

use serde::Serialize;
use uuid::Uuid;

use super::{AttemptPhase, AttemptState, DecisionKind};
use crate::domain::events::EventPayload;
use crate::domain::ids::TenantId;

/// `execution.attempts.v1.attempt-started`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStarted<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Step.
    pub step_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Release.
    pub release_id: &'a str,
    /// Snapshot.
    pub snapshot_id: Uuid,
    /// Fencing token.
    pub fencing_token: u64,
}

impl EventPayload for AttemptStarted<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-started";
}

/// `execution.attempts.v1.attempt-phase-changed`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptPhaseChanged<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Phase.
    pub phase: AttemptPhase,
    /// State.
    pub state: AttemptState,
}

impl EventPayload for AttemptPhaseChanged<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-phase-changed";
}

/// `execution.attempts.v1.attempt-checkpointed`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptCheckpointed<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Checkpoint.
    pub checkpoint_id: Uuid,
    /// Sequence.
    pub sequence: u32,
    /// Adapter version.
    pub adapter_version: &'a str,
}

impl EventPayload for AttemptCheckpointed<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-checkpointed";
}

/// `execution.attempts.v1.attempt-decision-requested`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptDecisionRequested<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Decision.
    pub decision_id: Uuid,
    /// Kind.
    pub kind: DecisionKind,
    /// Approval (approvals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<Uuid>,
}

impl EventPayload for AttemptDecisionRequested<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-decision-requested";
}

/// `execution.attempts.v1.attempt-cancellation-observed`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptCancellationObserved<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Calls settled as uncertain.
    pub uncertain_calls: u32,
}

impl EventPayload for AttemptCancellationObserved<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-cancellation-observed";
}

/// `execution.attempts.v1.attempt-outcome-reported`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptOutcomeReported<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Final state.
    pub state: AttemptState,
    /// Outcome hash.
    pub outcome_hash: &'a str,
    /// Corrections made.
    pub corrections: u32,
    /// Model calls made.
    pub model_calls: u32,
    /// Tool calls made.
    pub tool_calls: u32,
}

impl EventPayload for AttemptOutcomeReported<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-outcome-reported";
}

/// `execution.attempts.v1.sub-agent-delegated`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubAgentDelegated<'a> {
    /// Supervisor attempt.
    pub attempt_id: Uuid,
    /// Supervisor run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Child run.
    pub child_run_id: Uuid,
    /// Child agent.
    pub child_agent_id: &'a str,
    /// Depth of the child.
    pub depth: u32,
}

impl EventPayload for SubAgentDelegated<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.sub-agent-delegated";
}

/// `execution.attempts.v1.attempt-interrupt-requested` (the appliance's):
/// what reaches an external adapter through WatchAttempt.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptInterruptRequested<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Why.
    pub reason: &'a str,
    /// interrupt, run-cancelled, revocation, lease-lost.
    pub source: &'a str,
}

impl EventPayload for AttemptInterruptRequested<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.attempt-interrupt-requested";
}

/// `execution.attempts.v1.call-settled` (the appliance's): an operator
/// settled an uncertain call.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallSettled<'a> {
    /// Attempt.
    pub attempt_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Call.
    pub call_id: Uuid,
    /// happened | did-not-happen.
    pub effect: &'a str,
    /// Who.
    pub by: &'a str,
}

impl EventPayload for CallSettled<'_> {
    const TOPIC: &'static str = "execution.attempts.v1.call-settled";
}
