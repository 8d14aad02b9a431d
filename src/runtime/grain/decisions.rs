//! Human decisions: input and escalation questions, approvals, answers
//! and expiry.

use super::*;
use crate::domain::audit::Change;

impl Grain {
    pub(super) fn decision_metric(&self, kind: DecisionKind, delta: f64) {
        metrics::gauge!(names::DECISIONS_WAITING, "tenant" => self.attempt.tenant_id.to_string(), "kind" => kind.as_str())
            .increment(delta);
    }

    pub(super) async fn request_decision(
        &mut self,
        token: u64,
        ask: DecisionAsk,
    ) -> Result<DecisionRequest, RuntimeError> {
        self.fence(token, "RequestDecision").await?;
        self.check_interrupt("RequestDecision").await?;
        ask.check()?;
        let now = self.now();
        let timeout = Duration::minutes(self.shared.config.get().input_timeout_minutes as i64);
        let question_ref = ask
            .question
            .as_deref()
            .map(crate::domain::content::content_hash);
        let mut a = self.attempt.clone();
        let (decision, events) = a.request_decision(
            new_id(),
            ask.kind,
            None,
            None,
            question_ref,
            ask.summary,
            ask.options,
            ask.recommendation,
            timeout,
            now,
        )?;
        let mut decision = decision;
        decision.answer_schema = ask.answer_schema;
        decision.tool_call_id = ask.tool_call_id;
        decision.assignee = match &ask.assignee {
            Some(who) => Some(crate::domain::access::Assignee::parse("assignee", who)?),
            None => self.info()?.manifest.policy.assignee.clone(),
        };
        let retain = self.retain();
        let d = decision.clone();
        let question = ask.question;
        self.save(a, events, move |tx, s| {
            if let Some(q) = &question {
                tx.put_artifact(s, q, "application/json", Some(retain), now)?;
            }
            tx.put(s, &d)?;
            Ok(())
        })
        .await?;
        self.decision_metric(decision.kind, 1.0);
        self.pending = Some(decision.clone());
        Ok(decision)
    }

    pub(super) fn pending_named(&self, decision_id: Uuid) -> Result<DecisionRequest, RuntimeError> {
        match &self.pending {
            Some(d) if d.decision_id == decision_id => Ok(d.clone()),
            _ => {
                let stored: Option<DecisionRequest> = self.shared.store.get(
                    &self.scope,
                    &decision_key(self.attempt.attempt_id, decision_id),
                )?;
                match stored {
                    Some(d) => Err(precondition(format!(
                        "decision {decision_id} is {}; only a pending decision is answered",
                        d.status.as_str()
                    ))),
                    None => Err(DomainError::not_found("decision", decision_id).into()),
                }
            }
        }
    }

    /// Resolves the pending decision and stores it.
    pub(super) async fn resolve(
        &mut self,
        mut decision: DecisionRequest,
        resolution: Resolution,
        answer: Option<Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let mut events = a.resolve_decision(&mut decision, resolution, now)?;
        // The adapter gets a full lease to pick the answer up.
        a.renew_lease(self.lease_ttl(), now);
        // One that gave its capacity back asks again.
        if a.needs_capacity() {
            a.capacity_requested(now);
        }
        if decision.kind == DecisionKind::Approval
            && matches!(
                decision.status,
                DecisionStatus::Approved | DecisionStatus::Rejected
            )
        {
            events.push(NewEvent::new(
                &a.tenant_id,
                now,
                &ApprovalDecided {
                    approval_id: decision.approval_id.unwrap_or_default(),
                    run_id: a.run_id,
                    attempt_id: a.attempt_id,
                    tenant_id: &a.tenant_id,
                    decision: decision.status.as_str(),
                    decided_by: decision.answered_by.as_deref().unwrap_or(""),
                    proposal_hash: decision.proposal_hash.as_deref().unwrap_or(""),
                },
            ));
        }
        let retain = self.retain();
        let d = decision.clone();
        // An approval's decision is audited by its event; an answer has none.
        let answered = (decision.status == DecisionStatus::Answered).then(|| {
            Change::new(&d.tenant_id, "decision.answer", d.decision_id.to_string())
                .after(serde_json::json!({
                    "attemptId": d.attempt_id,
                    "kind": d.kind.as_str(),
                    "choice": d.choice,
                    "answerRef": d.answer_ref,
                }))
                .detail(d.summary.clone())
        });
        self.save(a, events, move |tx, s| {
            if let Some(bytes) = &answer {
                tx.put_artifact(s, bytes, "application/json", Some(retain), now)?;
            }
            if let Some(change) = answered {
                tx.audit(now, change)?;
            }
            tx.put(s, &d)?;
            Ok(())
        })
        .await?;
        self.decision_metric(decision.kind, -1.0);
        self.pending = None;
        if self.attempt.needs_capacity() {
            self.acquire_capacity();
        }
        Ok(())
    }

    pub(super) async fn answer(
        &mut self,
        decision_id: Uuid,
        by: String,
        choice: Option<String>,
        answer: Option<Vec<u8>>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let decision = self.pending_named(decision_id)?;
        match decision.kind {
            DecisionKind::Approval => {
                return Err(precondition(format!(
                    "decision {decision_id} is an approval ({}); approvals are decided with Runs/DecideApproval",
                    decision
                        .approval_id
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                )));
            }
            DecisionKind::Escalation => match &choice {
                Some(c) if decision.options.contains(c) => {}
                Some(c) => {
                    return Err(crate::domain::FieldError::new(
                        "choice",
                        format!(
                            "{c:?} is not one of the options: {}",
                            decision.options.join(", ")
                        ),
                    )
                    .into());
                }
                None if decision.options.is_empty() && answer.is_some() => {}
                None => {
                    return Err(crate::domain::FieldError::new(
                        "choice",
                        format!("is required: one of {}", decision.options.join(", ")),
                    )
                    .into());
                }
            },
            DecisionKind::Input => {
                let Some(bytes) = &answer else {
                    return Err(crate::domain::FieldError::new(
                        "answerJson",
                        "is required for an input decision",
                    )
                    .into());
                };
                if let Some(schema) = &decision.answer_schema {
                    let validator = jsonschema::validator_for(schema)
                        .map_err(|e| precondition(format!("the decision's answer schema: {e}")))?;
                    let document: serde_json::Value = serde_json::from_slice(bytes)
                        .map_err(|e| crate::domain::FieldError::new("answerJson", e.to_string()))?;
                    let problems = crate::runtime::release::violations(&validator, &document);
                    if !problems.is_empty() {
                        return Err(crate::domain::FieldError::new(
                            "answerJson",
                            format!("does not match the answer schema: {}", problems.join("; ")),
                        )
                        .into());
                    }
                }
            }
        }
        let answer_ref = answer.as_deref().map(crate::domain::content::content_hash);
        self.resolve(
            decision,
            Resolution::Answered {
                by,
                choice,
                answer_ref,
            },
            answer,
        )
        .await?;
        Ok(self.attempt.clone())
    }

    pub(super) async fn decide(
        &mut self,
        decision_id: Uuid,
        verdict: crate::runtime::ApprovalVerdict,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let crate::runtime::ApprovalVerdict {
            approve,
            by,
            reason,
            arguments,
            respond,
        } = verdict;
        if respond && (approve || reason.as_deref().is_none_or(|r| r.trim().is_empty())) {
            return Err(crate::domain::FieldError::new(
                "reason",
                "a response is a rejection with words for the agent: give them",
            )
            .into());
        }
        let decision = self.pending_named(decision_id)?;
        if decision.kind != DecisionKind::Approval {
            return Err(precondition(format!(
                "decision {decision_id} is an {} decision; answer it with Runtime/AnswerDecision",
                decision.kind.as_str()
            )));
        }
        let edited = match arguments {
            None => None,
            Some(_) if !approve => {
                return Err(crate::domain::FieldError::new(
                    "arguments",
                    "only an approval takes changed arguments; a rejection has none",
                )
                .into());
            }
            Some(arguments) => Some(self.edited_arguments(&decision, arguments)?),
        };
        let (resolution, bytes) = match edited {
            Some((hash, bytes)) if approve => (
                Resolution::Approved {
                    by,
                    reason,
                    edited: Some(hash),
                },
                Some(bytes),
            ),
            _ if approve => (
                Resolution::Approved {
                    by,
                    reason,
                    edited: None,
                },
                None,
            ),
            _ => (
                Resolution::Rejected {
                    by,
                    reason,
                    respond,
                },
                None,
            ),
        };
        self.resolve(decision, resolution, bytes).await?;
        Ok(self.attempt.clone())
    }

    /// The changed arguments of an approval, checked: the release's policy
    /// lets a reviewer change this tool's arguments, and they fit its
    /// input schema. Returns their request hash and canonical bytes.
    fn edited_arguments(
        &self,
        decision: &DecisionRequest,
        arguments: serde_json::Value,
    ) -> Result<(String, Vec<u8>), RuntimeError> {
        let info = self.info()?;
        let Some(proposal) = decision
            .proposal
            .as_ref()
            .filter(|p| p.kind == CallKind::Tool)
        else {
            return Err(precondition(format!(
                "decision {} proposes no tool call whose arguments could change",
                decision.decision_id
            )));
        };
        if !info.manifest.policy.allows_edit(&proposal.target) {
            return Err(precondition(format!(
                "the policy of release {} does not let a reviewer change the arguments of tool {} (policy.editable); approve or reject the call as proposed",
                info.manifest.release_id, proposal.target
            )));
        }
        let Some((_, schema)) = info.tool(&proposal.target) else {
            return Err(precondition(format!(
                "tool {} is not in the release's closure",
                proposal.target
            )));
        };
        if let Some(why) =
            crate::runtime::release::argument_mismatch(schema, &proposal.target, &arguments)
        {
            return Err(crate::domain::FieldError::new("arguments", why).into());
        }
        Ok((
            crate::domain::attempt::json_hash(&arguments),
            crate::domain::release::canonical_json(&arguments),
        ))
    }
}
