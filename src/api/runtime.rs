//! Runtime routes: an attempt's timeline and checkpoints, and a live watch
//! of it over SSE for the console. Also the input helpers the runtime's RPC
//! services share.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use chrono::{DateTime, Utc};
use futures::Stream;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::capacity::query_pairs;
use super::error::ApiError;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::auth::Principal;
use crate::domain::access::TenantScope;
use crate::domain::attempt::{
    AttemptFailure, AttemptLease, AttemptPhase, AttemptState, AttemptUsage, CallKind, CallRecord,
    CallStatus, CapacityGap, Checkpoint, CheckpointReason, DecisionRequest, InterruptRequest,
    PhaseMark, ReplayOf, Settlement, StaleRefusal, SubAgentDelegation,
};
use crate::domain::ids::parse_uuid;
use crate::domain::release::{AdapterKind, AttemptLimits, PolicyRule, SideEffectClass};
use crate::domain::retention::Tombstone;
use crate::domain::run::RerunOrigin;
use crate::domain::run::RunState;
use crate::domain::{DomainError, FieldError, ProjectId, TenantId};
use crate::runtime::content::{CallContent, OutcomeContent};
use crate::runtime::{PendingDecision, RuntimeError};

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Domain(d) => d.into(),
            RuntimeError::Store(s) => DomainError::from(s).into(),
        }
    }
}

/// A JSON document in a string field, named on failure.
pub fn parse_json(field: &str, text: &str) -> Result<Value, FieldError> {
    if text.trim().is_empty() {
        return Err(FieldError::new(field, "is required: a JSON document"));
    }
    serde_json::from_str(text)
        .map_err(|e| FieldError::new(field, format!("is not valid JSON: {e}")))
}

/// A run state filter.
pub fn parse_state(text: &str) -> Result<RunState, FieldError> {
    RunState::parse(text).ok_or_else(|| {
        FieldError::new(
            "state",
            format!("{text:?} is not Running, Succeeded, Failed, TimedOut, Cancelled or Uncertain"),
        )
    })
}

/// The tenant a request acts for: `?tenant=` (checked against the
/// caller's reach), else the caller's own.
pub(crate) fn scope_of(principal: &Principal, raw: Option<&str>) -> Result<TenantScope, ApiError> {
    let pairs = query_pairs(raw, &["tenant"])?;
    match pairs.iter().find(|(k, _)| k == "tenant") {
        Some((_, t)) => Ok(principal.scope_for(&TenantId::parse_field("tenant", t)?)?),
        None => Ok(principal.tenant_scope()),
    }
}

/// Where retention removed content: when, by whose retention, in words.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneBody {
    /// When the content was removed.
    pub purged_at: DateTime<Utc>,
    /// The tenant whose retention removed it.
    pub tenant_id: TenantId,
    /// The payload retention in force then, in days.
    pub payload_days: u32,
    /// The same in words.
    pub description: String,
}

impl TombstoneBody {
    fn of(t: Option<&Tombstone>) -> Option<TombstoneBody> {
        t.map(|t| TombstoneBody {
            purged_at: t.purged_at,
            tenant_id: t.tenant_id.clone(),
            payload_days: t.payload_days,
            description: t.describe(),
        })
    }
}

/// A checkpoint as the API shows it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointBody {
    /// The checkpoint.
    pub checkpoint_id: Uuid,
    /// 1-based, in the attempt.
    pub sequence: u32,
    /// The attempt's phase when it was taken.
    pub phase: AttemptPhase,
    /// The adapter that wrote it.
    pub adapter_version: String,
    /// Its format.
    pub checkpoint_format: u32,
    /// Artifact reference of the adapter's state.
    pub adapter_state_ref: String,
    /// Artifact reference of the context snapshot, if one was taken.
    pub context_snapshot_ref: Option<String>,
    /// SHA-256 over the checkpoint's content.
    pub hash: String,
    /// Why it was taken.
    pub reason: CheckpointReason,
    /// The call it precedes or follows, for call checkpoints.
    pub call_id: Option<Uuid>,
    /// Kept as evidence (the compactor never removes it).
    pub evidence: bool,
    /// Calls of the attempt before it.
    pub calls_before: Option<u32>,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Set once retention removed its state.
    pub purged: Option<TombstoneBody>,
}

impl From<&Checkpoint> for CheckpointBody {
    fn from(c: &Checkpoint) -> Self {
        CheckpointBody {
            checkpoint_id: c.checkpoint_id,
            sequence: c.sequence,
            phase: c.phase,
            adapter_version: c.adapter_version.clone(),
            checkpoint_format: c.checkpoint_format,
            adapter_state_ref: c.adapter_state_ref.clone(),
            context_snapshot_ref: c.context_snapshot_ref.clone(),
            hash: c.hash.clone(),
            reason: c.reason,
            call_id: c.call_id,
            evidence: c.evidence,
            calls_before: c.calls_before,
            created_at: c.created_at,
            purged: TombstoneBody::of(c.purged.as_ref()),
        }
    }
}

/// A call as the API shows it: what was asked, under which policy, and
/// what came of it, by hash and reference.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallBody {
    /// The call.
    pub call_id: Uuid,
    /// 1-based, in the attempt.
    pub sequence: u32,
    /// model, tool or sub-agent.
    pub kind: CallKind,
    /// The tool, model profile or agent.
    pub target: String,
    /// A tool's side-effect class.
    pub side_effect_class: Option<SideEffectClass>,
    /// SHA-256 of the request.
    pub request_hash: String,
    /// The policy decision that let it through.
    pub policy_decision_id: Option<Uuid>,
    /// What the release's policy said of it.
    pub policy_rule: Option<PolicyRule>,
    /// The approval it waited for, if gated.
    pub approval_id: Option<Uuid>,
    /// Artifact reference of its receipt.
    pub receipt_ref: Option<String>,
    /// What served a model call (the site endpoint).
    pub served_by: Option<String>,
    /// SHA-256 of the result.
    pub result_hash: Option<String>,
    /// Where it is.
    pub status: CallStatus,
    /// Why it failed.
    pub error: Option<String>,
    /// The checkpoint taken before it.
    pub pre_checkpoint_id: Option<Uuid>,
    /// The fencing token it was issued under.
    pub fencing_token: u64,
    /// Started.
    pub started_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// A receipt reported after it was settled as uncertain.
    pub late_receipt_ref: Option<String>,
    /// How an operator settled it, if it was uncertain.
    pub settlement: Option<Settlement>,
    /// The source call a re-run answered it from.
    pub replay_of: Option<ReplayOf>,
    /// Set once retention removed its content.
    pub purged: Option<TombstoneBody>,
    /// The tokens a model call used, as its server counted them.
    pub usage: Option<crate::domain::usage::TokenUsage>,
    /// Milliseconds the call took (a model call: as measured where the
    /// model was called).
    pub latency_ms: Option<u64>,
}

impl From<&CallRecord> for CallBody {
    fn from(c: &CallRecord) -> Self {
        CallBody {
            call_id: c.call_id,
            sequence: c.sequence,
            kind: c.kind,
            target: c.target.clone(),
            side_effect_class: c.side_effect_class,
            request_hash: c.request_hash.clone(),
            policy_decision_id: c.policy_decision_id,
            policy_rule: c.policy_rule,
            approval_id: c.approval_id,
            receipt_ref: c.receipt_ref.clone(),
            served_by: c.served_by.clone(),
            result_hash: c.result_hash.clone(),
            status: c.status,
            error: c.error.clone(),
            pre_checkpoint_id: c.pre_checkpoint_id,
            fencing_token: c.fencing_token,
            started_at: c.started_at,
            ended_at: c.ended_at,
            late_receipt_ref: c.late_receipt_ref.clone(),
            settlement: c.settlement.clone(),
            replay_of: c.replay_of.clone(),
            purged: TombstoneBody::of(c.purged.as_ref()),
            usage: c.usage,
            latency_ms: c.latency_ms,
        }
    }
}

/// An attempt's capacity: its lease and, while it waits, why.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBody {
    /// The capacity lease it holds or asked for.
    pub lease_id: Option<Uuid>,
    /// Whether the lease is granted.
    pub granted: bool,
    /// 1-based place in the pool's queue while it waits.
    pub queue_position: Option<usize>,
    /// The quota that holds it back, if one does.
    pub limiting_quota: Option<String>,
    /// Why it waits, in words.
    pub reason: Option<String>,
    /// Each stretch it spent without capacity.
    pub gaps: Vec<CapacityGap>,
    /// The run whose run slot (`concurrentRuns`) it counts in: its own
    /// run, or for a delegated child run its top-level run.
    pub run_slot: Uuid,
    /// Whether that run holds its slot now: from the grant of its first
    /// lease to its end, also while the attempt gave its CPU and memory
    /// back.
    pub run_slot_held: bool,
}

/// One stretch of an attempt's timeline: the state and loop phase it was
/// in, from when, and how long (to the next mark, or to the end or now).
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseSpan {
    /// When it began.
    pub at: DateTime<Utc>,
    /// The state.
    pub state: AttemptState,
    /// The loop phase.
    pub phase: AttemptPhase,
    /// How long it lasted (so far, for the last one), in milliseconds.
    pub duration_ms: i64,
}

impl PhaseSpan {
    /// The spans of `marks`, the last one lasting until `end`.
    pub fn of(marks: &[PhaseMark], end: DateTime<Utc>) -> Vec<PhaseSpan> {
        marks
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let until = marks.get(i + 1).map_or(end, |n| n.at);
                PhaseSpan {
                    at: m.at,
                    state: m.state,
                    phase: m.phase,
                    duration_ms: (until - m.at).num_milliseconds().max(0),
                }
            })
            .collect()
    }
}

/// An attempt's timeline: where it is and why, and everything it did.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its run.
    pub run_id: Uuid,
    /// Its step of the run.
    pub step_id: Uuid,
    /// 1-based, in its step.
    pub number: u32,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its project.
    pub project_id: ProjectId,
    /// The release it runs.
    pub release_id: String,
    /// The release's agent.
    pub agent_id: String,
    /// The context snapshot it started from.
    pub snapshot_id: Uuid,
    /// The model profile it calls.
    pub model_profile_id: String,
    /// Who runs its loop.
    pub adapter: AdapterKind,
    /// The adapter and checkpoint format it runs with.
    pub adapter_version: String,
    /// Its state.
    pub state: AttemptState,
    /// Its phase.
    pub phase: AttemptPhase,
    /// Its fencing token: every write it makes carries it.
    pub fencing_token: u64,
    /// Its attempt lease (the runtime's, not capacity).
    pub lease_id: Uuid,
    /// Who holds the attempt lease and until when.
    pub lease: AttemptLease,
    /// Why it waits, while it does.
    pub waiting_reason: Option<String>,
    /// The decision it waits for, while it does.
    pub pending_decision: Option<PendingDecision>,
    /// Its capacity.
    pub capacity: CapacityBody,
    /// Its limits.
    pub limits: AttemptLimits,
    /// What it used of them.
    pub usage: AttemptUsage,
    /// Output corrections so far.
    pub correction_count: u32,
    /// At most.
    pub max_corrections: u32,
    /// An interrupt asked of it.
    pub interrupt: Option<InterruptRequest>,
    /// Why its lease could not be renewed, while it could not.
    pub renewal_failure: Option<String>,
    /// Why it is paused.
    pub pause_reason: Option<String>,
    /// Why it failed.
    pub failure: Option<AttemptFailure>,
    /// Artifact reference of its output.
    pub output_ref: Option<String>,
    /// SHA-256 of its outcome.
    pub outcome_hash: Option<String>,
    /// When it saw its run's cancellation.
    pub cancellation_observed_at: Option<DateTime<Utc>>,
    /// Why a resume was refused.
    pub resume_refused: Option<String>,
    /// Started.
    pub started_at: DateTime<Utc>,
    /// Ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// Each state and phase it was in, from when and for how long.
    pub phases: Vec<PhaseSpan>,
    /// Writes refused for a stale fencing token.
    pub stale_refusals: Vec<StaleRefusal>,
    /// Set once retention removed its content.
    pub purged: Option<TombstoneBody>,
    /// Its checkpoints in order.
    pub checkpoints: Vec<CheckpointBody>,
    /// Its calls in order (each one's content is `GetCall`).
    pub calls: Vec<CallBody>,
    /// The decisions it asked for.
    pub decisions: Vec<DecisionRequest>,
    /// The child runs it delegated to.
    pub delegations: Vec<SubAgentDelegation>,
    /// Its output and, when verification refused it, the violations.
    pub outcome: OutcomeContent,
    /// Where a re-run came from.
    pub rerun_of: Option<RerunOrigin>,
}

/// The timeline of an attempt as the API shows it.
pub fn timeline(
    state: &AppState,
    scope: &TenantScope,
    attempt_id: Uuid,
) -> Result<Timeline, ApiError> {
    let runtime = &state.runtime;
    let view = runtime.view(scope, attempt_id)?;
    let a = &view.attempt;
    Ok(Timeline {
        attempt_id: a.attempt_id,
        run_id: a.run_id,
        step_id: a.step_id,
        number: a.number,
        tenant_id: a.tenant_id.clone(),
        project_id: a.project_id.clone(),
        release_id: a.release_id.clone(),
        agent_id: a.agent_id.clone(),
        snapshot_id: a.snapshot_id,
        model_profile_id: a.model_profile_id.clone(),
        adapter: a.adapter,
        adapter_version: a.adapter_version.clone(),
        state: a.state,
        phase: a.phase,
        fencing_token: a.fencing_token,
        lease_id: a.lease_id,
        lease: a.lease.clone(),
        waiting_reason: runtime.waiting_reason(&view),
        pending_decision: view
            .decision
            .as_ref()
            .map(|d| state.runtime.pending_decision(scope, d)),
        capacity: CapacityBody {
            lease_id: a.capacity_lease_id,
            granted: a.capacity_granted,
            queue_position: view.queue_position,
            limiting_quota: view.limiting_quota.clone(),
            reason: view.capacity_reason.clone(),
            gaps: a.capacity_gaps.clone(),
            run_slot: a.run_slot(),
            run_slot_held: state.capacity.holds_slot(a.run_slot()),
        },
        limits: a.limits,
        usage: a.usage,
        correction_count: a.correction_count,
        max_corrections: a.max_corrections,
        interrupt: a.interrupt.clone(),
        renewal_failure: a.renewal_failure.clone(),
        pause_reason: state.runtime.pause_reason(a),
        failure: a.failure.clone(),
        output_ref: a.output_ref.clone(),
        outcome_hash: a.outcome_hash.clone(),
        cancellation_observed_at: a.cancellation_observed_at,
        resume_refused: a.resume_refused.clone(),
        started_at: a.started_at,
        ended_at: a.ended_at,
        phases: PhaseSpan::of(&a.phases, a.ended_at.unwrap_or(state.clock.now())),
        stale_refusals: a.stale_refusals.clone(),
        purged: TombstoneBody::of(a.purged.as_ref()),
        checkpoints: runtime
            .checkpoints(scope, attempt_id)?
            .iter()
            .map(CheckpointBody::from)
            .collect(),
        calls: runtime
            .calls(scope, attempt_id)?
            .iter()
            .map(CallBody::from)
            .collect(),
        decisions: runtime.decisions(scope, attempt_id)?,
        delegations: runtime.delegations(scope, attempt_id)?,
        outcome: runtime.outcome_content(scope, a),
        rerun_of: a.rerun_of.clone(),
    })
}

/// A call with its content.
#[derive(Serialize, ToSchema)]
pub struct CallDetail {
    /// The call.
    #[serde(flatten)]
    pub call: CallBody,
    /// What it asked and answered.
    pub content: CallContent,
}

/// An attempt's checkpoints, for a resume or re-run decision.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointList {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its state.
    pub state: AttemptState,
    /// Its newest checkpoint.
    pub last_checkpoint_id: Option<Uuid>,
    /// The adapter and checkpoint format it runs with.
    pub adapter_version: String,
    /// Its checkpoint format.
    pub checkpoint_format: u32,
    /// Each checkpoint, in order.
    pub checkpoints: Vec<CheckpointBody>,
}

/// One update of a watched attempt (the SSE event `attempt`).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptUpdate {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its state.
    pub state: AttemptState,
    /// Its phase.
    pub phase: AttemptPhase,
    /// Checkpoints taken so far.
    pub checkpoints: u32,
    /// Its newest checkpoint.
    pub last_checkpoint_id: Option<Uuid>,
    /// Why it waits, while it does.
    pub waiting_reason: Option<String>,
    /// The decision it waits for, while it does.
    pub pending_decision: Option<PendingDecision>,
    /// 1-based place in its pool's queue while it waits for capacity.
    pub queue_position: Option<usize>,
    /// An interrupt asked of it.
    pub interrupt: Option<InterruptRequest>,
    /// SHA-256 of its outcome.
    pub outcome_hash: Option<String>,
    /// The attempt's version: the event's id.
    pub version: u64,
}

/// `GetAttemptTimeline`: phases, checkpoints, calls (hashes and receipt
/// references; each call's content is `GetCall`), decisions, the outcome
/// with its output and the validator's violations, and why it waits.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt")),
    responses(
        (status = 200, description = "The timeline", body = Timeline),
        (status = 404, description = "No such attempt in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn get_attempt(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Timeline>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    Ok(Json(timeline(&state, &scope, id)?))
}

/// `GetCall`: one call of an attempt with its content: the request (for a
/// model call also as a conversation), the result (for a model call also
/// as the assistant's reply), the receipts. Purged content shows its
/// tombstone; the hashes stay.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}/calls/{callId}", tag = "runtime",
    params(
        ("attemptId" = String, Path, description = "The attempt"),
        ("callId" = String, Path, description = "The call"),
    ),
    responses(
        (status = 200, description = "The call and its content", body = CallDetail),
        (status = 404, description = "No such call in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn get_call(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path((attempt_id, call_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<CallDetail>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let attempt_id = parse_uuid("attemptId", &attempt_id)?;
    let call_id = parse_uuid("callId", &call_id)?;
    let call = state.runtime.call(&scope, attempt_id, call_id)?;
    let content = state.runtime.call_content(&scope, &call);
    Ok(Json(CallDetail {
        call: CallBody::from(&call),
        content,
    }))
}

/// `GetArtifact`: the whole content behind a hash of the caller's tenant,
/// as stored: JSON as `application/json`, text as `text/plain`, anything
/// else as a download. Never rendered as a page: it is sandboxed.
#[utoipa::path(get, path = "/runtime/artifacts/{hash}", tag = "runtime",
    params(("hash" = String, Path, description = "sha256:<hex>")),
    responses(
        (status = 200, description = "The content: JSON as application/json, text as text/plain, anything else as an attachment", content(
            (Value = "application/json"),
            (String = "text/plain"),
            (Vec<u8> = "application/octet-stream"),
        )),
        (status = 404, description = "No such content in the caller's tenant (or purged)"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn get_artifact(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(hash): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<axum::response::Response, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    artifact_response(&state, &scope, &hash)
}

/// The response of an artifact of the scope's tenant (the API's and the
/// console's).
pub fn artifact_response(
    state: &AppState,
    scope: &TenantScope,
    hash: &str,
) -> Result<axum::response::Response, ApiError> {
    use axum::http::header;
    use axum::response::IntoResponse;
    if !crate::domain::content::is_content_hash(hash) {
        return Err(
            FieldError::new("hash", format!("{hash:?} is not sha256:<64 hex digits>")).into(),
        );
    }
    let (record, bytes) = state.runtime.artifact(scope, hash)?;
    let media = record.media_type.as_str();
    let (content_type, disposition) = if media == "application/json" {
        ("application/json", "inline")
    } else if media.starts_with("text/") {
        ("text/plain; charset=utf-8", "inline")
    } else {
        ("application/octet-stream", "attachment")
    };
    let name = hash.trim_start_matches("sha256:");
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "{disposition}; filename=\"{}\"",
                    &name[..16.min(name.len())]
                ),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                "sandbox; default-src 'none'".to_string(),
            ),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        bytes,
    )
        .into_response())
}

/// `ListCheckpoints`: sequence, phase and adapter version of each, for a
/// resume decision.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}/checkpoints", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt")),
    responses(
        (status = 200, description = "Checkpoints in order", body = CheckpointList),
        (status = 404, description = "No such attempt in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<CheckpointList>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let attempt = state.runtime.attempt(&scope, id)?;
    let checkpoints = state
        .runtime
        .checkpoints(&scope, id)?
        .iter()
        .map(CheckpointBody::from)
        .collect();
    Ok(Json(CheckpointList {
        attempt_id: id,
        state: attempt.state,
        last_checkpoint_id: attempt.last_checkpoint_id,
        adapter_version: attempt.adapter_version,
        checkpoint_format: attempt.checkpoint_format,
        checkpoints,
    }))
}

/// A piece of model text as a server-sent event: named by its kind
/// (`text`, `superseded`, `ended`, `gap`), its id the offset a reader
/// reconnects from (`Last-Event-ID`), its data the piece as JSON.
pub(crate) fn text_event(piece: &crate::domain::text::TextPiece) -> Event {
    use crate::domain::text::PieceKind;
    let kind = match piece.kind {
        PieceKind::Text { .. } => "text",
        PieceKind::Superseded { .. } => "superseded",
        PieceKind::Ended => "ended",
        PieceKind::Gap { .. } => "gap",
    };
    let resume = match piece.kind {
        PieceKind::Gap { up_to } => up_to,
        _ => piece.end(),
    };
    Event::default()
        .event(kind)
        .id(resume.to_string())
        .data(serde_json::to_string(piece).expect("pieces serialise"))
}

/// Where a reader of model text starts: `Last-Event-ID`, else `?from=`.
pub(crate) fn text_from(headers: &HeaderMap, from: Option<&str>) -> Result<u64, ApiError> {
    let given = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| ("Last-Event-ID", v))
        .or(from.map(|v| ("from", v)));
    match given {
        None => Ok(0),
        Some((field, v)) => v.trim().parse().map_err(|_| {
            ApiError::invalid(field, format!("{v:?} is not a byte offset of the text"))
        }),
    }
}

/// The attempt's model text as it is written (SSE): from byte `from` of
/// its text stream (or `Last-Event-ID`), pieces of each model call's
/// answer coalesced about every 100 ms, a `superseded` marker when a call
/// failed and is tried again (discard its text), `ended` when a call's
/// answer is whole (it is then in the call's record). Ends once the
/// attempt has ended.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}/text", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt"),
           ("from" = Option<u64>, Query, description = "Byte offset of the text stream to start at (past the end: the end)")),
    responses((status = 200, description = "text/event-stream of model text: each event is named by its kind (text, superseded, ended, gap), its id the offset to resume from and its data a TextPiece (JSON)", content_type = "text/event-stream", body = super::events::ServerSentEvent)),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn model_text(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let pairs = query_pairs(raw.as_deref(), &["tenant", "from"])?;
    let scope = match pairs.iter().find(|(k, _)| k == "tenant") {
        Some((_, t)) => auth
            .principal
            .scope_for(&TenantId::parse_field("tenant", t)?)?,
        None => auth.principal.tenant_scope(),
    };
    let from = text_from(
        &headers,
        pairs
            .iter()
            .find(|(k, _)| k == "from")
            .map(|(_, v)| v.as_str()),
    )?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let pieces = state
        .runtime
        .model_text(&scope, id, from, state.shutdown.clone())?;
    let events = futures::StreamExt::map(pieces, |piece| Ok(text_event(&piece)));
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The attempt's state, phase and checkpoints as they happen (SSE, event
/// `attempt`); the stream ends after the final state.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}/watch", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt")),
    responses((status = 200, description = "text/event-stream of attempt updates: each event is `attempt`, its id the attempt's version and its data an AttemptUpdate (JSON)", content_type = "text/event-stream", body = super::events::ServerSentEvent)),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn watch_attempt(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let updates = state.runtime.updates(&scope, id, state.shutdown.clone())?;
    let runtime = state.runtime.clone();
    let events = futures::StreamExt::map(updates, move |view| {
        let a = &view.attempt;
        let update = AttemptUpdate {
            attempt_id: a.attempt_id,
            state: a.state,
            phase: a.phase,
            checkpoints: a.usage.checkpoints,
            last_checkpoint_id: a.last_checkpoint_id,
            waiting_reason: runtime.waiting_reason(&view),
            pending_decision: view
                .decision
                .as_ref()
                .map(|d| runtime.pending_decision(&scope, d)),
            queue_position: view.queue_position,
            interrupt: a.interrupt.clone(),
            outcome_hash: a.outcome_hash.clone(),
            version: a.version,
        };
        Ok(Event::default()
            .event("attempt")
            .id(a.version.to_string())
            .data(serde_json::to_string(&update).expect("updates serialise")))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
