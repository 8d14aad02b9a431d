//! The rules of a re-run: which checkpoints of a finished attempt can
//! start one, which calls of the source count as effects already made,
//! which of them a re-run's call is answered from, and how the new run
//! takes over the source's steps.

use std::cmp::Ordering;

use super::attempt::{
    CallKind, CallRecord, CallStatus, Checkpoint, CheckpointReason, ExecutionAttempt,
};
use super::run::{RerunOrigin, Run, RunState};

/// Why no checkpoint of `attempt` can start a re-run, whichever the
/// release: it is not finished, or a call's effect is unknown.
pub fn attempt_blocker(attempt: &ExecutionAttempt, calls: &[CallRecord]) -> Option<String> {
    if !attempt.state.is_terminal() {
        return Some(format!(
            "attempt {} is {}; a re-run starts from a checkpoint of a finished attempt",
            attempt.attempt_id,
            attempt.state.as_str()
        ));
    }
    calls
        .iter()
        .find(|c| c.status == CallStatus::Uncertain && c.settlement.is_none())
        .map(|c| {
            format!(
                "call {} ({}) of attempt {} is uncertain: settle it first (whether its effect happened decides what a re-run may do again)",
                c.sequence, c.target, attempt.attempt_id
            )
        })
}

/// The number of the source attempt's call records written before
/// `checkpoint`: the calls with a higher sequence came after it.
pub fn calls_before(checkpoint: &Checkpoint, calls: &[CallRecord]) -> u32 {
    if let Some(n) = checkpoint.calls_before {
        return n;
    }
    // Checkpoints written before the count was kept: from the call they
    // precede or follow, else by time.
    let call = checkpoint
        .call_id
        .and_then(|id| calls.iter().find(|c| c.call_id == id));
    match (checkpoint.reason, call) {
        (CheckpointReason::BeforeGatedCall | CheckpointReason::Cadence, Some(c)) => c.sequence - 1,
        (_, Some(c)) => c.sequence,
        (_, None) => calls
            .iter()
            .filter(|c| c.started_at <= checkpoint.created_at)
            .count() as u32,
    }
}

/// The confirmed effects of the source attempt after `checkpoint`.
pub fn effects_after(checkpoint: &Checkpoint, calls: &[CallRecord]) -> Vec<CallRecord> {
    let before = calls_before(checkpoint, calls);
    calls
        .iter()
        .filter(|c| c.sequence > before && c.confirmed_effect())
        .cloned()
        .collect()
}

/// Why `checkpoint` cannot start a re-run with `release` (whose adapter
/// version and checkpoint format are given).
pub fn checkpoint_blocker(
    checkpoint: &Checkpoint,
    adapter_version: &str,
    checkpoint_format: u32,
) -> Option<String> {
    if let Some(t) = &checkpoint.purged {
        return Some(format!(
            "the adapter state of checkpoint {} was {}",
            checkpoint.sequence,
            t.describe()
        ));
    }
    checkpoint
        .compatible_with(adapter_version, checkpoint_format)
        .err()
}

impl RerunOrigin {
    /// The source call a re-run's call (kind, target, request hash) is
    /// answered from instead of being issued: a confirmed effect of the
    /// source attempt after the checkpoint that the operator did not name
    /// for re-issue.
    pub fn answers<'a>(
        &self,
        source_calls: &'a [CallRecord],
        kind: CallKind,
        target: &str,
        request_hash: &str,
    ) -> Option<&'a CallRecord> {
        source_calls.iter().find(|c| {
            c.sequence > self.calls_before
                && c.confirmed_effect()
                && !self.reissue.contains(&c.call_id)
                && c.kind == kind
                && c.target == target
                && c.request_hash == request_hash
        })
    }
}

impl Run {
    /// Makes this planned run the re-run `origin` describes: it starts at
    /// the origin's step, the steps before it keep what the source run
    /// verified, and it runs at the source's sub-agent depth.
    pub fn continue_from(&mut self, source: &Run, origin: RerunOrigin) {
        let at = origin.step_index as usize;
        self.depth = source.depth;
        for (i, (step, old)) in self.steps.iter_mut().zip(&source.steps).enumerate() {
            match i.cmp(&at) {
                Ordering::Less => {
                    step.state = RunState::Succeeded;
                    step.input_ref = old.input_ref.clone();
                    step.output_ref = old.output_ref.clone();
                }
                Ordering::Equal => step.input_ref = old.input_ref.clone(),
                Ordering::Greater => {}
            }
        }
        self.current_step = origin.step_index;
        self.rerun_of = Some(origin);
    }
}
