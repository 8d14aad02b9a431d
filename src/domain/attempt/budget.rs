//! An attempt's budgets: the active clock `maxMinutes` counts (Running,
//! or in a model or tool call; not waiting for capacity, a human, a
//! delegated child run, or paused), the limits a call is checked against
//! before it starts (model and tool calls, context, delegation depth, the
//! token budget `maxTotalTokens`), and what running out does.

use chrono::{DateTime, Duration, Utc};

use super::*;

/// A limit that stops the attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitReached {
    /// The limit's name: maxModelCalls, maxToolCalls, maxContextTokens,
    /// maxSubAgentDepth, maxTotalTokens.
    pub limit: &'static str,
    /// In words.
    pub reason: String,
}

impl LimitReached {
    /// The state the attempt ends in: the token budget is the attempt's
    /// budget running out (AttemptBudgetExceeded, TimedOut, like
    /// maxMinutes); a count or size limit fails it.
    pub fn ends_as(&self) -> AttemptState {
        if self.limit == "maxTotalTokens" {
            AttemptState::TimedOut
        } else {
            AttemptState::Failed
        }
    }
}

impl ExecutionAttempt {
    /// Whether its time counts against `maxMinutes` now: Running, or in a
    /// model or tool call, but not while it waits for a delegated child
    /// run (whose attempts have budgets of their own).
    pub(super) fn clock_runs(&self) -> bool {
        self.state.is_active()
            && !(self.state == AttemptState::WaitingForTool
                && self
                    .open_call
                    .as_ref()
                    .is_some_and(|c| c.kind == CallKind::SubAgent))
    }

    /// Starts or stops the active clock after a change of state or of the
    /// call in flight.
    pub(super) fn sync_clock(&mut self, now: DateTime<Utc>) {
        match (self.clock_runs(), self.running_since.is_some()) {
            (true, false) => self.running_since = Some(now),
            (false, true) => {
                self.usage.active_ms += self.active_stretch_ms(now);
                self.running_since = None;
            }
            _ => {}
        }
    }

    pub(super) fn active_stretch_ms(&self, now: DateTime<Utc>) -> u64 {
        self.running_since
            .map(|since| (now - since).num_milliseconds().max(0) as u64)
            .unwrap_or(0)
    }

    /// Active milliseconds so far.
    pub fn active_ms(&self, now: DateTime<Utc>) -> u64 {
        self.usage.active_ms + self.active_stretch_ms(now)
    }

    /// When `maxMinutes` runs out, while the attempt is active.
    pub fn budget_deadline(&self) -> Option<DateTime<Utc>> {
        let since = self.running_since?;
        let budget = u64::from(self.limits.max_minutes) * 60_000;
        let left = budget.saturating_sub(self.usage.active_ms);
        Some(since + Duration::milliseconds(left as i64))
    }

    /// The limit a call would break, if any. `delegation_depth` is the
    /// depth of the child run a sub-agent call would create; `depth_cap`
    /// is `Runtime:Attempts:MaxSubAgentDepth`.
    pub fn limit_for(
        &self,
        kind: CallKind,
        context_tokens: Option<u32>,
        depth_cap: u32,
    ) -> Option<LimitReached> {
        let l = &self.limits;
        match kind {
            CallKind::Model if self.usage.model_calls >= l.max_model_calls => Some(LimitReached {
                limit: "maxModelCalls",
                reason: format!(
                    "maxModelCalls {} reached: {} model calls made",
                    l.max_model_calls, self.usage.model_calls
                ),
            }),
            CallKind::Model => match context_tokens {
                Some(t) if t > l.max_context_tokens => Some(LimitReached {
                    limit: "maxContextTokens",
                    reason: format!(
                        "maxContextTokens {} exceeded: the call has {t} tokens of context (the larger of what its adapter declared and its request's size)",
                        l.max_context_tokens
                    ),
                }),
                t => {
                    let used = self.usage.tokens.total();
                    let asks = u64::from(t.unwrap_or(0));
                    (l.max_total_tokens > 0 && used + asks > l.max_total_tokens).then(|| {
                        LimitReached {
                            limit: "maxTotalTokens",
                            reason: format!(
                                "maxTotalTokens {} would be exceeded: {used} tokens used by {} model calls, and the call has {asks} tokens of context",
                                l.max_total_tokens, self.usage.tokens.model_calls
                            ),
                        }
                    })
                }
            },
            CallKind::Tool if self.usage.tool_calls >= l.max_tool_calls => Some(LimitReached {
                limit: "maxToolCalls",
                reason: format!(
                    "maxToolCalls {} reached: {} tool calls made",
                    l.max_tool_calls, self.usage.tool_calls
                ),
            }),
            CallKind::Tool => None,
            CallKind::SubAgent => {
                let cap = l.max_sub_agent_depth.min(depth_cap);
                let child_depth = self.depth + 1;
                (child_depth > cap).then(|| LimitReached {
                    limit: "maxSubAgentDepth",
                    reason: format!(
                        "maxSubAgentDepth {cap} reached: a child of this run would be at depth {child_depth}"
                    ),
                })
            }
        }
    }

    /// `maxMinutes` ran out: the open call settles like on cancellation,
    /// then Running -> TimedOut (or WaitingForTool -> Uncertain).
    pub fn time_out(
        &mut self,
        open: Option<&mut CallRecord>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        let mut events = Vec::new();
        let why = format!("maxMinutes {} reached", self.limits.max_minutes);
        let uncertain = self.settle_open_call(open, &why, now, &mut events)?;
        let failure = Some(AttemptFailure {
            class: FailureClass::Budget,
            reason: format!(
                "maxMinutes {} reached after {} s of active time",
                self.limits.max_minutes,
                self.active_ms(now) / 1000
            ),
            feedback_ref: None,
            detail_ref: None,
        });
        let state = if uncertain {
            AttemptState::Uncertain
        } else {
            AttemptState::TimedOut
        };
        events.extend(self.finish(state, failure, None, now)?);
        Ok(events)
    }
}
