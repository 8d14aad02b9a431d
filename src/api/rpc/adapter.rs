//! `agentbay.adapter.v1.Adapter`: the RPC an external execution adapter
//! runs its loop through. Every method needs `factory.runs.execute` and
//! acts in the caller's tenant.

use std::time::Duration;

use connectrpc::{RequestContext, Response, ServiceRequest, ServiceResult};

use super::{principal, time};
use crate::api::AppState;
use crate::api::error::rpc;
use crate::api::runtime::parse_json;
use crate::domain::FieldError;
use crate::domain::attempt::{
    AttemptPhase, CallKind, DecisionKind, ErrorDetail, ExecutionAttempt, FailureClass,
};
use crate::domain::ids::{optional_uuid, required_uuid};
use crate::domain::release::canonical_json;
use crate::proto::agentbay::adapter::v1 as pb;
use crate::runtime::builtin::{ModelAsk, adapter_model_call};
use crate::runtime::text::Written;
use crate::runtime::{self, BeginOutcome, Outcome};

/// The Adapter service.
pub struct AdapterService {
    state: AppState,
}

impl AdapterService {
    /// Serves the Adapter RPCs.
    pub fn new(state: AppState) -> Self {
        AdapterService { state }
    }
}

fn status(a: &ExecutionAttempt) -> pb::AttemptStatus {
    pb::AttemptStatus {
        attempt_id: a.attempt_id.to_string(),
        state: a.state.as_str().to_string(),
        phase: a.phase.as_str().to_string(),
        fencing_token: a.fencing_token,
        interrupt_requested: a.interrupt.is_some(),
        interrupt_reason: a
            .interrupt
            .as_ref()
            .map(|i| i.reason.clone())
            .unwrap_or_default(),
        waiting_reason: a.waiting_reason().unwrap_or_default(),
        lease_expires_at: time(a.lease.expires_at),
        failure_class: a
            .failure
            .as_ref()
            .map(|f| f.class.as_str().to_string())
            .unwrap_or_default(),
        failure_reason: a
            .failure
            .as_ref()
            .map(|f| f.reason.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// A JSON document field as canonical bytes (absent when empty).
fn document(field: &str, text: &str) -> Result<Option<Vec<u8>>, FieldError> {
    if text.is_empty() {
        return Ok(None);
    }
    Ok(Some(canonical_json(&parse_json(field, text)?)))
}

impl AdapterService {
    /// A model call's request, checked: the attempt (one the caller may
    /// act on) first, then what the call carries.
    fn model_ask(
        &self,
        ctx: &RequestContext,
        request: &pb::CallModelRequestView<'_>,
    ) -> Result<
        (
            crate::domain::access::TenantScope,
            ExecutionAttempt,
            ModelAsk,
        ),
        connectrpc::ConnectError,
    > {
        let caller = principal(ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        // The attempt first: what its model call may carry is checked for
        // an attempt the caller may act on.
        let scope = caller.tenant_scope();
        let attempt = self.state.runtime.attempt(&scope, id).map_err(rpc)?;
        let array = |field: &str, text: &str| -> Result<Vec<serde_json::Value>, FieldError> {
            if text.is_empty() {
                return Ok(Vec::new());
            }
            match parse_json(field, text)? {
                serde_json::Value::Array(items) => Ok(items),
                _ => Err(FieldError::new(field, "must be a JSON array")),
            }
        };
        let ask = (|| -> Result<ModelAsk, FieldError> {
            let messages = array("messagesJson", request.messages_json)?;
            if messages.is_empty() {
                return Err(FieldError::new(
                    "messagesJson",
                    "must hold at least one message",
                ));
            }
            if let Some(i) = messages
                .iter()
                .position(|m| m.get("role").and_then(serde_json::Value::as_str).is_none())
            {
                return Err(FieldError::new(
                    format!("messagesJson[{i}].role"),
                    "every message needs a role (system, user, assistant or tool)",
                ));
            }
            Ok(ModelAsk {
                messages,
                tools: array("toolsJson", request.tools_json)?,
                context_tokens: (request.context_tokens > 0).then_some(request.context_tokens),
                state: document("stateJson", request.state_json)?,
            })
        })()
        .map_err(rpc)?;
        Ok((scope, attempt, ask))
    }
}

/// What CallModel answers for a model turn.
fn model_response(turn: &crate::runtime::builtin::ModelTurn) -> pb::CallModelResponse {
    let reply = turn.reply.as_ref();
    let completed = turn.completed.as_ref();
    let checkpoint = completed.and_then(|c| c.checkpoint.as_ref());
    pb::CallModelResponse {
        outcome: outcome(turn.begun.outcome).into(),
        call_id: turn
            .begun
            .call_id
            .map(|u| u.to_string())
            .unwrap_or_default(),
        reason: turn.begun.reason.clone().unwrap_or_default(),
        content: reply.and_then(|r| r.content.clone()).unwrap_or_default(),
        tool_calls_json: reply
            .map(|r| serde_json::to_string(&r.tool_calls).expect("json"))
            .unwrap_or_else(|| "[]".into()),
        input_tokens: reply.map_or(0, |r| r.input_tokens),
        output_tokens: reply.map_or(0, |r| r.output_tokens),
        cached_tokens: reply.map_or(0, |r| r.cached_tokens),
        model: reply.map(|r| r.model.clone()).unwrap_or_default(),
        served_by: turn.served_by.clone(),
        latency_ms: reply.map_or(0, |r| r.latency_ms),
        checkpoint_id: checkpoint
            .map(|c| c.checkpoint_id.to_string())
            .unwrap_or_default(),
        checkpoint_sequence: checkpoint.map_or(0, |c| c.sequence),
        interrupt_requested: completed.is_some_and(|c| c.interrupt_requested),
        ..Default::default()
    }
}

fn outcome(o: BeginOutcome) -> pb::BeginOutcome {
    match o {
        BeginOutcome::Started => pb::BeginOutcome::STARTED,
        BeginOutcome::Refused => pb::BeginOutcome::REFUSED,
        BeginOutcome::ApprovalRequired => pb::BeginOutcome::APPROVAL_REQUIRED,
        BeginOutcome::Replayed => pb::BeginOutcome::REPLAYED,
    }
}

fn wait(seconds: u32) -> Duration {
    Duration::from_secs(u64::from(seconds))
}

#[allow(refining_impl_trait)]
impl pb::Adapter for AdapterService {
    async fn claim_attempt(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ClaimAttemptRequest>,
    ) -> ServiceResult<pb::ClaimAttemptResponse> {
        let caller = principal(&ctx)?;
        FieldError::require("agentId", request.agent_id, "").map_err(rpc)?;
        let session = match request.session {
            "" => caller.subject.to_string(),
            s if s.chars().count() > 200 => {
                return Err(rpc(FieldError::new(
                    "session",
                    "must be at most 200 characters",
                )));
            }
            s => s.to_string(),
        };
        let ticket = self
            .state
            .runtime
            .claim(
                &caller.tenant_scope(),
                request.agent_id,
                &session,
                wait(request.wait_seconds),
            )
            .await
            .map_err(rpc)?;
        let attempt = ticket.map(|t| {
            let a = &t.attempt;
            pb::AttemptTicket {
                attempt_id: a.attempt_id.to_string(),
                run_id: a.run_id.to_string(),
                step_id: a.step_id.to_string(),
                fencing_token: a.fencing_token,
                release_id: a.release_id.clone(),
                agent_id: a.agent_id.clone(),
                input_json: String::from_utf8_lossy(&t.input).into_owned(),
                resumed: t.resumed,
                state_json: t
                    .state
                    .map(|s| String::from_utf8_lossy(&s).into_owned())
                    .unwrap_or_default(),
                checkpoint_sequence: t.checkpoint_sequence,
                phase: a.phase.as_str().to_string(),
                correction_count: a.correction_count,
                max_corrections: a.max_corrections,
                max_minutes: a.limits.max_minutes,
                max_model_calls: a.limits.max_model_calls,
                max_tool_calls: a.limits.max_tool_calls,
                max_context_tokens: a.limits.max_context_tokens,
                model_profile_id: a.model_profile_id.clone(),
                max_total_tokens: a.limits.max_total_tokens,
                lease_expires_at: time(a.lease.expires_at),
                adapter_version: a.adapter_version.clone(),
                checkpoint_format: a.checkpoint_format,
                rerun_of_attempt_id: a
                    .rerun_of
                    .as_ref()
                    .map(|o| o.attempt_id.to_string())
                    .unwrap_or_default(),
                rerun_of_checkpoint_sequence: a
                    .rerun_of
                    .as_ref()
                    .map_or(0, |o| o.checkpoint_sequence),
                ..Default::default()
            }
        });
        Response::ok(pb::ClaimAttemptResponse {
            attempt: attempt.map(buffa::MessageField::some).unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn start_attempt(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::StartAttemptRequest>,
    ) -> ServiceResult<pb::AttemptStatus> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        FieldError::require("adapterVersion", request.adapter_version, "e.g. external/1")
            .map_err(rpc)?;
        let context = (!request.context_snapshot_ref.is_empty())
            .then(|| request.context_snapshot_ref.to_string());
        let attempt = self
            .state
            .runtime
            .start_attempt(
                &caller.tenant_scope(),
                id,
                request.fencing_token,
                request.adapter_version.to_string(),
                request.checkpoint_format,
                context,
            )
            .await
            .map_err(rpc)?;
        Response::ok(status(&attempt))
    }

    async fn heartbeat(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::HeartbeatRequest>,
    ) -> ServiceResult<pb::AttemptStatus> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let attempt = self
            .state
            .runtime
            .heartbeat(&caller.tenant_scope(), id, request.fencing_token)
            .await
            .map_err(rpc)?;
        Response::ok(status(&attempt))
    }

    async fn begin_call(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::BeginCallRequest>,
    ) -> ServiceResult<pb::BeginCallResponse> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let call = (|| -> Result<runtime::BeginCall, FieldError> {
            let kind = CallKind::parse(request.kind).ok_or_else(|| {
                FieldError::new(
                    "kind",
                    format!("{:?} is not model, tool or sub-agent", request.kind),
                )
            })?;
            FieldError::require(
                "target",
                request.target,
                "the tool id, model profile id or child release id",
            )?;
            let request_doc = if request.request_json.is_empty() {
                serde_json::Value::Object(Default::default())
            } else {
                parse_json("requestJson", request.request_json)?
            };
            Ok(runtime::BeginCall {
                kind,
                target: request.target.to_string(),
                request: request_doc,
                context_tokens: (kind == CallKind::Model).then_some(request.context_tokens),
                approval_id: optional_uuid("approvalId", request.approval_id)?,
                state: document("stateJson", request.state_json)?,
                context_since: None,
                in_process: false,
                approval_asked: request.require_approval,
            })
        })()
        .map_err(rpc)?;
        let begun = self
            .state
            .runtime
            .begin_call(&caller.tenant_scope(), id, request.fencing_token, call)
            .await
            .map_err(rpc)?;
        let opt = |u: Option<uuid::Uuid>| u.map(|u| u.to_string()).unwrap_or_default();
        Response::ok(pb::BeginCallResponse {
            outcome: outcome(begun.outcome).into(),
            call_id: opt(begun.call_id),
            policy_decision_id: opt(begun.policy_decision_id),
            fencing_token: begun.fencing_token,
            reason: begun.reason.unwrap_or_default(),
            decision_id: opt(begun.decision_id),
            approval_id: opt(begun.approval_id),
            checkpoint_id: opt(begun.checkpoint_id),
            child_run_id: opt(begun.child_run_id),
            request_hash: begun.request_hash,
            replayed_from_call_id: opt(begun.replayed_from),
            result_json: begun
                .result
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn complete_call(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CompleteCallRequest>,
    ) -> ServiceResult<pb::CompleteCallResponse> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let completion = (|| -> Result<runtime::Completion, FieldError> {
            Ok(runtime::Completion {
                call_id: required_uuid("callId", request.call_id)?,
                ok: request.ok,
                result: document("resultJson", request.result_json)?,
                receipt: document("receiptJson", request.receipt_json)?,
                error: (!request.error.is_empty())
                    .then(|| request.error.chars().take(2000).collect()),
                state: document("stateJson", request.state_json)?,
                usage: request
                    .usage
                    .as_option()
                    .map(|u| {
                        crate::domain::usage::TokenUsage::reported(
                            "usage",
                            u.input_tokens,
                            u.output_tokens,
                            u.cached_tokens,
                        )
                    })
                    .transpose()?,
                latency_ms: (request.latency_ms > 0).then_some(request.latency_ms),
            })
        })()
        .map_err(rpc)?;
        let done = self
            .state
            .runtime
            .complete_call(
                &caller.tenant_scope(),
                id,
                request.fencing_token,
                completion,
            )
            .await
            .map_err(rpc)?;
        Response::ok(pb::CompleteCallResponse {
            state: done.state.as_str().to_string(),
            checkpoint_id: done
                .checkpoint
                .as_ref()
                .map(|c| c.checkpoint_id.to_string())
                .unwrap_or_default(),
            checkpoint_sequence: done
                .checkpoint
                .as_ref()
                .map(|c| c.sequence)
                .unwrap_or_default(),
            result_hash: done.result_hash.unwrap_or_default(),
            receipt_ref: done.receipt_ref.unwrap_or_default(),
            interrupt_requested: done.interrupt_requested,
            ..Default::default()
        })
    }

    async fn call_model(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CallModelRequest>,
    ) -> ServiceResult<pb::CallModelResponse> {
        let (scope, attempt, ask) = self.model_ask(&ctx, &request)?;
        let turn = adapter_model_call(
            &self.state.runtime,
            &scope,
            &attempt,
            request.fencing_token,
            ask,
        )
        .await
        .map_err(rpc)?;
        Response::ok(model_response(&turn))
    }

    async fn stream_model(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CallModelRequest>,
    ) -> ServiceResult<connectrpc::ServiceStream<pb::StreamModelUpdate>> {
        let (scope, attempt, ask) = self.model_ask(&ctx, &request)?;
        let (runtime, token) = (self.state.runtime.clone(), request.fencing_token);
        let tenant = scope.tenant().clone();
        let attempt_id = attempt.attempt_id;
        let call = async move {
            adapter_model_call(&runtime, &scope, &attempt, token, ask)
                .await
                .map(|turn| model_response(&turn))
        };
        let updates = self.state.runtime.while_written(&tenant, attempt_id, call);
        let updates = futures::StreamExt::map(updates, |written| match written {
            Written::Text(piece) => Ok(pb::StreamModelUpdate {
                text: Some(super::runtime::text_message(piece)).into(),
                ..Default::default()
            }),
            Written::Done(Ok(reply)) => Ok(pb::StreamModelUpdate {
                reply: Some(reply).into(),
                ..Default::default()
            }),
            Written::Done(Err(e)) => Err(rpc(e)),
        });
        Ok(Response::new(
            Box::pin(updates) as connectrpc::ServiceStream<pb::StreamModelUpdate>
        ))
    }

    async fn await_call(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::AwaitCallRequest>,
    ) -> ServiceResult<pb::AwaitCallResponse> {
        let caller = principal(&ctx)?;
        let scope = caller.tenant_scope();
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let call_id = required_uuid("callId", request.call_id).map_err(rpc)?;
        let call = self
            .state
            .runtime
            .await_call(
                &scope,
                id,
                request.fencing_token,
                call_id,
                wait(request.wait_seconds),
            )
            .await
            .map_err(rpc)?;
        let result_json = call
            .result_hash
            .as_ref()
            .and_then(|r| self.state.runtime.content(&scope, r).ok().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Response::ok(pb::AwaitCallResponse {
            status: call.status.as_str().to_string(),
            result_json,
            error: call.error.unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn checkpoint(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CheckpointRequest>,
    ) -> ServiceResult<pb::CheckpointResponse> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let (state, phase) = (|| -> Result<(Vec<u8>, Option<AttemptPhase>), FieldError> {
            let state = document("stateJson", request.state_json)?.ok_or_else(|| {
                FieldError::new(
                    "stateJson",
                    "is required: the adapter's state to resume from",
                )
            })?;
            let phase = match request.phase {
                "" => None,
                p => Some(AttemptPhase::parse(p).ok_or_else(|| {
                    FieldError::new("phase", format!("{p:?} is not a phase of the loop"))
                })?),
            };
            Ok((state, phase))
        })()
        .map_err(rpc)?;
        let (cp, state) = self
            .state
            .runtime
            .checkpoint(
                &caller.tenant_scope(),
                id,
                request.fencing_token,
                state,
                phase,
            )
            .await
            .map_err(rpc)?;
        Response::ok(pb::CheckpointResponse {
            checkpoint_id: cp.checkpoint_id.to_string(),
            sequence: cp.sequence,
            state: state.as_str().to_string(),
            hash: cp.hash,
            ..Default::default()
        })
    }

    async fn request_decision(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RequestDecisionRequest>,
    ) -> ServiceResult<pb::RequestDecisionResponse> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let ask = (|| -> Result<runtime::DecisionAsk, FieldError> {
            let kind = match DecisionKind::parse(request.kind) {
                Some(DecisionKind::Approval) => {
                    return Err(FieldError::new(
                        "kind",
                        "approvals are opened by BeginCall when the policy requires one",
                    ));
                }
                Some(k) => k,
                None => {
                    return Err(FieldError::new(
                        "kind",
                        format!("{:?} is not input or escalation", request.kind),
                    ));
                }
            };
            let options: Vec<String> = request.options.iter().map(|o| o.to_string()).collect();
            let recommendation =
                (!request.recommendation.is_empty()).then(|| request.recommendation.to_string());
            let ask = runtime::DecisionAsk {
                kind,
                question: document("questionJson", request.question_json)?,
                summary: request.summary.chars().take(300).collect(),
                options,
                recommendation,
                answer_schema: match request.answer_schema_json {
                    "" => None,
                    text => Some(serde_json::from_str(text).map_err(|e| {
                        FieldError::new("answerSchemaJson", format!("is not JSON: {e}"))
                    })?),
                },
                tool_call_id: None,
                assignee: (!request.assignee.is_empty()).then(|| request.assignee.to_string()),
            };
            ask.check().map_err(|e| match e.field.as_str() {
                "answerSchema" => FieldError::new("answerSchemaJson", e.reason),
                _ => e,
            })?;
            Ok(ask)
        })()
        .map_err(rpc)?;
        let decision = self
            .state
            .runtime
            .request_decision(&caller.tenant_scope(), id, request.fencing_token, ask)
            .await
            .map_err(rpc)?;
        Response::ok(pb::RequestDecisionResponse {
            decision_id: decision.decision_id.to_string(),
            expires_at: decision.expires_at.to_rfc3339(),
            ..Default::default()
        })
    }

    async fn await_decision(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::AwaitDecisionRequest>,
    ) -> ServiceResult<pb::AwaitDecisionResponse> {
        let caller = principal(&ctx)?;
        let scope = caller.tenant_scope();
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let decision_id = required_uuid("decisionId", request.decision_id).map_err(rpc)?;
        let (d, state) = self
            .state
            .runtime
            .await_decision(
                &scope,
                id,
                request.fencing_token,
                decision_id,
                wait(request.wait_seconds),
            )
            .await
            .map_err(rpc)?;
        let text = |r: Option<&String>| {
            r.and_then(|r| self.state.runtime.content(&scope, r).ok().flatten())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let answer_json = text(d.answer_ref.as_ref());
        let approved_arguments_json = text(d.edited_request_hash.as_ref());
        Response::ok(pb::AwaitDecisionResponse {
            status: d.status.as_str().to_string(),
            choice: d.choice.unwrap_or_default(),
            answer_json,
            approved_arguments_json,
            responded: d.responded,
            reason: d.reason.unwrap_or_default(),
            answered_by: d.answered_by.unwrap_or_default(),
            attempt_state: state.as_str().to_string(),
            ..Default::default()
        })
    }

    async fn report_outcome(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ReportOutcomeRequest>,
    ) -> ServiceResult<pb::ReportOutcomeResponse> {
        let caller = principal(&ctx)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let report = (|| -> Result<runtime::Report, FieldError> {
            // Every field given is checked, whichever way the attempt went.
            let output = match request.output_json {
                "" => None,
                text => Some(parse_json("outputJson", text)?),
            };
            let class = match request.failure_class {
                "" => None,
                c => Some(FailureClass::parse(c).ok_or_else(|| {
                    FieldError::new(
                        "failureClass",
                        format!(
                            "{c:?} is not validation, infrastructure, transient, policy, budget or agent"
                        ),
                    )
                })?),
            };
            if request.succeeded {
                let output = output.ok_or_else(|| {
                    FieldError::new("outputJson", "is required when succeeded is true")
                })?;
                return Ok(runtime::Report {
                    succeeded: true,
                    output: Some(output),
                    failure_class: None,
                    reason: None,
                    error: None,
                });
            }
            let class = class.ok_or_else(|| {
                FieldError::new("failureClass", "is required when succeeded is false")
            })?;
            FieldError::require("reason", request.reason, "when succeeded is false")?;
            Ok(runtime::Report {
                succeeded: false,
                output: None,
                failure_class: Some(class),
                reason: Some(request.reason.chars().take(2000).collect()),
                error: Some(ErrorDetail::bounded(
                    request.error_type,
                    request.error_message,
                    request.traceback,
                )),
            })
        })()
        .map_err(rpc)?;
        let reported = self
            .state
            .runtime
            .report(&caller.tenant_scope(), id, request.fencing_token, report)
            .await
            .map_err(rpc)?;
        let (verdict, feedback, left) = match reported.verdict {
            Outcome::Verified => (pb::Verdict::VERIFIED, String::new(), 0),
            Outcome::Correct { feedback, left } => (pb::Verdict::CORRECT, feedback, left),
            Outcome::Exhausted { feedback } => (pb::Verdict::EXHAUSTED, feedback, 0),
            Outcome::Failed => (pb::Verdict::FAILED, String::new(), 0),
        };
        Response::ok(pb::ReportOutcomeResponse {
            verdict: verdict.into(),
            feedback,
            corrections_left: left,
            state: reported.state.as_str().to_string(),
            outcome_hash: reported.outcome_hash.unwrap_or_default(),
            acknowledged: reported.acknowledged,
            ..Default::default()
        })
    }
}
