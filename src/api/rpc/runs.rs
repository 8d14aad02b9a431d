//! `agentbay.runs.v1.Runs`: SubmitRun, GetRun, ListRuns, CancelRun,
//! DecideApproval, SettleCall.

use connectrpc::{RequestContext, Response, ServiceRequest, ServiceResult};
use uuid::Uuid;

use super::{principal, tenant_scope, time};
use crate::api::AppState;
use crate::api::error::rpc;
use crate::api::runtime::{parse_json, parse_state};
use crate::capacity::ledger::{self, UsageQuery};
use crate::domain::access::TenantScope;
use crate::domain::attempt::Effect;
use crate::domain::ids::{optional_uuid, parse_uuid, required_uuid};
use crate::domain::release::AttemptLimits;
use crate::domain::run::Run;
use crate::domain::usage::TokenUsage;
use crate::domain::{FieldError, ProjectId};
use crate::proto::agentbay::runs::v1 as pb;
use crate::runs::rerun::RerunRequest;
use crate::runs::{ApprovalRef, RunFilter, RunRequest};
use crate::runtime::grain::AttemptView;
use crate::runtime::{PendingDecision, Runtime};

/// The Runs service.
pub struct RunsService {
    state: AppState,
}

impl RunsService {
    /// Serves the Runs RPCs.
    pub fn new(state: AppState) -> Self {
        RunsService { state }
    }
}

/// The wire form of a token sum.
pub(crate) fn tokens_message(u: &TokenUsage) -> pb::TokenUsage {
    pb::TokenUsage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_tokens: u.cached_tokens,
        model_calls: u.model_calls,
        total_tokens: u.total(),
        ..Default::default()
    }
}

fn limits_message(l: &AttemptLimits) -> pb::Limits {
    pb::Limits {
        max_minutes: l.max_minutes,
        max_model_calls: l.max_model_calls,
        max_tool_calls: l.max_tool_calls,
        max_context_tokens: l.max_context_tokens,
        max_sub_agent_depth: l.max_sub_agent_depth,
        max_total_tokens: l.max_total_tokens,
        ..Default::default()
    }
}

/// The wire form of a pending decision.
pub(crate) fn pending_decision_message(d: PendingDecision) -> pb::PendingDecision {
    let string = |v: Option<String>| v.unwrap_or_default();
    pb::PendingDecision {
        decision_id: d.decision_id.to_string(),
        kind: d.kind.to_string(),
        approval_id: string(d.approval_id.map(|a| a.to_string())),
        summary: d.summary,
        question: string(d.question),
        proposed_call: d
            .proposed_call
            .map(|p| pb::ProposedCall {
                kind: p.kind.to_string(),
                target: p.target,
                side_effect_class: p.side_effect_class.unwrap_or_default().to_string(),
                arguments_json: string(p.arguments.map(|a| a.to_string())),
                request_hash: p.request_hash,
                policy_decision_id: p.policy_decision_id.to_string(),
                ..Default::default()
            })
            .into(),
        options: d.options,
        recommendation: string(d.recommendation),
        answer_schema_json: string(d.answer_schema.map(|s| s.to_string())),
        requested_at: d.requested_at.to_rfc3339(),
        expires_at: d.expires_at.to_rfc3339(),
        purged: string(d.purged),
        assignee: string(d.assignee),
        ..Default::default()
    }
}

/// The wire form of an attempt.
pub fn attempt_message(
    runtime: &Runtime,
    scope: &TenantScope,
    view: &AttemptView,
    now: chrono::DateTime<chrono::Utc>,
) -> pb::Attempt {
    let a = &view.attempt;
    pb::Attempt {
        attempt_id: a.attempt_id.to_string(),
        run_id: a.run_id.to_string(),
        step_id: a.step_id.to_string(),
        number: a.number,
        state: a.state.as_str().to_string(),
        phase: a.phase.as_str().to_string(),
        fencing_token: a.fencing_token,
        waiting_reason: runtime.waiting_reason(view).unwrap_or_default(),
        limiting_quota: view.limiting_quota.clone().unwrap_or_default(),
        queue_position: view.queue_position.unwrap_or(0) as u32,
        correction_count: a.correction_count,
        max_corrections: a.max_corrections,
        model_calls: a.usage.model_calls,
        tool_calls: a.usage.tool_calls,
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
        outcome_hash: a.outcome_hash.clone().unwrap_or_default(),
        pending_decision_id: a
            .pending_decision
            .map(|d| d.to_string())
            .unwrap_or_default(),
        release_id: a.release_id.clone(),
        agent_id: a.agent_id.clone(),
        started_at: a.started_at.to_rfc3339(),
        ended_at: time(a.ended_at),
        checkpoints: a.usage.checkpoints,
        capacity_lease_id: a
            .capacity_lease_id
            .map(|l| l.to_string())
            .unwrap_or_default(),
        pending_decision: view
            .decision
            .as_ref()
            .map(|d| pending_decision_message(runtime.pending_decision(scope, d)))
            .into(),
        tokens: buffa::MessageField::some(tokens_message(&a.usage.tokens)),
        active_seconds: a.active_ms(now) / 1000,
        wall_seconds: (a.ended_at.unwrap_or(now) - a.started_at)
            .num_seconds()
            .max(0) as u64,
        ..Default::default()
    }
}

/// Labels given as a map, checked.
fn labels_of<'a>(
    given: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<crate::domain::run::Labels, FieldError> {
    let texts: Vec<String> = given.map(|(k, v)| format!("{k}={v}")).collect();
    crate::domain::run::parse_labels("labels", texts.iter().map(String::as_str))
}

/// The wire form of a run, with its attempts as they are now.
pub fn run_message(state: &AppState, scope: &TenantScope, run: &Run) -> pb::Run {
    let now = state.clock.now();
    let tokens = state
        .runs
        .tokens(scope, run.run_id)
        .unwrap_or_else(|_| ledger::RunTokens::none(scope.tenant(), run.run_id));
    let steps = run
        .steps
        .iter()
        .map(|s| pb::Step {
            step_id: s.step_id.to_string(),
            index: s.index,
            name: s.name.clone(),
            state: s.state.as_str().to_string(),
            attempts: s
                .attempts
                .iter()
                .filter_map(|id| state.runtime.view(scope, *id).ok())
                .map(|v| attempt_message(&state.runtime, scope, &v, now))
                .collect(),
            ..Default::default()
        })
        .collect();
    let output_json = run
        .output_ref
        .as_ref()
        .filter(|_| run.purged.is_none())
        .and_then(|r| state.runtime.content(scope, r).ok().flatten())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    pb::Run {
        run_id: run.run_id.to_string(),
        tenant_id: run.tenant_id.to_string(),
        project_id: run.project_id.to_string(),
        release_id: run.snapshot.release_id.clone(),
        agent_id: run.agent_id.clone(),
        snapshot_id: run.snapshot.snapshot_id.to_string(),
        state: run.state.as_str().to_string(),
        reason: run.reason.clone().unwrap_or_default(),
        steps,
        output_json,
        output_ref: run.output_ref.clone().unwrap_or_default(),
        input_ref: run.input_ref.clone(),
        depth: run.depth,
        parent_run_id: run
            .parent
            .as_ref()
            .map(|p| p.run_id.to_string())
            .unwrap_or_default(),
        created_at: run.created_at.to_rfc3339(),
        ended_at: time(run.ended_at),
        cancel_requested: run.cancel_requested.is_some(),
        max_attempts: run.max_attempts,
        limits: buffa::MessageField::some(limits_message(&run.snapshot.limits)),
        hold: run
            .hold
            .as_ref()
            .map(|h| pb::Hold {
                reason: h.reason.clone(),
                by: h.by.clone(),
                at: h.at.to_rfc3339(),
                ..Default::default()
            })
            .into(),
        purged: run
            .purged
            .as_ref()
            .map(|t| t.describe())
            .unwrap_or_default(),
        rerun_of: run
            .rerun_of
            .as_ref()
            .map(|o| pb::RerunOrigin {
                run_id: o.run_id.to_string(),
                attempt_id: o.attempt_id.to_string(),
                checkpoint_id: o.checkpoint_id.to_string(),
                checkpoint_sequence: o.checkpoint_sequence,
                release_id: o.release_id.clone(),
                reissue_call_ids: o.reissue.iter().map(Uuid::to_string).collect(),
                by: o.by.clone(),
                at: o.at.to_rfc3339(),
                ..Default::default()
            })
            .into(),
        tokens: buffa::MessageField::some(tokens_message(&tokens.own)),
        tokens_with_children: buffa::MessageField::some(tokens_message(&tokens.with_children)),
        run_key: run.run_key.clone().unwrap_or_default(),
        labels: run
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

#[allow(refining_impl_trait)]
impl pb::Runs for RunsService {
    async fn submit_run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::SubmitRunRequest>,
    ) -> ServiceResult<pb::SubmitRunResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let run_request = (|| -> Result<RunRequest, FieldError> {
            FieldError::require("releaseId", request.release_id, "")?;
            let limits = request.limits.as_option().map(|l| AttemptLimits {
                max_minutes: l.max_minutes,
                max_model_calls: l.max_model_calls,
                max_tool_calls: l.max_tool_calls,
                max_context_tokens: l.max_context_tokens,
                max_sub_agent_depth: l.max_sub_agent_depth,
                max_total_tokens: l.max_total_tokens,
            });
            let request_id =
                (!request.request_id.is_empty()).then(|| request.request_id.to_string());
            Ok(RunRequest {
                project_id: ProjectId::parse_field("projectId", request.project_id)?,
                release_id: request.release_id.to_string(),
                input: parse_json("inputJson", request.input_json)?,
                limits,
                max_attempts: request.max_attempts,
                max_corrections: request.max_corrections,
                request_id,
                run_key: (!request.run_key.is_empty()).then(|| request.run_key.to_string()),
                labels: labels_of(request.labels.iter().map(|(k, v)| (&**k, &**v)))?,
                environment_id: (!request.environment_id.is_empty())
                    .then(|| request.environment_id.to_string()),
                submitted_by: caller.subject.to_string(),
            })
        })()
        .map_err(rpc)?;
        let run = self
            .state
            .runs
            .submit(&scope, run_request)
            .await
            .map_err(rpc)?;
        Response::ok(pb::SubmitRunResponse {
            run: buffa::MessageField::some(run_message(&self.state, &scope, &run)),
            ..Default::default()
        })
    }

    async fn get_run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::GetRunRequest>,
    ) -> ServiceResult<pb::GetRunResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let id = required_uuid("runId", request.run_id).map_err(rpc)?;
        let run = self.state.runs.get(&scope, id).map_err(rpc)?;
        let mut message = run_message(&self.state, &scope, &run);
        message.rerun_ids = self
            .state
            .runs
            .reruns(&scope, id)
            .map_err(rpc)?
            .iter()
            .map(|r| r.run_id.to_string())
            .collect();
        Response::ok(pb::GetRunResponse {
            run: buffa::MessageField::some(message),
            ..Default::default()
        })
    }

    async fn get_usage(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::GetUsageRequest>,
    ) -> ServiceResult<pb::GetUsageResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let today = self.state.clock.now().date_naive();
        let query = UsageQuery::parse(
            Some(request.from).filter(|d| !d.is_empty()),
            Some(request.to).filter(|d| !d.is_empty()),
            request.group_by,
            Some(request.project_id).filter(|p| !p.is_empty()),
            Some(request.agent_id).filter(|a| !a.is_empty()),
            today,
        )
        .map_err(rpc)?;
        let report = self
            .state
            .capacity
            .token_usage(&scope, &query)
            .map_err(crate::runtime::RuntimeError::from)
            .map_err(rpc)?;
        Response::ok(pb::GetUsageResponse {
            rows: report
                .rows
                .iter()
                .map(|r| pb::UsageRow {
                    day: r.day.map(|d| d.to_string()).unwrap_or_default(),
                    project_id: r
                        .project_id
                        .as_ref()
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                    agent_id: r.agent_id.clone().unwrap_or_default(),
                    release_id: r.release_id.clone().unwrap_or_default(),
                    usage: buffa::MessageField::some(tokens_message(&r.usage)),
                    ..Default::default()
                })
                .collect(),
            total: buffa::MessageField::some(tokens_message(&report.total)),
            from: report.from.to_string(),
            to: report.to.to_string(),
            ..Default::default()
        })
    }

    async fn list_runs(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::ListRunsRequest>,
    ) -> ServiceResult<pb::ListRunsResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let filter = (|| -> Result<RunFilter, FieldError> {
            Ok(RunFilter {
                state: match request.state {
                    "" => None,
                    s => Some(parse_state(s)?),
                },
                agent_id: (!request.agent_id.is_empty()).then(|| request.agent_id.to_string()),
                release_id: (!request.release_id.is_empty())
                    .then(|| request.release_id.to_string()),
                project_id: match request.project_id {
                    "" => None,
                    p => Some(ProjectId::parse_field("projectId", p)?),
                },
                submitted_from: match request.submitted_from {
                    "" => None,
                    d => Some(FieldError::parse_day("submittedFrom", d)?),
                },
                submitted_until: match request.submitted_until {
                    "" => None,
                    d => Some(FieldError::parse_day("submittedUntil", d)?),
                },
                reason_contains: match request.reason_contains.trim() {
                    "" => None,
                    t if t.chars().count() > 200 => {
                        return Err(FieldError::new(
                            "reasonContains",
                            "is longer than 200 characters",
                        ));
                    }
                    t => Some(t.to_string()),
                },
                label: match request.label.trim() {
                    "" => None,
                    t => {
                        let (k, v) = t.split_once('=').ok_or_else(|| {
                            FieldError::new("label", format!("{t:?} is not key=value"))
                        })?;
                        Some((k.to_string(), v.to_string()))
                    }
                },
                waiting: match request.waiting {
                    "" => None,
                    w => Some(crate::domain::run::parse_waiting("waiting", w)?),
                },
            })
        })()
        .map_err(rpc)?;
        let after = optional_uuid("pageAfter", request.page_after).map_err(rpc)?;
        let size = match request.page_size {
            0 => 50,
            n => n.min(500) as usize,
        };
        let runs = self
            .state
            .runs
            .list(&scope, &filter, after, size)
            .map_err(rpc)?;
        let next = if runs.len() == size {
            runs.last()
                .map(|r| r.run_id.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Response::ok(pb::ListRunsResponse {
            runs: runs
                .iter()
                .map(|r| run_message(&self.state, &scope, r))
                .collect(),
            next_page_after: next,
            ..Default::default()
        })
    }

    async fn cancel_run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::CancelRunRequest>,
    ) -> ServiceResult<pb::CancelRunResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let id = required_uuid("runId", request.run_id).map_err(rpc)?;
        let run = self
            .state
            .runs
            .cancel(&scope, id, &caller.subject.to_string(), request.reason)
            .await
            .map_err(rpc)?;
        Response::ok(pb::CancelRunResponse {
            run: buffa::MessageField::some(run_message(&self.state, &scope, &run)),
            ..Default::default()
        })
    }

    async fn hold_run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::HoldRunRequest>,
    ) -> ServiceResult<pb::HoldRunResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let id = required_uuid("runId", request.run_id).map_err(rpc)?;
        let reason = (!request.release).then_some(request.reason);
        let run = self
            .state
            .runs
            .hold(&scope, id, &caller.subject.to_string(), reason)
            .await
            .map_err(rpc)?;
        Response::ok(pb::HoldRunResponse {
            run: buffa::MessageField::some(run_message(&self.state, &scope, &run)),
            ..Default::default()
        })
    }

    async fn decide_approval(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::DecideApprovalRequest>,
    ) -> ServiceResult<pb::DecideApprovalResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let decision = optional_uuid("decisionId", request.decision_id).map_err(rpc)?;
        let approval = optional_uuid("approvalId", request.approval_id).map_err(rpc)?;
        let id = match (decision, approval) {
            (Some(decision), _) => ApprovalRef::Decision(decision),
            (None, Some(approval)) => ApprovalRef::Approval(approval),
            (None, None) => {
                return Err(rpc(FieldError::new(
                    "decisionId",
                    "is required: the pending decision's id (or give approvalId)",
                )));
            }
        };
        let reason = (!request.reason.is_empty()).then(|| request.reason.to_string());
        let arguments = match request.arguments_json {
            "" => None,
            text => Some(parse_json("argumentsJson", text).map_err(rpc)?),
        };
        let attempt = self
            .state
            .runs
            .decide_approval(
                &scope,
                id,
                crate::runtime::ApprovalVerdict {
                    approve: request.approve,
                    by: caller.subject.to_string(),
                    reason,
                    arguments,
                    respond: request.respond,
                },
            )
            .await
            .map_err(rpc)?;
        let view = self
            .state
            .runtime
            .view(&scope, attempt.attempt_id)
            .map_err(rpc)?;
        Response::ok(pb::DecideApprovalResponse {
            attempt: buffa::MessageField::some(attempt_message(
                &self.state.runtime,
                &scope,
                &view,
                self.state.clock.now(),
            )),
            ..Default::default()
        })
    }

    async fn rerun_from_checkpoint(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::RerunFromCheckpointRequest>,
    ) -> ServiceResult<pb::RerunFromCheckpointResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let rerun = (|| -> Result<RerunRequest, FieldError> {
            Ok(RerunRequest {
                attempt_id: required_uuid("attemptId", request.attempt_id)?,
                checkpoint_sequence: (request.checkpoint_sequence > 0)
                    .then_some(request.checkpoint_sequence),
                release_id: (!request.release_id.is_empty())
                    .then(|| request.release_id.to_string()),
                reissue: request
                    .reissue_call_ids
                    .iter()
                    .map(|id| parse_uuid("reissueCallIds", id))
                    .collect::<Result<_, _>>()?,
                request_id: (!request.request_id.is_empty())
                    .then(|| request.request_id.to_string()),
                by: caller.subject.to_string(),
            })
        })()
        .map_err(rpc)?;
        let run = self.state.runs.rerun(&scope, rerun).await.map_err(rpc)?;
        Response::ok(pb::RerunFromCheckpointResponse {
            run: buffa::MessageField::some(run_message(&self.state, &scope, &run)),
            ..Default::default()
        })
    }

    async fn settle_call(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::SettleCallRequest>,
    ) -> ServiceResult<pb::SettleCallResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let (attempt_id, call_id, effect) = (|| -> Result<(Uuid, Uuid, Effect), FieldError> {
            let effect = match request.effect {
                "happened" => Effect::Happened,
                "did-not-happen" => Effect::DidNotHappen,
                other => {
                    return Err(FieldError::new(
                        "effect",
                        format!("{other:?} is not happened or did-not-happen"),
                    ));
                }
            };
            Ok((
                required_uuid("attemptId", request.attempt_id)?,
                required_uuid("callId", request.call_id)?,
                effect,
            ))
        })()
        .map_err(rpc)?;
        let run = self
            .state
            .runs
            .settle_call(
                &scope,
                attempt_id,
                call_id,
                effect,
                request.reason,
                request.retry,
                &caller.subject.to_string(),
            )
            .await
            .map_err(rpc)?;
        Response::ok(pb::SettleCallResponse {
            run: buffa::MessageField::some(run_message(&self.state, &scope, &run)),
            ..Default::default()
        })
    }
}
