//! The entities inside an ExecutionAttempt: checkpoints, call records,
//! decision requests and sub-agent delegations. They are stored in tables
//! of their own (keyed under their attempt) but change only through the
//! attempt's transitions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::AttemptPhase;
use crate::domain::ids::TenantId;
use crate::domain::release::{PolicyRule, SideEffectClass, canonical_json};

/// `sha256:<hex>` of a JSON value's canonical form.
pub fn json_hash(value: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(canonical_json(value)))
    )
}

/// Why a checkpoint was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointReason {
    /// The attempt started: its first resumable point.
    Started,
    /// Before a gated call (class shared-write and above).
    BeforeGatedCall,
    /// After an observed outcome of a call.
    AfterObservation,
    /// `Runtime:Attempts:CheckpointEveryCalls` calls since the last one.
    Cadence,
    /// The adapter asked for one.
    Adapter,
    /// Before the attempt paused.
    Pause,
}

impl CheckpointReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointReason::Started => "started",
            CheckpointReason::BeforeGatedCall => "before-gated-call",
            CheckpointReason::AfterObservation => "after-observation",
            CheckpointReason::Cadence => "cadence",
            CheckpointReason::Adapter => "adapter",
            CheckpointReason::Pause => "pause",
        }
    }
}

/// A durable point the attempt can resume from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The checkpoint.
    pub checkpoint_id: Uuid,
    /// Its attempt.
    pub attempt_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// 1, 2, ... within the attempt.
    pub sequence: u32,
    /// Where the loop was.
    pub phase: AttemptPhase,
    /// Artifact reference of the adapter's state (opaque to the runtime).
    pub adapter_state_ref: String,
    /// Adapter the state belongs to, e.g. `external/1`.
    pub adapter_version: String,
    /// Checkpoint format of the state.
    pub checkpoint_format: u32,
    /// Context snapshot in use.
    pub context_snapshot_ref: Option<String>,
    /// Hash of the checkpoint's canonical form.
    pub hash: String,
    /// Written at.
    pub created_at: DateTime<Utc>,
    /// Why it was written.
    pub reason: CheckpointReason,
    /// The call it precedes (before a gated call) or follows.
    pub call_id: Option<Uuid>,
    /// Referenced by evidence (a gated call): kept by the compactor.
    pub evidence: bool,
    /// Where purged content was: the references above stay (hashes and
    /// contracts still hold), the content is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged: Option<crate::domain::retention::Tombstone>,
    /// Call records the attempt had written when the checkpoint was: the
    /// calls with a higher sequence came after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_before: Option<u32>,
}

impl Checkpoint {
    /// The hash over the fields that define the checkpoint.
    pub fn compute_hash(&self) -> String {
        json_hash(&json!({
            "attemptId": self.attempt_id,
            "sequence": self.sequence,
            "phase": self.phase.as_str(),
            "adapterStateRef": self.adapter_state_ref,
            "adapterVersion": self.adapter_version,
            "checkpointFormat": self.checkpoint_format,
            "contextSnapshotRef": self.context_snapshot_ref,
        }))
    }

    /// Whether an adapter of `adapter_version` reading `checkpoint_format`
    /// can resume from this checkpoint; the reason when it cannot.
    pub fn compatible_with(
        &self,
        adapter_version: &str,
        checkpoint_format: u32,
    ) -> Result<(), String> {
        if self.adapter_version != adapter_version {
            return Err(format!(
                "checkpoint {} was written by adapter {}, this adapter is {}",
                self.sequence, self.adapter_version, adapter_version
            ));
        }
        if self.checkpoint_format != checkpoint_format {
            return Err(format!(
                "checkpoint {} has format {}, this adapter reads format {}",
                self.sequence, self.checkpoint_format, checkpoint_format
            ));
        }
        Ok(())
    }

    /// The stored id within the tenant: `<attempt>/<sequence>`.
    pub fn key(attempt_id: Uuid, sequence: u32) -> String {
        format!("{attempt_id}/{sequence:010}")
    }
}

/// What a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CallKind {
    /// A model invocation against the pinned profile.
    Model,
    /// A tool of the release.
    Tool,
    /// A child run of another agent.
    SubAgent,
}

impl CallKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Model => "model",
            CallKind::Tool => "tool",
            CallKind::SubAgent => "sub-agent",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<CallKind> {
        [CallKind::Model, CallKind::Tool, CallKind::SubAgent]
            .into_iter()
            .find(|k| k.as_str() == text)
    }
}

/// Where a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CallStatus {
    /// Started; no result observed yet.
    Issued,
    /// The result was observed.
    Completed,
    /// Refused before it started (outside the closure, denied, invalid
    /// arguments, over a limit) or ended in an error.
    Failed,
    /// Stopped before a result, and its class means it had no effect.
    Abandoned,
    /// Stopped before a result with an effect that cannot be confirmed:
    /// shown to an operator, never retried automatically.
    Uncertain,
}

impl CallStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Issued => "issued",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Abandoned => "abandoned",
            CallStatus::Uncertain => "uncertain",
        }
    }
}

/// An operator's word on an uncertain call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// The effect happened.
    Happened,
    /// It did not.
    DidNotHappen,
}

impl Effect {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Happened => "happened",
            Effect::DidNotHappen => "did-not-happen",
        }
    }
}

/// How an operator settled an uncertain call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Settlement {
    /// What they found.
    pub effect: Effect,
    /// Why they say so (required).
    pub reason: String,
    /// Who.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// One outbound call: hashes and references only, never content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    /// The call.
    pub call_id: Uuid,
    /// Its attempt.
    pub attempt_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// 1, 2, ... within the attempt.
    pub sequence: u32,
    /// Model, tool or sub-agent.
    pub kind: CallKind,
    /// Model profile, tool id or child agent id.
    pub target: String,
    /// Side-effect class (tools).
    pub side_effect_class: Option<SideEffectClass>,
    /// Artifact reference of the request (arguments, prompt).
    pub request_hash: String,
    /// The policy decision that allowed or refused it.
    pub policy_decision_id: Option<Uuid>,
    /// What the policy said.
    pub policy_rule: Option<PolicyRule>,
    /// The approval that allowed it, for a call that needed one.
    pub approval_id: Option<Uuid>,
    /// Artifact reference of the receipt (tool-invocation-v1 /
    /// model-invocation-v1).
    pub receipt_ref: Option<String>,
    /// What served a model call: the endpoint and the profile that chose
    /// it (a site profile, or the release's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
    /// Artifact reference of the result.
    pub result_hash: Option<String>,
    /// Where it is.
    pub status: CallStatus,
    /// Why it failed, was refused or is uncertain.
    pub error: Option<String>,
    /// The checkpoint written before it (gated calls).
    pub pre_checkpoint_id: Option<Uuid>,
    /// The fencing token it was issued under.
    pub fencing_token: u64,
    /// Context tokens the caller declared (model calls).
    pub context_tokens: Option<u32>,
    /// Tokens the model server counted for a model call that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::domain::usage::TokenUsage>,
    /// Milliseconds the call took: from its start to its result, or as
    /// the adapter or model client measured the model's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Started.
    pub started_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// A receipt the adapter reported after the call was settled as
    /// uncertain: evidence for the operator, never a result.
    pub late_receipt_ref: Option<String>,
    /// An operator's settlement of an uncertain call.
    pub settlement: Option<Settlement>,
    /// Where purged content was: the references above stay (hashes and
    /// contracts still hold), the content is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged: Option<crate::domain::retention::Tombstone>,
    /// A call of a re-run that was not issued: the source attempt had
    /// confirmed the same call's effect, and its result is this call's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<ReplayOf>,
}

/// The source call a re-run's call was answered from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayOf {
    /// The source attempt.
    pub attempt_id: Uuid,
    /// The source call.
    pub call_id: Uuid,
    /// Its sequence there.
    pub sequence: u32,
}

impl CallRecord {
    /// Whether the call had an effect outside the attempt that is known
    /// to have happened: a gated tool call (shared-write and above) or a
    /// sub-agent delegation that completed, or an uncertain one an
    /// operator settled as happened. A re-run never issues such a call
    /// again unless the operator asks for it by name.
    pub fn confirmed_effect(&self) -> bool {
        let effectful = match self.kind {
            CallKind::Tool => self.side_effect_class.is_some_and(|c| c.is_gated()),
            CallKind::SubAgent => true,
            CallKind::Model => false,
        };
        let happened = match self.status {
            CallStatus::Completed => self.replay_of.is_none(),
            CallStatus::Uncertain => self
                .settlement
                .as_ref()
                .is_some_and(|s| s.effect == Effect::Happened),
            _ => false,
        };
        effectful && happened
    }

    /// The stored id within the tenant: `<attempt>/<sequence>`.
    pub fn key(attempt_id: Uuid, sequence: u32) -> String {
        format!("{attempt_id}/{sequence:06}")
    }

    /// Whether the call was in flight: issued and not yet observed.
    pub fn is_open(&self) -> bool {
        self.status == CallStatus::Issued
    }
}

/// What a human is asked for.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionKind {
    /// Permission for a gated call; owned by Run Control (approvalId).
    Approval,
    /// Missing input.
    Input,
    /// A choice among options, with a recommendation.
    Escalation,
}

impl DecisionKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Approval => "approval",
            DecisionKind::Input => "input",
            DecisionKind::Escalation => "escalation",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<DecisionKind> {
        [
            DecisionKind::Approval,
            DecisionKind::Input,
            DecisionKind::Escalation,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// Where a decision is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionStatus {
    /// Waiting for a human.
    Pending,
    /// Approval granted.
    Approved,
    /// Approval refused.
    Rejected,
    /// Input or escalation answered.
    Answered,
    /// Nobody answered in time.
    Expired,
    /// The attempt stopped first.
    Cancelled,
}

impl DecisionStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionStatus::Pending => "pending",
            DecisionStatus::Approved => "approved",
            DecisionStatus::Rejected => "rejected",
            DecisionStatus::Answered => "answered",
            DecisionStatus::Expired => "expired",
            DecisionStatus::Cancelled => "cancelled",
        }
    }
}

/// The call an approval is about: it is issued only once approved, and
/// only with exactly this request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposedCall {
    /// Kind.
    pub kind: CallKind,
    /// Tool id.
    pub target: String,
    /// Class.
    pub side_effect_class: Option<SideEffectClass>,
    /// Artifact reference of the request.
    pub request_hash: String,
    /// The policy decision that asked for approval.
    pub policy_decision_id: Uuid,
}

impl ProposedCall {
    /// `proposalHash`: what exactly is approved.
    pub fn hash(&self) -> String {
        json_hash(&json!({
            "kind": self.kind.as_str(),
            "target": self.target,
            "requestHash": self.request_hash,
        }))
    }
}

/// A human decision the attempt waits for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRequest {
    /// The decision.
    pub decision_id: Uuid,
    /// Its attempt.
    pub attempt_id: Uuid,
    /// Its run.
    pub run_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// Approval, input or escalation.
    pub kind: DecisionKind,
    /// The Run Control approval (approvals only).
    pub approval_id: Option<Uuid>,
    /// What is to be approved (approvals only).
    pub proposal: Option<ProposedCall>,
    /// Hash of the proposal.
    pub proposal_hash: Option<String>,
    /// Artifact reference of the question put to the human.
    pub question_ref: Option<String>,
    /// A one-line summary for lists (never payload content).
    pub summary: String,
    /// Choices (escalations).
    pub options: Vec<String>,
    /// The attempt's recommendation among them.
    pub recommendation: Option<String>,
    /// Where it is.
    pub status: DecisionStatus,
    /// Asked at.
    pub requested_at: DateTime<Utc>,
    /// Expires at (Runtime:Decisions:InputTimeoutMinutes).
    pub expires_at: DateTime<Utc>,
    /// Answered at.
    pub answered_at: Option<DateTime<Utc>>,
    /// Who answered.
    pub answered_by: Option<String>,
    /// The chosen option (escalations).
    pub choice: Option<String>,
    /// Artifact reference of the answer (input).
    pub answer_ref: Option<String>,
    /// The reviewer's reason.
    pub reason: Option<String>,
    /// For an approval: whether the approved call has been issued.
    pub consumed: bool,
    /// A rejection that responds: the reviewer's reason went back to the
    /// agent, which goes on without the call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub responded: bool,
    /// Who is expected to answer: the asker's choice, else the release
    /// policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub assignee: Option<crate::domain::access::Assignee>,
    /// The arguments a reviewer approved instead of the proposed ones
    /// (their artifact reference): the approval allows the call with
    /// these, and `proposal_hash` is that call's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_request_hash: Option<String>,
    /// The JSON Schema an input answer must satisfy, when the asker gave
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_schema: Option<serde_json::Value>,
    /// The model's tool call that asked (builtin `ask` and `escalate`
    /// tools): a resumed loop finds its answer here instead of asking
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Where purged content was: the references above stay (hashes and
    /// contracts still hold), the content is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged: Option<crate::domain::retention::Tombstone>,
}

impl DecisionRequest {
    /// Whether a person can approve or reject it now: a pending approval.
    pub fn awaits_approval(&self) -> bool {
        self.kind == DecisionKind::Approval && self.status == DecisionStatus::Pending
    }

    /// The attempt stopped before anyone answered.
    pub fn cancel(&mut self, now: DateTime<Utc>) {
        if self.status == DecisionStatus::Pending {
            self.status = DecisionStatus::Cancelled;
            self.answered_at = Some(now);
        }
    }
}

/// A child run delegated by a supervisor attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubAgentDelegation {
    /// The delegation.
    pub delegation_id: Uuid,
    /// The supervisor attempt.
    pub attempt_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// The child run.
    pub child_run_id: Uuid,
    /// The child's agent.
    pub child_agent_id: String,
    /// The child's release.
    pub child_release_id: String,
    /// Why.
    pub purpose: String,
    /// 1 for a child of a top-level run.
    pub depth: u32,
    /// submitted, then the child run's final state.
    pub status: String,
    /// The sub-agent call it belongs to.
    pub call_id: Uuid,
    /// Submitted at.
    pub created_at: DateTime<Utc>,
}

impl SubAgentDelegation {
    /// The child run ended in `state`.
    pub fn child_ended(&mut self, state: &str) {
        self.status = state.to_string();
    }

    /// The stored id within the tenant: `<attempt>/<delegation>`.
    pub fn key(attempt_id: Uuid, delegation_id: Uuid) -> String {
        format!("{attempt_id}/{delegation_id}")
    }
}

/// What every outbound call of an attempt carries, so that the site's tool
/// or model server can refuse a call from an attempt that lost its lease
/// (a stale fencing token) and tie what it did to the attempt's records:
/// in HTTP headers for model requests, in the request's `_meta` (keys with
/// the `agentbay/` prefix) for MCP calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallFence {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its fencing token: a server that has seen a higher one for the
    /// attempt's run refuses this call.
    pub fencing_token: u64,
    /// The call.
    pub call_id: Uuid,
    /// The policy decision that let it through.
    pub policy_decision_id: Option<Uuid>,
}

impl CallFence {
    /// The prefix of the keys in an MCP request's `_meta`.
    pub const META_PREFIX: &'static str = "agentbay/";

    /// The HTTP headers of a model request.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("Agentbay-Attempt-Id", self.attempt_id.to_string()),
            ("Agentbay-Fencing-Token", self.fencing_token.to_string()),
            ("Agentbay-Call-Id", self.call_id.to_string()),
        ];
        if let Some(p) = self.policy_decision_id {
            h.push(("Agentbay-Policy-Decision-Id", p.to_string()));
        }
        h
    }

    /// The `_meta` entries of an MCP request: `agentbay/attemptId`,
    /// `agentbay/fencingToken` (a number), `agentbay/callId` and
    /// `agentbay/policyDecisionId`.
    pub fn meta(&self) -> serde_json::Map<String, serde_json::Value> {
        let key = |k: &str| format!("{}{k}", Self::META_PREFIX);
        let mut m = serde_json::Map::new();
        m.insert(key("attemptId"), self.attempt_id.to_string().into());
        m.insert(key("fencingToken"), self.fencing_token.into());
        m.insert(key("callId"), self.call_id.to_string().into());
        if let Some(p) = self.policy_decision_id {
            m.insert(key("policyDecisionId"), p.to_string().into());
        }
        m
    }
}
