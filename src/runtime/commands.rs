//! What callers hand the runtime and what it answers: claims, calls and
//! their completions, outcome reports, decisions as a person sees them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::access::TenantScope;
use crate::domain::attempt::*;
use crate::store::Store;

/// What an adapter gets when it claims an attempt.
#[derive(Clone, Debug)]
pub struct Ticket {
    /// The attempt as it is now.
    pub attempt: ExecutionAttempt,
    /// The step's input document.
    pub input: Vec<u8>,
    /// Resuming: the adapter state of the last checkpoint.
    pub state: Option<Vec<u8>>,
    /// Resuming: the sequence of the last checkpoint.
    pub checkpoint_sequence: u32,
    /// Whether the attempt ran before (resume).
    pub resumed: bool,
}

/// A call an adapter asks to begin.
#[derive(Clone, Debug)]
pub struct BeginCall {
    /// Model, tool or sub-agent.
    pub kind: CallKind,
    /// Tool id, model profile id or child release id.
    pub target: String,
    /// The request document.
    pub request: serde_json::Value,
    /// Context size (model calls).
    pub context_tokens: Option<u32>,
    /// The approval that allows it.
    pub approval_id: Option<Uuid>,
    /// The adapter's state.
    pub state: Option<Vec<u8>>,
    /// When the loop began assembling this model call's context.
    pub context_since: Option<chrono::DateTime<chrono::Utc>>,
    /// The builtin loop asks (nobody outside the appliance waits on the
    /// answer): the start of a call without effect need not wait for the
    /// disk.
    pub in_process: bool,
    /// The adapter asks a reviewer's approval of this tool call although
    /// the policy may allow it (a framework's tool marked as needing
    /// approval). It never loosens the policy: a denied call stays refused.
    pub approval_asked: bool,
}

/// The answer to a BeginCall.
#[derive(Clone, Debug, Default)]
pub struct Begun {
    /// Started, refused or waiting for approval.
    pub outcome: BeginOutcome,
    /// The call.
    pub call_id: Option<Uuid>,
    /// The policy decision.
    pub policy_decision_id: Option<Uuid>,
    /// The fencing token.
    pub fencing_token: u64,
    /// Why it was refused.
    pub reason: Option<String>,
    /// The decision to wait for.
    pub decision_id: Option<Uuid>,
    /// The approval to wait for.
    pub approval_id: Option<Uuid>,
    /// The checkpoint before a gated call.
    pub checkpoint_id: Option<Uuid>,
    /// The child run of a sub-agent call.
    pub child_run_id: Option<Uuid>,
    /// The request's hash.
    pub request_hash: String,
    /// Replayed: the source call whose result this is.
    pub replayed_from: Option<Uuid>,
    /// Replayed: the result document, when the source call had one.
    pub result: Option<Vec<u8>>,
}

/// How a BeginCall ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BeginOutcome {
    /// The call is issued.
    #[default]
    Started,
    /// Refused and recorded as a failed call.
    Refused,
    /// The attempt waits for an approval.
    ApprovalRequired,
    /// Not issued: a re-run made the same call (target and request) whose
    /// effect its source attempt confirmed after the checkpoint; the call
    /// is recorded as completed with the source's result, which the
    /// adapter observes instead of calling.
    Replayed,
}

/// A call's reported end.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The call.
    pub call_id: Uuid,
    /// Whether it succeeded.
    pub ok: bool,
    /// The result document.
    pub result: Option<Vec<u8>>,
    /// The receipt document.
    pub receipt: Option<Vec<u8>>,
    /// The error.
    pub error: Option<String>,
    /// The adapter's state after observing it.
    pub state: Option<Vec<u8>>,
    /// Tokens a model call used, as its server counted them (the usage of
    /// an OpenAI-compatible answer, the final chunk's for a streamed one).
    pub usage: Option<crate::domain::usage::TokenUsage>,
    /// Milliseconds the model took, as measured where it was called.
    pub latency_ms: Option<u64>,
}

/// What CompleteCall answers.
#[derive(Clone, Debug)]
pub struct Completed {
    /// The attempt's state.
    pub state: AttemptState,
    /// The checkpoint written after the observation.
    pub checkpoint: Option<Checkpoint>,
    /// The result's reference.
    pub result_hash: Option<String>,
    /// The receipt's reference.
    pub receipt_ref: Option<String>,
    /// An interrupt waits to be observed.
    pub interrupt_requested: bool,
}

/// An adapter's outcome report.
#[derive(Clone, Debug)]
pub struct Report {
    /// Success (verified against the output contract) or failure.
    pub succeeded: bool,
    /// The output document.
    pub output: Option<serde_json::Value>,
    /// The failure's class.
    pub failure_class: Option<FailureClass>,
    /// The failure's reason.
    pub reason: Option<String>,
    /// What the adapter said of an error in the agent's code.
    pub error: Option<crate::domain::attempt::ErrorDetail>,
}

/// A reviewer's word on an approval: approve (as proposed, or with
/// changed arguments where the release's policy allows) or reject.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalVerdict {
    /// Approved?
    pub approve: bool,
    /// Who.
    pub by: String,
    /// Why.
    pub reason: Option<String>,
    /// The arguments approved instead of the proposed ones.
    pub arguments: Option<serde_json::Value>,
    /// A rejection that responds: the reason goes back to the agent and
    /// the attempt goes on without the call.
    pub respond: bool,
}

impl ApprovalVerdict {
    /// Approval or rejection as proposed.
    pub fn plain(approve: bool, by: &str, reason: Option<String>) -> ApprovalVerdict {
        ApprovalVerdict {
            approve,
            by: by.to_string(),
            reason,
            arguments: None,
            respond: false,
        }
    }
}

/// The verdict on an outcome report.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Succeeded.
    Verified,
    /// Not valid: correct and report again.
    Correct {
        /// What the validator said.
        feedback: String,
        /// Corrections left after this one.
        left: u32,
    },
    /// Not valid, no correction left: Failed(validation).
    Exhausted {
        /// What the validator said.
        feedback: String,
    },
    /// The reported failure was recorded.
    Failed,
}

/// What ReportOutcome answers.
#[derive(Clone, Debug)]
pub struct Reported {
    /// The verdict.
    pub verdict: Outcome,
    /// The attempt's state.
    pub state: AttemptState,
    /// The outcome hash, once final.
    pub outcome_hash: Option<String>,
    /// A repeat of the recorded report.
    pub acknowledged: bool,
}

/// A decision an attempt waits for, as readers see it: the record with the
/// question and the proposed call's arguments read from the artifact store.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingDecision {
    /// The decision (what `DecideApproval` and `AnswerDecision` take).
    pub decision_id: Uuid,
    /// approval | input | escalation.
    pub kind: &'static str,
    /// The Run Control approval (approvals).
    pub approval_id: Option<Uuid>,
    /// One line.
    pub summary: String,
    /// The question put to the human (input and escalation).
    pub question: Option<String>,
    /// The call issued only once approved (approvals).
    pub proposed_call: Option<ProposedCallView>,
    /// Choices (escalations).
    pub options: Vec<String>,
    /// The attempt's recommendation among them.
    pub recommendation: Option<String>,
    /// The JSON Schema the answer must satisfy (input).
    pub answer_schema: Option<serde_json::Value>,
    /// Asked at.
    pub requested_at: DateTime<Utc>,
    /// Expires at.
    pub expires_at: DateTime<Utc>,
    /// Set once retention removed the question and the arguments.
    pub purged: Option<String>,
    /// Who is expected to answer (`role:Reviewer`, `user:alice`).
    pub assignee: Option<String>,
}

/// The call an approval is about, with its arguments.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposedCallView {
    /// model | tool.
    pub kind: &'static str,
    /// The tool or model profile.
    pub target: String,
    /// The tool's side-effect class.
    pub side_effect_class: Option<&'static str>,
    /// The request's arguments (a JSON document), unless purged or larger
    /// than [`PendingDecision::ARGUMENTS_MAX`].
    pub arguments: Option<serde_json::Value>,
    /// Artifact reference of the whole request.
    pub request_hash: String,
    /// The policy decision that asked for approval.
    pub policy_decision_id: Uuid,
}

impl PendingDecision {
    /// Largest request shown inline; a bigger one is named by its hash.
    pub const ARGUMENTS_MAX: usize = 256 * 1024;

    /// The decision `d` of `scope` with its content.
    pub fn read(store: &Store, scope: &TenantScope, d: &DecisionRequest) -> PendingDecision {
        let purged = d.purged.as_ref().map(|t| t.describe());
        let content = |hash: &str| {
            if purged.is_some() {
                return None;
            }
            store.read_artifact(scope, hash).ok().flatten()
        };
        PendingDecision {
            decision_id: d.decision_id,
            kind: d.kind.as_str(),
            approval_id: d.approval_id,
            summary: d.summary.clone(),
            question: d.question_ref.as_deref().and_then(content).map(|bytes| {
                match serde_json::from_slice::<String>(&bytes) {
                    Ok(text) => text,
                    Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
                }
            }),
            proposed_call: d.proposal.as_ref().map(|p| ProposedCallView {
                kind: p.kind.as_str(),
                target: p.target.clone(),
                side_effect_class: p.side_effect_class.map(|c| c.as_str()),
                arguments: content(&p.request_hash)
                    .filter(|b| b.len() <= Self::ARGUMENTS_MAX)
                    .and_then(|b| serde_json::from_slice(&b).ok()),
                request_hash: p.request_hash.clone(),
                policy_decision_id: p.policy_decision_id,
            }),
            options: d.options.clone(),
            recommendation: d.recommendation.clone(),
            answer_schema: d.answer_schema.clone(),
            assignee: d.assignee.clone().map(String::from),
            requested_at: d.requested_at,
            expires_at: d.expires_at,
            purged,
        }
    }
}

/// A new decision.
#[derive(Clone, Debug)]
pub struct DecisionAsk {
    /// Input or escalation.
    pub kind: DecisionKind,
    /// The question document.
    pub question: Option<Vec<u8>>,
    /// One line.
    pub summary: String,
    /// Options (escalations).
    pub options: Vec<String>,
    /// Recommendation (escalations).
    pub recommendation: Option<String>,
    /// The JSON Schema an input answer must satisfy.
    pub answer_schema: Option<serde_json::Value>,
    /// The model's tool call that asks (builtin loop).
    pub tool_call_id: Option<String>,
    /// Who is expected to answer, `role:<Role>` or `user:<name>` (else
    /// the release policy's assignee).
    pub assignee: Option<String>,
}

impl DecisionAsk {
    /// What every question must say, whoever asks: a summary; an
    /// escalation's options (two or more) and a recommendation among them;
    /// an answer schema that is a JSON Schema (input only).
    pub fn check(&self) -> Result<(), crate::domain::FieldError> {
        use crate::domain::FieldError;
        FieldError::require(
            "summary",
            &self.summary,
            "one line a reviewer reads in the inbox",
        )?;
        if let Some(who) = &self.assignee {
            crate::domain::access::Assignee::parse("assignee", who)?;
        }
        if self.kind == DecisionKind::Escalation && self.options.len() < 2 {
            return Err(FieldError::new(
                "options",
                "an escalation needs at least two options",
            ));
        }
        if let Some(r) = &self.recommendation
            && !self.options.contains(r)
        {
            return Err(FieldError::new(
                "recommendation",
                format!("{r:?} is not one of the options"),
            ));
        }
        if let Some(schema) = &self.answer_schema {
            if self.kind != DecisionKind::Input {
                return Err(FieldError::new(
                    "answerSchema",
                    "only an input decision takes an answer schema",
                ));
            }
            jsonschema::validator_for(schema).map_err(|e| {
                FieldError::new("answerSchema", format!("is not a JSON Schema: {e}"))
            })?;
        }
        Ok(())
    }
}
