//! Calls of an attempt: the gate, the closure and the policy, approvals,
//! results and their checkpoints, and sub-agent results.

use super::*;
use crate::domain::attempt::LimitReached;
use crate::runtime::port::ChildPlan;

/// Seconds after a builtin tool call's timeout at which the grain times it
/// out, should the loop not have.
const BUILTIN_TIMEOUT_GRACE_SECONDS: u64 = 5;

impl Grain {
    /// The adapter state to keep with a checkpoint: the one sent now, else
    /// the last one.
    pub(super) fn state_ref(&self, state: Option<&[u8]>) -> (String, Option<Vec<u8>>) {
        match state {
            Some(bytes) => (
                crate::domain::content::content_hash(bytes),
                Some(bytes.to_vec()),
            ),
            None => match &self.attempt.adapter_state_ref {
                Some(r) => (r.clone(), None),
                None => (json_hash(&serde_json::Value::Null), Some(b"null".to_vec())),
            },
        }
    }

    pub(super) async fn refuse(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        reason: String,
    ) -> Result<Begun, RuntimeError> {
        let policy_decision_id = start.policy_decision_id;
        let request_hash = start.request_hash.clone();
        let call_id = self.record_refusal(start, request, &reason, None).await?;
        Ok(Begun {
            outcome: BeginOutcome::Refused,
            call_id: Some(call_id),
            policy_decision_id,
            fencing_token: self.attempt.fencing_token,
            reason: Some(reason),
            request_hash,
            ..Begun::default()
        })
    }

    /// Records a refused call (and, with `failure`, ends the attempt).
    pub(super) async fn record_refusal(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        reason: &str,
        failure: Option<(AttemptState, AttemptFailure)>,
    ) -> Result<uuid::Uuid, RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let kind = start.kind;
        let record = a.refuse_call(start, reason, now);
        let call_id = record.call_id;
        let events = match failure {
            Some((state, f)) => a.end_as(state, f, None, now)?,
            None => Vec::new(),
        };
        let retain = self.retain();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            tx.put(s, &record)?;
            Ok(())
        })
        .await?;
        self.call_metric(kind, CallStatus::Failed);
        Ok(call_id)
    }

    /// A re-run's call that is identical (kind, target, request) to one
    /// whose effect the source attempt confirmed after the checkpoint,
    /// and that the operator did not name for re-issue: recorded as
    /// completed with the source's result and receipt, never issued.
    async fn replay(
        &mut self,
        call: &BeginCall,
        start: &CallStart,
        request: &[u8],
        info: &ReleaseInfo,
    ) -> Result<Option<Begun>, RuntimeError> {
        let Some(origin) = self.attempt.rerun_of.clone() else {
            return Ok(None);
        };
        let class = match call.kind {
            CallKind::Model => return Ok(None),
            CallKind::Tool => match info.tool(&call.target) {
                Some((tool, _)) if tool.side_effect_class.is_gated() => {
                    Some(tool.side_effect_class)
                }
                _ => return Ok(None),
            },
            CallKind::SubAgent => None,
        };
        let source_calls: Vec<CallRecord> = self
            .shared
            .store
            .list_under(&self.scope, &format!("{}/", origin.attempt_id))?;
        let Some(source) = origin
            .answers(&source_calls, call.kind, &call.target, &start.request_hash)
            .cloned()
        else {
            return Ok(None);
        };
        let now = self.now();
        let mut start = start.clone();
        start.side_effect_class = class;
        let mut a = self.attempt.clone();
        let record = a.replay_call(start.clone(), &source, now);
        let call_id = record.call_id;
        let result = match &source.result_hash {
            Some(r) => self.read(r)?,
            None => None,
        };
        let (request, retain) = (request.to_vec(), self.retain());
        self.save(a, Vec::new(), move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            tx.put(s, &record)?;
            Ok(())
        })
        .await?;
        self.call_metric(call.kind, CallStatus::Completed);
        Ok(Some(Begun {
            outcome: BeginOutcome::Replayed,
            call_id: Some(call_id),
            policy_decision_id: start.policy_decision_id,
            fencing_token: self.attempt.fencing_token,
            reason: Some(format!(
                "not issued again: call {} of attempt {} (the source of this re-run) confirmed its effect after checkpoint {}; its result is this call's",
                source.sequence, origin.attempt_id, origin.checkpoint_sequence
            )),
            request_hash: start.request_hash,
            replayed_from: Some(source.call_id),
            result,
            ..Begun::default()
        }))
    }

    pub(super) async fn begin_call(
        &mut self,
        token: u64,
        call: BeginCall,
    ) -> Result<Begun, RuntimeError> {
        self.fence(token, "BeginCall").await?;
        self.check_interrupt("BeginCall").await?;
        match self.attempt.gate() {
            Ok(()) => {}
            Err(Gate::Paused(why)) => {
                return Err(DomainError::Waiting(format!(
                    "attempt {} is paused ({why}); call again once its lease is renewed",
                    self.attempt.attempt_id
                ))
                .into());
            }
            Err(Gate::NoCapacity(why)) => {
                return Err(DomainError::Waiting(format!(
                    "attempt {} makes no calls yet: {why}; call again once capacity is granted (its timeline shows the queue position and the quota that holds it)",
                    self.attempt.attempt_id
                ))
                .into());
            }
            Err(Gate::Busy(id)) => {
                return Err(precondition(format!(
                    "call {id} is still open; complete it before beginning another"
                )));
            }
            Err(Gate::WrongState(e)) => return Err(e.into()),
            Err(Gate::Interrupted) => unreachable!("observed above"),
        }
        let info = self.info()?;
        let now = self.now();
        let request = canonical_json(&call.request);
        let request_hash = json_hash(&call.request);
        let policy_decision_id = new_id();
        let mut start = CallStart {
            call_id: new_id(),
            kind: call.kind,
            target: call.target.clone(),
            side_effect_class: None,
            request_hash: request_hash.clone(),
            policy_decision_id: Some(policy_decision_id),
            policy_rule: None,
            approval_id: None,
            // What an adapter declares never replaces what is measured:
            // a model call's context is at least its request's estimate.
            context_tokens: match call.kind {
                CallKind::Model => Some(
                    call.context_tokens
                        .unwrap_or(0)
                        .max(crate::runtime::builtin::context::tokens(&request)),
                ),
                _ => call.context_tokens,
            },
            pre_checkpoint_id: None,
            context_since: call.context_since,
            timeout_seconds: None,
        };
        if let Some(begun) = self.replay(&call, &start, &request, &info).await? {
            return Ok(begun);
        }
        let mut consumed: Option<DecisionRequest> = None;
        let mut child: Option<(crate::domain::run::NewRun, SubAgentDelegation)> = None;
        match call.kind {
            CallKind::Tool => {
                let Some((tool, schema)) = info.tool(&call.target) else {
                    let reason = format!(
                        "tool {:?} is outside the release's closure (its tools: {})",
                        call.target,
                        info.tool_ids().join(", ")
                    );
                    return self.refuse(start, request, reason).await;
                };
                let class = tool.side_effect_class;
                start.side_effect_class = Some(class);
                // The builtin loop kills the tool's process tree at its
                // timeout and records what bound it; the grain's reminder
                // is then a backstop a little later. An external adapter's
                // call times out at the grain.
                let seconds = tool
                    .timeout_seconds
                    .unwrap_or(self.shared.config.get().tool_timeout_seconds);
                start.timeout_seconds = Some(match self.attempt.adapter {
                    AdapterKind::Builtin => seconds + BUILTIN_TIMEOUT_GRACE_SECONDS,
                    AdapterKind::External => seconds,
                });
                if let Some(reason) =
                    crate::runtime::release::argument_mismatch(schema, &call.target, &call.request)
                {
                    return self.refuse(start, request, reason).await;
                }
                let mut rule = info.manifest.policy.rule(&call.target, class);
                if call.approval_asked {
                    rule = rule.with_approval_asked();
                }
                start.policy_rule = Some(rule);
                match rule {
                    PolicyRule::Allow => {}
                    PolicyRule::Deny => {
                        let reason = info
                            .manifest
                            .policy
                            .denial(&call.target, class)
                            .unwrap_or_default();
                        return self.refuse(start, request, reason).await;
                    }
                    PolicyRule::RequireApproval => {
                        match call.approval_id.or_else(|| self.granted_approval(&start)) {
                            None => return self.ask_approval(start, request, class).await,
                            Some(approval_id) => {
                                let decision = self.approved(approval_id, &start)?;
                                start.approval_id = Some(approval_id);
                                start.policy_decision_id =
                                    decision.proposal.as_ref().map(|p| p.policy_decision_id);
                                let mut d = decision;
                                d.consumed = true;
                                consumed = Some(d);
                            }
                        }
                    }
                }
            }
            CallKind::Model => {
                if call.target != info.manifest.model_profile.id {
                    let reason = format!(
                        "model profile {:?} is not the release's ({}); a release cannot widen its models",
                        call.target, info.manifest.model_profile.id
                    );
                    return self.refuse(start, request, reason).await;
                }
                if self.attempt.gate().is_ok()
                    && let Some(limit) = self
                        .shared
                        .capacity
                        .token_quota(&self.attempt.tenant_id, &self.attempt.project_id)
                {
                    return self.tokens_ran_out(start, request, limit).await;
                }
                // The site's server for the profile takes the call now, or
                // the attempt waits its turn.
                if let Some(site) = crate::runtime::profiles::resolve(
                    &self.shared.store,
                    &self.attempt.tenant_id,
                    &call.target,
                )? && let Err(why) = self.shared.servers.admit(
                    &site,
                    &self.attempt.tenant_id,
                    self.attempt.attempt_id,
                ) {
                    return self.wait_for_model_server(&site.endpoint, why).await;
                }
                start.policy_rule = Some(PolicyRule::Allow);
            }
            CallKind::SubAgent => {
                if let Some(limit) = self.attempt.limit_for(
                    CallKind::SubAgent,
                    None,
                    self.shared.config.get().max_sub_agent_depth,
                ) {
                    return self.limit_reached(start, request, limit).await;
                }
                let child_info = match self
                    .shared
                    .releases
                    .dispatchable(&self.scope, &call.target)
                    .await
                {
                    Ok(_) => self.shared.release_info(&self.scope, &call.target)?,
                    Err(e) => {
                        let reason = format!("sub-agent release {:?} cannot run: {e}", call.target);
                        return self.refuse(start, request, reason).await;
                    }
                };
                start.policy_rule = Some(PolicyRule::Allow);
                let delegation_id = new_id();
                let depth = self.attempt.depth + 1;
                let plan = self.shared.runs.plan_child(ChildPlan {
                    supervisor: &self.attempt,
                    release: &child_info.release,
                    manifest: &child_info.manifest,
                    steps: child_info.steps.clone(),
                    input: call.request.clone(),
                    parent: ParentLink {
                        run_id: self.attempt.run_id,
                        attempt_id: self.attempt.attempt_id,
                        delegation_id,
                        call_id: start.call_id,
                        ancestors: self.attempt.ancestors.clone(),
                    },
                    config: &self.shared.config.get(),
                    now,
                })?;
                let delegation = SubAgentDelegation {
                    delegation_id,
                    attempt_id: self.attempt.attempt_id,
                    tenant_id: self.attempt.tenant_id.clone(),
                    child_run_id: plan.run.run_id,
                    child_agent_id: child_info.release.agent_id.clone(),
                    child_release_id: child_info.release.release_id.clone(),
                    purpose: call
                        .request
                        .get("purpose")
                        .and_then(|p| p.as_str())
                        .unwrap_or("delegated task")
                        .chars()
                        .take(200)
                        .collect(),
                    depth,
                    status: "submitted".into(),
                    call_id: start.call_id,
                    created_at: now,
                };
                child = Some((plan, delegation));
            }
        }
        let gated = start.side_effect_class.is_some_and(|c| c.is_gated());
        let mut a = self.attempt.clone();
        let mut events = Vec::new();
        let mut checkpoint = None;
        let (state_ref, state_bytes) = self.state_ref(call.state.as_deref());
        if gated || a.cadence_due(self.shared.config.get().checkpoint_every_calls) {
            let reason = if gated {
                CheckpointReason::BeforeGatedCall
            } else {
                CheckpointReason::Cadence
            };
            let (cp, more) = a.checkpoint(
                new_id(),
                reason,
                state_ref.clone(),
                Some(start.call_id),
                now,
            )?;
            start.pre_checkpoint_id = Some(cp.checkpoint_id);
            events.extend(more);
            checkpoint = Some(cp);
        }
        let depth_cap = self.shared.config.get().max_sub_agent_depth;
        let kind = start.kind;
        let record = match a.begin_call(start.clone(), depth_cap, now) {
            Ok((record, more)) => {
                events.extend(more);
                record
            }
            Err(CallError::Limit(limit)) => {
                return self.limit_reached(start, request, limit).await;
            }
            Err(CallError::Gate(Gate::Paused(why))) => {
                // The checkpoint before the call was where it paused.
                let cp = checkpoint.clone();
                let retain = self.retain();
                self.save(a, events, move |tx, s| {
                    if let Some(bytes) = state_bytes {
                        tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
                    }
                    if let Some(cp) = &cp {
                        tx.put(s, cp)?;
                    }
                    Ok(())
                })
                .await?;
                return Err(DomainError::Waiting(format!(
                    "attempt {} paused at checkpoint before the call ({why}); call again once its lease is renewed",
                    self.attempt.attempt_id
                ))
                .into());
            }
            Err(CallError::Gate(g)) => {
                return Err(precondition(format!("the call cannot start: {g:?}")));
            }
        };
        let mut child_attempt = None;
        let mut delegated = None;
        if let Some((plan, delegation)) = &child {
            delegated = Some(NewEvent::new(
                &a.tenant_id,
                now,
                &SubAgentDelegated {
                    attempt_id: a.attempt_id,
                    run_id: a.run_id,
                    tenant_id: &a.tenant_id,
                    child_run_id: plan.run.run_id,
                    child_agent_id: &delegation.child_agent_id,
                    depth: delegation.depth,
                },
            ));
        }
        events.extend(delegated);
        let retain = self.retain();
        let cp = checkpoint.clone();
        let rec = record.clone();
        let approval = consumed.clone();
        let (tx_out, rx_out) = oneshot::channel();
        let effect_free = kind == CallKind::Model
            || (kind == CallKind::Tool
                && record.side_effect_class == Some(crate::domain::release::SideEffectClass::Read));
        if call.in_process
            && effect_free
            && checkpoint.is_none()
            && child.is_none()
            && consumed.is_none()
        {
            self.save_queued(a, events, move |tx, s| {
                tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
                if let Some(bytes) = state_bytes {
                    tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
                }
                tx.put(s, &rec)?;
                Ok(())
            });
            self.call_metric(kind, CallStatus::Issued);
            self.open = Some(record.clone());
            return Ok(Begun {
                outcome: BeginOutcome::Started,
                call_id: Some(record.call_id),
                policy_decision_id: record.policy_decision_id,
                fencing_token: self.attempt.fencing_token,
                request_hash: record.request_hash,
                ..Begun::default()
            });
        }
        let runs = self.shared.runs.clone();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            if let Some(bytes) = state_bytes {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            if let Some(cp) = &cp {
                tx.put(s, cp)?;
            }
            tx.put(s, &rec)?;
            if let Some(d) = &approval {
                tx.put(s, d)?;
            }
            if let Some((plan, delegation)) = child {
                tx.put(s, &delegation)?;
                let attempt = runs.create_child(tx, s, plan, retain, now)?;
                let _ = tx_out.send(attempt);
            }
            Ok(())
        })
        .await?;
        if let Ok(attempt) = rx_out.await {
            child_attempt = Some(attempt);
        }
        if checkpoint.is_some() {
            self.checkpoint_metric();
        }
        self.call_metric(kind, CallStatus::Issued);
        self.open = Some(record.clone());
        let child_run_id = child_attempt.as_ref().map(|c| c.run_id);
        if let Some(attempt) = child_attempt
            && let Some(runtime) = self.shared.runtime()
            && let Err(e) = runtime.adopt(&self.scope, attempt.attempt_id)
        {
            tracing::error!(attempt = %attempt.attempt_id, error = %e, "starting a child run's attempt; the reconciler will retry");
        }
        Ok(Begun {
            outcome: BeginOutcome::Started,
            call_id: Some(record.call_id),
            policy_decision_id: record.policy_decision_id,
            fencing_token: self.attempt.fencing_token,
            reason: None,
            decision_id: None,
            approval_id: record.approval_id,
            checkpoint_id: checkpoint.map(|c| c.checkpoint_id),
            child_run_id,
            request_hash: record.request_hash,
            replayed_from: None,
            result: None,
        })
    }

    /// A limit stops the attempt: the call is recorded as refused and the
    /// attempt fails (budget), naming the limit.
    /// `tokensPerDay` refuses a model call: the call is recorded as
    /// refused and not made; the attempt pauses until the next UTC day
    /// (or until the quota allows calls again), or fails, as
    /// `runtime.when_tokens_run_out` says.
    async fn tokens_ran_out(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        limit: crate::domain::capacity::Limit,
    ) -> Result<Begun, RuntimeError> {
        let now = self.now();
        let mode = self.shared.config.get().when_tokens_run_out;
        if mode == crate::config::WhenTokensRunOut::Fail {
            let reached = LimitReached {
                limit: "tokensPerDay",
                reason: format!("{limit} (runtime.when_tokens_run_out = fail)"),
            };
            return self.limit_reached(start, request, reached).await;
        }
        let refused = format!("{limit} (runtime.when_tokens_run_out = wait)");
        self.record_refusal(start, request, &refused, None).await?;
        let mut a = self.attempt.clone();
        let (events, why) = a.pause_for_quota(&limit, now)?;
        self.save(a, events, |_, _| Ok(())).await?;
        Err(DomainError::Waiting(format!(
            "attempt {} is paused: {why}",
            self.attempt.attempt_id
        ))
        .into())
    }

    /// The site's model server its call goes to is at its limits: the
    /// attempt pauses until its turn comes (no call is recorded: none was
    /// made or refused).
    async fn wait_for_model_server(
        &mut self,
        server: &str,
        why: String,
    ) -> Result<Begun, RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let events = a.wait_for_model_server(server, why.clone(), now)?;
        self.save(a, events, |_, _| Ok(())).await?;
        Err(DomainError::Waiting(format!(
            "attempt {} is paused: {why}; call again once it runs",
            self.attempt.attempt_id
        ))
        .into())
    }

    pub(super) async fn limit_reached(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        limit: LimitReached,
    ) -> Result<Begun, RuntimeError> {
        let reason = limit.reason.clone();
        let failure = AttemptFailure {
            class: FailureClass::Budget,
            reason: reason.clone(),
            feedback_ref: None,
            detail_ref: None,
        };
        let state = limit.ends_as();
        self.record_refusal(start, request, &reason, Some((state, failure)))
            .await?;
        Err(DomainError::Exhausted(format!(
            "{reason}; attempt {} ended {state} (budget)",
            self.attempt.attempt_id
        ))
        .into())
    }

    /// An approved approval of this attempt, not yet used, for exactly
    /// this call (the adapter restarted between the answer and the call).
    pub(super) fn granted_approval(&self, start: &CallStart) -> Option<Uuid> {
        let decisions: Vec<DecisionRequest> = self
            .shared
            .store
            .list_under(&self.scope, &format!("{}/", self.attempt.attempt_id))
            .ok()?;
        decisions
            .into_iter()
            .filter(|d| d.status == DecisionStatus::Approved && !d.consumed)
            .find(|d| {
                self.approved(d.approval_id.unwrap_or_default(), start)
                    .is_ok()
            })
            .and_then(|d| d.approval_id)
    }

    /// The approval that allows exactly this call, checked.
    pub(super) fn approved(
        &self,
        approval_id: Uuid,
        start: &CallStart,
    ) -> Result<DecisionRequest, RuntimeError> {
        let ids = self.shared.store.index_ids(
            &self.scope,
            crate::runtime::index::APPROVAL,
            &approval_id.to_string(),
        )?;
        let decision: Option<DecisionRequest> = match ids.first() {
            Some(key) => self.shared.store.get(&self.scope, key)?,
            None => None,
        };
        let Some(decision) = decision.filter(|d| d.attempt_id == self.attempt.attempt_id) else {
            return Err(DomainError::not_found("approval", approval_id).into());
        };
        if decision.status != DecisionStatus::Approved {
            return Err(precondition(format!(
                "approval {approval_id} is {}; the call needs it approved",
                decision.status.as_str()
            )));
        }
        if decision.consumed {
            return Err(precondition(format!(
                "approval {approval_id} was used already; each approval allows one call"
            )));
        }
        let proposal = ProposedCall {
            kind: start.kind,
            target: start.target.clone(),
            side_effect_class: start.side_effect_class,
            request_hash: start.request_hash.clone(),
            policy_decision_id: Uuid::nil(),
        };
        if decision.proposal_hash.as_deref() != Some(proposal.hash().as_str()) {
            return Err(precondition(format!(
                "approval {approval_id} was given for another call (proposal {}); this request hashes to {}",
                decision.proposal_hash.as_deref().unwrap_or("-"),
                proposal.hash()
            )));
        }
        Ok(decision)
    }

    pub(super) async fn ask_approval(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        class: crate::domain::release::SideEffectClass,
    ) -> Result<Begun, RuntimeError> {
        let now = self.now();
        let decision_id = new_id();
        let approval_id = new_id();
        let policy_decision_id = start.policy_decision_id.expect("set");
        let proposal = ProposedCall {
            kind: start.kind,
            target: start.target.clone(),
            side_effect_class: Some(class),
            request_hash: start.request_hash.clone(),
            policy_decision_id,
        };
        let summary = format!(
            "{} call {} ({}) needs approval",
            start.kind.as_str(),
            start.target,
            class.as_str()
        );
        let timeout = Duration::minutes(self.shared.config.get().input_timeout_minutes as i64);
        let assignee = self.info()?.manifest.policy.assignee.clone();
        let mut a = self.attempt.clone();
        let (mut decision, events) = a.request_decision(
            decision_id,
            DecisionKind::Approval,
            Some(approval_id),
            Some(proposal),
            Some(start.request_hash.clone()),
            summary,
            Vec::new(),
            None,
            timeout,
            now,
        )?;
        decision.assignee = assignee;
        let retain = self.retain();
        let d = decision.clone();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            tx.put(s, &d)?;
            Ok(())
        })
        .await?;
        self.decision_metric(DecisionKind::Approval, 1.0);
        self.pending = Some(decision);
        Ok(Begun {
            outcome: BeginOutcome::ApprovalRequired,
            call_id: None,
            policy_decision_id: Some(policy_decision_id),
            fencing_token: self.attempt.fencing_token,
            reason: Some(format!(
                "policy requires approval for tool {} ({}); wait for decision {decision_id}, then begin the same call with approval {approval_id}",
                start.target,
                class.as_str()
            )),
            decision_id: Some(decision_id),
            approval_id: Some(approval_id),
            checkpoint_id: None,
            child_run_id: None,
            request_hash: start.request_hash,
            replayed_from: None,
            result: None,
        })
    }

    pub(super) async fn complete_call(
        &mut self,
        token: u64,
        c: Completion,
    ) -> Result<Completed, RuntimeError> {
        self.fence(token, "CompleteCall").await?;
        let Some(open) = self
            .open
            .clone()
            .filter(|r| r.call_id == c.call_id && r.is_open())
        else {
            let calls: Vec<CallRecord> = self
                .shared
                .store
                .list_under(&self.scope, &format!("{}/", self.attempt.attempt_id))?;
            return match calls.iter().find(|r| r.call_id == c.call_id) {
                Some(r) => Err(precondition(format!(
                    "call {} is {}; only an open call is completed",
                    c.call_id,
                    r.status.as_str()
                ))),
                None => Err(DomainError::not_found("call", c.call_id).into()),
            };
        };
        if open.kind == CallKind::SubAgent {
            return Err(precondition(
                "a sub-agent call completes when its child run ends; use AwaitCall".into(),
            ));
        }
        if open.kind == CallKind::Model {
            // Its place at the model server is free for the next call.
            let tokens = c.usage.map_or(0, |u| u.input_tokens + u.output_tokens);
            self.shared.servers.ended(self.attempt.attempt_id, tokens);
        }
        let now = self.now();
        let retain = self.retain();
        let result_hash = c
            .result
            .as_deref()
            .map(crate::domain::content::content_hash);
        let receipt_ref = c
            .receipt
            .as_deref()
            .map(crate::domain::content::content_hash);
        let mut record = open;
        let mut a = self.attempt.clone();
        let mut events = a.observe_call(
            &mut record,
            CallResult {
                ok: c.ok,
                result_hash: result_hash.clone(),
                receipt_ref: receipt_ref.clone(),
                error: c.error.clone(),
                // A model-invocation-v1 receipt names what served the call.
                served_by: c
                    .receipt
                    .as_deref()
                    .and_then(|r| serde_json::from_slice::<serde_json::Value>(r).ok())
                    .and_then(|r| r.get("servedBy")?.as_str().map(str::to_string)),
                usage: c.usage,
                latency_ms: c.latency_ms,
            },
            now,
        )?;
        let (state_ref, state_bytes) = self.state_ref(c.state.as_deref());
        let (cp, more) = a.checkpoint(
            new_id(),
            CheckpointReason::AfterObservation,
            state_ref,
            Some(record.call_id),
            now,
        )?;
        events.extend(more);
        let (rec, cp2) = (record.clone(), cp.clone());
        let (result, receipt) = (c.result.clone(), c.receipt.clone());
        let charged = record.usage;
        let (runs, charged_to) = (self.shared.runs.clone(), a.clone());
        self.save(a, events, move |tx, s| {
            for bytes in [result, receipt, state_bytes].into_iter().flatten() {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            tx.put(s, &rec)?;
            tx.put(s, &cp2)?;
            if let Some(usage) = &charged {
                runs.charge_tokens(tx, s, &charged_to, usage, now)?;
            }
            Ok(())
        })
        .await?;
        self.open = None;
        self.checkpoint_metric();
        self.call_metric(record.kind, record.status);
        if record.kind == CallKind::Model {
            self.model_metrics(&record);
        }
        Ok(Completed {
            state: self.attempt.state,
            checkpoint: Some(cp),
            result_hash,
            receipt_ref,
            interrupt_requested: self.attempt.interrupt.is_some(),
        })
    }

    pub(super) async fn adapter_checkpoint(
        &mut self,
        token: u64,
        state: Vec<u8>,
        phase: Option<AttemptPhase>,
    ) -> Result<(Checkpoint, AttemptState), RuntimeError> {
        self.fence(token, "Checkpoint").await?;
        self.check_interrupt("Checkpoint").await?;
        let now = self.now();
        let mut a = self.attempt.clone();
        let mut events = Vec::new();
        if let Some(phase) = phase {
            events.extend(a.set_phase(phase, now));
        }
        let state_ref = crate::domain::content::content_hash(&state);
        let (cp, more) = a.checkpoint(new_id(), CheckpointReason::Adapter, state_ref, None, now)?;
        events.extend(more);
        let retain = self.retain();
        let cp2 = cp.clone();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &state, "application/json", Some(retain), now)?;
            tx.put(s, &cp2)?;
            Ok(())
        })
        .await?;
        self.checkpoint_metric();
        Ok((cp, self.attempt.state))
    }

    pub(super) async fn child_ended(&mut self, child: ChildEnded) -> Result<(), RuntimeError> {
        let Some(open) = self
            .open
            .clone()
            .filter(|r| r.call_id == child.parent.call_id && r.is_open())
        else {
            return Ok(());
        };
        let now = self.now();
        let mut record = open;
        let mut a = self.attempt.clone();
        let ok = child.state == RunState::Succeeded;
        let mut events = a.observe_call(
            &mut record,
            CallResult {
                usage: None,
                latency_ms: None,
                ok,
                result_hash: child.output_ref.clone(),
                receipt_ref: Some(format!("run:{}", child.child_run_id)),
                served_by: None,
                error: (!ok).then(|| {
                    format!(
                        "child run {} ended {}: {}",
                        child.child_run_id,
                        child.state,
                        child.reason.clone().unwrap_or_default()
                    )
                }),
            },
            now,
        )?;
        // The adapter gets a full lease to pick the result up.
        a.renew_lease(self.lease_ttl(), now);
        let (state_ref, state_bytes) = self.state_ref(None);
        let (cp, more) = a.checkpoint(
            new_id(),
            CheckpointReason::AfterObservation,
            state_ref,
            Some(record.call_id),
            now,
        )?;
        events.extend(more);
        let retain = self.retain();
        let rec = record.clone();
        let (attempt_id, delegation_id, state) =
            (a.attempt_id, child.parent.delegation_id, child.state);
        self.save(a, events, move |tx, s| {
            if let Some(bytes) = state_bytes {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            tx.put(s, &rec)?;
            tx.put(s, &cp)?;
            let key = SubAgentDelegation::key(attempt_id, delegation_id);
            if let Some(mut d) = tx.get::<SubAgentDelegation>(s, &key)? {
                d.child_ended(state.as_str());
                tx.put(s, &d)?;
            }
            Ok(())
        })
        .await?;
        self.open = None;
        self.checkpoint_metric();
        self.call_metric(CallKind::SubAgent, record.status);
        // It gave its compute back while the child ran: it asks again
        // (its run kept its run slot).
        if self.attempt.needs_capacity() {
            self.acquire_capacity();
        }
        Ok(())
    }
}
