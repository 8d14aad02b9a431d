//! An attempt's human decisions: asking one (an approval, an input, an
//! escalation) and resolving it (answered, approved, rejected, expired).

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

use super::*;

impl ExecutionAttempt {
    /// Running -> WaitingForDecision with a new decision request.
    #[allow(clippy::too_many_arguments)]
    pub fn request_decision(
        &mut self,
        decision_id: Uuid,
        kind: DecisionKind,
        approval_id: Option<Uuid>,
        proposal: Option<ProposedCall>,
        question_ref: Option<String>,
        summary: String,
        options: Vec<String>,
        recommendation: Option<String>,
        timeout: Duration,
        now: DateTime<Utc>,
    ) -> Result<(DecisionRequest, Vec<NewEvent>), IllegalTransition> {
        if self.state != AttemptState::Running || self.open_call.is_some() {
            return Err(self.illegal(format!("request an {} decision", kind.as_str())));
        }
        let mut events = Vec::new();
        let phase = self.phase;
        self.move_to(AttemptState::WaitingForDecision, phase, now, &mut events)?;
        self.pending_decision = Some(decision_id);
        self.usage.decisions += 1;
        let proposal_hash = proposal.as_ref().map(ProposedCall::hash);
        let request = DecisionRequest {
            responded: false,
            edited_request_hash: None,
            assignee: None,
            decision_id,
            attempt_id: self.attempt_id,
            run_id: self.run_id,
            tenant_id: self.tenant_id.clone(),
            kind,
            approval_id,
            proposal,
            proposal_hash,
            question_ref,
            summary,
            options,
            recommendation,
            status: DecisionStatus::Pending,
            requested_at: now,
            expires_at: now + timeout,
            answered_at: None,
            answered_by: None,
            choice: None,
            answer_ref: None,
            reason: None,
            consumed: false,
            answer_schema: None,
            tool_call_id: None,
            purged: None,
        };
        events.push(NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptDecisionRequested {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                decision_id,
                kind,
                approval_id,
            },
        ));
        Ok((request, events))
    }

    /// Resolves the pending decision: approved or answered -> Running;
    /// rejected or expired -> Failed.
    pub fn resolve_decision(
        &mut self,
        decision: &mut DecisionRequest,
        resolution: Resolution,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, DomainError> {
        if self.pending_decision != Some(decision.decision_id)
            || self.state != AttemptState::WaitingForDecision
            || decision.status != DecisionStatus::Pending
        {
            return Err(DomainError::FailedPrecondition(format!(
                "decision {} is {} and attempt {} is {}: nothing to resolve",
                decision.decision_id,
                decision.status.as_str(),
                self.attempt_id,
                self.state
            )));
        }
        let mut events = Vec::new();
        self.pending_decision = None;
        decision.answered_at = Some(now);
        let failure = match resolution {
            Resolution::Approved { by, reason, edited } => {
                if let Some(request_hash) = edited {
                    // What is approved is the call with the changed
                    // arguments: only that call may use the approval.
                    let Some(proposal) = decision.proposal.as_ref() else {
                        return Err(DomainError::FailedPrecondition(format!(
                            "decision {} proposes no call whose arguments could change",
                            decision.decision_id
                        )));
                    };
                    let approved = ProposedCall {
                        request_hash: request_hash.clone(),
                        ..proposal.clone()
                    };
                    decision.proposal_hash = Some(approved.hash());
                    decision.edited_request_hash = Some(request_hash);
                }
                decision.status = DecisionStatus::Approved;
                decision.answered_by = Some(by);
                decision.reason = reason;
                None
            }
            Resolution::Answered {
                by,
                choice,
                answer_ref,
            } => {
                decision.status = DecisionStatus::Answered;
                decision.answered_by = Some(by);
                decision.choice = choice;
                decision.answer_ref = answer_ref;
                None
            }
            Resolution::Rejected {
                by,
                reason,
                respond,
            } => {
                decision.status = DecisionStatus::Rejected;
                if respond {
                    // The call is not made; the agent hears why and goes on.
                    decision.responded = true;
                    decision.answered_by = Some(by);
                    decision.reason = reason;
                    let phase = self.phase;
                    self.move_to(AttemptState::Running, phase, now, &mut events)?;
                    return Ok(events);
                }
                let why = format!(
                    "approval {} for {} was rejected by {by}{}",
                    decision
                        .approval_id
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    decision
                        .proposal
                        .as_ref()
                        .map(|p| format!("{} {}", p.kind.as_str(), p.target))
                        .unwrap_or_else(|| "the call".into()),
                    reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
                decision.answered_by = Some(by);
                decision.reason = reason;
                Some(AttemptFailure {
                    class: FailureClass::Policy,
                    reason: why,
                    feedback_ref: None,
                    detail_ref: None,
                })
            }
            Resolution::Expired { minutes } => {
                decision.status = DecisionStatus::Expired;
                decision.answered_at = None;
                Some(AttemptFailure {
                    class: FailureClass::Budget,
                    reason: format!(
                        "{} decision {} expired: nobody answered within {minutes} minutes (Runtime:Decisions:InputTimeoutMinutes)",
                        decision.kind.as_str(),
                        decision.decision_id
                    ),
                    feedback_ref: None,
                    detail_ref: None,
                })
            }
        };
        match failure {
            None => {
                let phase = self.phase;
                self.move_to(AttemptState::Running, phase, now, &mut events)?;
            }
            Some(failure) => {
                events.extend(self.finish(AttemptState::Failed, Some(failure), None, now)?);
            }
        }
        Ok(events)
    }
}
