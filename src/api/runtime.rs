//! Runtime routes: an attempt's timeline and checkpoints, and a live watch
//! of it over SSE for the console. Also the input helpers the runtime's RPC
//! services share.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde_json::{Value, json};
use uuid::Uuid;

use super::capacity::query_pairs;
use super::error::ApiError;
use crate::app::AppState;
use crate::auth::Principal;
use crate::auth::extract::{Authorized, need};
use crate::domain::attempt::{AttemptState, Checkpoint};
use crate::domain::ids::parse_uuid;
use crate::domain::run::RunState;
use crate::domain::{FieldError, TenantId};
use crate::runtime::grain::AttemptView;
use crate::runtime::{PendingDecision, RuntimeError};
use crate::store::{StoredEvent, TenantScope};

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Domain(d) => d.into(),
            RuntimeError::Store(s) => s.into(),
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

/// The attempt's views as they change, starting with the current one and
/// ending after the final one.
pub fn attempt_updates(
    state: &AppState,
    scope: &TenantScope,
    attempt_id: Uuid,
) -> Result<impl Stream<Item = std::sync::Arc<AttemptView>> + Send + use<>, RuntimeError> {
    let mut rx = state.runtime.watch(scope, attempt_id)?;
    let mut shutdown = state.shutdown.clone();
    let (runtime, scope) = (state.runtime.clone(), scope.clone());
    Ok(async_stream(move |yield_| async move {
        let mut last = 0u64;
        loop {
            let view = rx.borrow_and_update().clone();
            if view.attempt.version != last || view.attempt.state.is_terminal() {
                last = view.attempt.version;
                let done = view.attempt.state.is_terminal();
                if yield_.send(view).await.is_err() || done {
                    return;
                }
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    // The grain ended: the stored attempt is the last word.
                    if let Ok(v) = runtime.view(&scope, attempt_id) {
                        let _ = yield_.send(v).await;
                    }
                    return;
                },
                _ = shutdown.changed() => return,
            }
        }
    }))
}

/// Every event of an attempt after `after`, in outbox order (read through
/// the attempt's event index, then live as each becomes durable), until
/// the attempt has ended and all its events are delivered. Nothing is
/// coalesced: a reader that resumes with the last sequence it got misses
/// nothing and gets nothing twice.
pub fn attempt_events(
    state: &AppState,
    scope: &TenantScope,
    attempt_id: Uuid,
    after: u64,
) -> Result<impl Stream<Item = Arc<StoredEvent>> + Send + use<>, RuntimeError> {
    // The attempt exists in the caller's tenant (or this is NotFound).
    state.runtime.attempt(scope, attempt_id)?;
    let (store, runtime, scope) = (state.store.clone(), state.runtime.clone(), scope.clone());
    let mut shutdown = state.shutdown.clone();
    let id = attempt_id.to_string();
    Ok(async_stream(move |yield_| async move {
        let mut live = store.subscribe();
        let mut last = after;
        loop {
            // The attempt's grain is gone only once its last write is
            // durable: then everything it emitted is in the backlog.
            let ended = !runtime.is_live(&scope, attempt_id)
                && runtime
                    .attempt(&scope, attempt_id)
                    .is_ok_and(|a| a.state.is_terminal());
            loop {
                let batch = match store.attempt_events_after(&scope, attempt_id, last, 256) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(attempt = %attempt_id, error = %e, "attempt event stream stopped");
                        return;
                    }
                };
                let full = batch.len() == 256;
                for event in batch {
                    last = event.sequence;
                    if yield_.send(event).await.is_err() {
                        return;
                    }
                }
                if !full {
                    break;
                }
            }
            if ended {
                return;
            }
            // Wait for the next durable event of the attempt (or its end).
            loop {
                let received = tokio::select! {
                    r = live.recv() => r,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => break,
                    _ = shutdown.changed() => return,
                    _ = yield_.closed() => return,
                };
                match received {
                    Ok(event) => {
                        if event.sequence <= last
                            || event.tenant_id != *scope.tenant()
                            || event.attempt_id() != Some(id.as_str())
                        {
                            continue;
                        }
                        last = event.sequence;
                        let terminal = event
                            .payload
                            .get("state")
                            .and_then(|s| s.as_str())
                            .and_then(AttemptState::parse)
                            .is_some_and(AttemptState::is_terminal);
                        if yield_.send(event).await.is_err() {
                            return;
                        }
                        if terminal {
                            // The rest of its last transaction, then the end.
                            break;
                        }
                    }
                    // Fell behind the broadcast: read the backlog again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }))
}

/// A stream fed by a producer task over a small channel.
pub(crate) fn async_stream<T, F, Fut>(produce: F) -> impl Stream<Item = T> + Send + use<T, F, Fut>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn scope_of(principal: &Principal, raw: Option<&str>) -> Result<TenantScope, ApiError> {
    let pairs = query_pairs(raw, &["tenant"])?;
    match pairs.iter().find(|(k, _)| k == "tenant") {
        Some((_, t)) => Ok(principal.scope_for(&TenantId::parse_field("tenant", t)?)?),
        None => Ok(principal.tenant_scope()),
    }
}

fn checkpoint_json(c: &Checkpoint) -> Value {
    json!({
        "checkpointId": c.checkpoint_id,
        "sequence": c.sequence,
        "phase": c.phase.as_str(),
        "adapterVersion": c.adapter_version,
        "checkpointFormat": c.checkpoint_format,
        "adapterStateRef": c.adapter_state_ref,
        "contextSnapshotRef": c.context_snapshot_ref,
        "hash": c.hash,
        "reason": c.reason.as_str(),
        "callId": c.call_id,
        "evidence": c.evidence,
        "callsBefore": c.calls_before,
        "createdAt": c.created_at,
        "purged": tombstone_json(c.purged.as_ref()),
    })
}

/// Where retention removed content: when, by whose retention, in words.
/// `null` while the content is there.
pub fn tombstone_json(t: Option<&crate::domain::retention::Tombstone>) -> Value {
    match t {
        None => Value::Null,
        Some(t) => json!({
            "purgedAt": t.purged_at,
            "tenantId": t.tenant_id,
            "payloadDays": t.payload_days,
            "description": t.describe(),
        }),
    }
}

fn call_json(c: &crate::domain::attempt::CallRecord) -> Value {
    json!({
        "callId": c.call_id,
        "sequence": c.sequence,
        "kind": c.kind.as_str(),
        "target": c.target,
        "sideEffectClass": c.side_effect_class.map(|s| s.as_str()),
        "requestHash": c.request_hash,
        "policyDecisionId": c.policy_decision_id,
        "policyRule": c.policy_rule,
        "approvalId": c.approval_id,
        "receiptRef": c.receipt_ref,
        "servedBy": c.served_by,
        "resultHash": c.result_hash,
        "status": c.status.as_str(),
        "error": c.error,
        "preCheckpointId": c.pre_checkpoint_id,
        "fencingToken": c.fencing_token,
        "startedAt": c.started_at,
        "endedAt": c.ended_at,
        "lateReceiptRef": c.late_receipt_ref,
        "settlement": c.settlement,
        "replayOf": c.replay_of,
        "purged": tombstone_json(c.purged.as_ref()),
    })
}

/// The timeline of an attempt as the API shows it.
pub fn timeline(
    state: &AppState,
    scope: &TenantScope,
    attempt_id: Uuid,
) -> Result<Value, ApiError> {
    let runtime = &state.runtime;
    let view = runtime.view(scope, attempt_id)?;
    let a = &view.attempt;
    let checkpoints: Vec<Value> = runtime
        .checkpoints(scope, attempt_id)?
        .iter()
        .map(checkpoint_json)
        .collect();
    let calls = runtime.calls(scope, attempt_id)?;
    let decisions = runtime.decisions(scope, attempt_id)?;
    let delegations = runtime.delegations(scope, attempt_id)?;
    let mut out = json!({
        "attemptId": a.attempt_id,
        "runId": a.run_id,
        "stepId": a.step_id,
        "number": a.number,
        "tenantId": a.tenant_id,
        "projectId": a.project_id,
        "releaseId": a.release_id,
        "agentId": a.agent_id,
        "snapshotId": a.snapshot_id,
        "modelProfileId": a.model_profile_id,
        "adapter": a.adapter.as_str(),
        "adapterVersion": a.adapter_version,
        "state": a.state.as_str(),
        "phase": a.phase.as_str(),
        "fencingToken": a.fencing_token,
        "leaseId": a.lease_id,
        "lease": a.lease,
        "waitingReason": view.waiting_reason(),
        "pendingDecision": view
            .decision
            .as_ref()
            .map(|d| PendingDecision::read(&state.store, scope, d)),
        "capacity": {
            "leaseId": a.capacity_lease_id,
            "granted": a.capacity_granted,
            "queuePosition": view.queue_position,
            "limitingQuota": view.limiting_quota,
            "reason": view.capacity_reason,
            "gaps": a.capacity_gaps,
        },
        "limits": a.limits,
        "usage": a.usage,
        "correctionCount": a.correction_count,
        "maxCorrections": a.max_corrections,
        "interrupt": a.interrupt,
        "renewalFailure": a.renewal_failure,
        "pauseReason": a.pause_reason,
        "failure": a.failure,
        "outputRef": a.output_ref,
        "outcomeHash": a.outcome_hash,
        "cancellationObservedAt": a.cancellation_observed_at,
        "resumeRefused": a.resume_refused,
        "startedAt": a.started_at,
        "endedAt": a.ended_at,
        "phases": a.phases,
        "staleRefusals": a.stale_refusals,
        "purged": tombstone_json(a.purged.as_ref()),
        "checkpoints": checkpoints,
        "calls": calls.iter().map(call_json).collect::<Vec<_>>(),
        "decisions": decisions,
        "delegations": delegations,
    });
    out["outcome"] = serde_json::to_value(runtime.outcome_content(scope, a)).expect("serialises");
    out["rerunOf"] = serde_json::to_value(&a.rerun_of).expect("serialises");
    Ok(out)
}

/// `GetAttemptTimeline`: phases, checkpoints, calls (hashes and receipt
/// references; each call's content is `GetCall`), decisions, the outcome
/// with its output and the validator's violations, and why it waits.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt")),
    responses(
        (status = 200, description = "The timeline", body = Object),
        (status = 404, description = "No such attempt in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn get_attempt(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
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
        (status = 200, description = "The call and its content", body = Object),
        (status = 404, description = "No such call in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn get_call(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path((attempt_id, call_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let attempt_id = parse_uuid("attemptId", &attempt_id)?;
    let call_id = parse_uuid("callId", &call_id)?;
    let call = state.runtime.call(&scope, attempt_id, call_id)?;
    let content = state.runtime.call_content(&scope, &call);
    let mut out = call_json(&call);
    out["content"] = serde_json::to_value(content).expect("content serialises");
    Ok(Json(out))
}

/// `GetArtifact`: the whole content behind a hash of the caller's tenant,
/// as stored: JSON as `application/json`, text as `text/plain`, anything
/// else as a download. Never rendered as a page: it is sandboxed.
#[utoipa::path(get, path = "/runtime/artifacts/{hash}", tag = "runtime",
    params(("hash" = String, Path, description = "sha256:<hex>")),
    responses(
        (status = 200, description = "The content"),
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
    if !crate::store::artifacts::is_content_hash(hash) {
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
        (status = 200, description = "Checkpoints in order", body = Object),
        (status = 404, description = "No such attempt in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let attempt = state.runtime.attempt(&scope, id)?;
    let checkpoints: Vec<Value> = state
        .runtime
        .checkpoints(&scope, id)?
        .iter()
        .map(checkpoint_json)
        .collect();
    Ok(Json(json!({
        "attemptId": id,
        "state": attempt.state.as_str(),
        "lastCheckpointId": attempt.last_checkpoint_id,
        "adapterVersion": attempt.adapter_version,
        "checkpointFormat": attempt.checkpoint_format,
        "checkpoints": checkpoints,
    })))
}

/// The attempt's state, phase and checkpoints as they happen (SSE, event
/// `attempt`); the stream ends after the final state.
#[utoipa::path(get, path = "/runtime/attempts/{attemptId}/watch", tag = "runtime",
    params(("attemptId" = String, Path, description = "The attempt")),
    responses((status = 200, description = "text/event-stream of attempt views")),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn watch_attempt(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let scope = scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let updates = attempt_updates(&state, &scope, id)?;
    let store = state.store.clone();
    let events = futures::StreamExt::map(updates, move |view| {
        let a = &view.attempt;
        let data = json!({
            "attemptId": a.attempt_id,
            "state": a.state.as_str(),
            "phase": a.phase.as_str(),
            "checkpoints": a.usage.checkpoints,
            "lastCheckpointId": a.last_checkpoint_id,
            "waitingReason": view.waiting_reason(),
            "pendingDecision": view
                .decision
                .as_ref()
                .map(|d| PendingDecision::read(&store, &scope, d)),
            "queuePosition": view.queue_position,
            "interrupt": a.interrupt,
            "outcomeHash": a.outcome_hash,
            "version": a.version,
        });
        Ok(Event::default()
            .event("attempt")
            .id(a.version.to_string())
            .data(data.to_string()))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
