//! An attempt's calls: the gate a call passes (state, interruption, the
//! call in flight), issuing one within the limits, recording a refused or
//! replayed one, observing its result (with the tokens a model call used)
//! and settling one that cannot finish.

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

use super::*;

impl ExecutionAttempt {
    /// Whether a call may start now.
    pub fn gate(&self) -> Result<(), Gate> {
        if self.interrupt.is_some() && !self.state.is_terminal() {
            return Err(Gate::Interrupted);
        }
        match self.state {
            AttemptState::Running if !self.capacity_granted => {
                return Err(Gate::NoCapacity(format!(
                    "it gave capacity lease {} back while it waited and waits for capacity again",
                    self.capacity_gaps
                        .last()
                        .map(|g| g.lease_id.to_string())
                        .unwrap_or_default()
                )));
            }
            AttemptState::Running => {}
            AttemptState::Paused => {
                return Err(Gate::Paused(self.pause_reason.clone().unwrap_or_default()));
            }
            _ => return Err(Gate::WrongState(self.illegal("start a call"))),
        }
        if let Some(open) = &self.open_call {
            return Err(Gate::Busy(open.call_id));
        }
        Ok(())
    }

    pub(super) fn next_call_sequence(&mut self) -> u32 {
        self.usage.calls += 1;
        self.usage.calls
    }

    /// Issues a call: a record in state issued. Tool and sub-agent calls
    /// put the attempt in WaitingForTool; a model call keeps it Running
    /// (phase Calling). The caller has checked the policy and the closure;
    /// the gate and the limits are checked here, so no call ever starts
    /// past a limit or after an interruption.
    pub fn begin_call(
        &mut self,
        call: CallStart,
        depth_cap: u32,
        now: DateTime<Utc>,
    ) -> Result<(CallRecord, Vec<NewEvent>), CallError> {
        self.gate().map_err(CallError::Gate)?;
        if let Some(limit) = self.limit_for(call.kind, call.context_tokens, depth_cap) {
            return Err(CallError::Limit(limit));
        }
        let mut events = Vec::new();
        let sequence = self.next_call_sequence();
        match call.kind {
            CallKind::Model => {
                self.usage.model_calls += 1;
                if let Some(t) = call.context_tokens {
                    self.usage.context_tokens = self.usage.context_tokens.max(t);
                }
                if let Some(since) = call.context_since {
                    events.extend(self.set_phase(AttemptPhase::BuildingContext, since.min(now)));
                }
                events.extend(self.set_phase(AttemptPhase::Calling, now));
            }
            CallKind::Tool | CallKind::SubAgent => {
                if call.kind == CallKind::Tool {
                    self.usage.tool_calls += 1;
                } else {
                    self.usage.sub_agents += 1;
                }
                self.move_to(
                    AttemptState::WaitingForTool,
                    AttemptPhase::Calling,
                    now,
                    &mut events,
                )
                .map_err(|e| CallError::Gate(Gate::WrongState(e)))?;
            }
        }
        self.open_call = Some(OpenCall {
            call_id: call.call_id,
            sequence,
            kind: call.kind,
            side_effect_class: call.side_effect_class,
            timeout_at: call
                .timeout_seconds
                .filter(|_| call.kind == CallKind::Tool)
                .map(|s| now + Duration::seconds(s as i64)),
        });
        self.usage.calls_since_checkpoint += 1;
        self.sync_clock(now);
        let record = self.call_record(call, sequence, None, now);
        Ok((record, events))
    }

    /// Records a call refused before it started (outside the closure,
    /// denied by policy, invalid arguments): status failed, nothing issued,
    /// nothing counted against the limits.
    pub fn refuse_call(&mut self, call: CallStart, reason: &str, now: DateTime<Utc>) -> CallRecord {
        let sequence = self.next_call_sequence();
        let mut record = self.call_record(call, sequence, Some(reason), now);
        record.pre_checkpoint_id = None;
        record
    }

    /// A call's record: issued, or failed with `refused` as its error.
    pub(super) fn call_record(
        &self,
        call: CallStart,
        sequence: u32,
        refused: Option<&str>,
        now: DateTime<Utc>,
    ) -> CallRecord {
        CallRecord {
            call_id: call.call_id,
            attempt_id: self.attempt_id,
            tenant_id: self.tenant_id.clone(),
            sequence,
            kind: call.kind,
            target: call.target,
            side_effect_class: call.side_effect_class,
            request_hash: call.request_hash,
            policy_decision_id: call.policy_decision_id,
            policy_rule: call.policy_rule,
            approval_id: call.approval_id,
            receipt_ref: None,
            served_by: None,
            result_hash: None,
            status: if refused.is_some() {
                CallStatus::Failed
            } else {
                CallStatus::Issued
            },
            error: refused.map(str::to_string),
            pre_checkpoint_id: call.pre_checkpoint_id,
            fencing_token: self.fencing_token,
            context_tokens: call.context_tokens,
            usage: None,
            latency_ms: None,
            started_at: now,
            ended_at: refused.map(|_| now),
            late_receipt_ref: None,
            purged: None,
            settlement: None,
            replay_of: None,
        }
    }

    /// A call of a re-run identical (target and request) to one whose
    /// effect the source attempt confirmed: recorded as completed with the
    /// source's result and receipt, and never issued. The caller has
    /// passed the gate.
    pub fn replay_call(
        &mut self,
        call: CallStart,
        source: &CallRecord,
        now: DateTime<Utc>,
    ) -> CallRecord {
        let sequence = self.next_call_sequence();
        let mut record = self.call_record(call, sequence, None, now);
        record.pre_checkpoint_id = None;
        record.status = CallStatus::Completed;
        record.result_hash = source.result_hash.clone();
        record.receipt_ref = source.receipt_ref.clone();
        record.ended_at = Some(now);
        record.replay_of = Some(ReplayOf {
            attempt_id: source.attempt_id,
            call_id: source.call_id,
            sequence: source.sequence,
        });
        record
    }

    /// The open call's result was observed: the record completes (or
    /// fails), WaitingForTool -> Running, phase Observing.
    pub fn observe_call(
        &mut self,
        record: &mut CallRecord,
        result: CallResult,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.open_call.as_ref().map(|c| c.call_id) != Some(record.call_id) {
            return Err(self.illegal(format!("observe call {} (it is not open)", record.call_id)));
        }
        let mut events = Vec::new();
        if self.state == AttemptState::WaitingForTool {
            self.move_to(
                AttemptState::Running,
                AttemptPhase::Observing,
                now,
                &mut events,
            )?;
        } else if self.state == AttemptState::Running {
            events.extend(self.set_phase(AttemptPhase::Observing, now));
        } else {
            return Err(self.illegal("observe a call result"));
        }
        self.open_call = None;
        record.status = if result.ok {
            CallStatus::Completed
        } else {
            CallStatus::Failed
        };
        record.result_hash = result.result_hash;
        record.receipt_ref = result.receipt_ref;
        record.served_by = result.served_by;
        record.error = result.error;
        record.ended_at = Some(now);
        record.latency_ms = Some(
            result
                .latency_ms
                .unwrap_or_else(|| (now - record.started_at).num_milliseconds().max(0) as u64),
        );
        if record.kind == CallKind::Model
            && let Some(usage) = result.usage
        {
            let usage = TokenUsage {
                model_calls: 1,
                ..usage
            };
            record.usage = Some(usage);
            self.usage.tokens.add(&usage);
        }
        Ok(events)
    }

    /// Whether the checkpoint cadence asks for one now.
    pub fn cadence_due(&self, every_calls: u32) -> bool {
        every_calls > 0 && self.usage.calls_since_checkpoint >= every_calls
    }

    /// Settles the open call of a forced stop; true when its effect is
    /// unconfirmed (Uncertain). A call nobody can have acted on is
    /// abandoned, and a WaitingForTool attempt is back to Running.
    pub(super) fn settle_open_call(
        &mut self,
        open: Option<&mut CallRecord>,
        why: &str,
        now: DateTime<Utc>,
        events: &mut Vec<NewEvent>,
    ) -> Result<bool, IllegalTransition> {
        let Some(call) = self.open_call.clone() else {
            return Ok(false);
        };
        let Some(record) = open.filter(|r| r.call_id == call.call_id) else {
            return Err(self.illegal(format!("settle call {} without its record", call.call_id)));
        };
        record.ended_at = Some(now);
        if call.effect_unconfirmed() {
            record.status = CallStatus::Uncertain;
            record.error = Some(format!(
                "in flight when the attempt stopped ({why}); its effect cannot be confirmed: an operator must settle it"
            ));
            return Ok(true);
        }
        record.status = CallStatus::Abandoned;
        record.error = Some(format!("stopped before a result ({why}); it has no effect"));
        self.open_call = None;
        if self.state == AttemptState::WaitingForTool {
            self.move_to(AttemptState::Running, AttemptPhase::Observing, now, events)?;
        }
        Ok(false)
    }

    /// A tool call outlasted its timeout (the grain's reminder, or the
    /// builtin loop that killed its process tree) and settles by its
    /// class: a read fails and the attempt goes on; a call with effects may
    /// have had them, so it is Uncertain (never issued again) and so is
    /// the attempt. `open` is the open call's record; it must be `call_id`.
    pub fn call_timed_out(
        &mut self,
        open: Option<&mut CallRecord>,
        call_id: Uuid,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        let Some(call) = self.open_call.clone().filter(|c| c.call_id == call_id) else {
            return Err(self.illegal(format!("time out call {call_id}: it is not open")));
        };
        let mut events = Vec::new();
        if call.effect_unconfirmed() {
            self.settle_open_call(open, why, now, &mut events)?;
            let failure = Some(AttemptFailure {
                class: FailureClass::Infrastructure,
                reason: why.to_string(),
                feedback_ref: None,
                detail_ref: None,
            });
            events.extend(self.finish(AttemptState::Uncertain, failure, None, now)?);
            return Ok(events);
        }
        let Some(record) = open.filter(|r| r.call_id == call_id) else {
            return Err(self.illegal(format!("time out call {call_id} without its record")));
        };
        record.status = CallStatus::Failed;
        record.ended_at = Some(now);
        record.error = Some(why.to_string());
        self.open_call = None;
        if self.state == AttemptState::WaitingForTool {
            self.move_to(
                AttemptState::Running,
                AttemptPhase::Observing,
                now,
                &mut events,
            )?;
        }
        Ok(events)
    }
}
