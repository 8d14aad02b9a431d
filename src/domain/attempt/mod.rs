//! The ExecutionAttempt aggregate: one try of one step under one lease.
//!
//! The states, phases, invariants and limits are the specification's
//! (AgentRuntimeService). Every change goes through a transition here;
//! the attempt's grain (`runtime::grain`) orders the commands and stores
//! what a transition returns, the API never edits a field.
//!
//! The state machine is the specification's diagram plus three edges an
//! appliance needs, each for a case the diagram leaves open:
//! - `Claimed -> Cancelled`: the run is cancelled while its attempt still
//!   waits for capacity or for an adapter to claim it;
//! - `Claimed -> Failed`: the release cannot be loaded (revoked, rejected)
//!   or capacity is denied for good before the loop starts;
//! - `Paused -> Cancelled`: cancellation (or a lost lease) while paused; a
//!   paused attempt has no call in flight, so it is observed at once.
//!
//! Budgets: `maxMinutes` counts active time (Running, and WaitingForTool
//! for a model or tool call), not time spent waiting for capacity, for a
//! human, for a delegated child run, or while paused: the specification's
//! attempt budget is the attempt's own work; a wait for a person has its
//! own limit (`Runtime:Decisions:InputTimeoutMinutes`) and a child run's
//! attempts their own budgets. The attempt page shows this clock beside
//! the wall clock.

pub mod budget;
pub mod calls;
pub mod capacity;
pub mod decisions;
pub mod entities;
pub mod events;

use std::fmt;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

pub use self::budget::LimitReached;
pub use self::entities::*;
pub use self::events::*;
use crate::domain::error::DomainError;
use crate::domain::events::NewEvent;
use crate::domain::ids::{ProjectId, TenantId};
use crate::domain::release::{AdapterKind, AttemptLimits, PolicyRule, SideEffectClass};
use crate::domain::usage::TokenUsage;

/// Where an attempt is.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
pub enum AttemptState {
    /// Dispatched with its lease; the loop has not started.
    Claimed,
    /// The loop runs.
    Running,
    /// A gated or long call (tool, sub-agent) is in flight.
    WaitingForTool,
    /// A human decision is awaited.
    WaitingForDecision,
    /// Lease renewal failed; stopped at a checkpoint until it is renewed.
    Paused,
    /// The output was verified.
    Succeeded,
    /// Corrections exhausted, a terminal error, a refused or expired
    /// decision, or a budget limit.
    Failed,
    /// `maxMinutes` ran out.
    TimedOut,
    /// Cancellation was observed.
    Cancelled,
    /// Stopped with a call whose effect cannot be confirmed.
    Uncertain,
}

impl AttemptState {
    /// Every state.
    pub const ALL: [AttemptState; 10] = [
        AttemptState::Claimed,
        AttemptState::Running,
        AttemptState::WaitingForTool,
        AttemptState::WaitingForDecision,
        AttemptState::Paused,
        AttemptState::Succeeded,
        AttemptState::Failed,
        AttemptState::TimedOut,
        AttemptState::Cancelled,
        AttemptState::Uncertain,
    ];

    /// Final states: nothing changes an attempt after them.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AttemptState::Succeeded
                | AttemptState::Failed
                | AttemptState::TimedOut
                | AttemptState::Cancelled
                | AttemptState::Uncertain
        )
    }

    /// States whose time counts against `maxMinutes`.
    pub fn is_active(self) -> bool {
        matches!(self, AttemptState::Running | AttemptState::WaitingForTool)
    }

    /// States of a live attempt whose time is spent waiting (for capacity,
    /// a person, or a resume), not working: neither active nor final.
    pub fn is_waiting(self) -> bool {
        !self.is_active() && !self.is_terminal()
    }

    /// The name, as the specification spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptState::Claimed => "Claimed",
            AttemptState::Running => "Running",
            AttemptState::WaitingForTool => "WaitingForTool",
            AttemptState::WaitingForDecision => "WaitingForDecision",
            AttemptState::Paused => "Paused",
            AttemptState::Succeeded => "Succeeded",
            AttemptState::Failed => "Failed",
            AttemptState::TimedOut => "TimedOut",
            AttemptState::Cancelled => "Cancelled",
            AttemptState::Uncertain => "Uncertain",
        }
    }

    /// Parses a name, case-insensitively.
    pub fn parse(text: &str) -> Option<AttemptState> {
        AttemptState::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(text))
    }

    /// Whether `self -> to` is an edge of the state machine, and its name.
    pub fn edge(self, to: AttemptState) -> Option<&'static str> {
        use AttemptState::*;
        Some(match (self, to) {
            (Claimed, Running) => "ReleaseLoadedAndContextBuilt",
            (Running, WaitingForTool) => "ToolCallIssued",
            (WaitingForTool, Running) => "ToolResultObserved",
            (Running, WaitingForDecision) => "DecisionRequested",
            (WaitingForDecision, Running) => "DecisionReceived",
            (Running, Paused) => "ControlPlaneUnreachable",
            (Paused, Running) => "LeaseRenewed",
            (Running, Succeeded) => "OutputVerified",
            (Running, Failed) => "CorrectionsExhaustedOrTerminalError",
            (Running, TimedOut) => "AttemptBudgetExceeded",
            (WaitingForDecision, Failed) => "DecisionRejectedOrExpired",
            (Running, Cancelled) => "CancellationObserved",
            (WaitingForTool, Cancelled) => "CancellationObserved",
            (WaitingForDecision, Cancelled) => "CancellationObserved",
            (WaitingForTool, Uncertain) => "EffectUnconfirmed",
            // The appliance's three additions (see the module docs).
            (Claimed, Cancelled) => "CancelledBeforeStart",
            (Claimed, Failed) => "NotStartable",
            (Paused, Cancelled) => "CancellationObserved",
            _ => return None,
        })
    }
}

impl fmt::Display for AttemptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the loop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AttemptPhase {
    /// Resolving the snapshot.
    Resolving,
    /// Loading and verifying the release.
    LoadingRelease,
    /// Assembling context within the token budget.
    BuildingContext,
    /// Deciding the next step.
    Planning,
    /// A model or tool call is out.
    Calling,
    /// Taking in a call's result.
    Observing,
    /// Checking the output against the output contract.
    Verifying,
    /// Correcting after a failed verification.
    Correcting,
    /// Writing a checkpoint.
    Checkpointing,
    /// Reporting the outcome.
    Reporting,
}

impl AttemptPhase {
    /// Every phase.
    pub const ALL: [AttemptPhase; 10] = [
        AttemptPhase::Resolving,
        AttemptPhase::LoadingRelease,
        AttemptPhase::BuildingContext,
        AttemptPhase::Planning,
        AttemptPhase::Calling,
        AttemptPhase::Observing,
        AttemptPhase::Verifying,
        AttemptPhase::Correcting,
        AttemptPhase::Checkpointing,
        AttemptPhase::Reporting,
    ];

    /// The name, as the specification spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptPhase::Resolving => "Resolving",
            AttemptPhase::LoadingRelease => "LoadingRelease",
            AttemptPhase::BuildingContext => "BuildingContext",
            AttemptPhase::Planning => "Planning",
            AttemptPhase::Calling => "Calling",
            AttemptPhase::Observing => "Observing",
            AttemptPhase::Verifying => "Verifying",
            AttemptPhase::Correcting => "Correcting",
            AttemptPhase::Checkpointing => "Checkpointing",
            AttemptPhase::Reporting => "Reporting",
        }
    }

    /// Parses a name, case-insensitively.
    pub fn parse(text: &str) -> Option<AttemptPhase> {
        AttemptPhase::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for AttemptPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attempt failed: decides whether Run Control tries again.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// The output did not satisfy the contract within maxCorrections.
    Validation,
    /// The appliance, the adapter or the store failed.
    Infrastructure,
    /// A passing failure (a dependency timed out): worth another attempt.
    Transient,
    /// A policy or a human refused.
    Policy,
    /// A limit of the attempt was reached.
    Budget,
    /// The agent's own code failed (its handler raised an exception): a
    /// bug another attempt repeats, so it is not retried unless the
    /// release's contract says `retryAgentFailures`.
    Agent,
    /// Every server of its model profile stayed down longer than
    /// `runtime.model_outage_max_minutes` while the attempt waited.
    ModelUnavailable,
}

impl FailureClass {
    /// Every class.
    pub const ALL: [FailureClass; 7] = [
        FailureClass::Validation,
        FailureClass::Infrastructure,
        FailureClass::Transient,
        FailureClass::Policy,
        FailureClass::Budget,
        FailureClass::Agent,
        FailureClass::ModelUnavailable,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Validation => "validation",
            FailureClass::Infrastructure => "infrastructure",
            FailureClass::Transient => "transient",
            FailureClass::Policy => "policy",
            FailureClass::Budget => "budget",
            FailureClass::Agent => "agent",
            FailureClass::ModelUnavailable => "model-unavailable",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// Whether another attempt may succeed where this one failed.
    pub fn retryable(self) -> bool {
        matches!(self, FailureClass::Infrastructure | FailureClass::Transient)
    }
}

/// How an attempt failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptFailure {
    /// The class.
    pub class: FailureClass,
    /// In words, naming the limit, the decision or the error.
    pub reason: String,
    /// Artifact reference of the validator's feedback (validation).
    pub feedback_ref: Option<String>,
    /// Artifact reference of what the adapter said of the error: its type,
    /// message and traceback ([`ErrorDetail`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail_ref: Option<String>,
}

/// What an adapter reports of an error in the agent's code, bounded: kept
/// as an artifact beside the failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorDetail {
    /// The exception's type (`KeyError`).
    pub error_type: String,
    /// Its message.
    pub message: String,
    /// The traceback, cut at [`ErrorDetail::MAX_TRACEBACK`] bytes.
    pub traceback: String,
}

impl ErrorDetail {
    /// Longest type name kept, in characters.
    pub const MAX_TYPE: usize = 200;
    /// Longest traceback kept, in bytes; a longer one keeps its last
    /// part (where the error is) after a note of what was cut.
    pub const MAX_TRACEBACK: usize = 64 * 1024;

    /// The detail as reported, bounded.
    pub fn bounded(error_type: &str, message: &str, traceback: &str) -> ErrorDetail {
        let traceback = if traceback.len() > Self::MAX_TRACEBACK {
            let mut start = traceback.len() - Self::MAX_TRACEBACK;
            while !traceback.is_char_boundary(start) {
                start += 1;
            }
            format!(
                "… the first {start} bytes are cut …\n{}",
                &traceback[start..]
            )
        } else {
            traceback.to_string()
        };
        ErrorDetail {
            error_type: error_type.chars().take(Self::MAX_TYPE).collect(),
            message: message
                .chars()
                .take(crate::domain::error::MAX_TEXT_CHARS)
                .collect(),
            traceback,
        }
    }

    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.error_type.is_empty() && self.message.is_empty() && self.traceback.is_empty()
    }
}

/// Who asked an attempt to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptSource {
    /// `Runtime/Interrupt`.
    Interrupt,
    /// The run was cancelled.
    RunCancelled,
    /// The release was revoked with in-flight policy `interrupt`.
    Revocation,
    /// The attempt's lease is gone (reconciler).
    LeaseLost,
}

impl InterruptSource {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InterruptSource::Interrupt => "interrupt",
            InterruptSource::RunCancelled => "run-cancelled",
            InterruptSource::Revocation => "revocation",
            InterruptSource::LeaseLost => "lease-lost",
        }
    }
}

/// A request to stop, recorded until it is observed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterruptRequest {
    /// When.
    pub requested_at: DateTime<Utc>,
    /// Who.
    pub by: String,
    /// Why.
    pub reason: String,
    /// Where it came from.
    pub source: InterruptSource,
}

/// Counters checked against the limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptUsage {
    /// Model calls issued.
    pub model_calls: u32,
    /// Tool calls issued.
    pub tool_calls: u32,
    /// Sub-agents delegated.
    pub sub_agents: u32,
    /// Largest context declared for a model call.
    pub context_tokens: u32,
    /// Call records written (also refused ones): the next sequence.
    pub calls: u32,
    /// Checkpoints written: the next sequence.
    pub checkpoints: u32,
    /// Decisions requested.
    pub decisions: u32,
    /// Calls since the last checkpoint.
    pub calls_since_checkpoint: u32,
    /// Milliseconds spent Running or WaitingForTool before the current
    /// active stretch.
    pub active_ms: u64,
    /// Tokens of its model calls, as their servers counted them.
    #[serde(default)]
    pub tokens: crate::domain::usage::TokenUsage,
}

/// The call in flight, if any: at most one at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenCall {
    /// The call.
    pub call_id: Uuid,
    /// Its sequence.
    pub sequence: u32,
    /// Model, tool or sub-agent.
    pub kind: CallKind,
    /// Class (tools).
    pub side_effect_class: Option<SideEffectClass>,
    /// When a tool call times out (the grain's call-timeout reminder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_at: Option<DateTime<Utc>>,
}

impl OpenCall {
    /// Whether stopping the call now leaves an effect nobody can confirm:
    /// model calls and read tools have none; a sub-agent's effects are its
    /// child run's, which is cancelled and settles on its own.
    pub fn effect_unconfirmed(&self) -> bool {
        match self.kind {
            CallKind::Model | CallKind::SubAgent => false,
            CallKind::Tool => self
                .side_effect_class
                .is_none_or(|c| c > SideEffectClass::Read),
        }
    }
}

/// The lease the attempt runs under (Run Control's, not capacity's).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptLease {
    /// Who holds it: the appliance for builtin attempts, the adapter
    /// session for external ones; none until claimed.
    pub holder: Option<String>,
    /// Until when, unless renewed.
    pub expires_at: Option<DateTime<Utc>>,
    /// Renewals so far (the heartbeat's idempotency key with leaseId).
    pub renewals: u64,
}

/// One entry of the phase history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseMark {
    /// When.
    pub at: DateTime<Utc>,
    /// State then.
    pub state: AttemptState,
    /// Phase then.
    pub phase: AttemptPhase,
}

/// How an attempt record stores its phase history: each mark as
/// `[seconds, nanoseconds, state, phase]`. The history is most of an
/// attempt record and the record is written at every step, so a mark is
/// kept in about 30 bytes instead of the 80 of a named map with an RFC 3339
/// time (and without formatting 64 times at every write). Marks an earlier
/// version stored as maps read as before.
pub mod phase_history {
    use std::fmt;

    use chrono::DateTime;
    use serde::de::{self, MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serializer};

    use super::PhaseMark;

    /// Writes the marks as arrays.
    pub fn serialize<S: Serializer>(phases: &[PhaseMark], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(phases.iter().map(|p| {
            (
                p.at.timestamp(),
                p.at.timestamp_subsec_nanos(),
                p.state,
                p.phase,
            )
        }))
    }

    /// Reads marks stored as arrays or, as before, as maps.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PhaseMark>, D::Error> {
        Vec::<Mark>::deserialize(d).map(|marks| marks.into_iter().map(|m| m.0).collect())
    }

    struct Mark(PhaseMark);

    impl<'de> Deserialize<'de> for Mark {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mark, D::Error> {
            d.deserialize_any(MarkVisitor).map(Mark)
        }
    }

    struct MarkVisitor;

    impl<'de> Visitor<'de> for MarkVisitor {
        type Value = PhaseMark;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a phase mark [seconds, nanoseconds, state, phase]")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PhaseMark, A::Error> {
            let missing = |i| de::Error::invalid_length(i, &MarkVisitor);
            let secs: i64 = seq.next_element()?.ok_or_else(|| missing(0))?;
            let nanos: u32 = seq.next_element()?.ok_or_else(|| missing(1))?;
            let state = seq.next_element()?.ok_or_else(|| missing(2))?;
            let phase = seq.next_element()?.ok_or_else(|| missing(3))?;
            let at = DateTime::from_timestamp(secs, nanos)
                .ok_or_else(|| de::Error::custom(format!("time {secs}.{nanos} out of range")))?;
            Ok(PhaseMark { at, state, phase })
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PhaseMark, A::Error> {
            PhaseMark::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{AttemptPhase, AttemptState, PhaseMark};
        use chrono::{TimeZone, Utc};

        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Holder {
            #[serde(with = "super")]
            phases: Vec<PhaseMark>,
        }

        #[derive(serde::Serialize)]
        struct Before {
            phases: Vec<PhaseMark>,
        }

        #[test]
        fn marks_round_trip_compactly_and_older_maps_still_read() {
            let phases: Vec<PhaseMark> = (0..64)
                .map(|i| PhaseMark {
                    at: Utc.timestamp_opt(1_790_000_000 + i, 123_456_789).unwrap(),
                    state: AttemptState::Running,
                    phase: AttemptPhase::Calling,
                })
                .collect();
            let compact = rmp_serde::to_vec_named(&Holder {
                phases: phases.clone(),
            })
            .unwrap();
            let named = rmp_serde::to_vec_named(&Before {
                phases: phases.clone(),
            })
            .unwrap();
            assert!(
                compact.len() * 2 < named.len(),
                "{} bytes against {}",
                compact.len(),
                named.len()
            );
            for bytes in [&compact, &named] {
                let back: Holder = rmp_serde::from_slice(bytes).unwrap();
                assert_eq!(back.phases, phases);
            }
        }
    }
}

/// A call refused for a stale fencing token, kept as evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaleRefusal {
    /// When.
    pub at: DateTime<Utc>,
    /// The token presented.
    pub presented: u64,
    /// What was attempted.
    pub operation: String,
}

/// How many phase marks and stale refusals an attempt keeps.
pub const HISTORY_LIMIT: usize = 64;

/// A stretch in which the attempt held no capacity: it waited for a human
/// (or was paused) longer than `runtime.return_capacity_after_seconds`,
/// gave its capacity lease back, and asked again once it could go on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityGap {
    /// The lease given back.
    pub lease_id: Uuid,
    /// When.
    pub returned_at: DateTime<Utc>,
    /// Why, in words.
    pub reason: String,
    /// When it asked for capacity again (the decision was answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<DateTime<Utc>>,
    /// When capacity was granted again, and the new lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_at: Option<DateTime<Utc>>,
    /// The lease it runs under again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_lease_id: Option<Uuid>,
}

/// What a new attempt is created with.
#[derive(Clone, Debug)]
pub struct NewAttempt {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Run and step.
    pub run_id: Uuid,
    /// Step.
    pub step_id: Uuid,
    /// 1 for the first attempt of the step.
    pub number: u32,
    /// Owner.
    pub tenant_id: TenantId,
    /// Project.
    pub project_id: ProjectId,
    /// Environment.
    pub environment_id: Option<String>,
    /// The fencing token of its lease.
    pub fencing_token: u64,
    /// The run's snapshot.
    pub snapshot_id: Uuid,
    /// Release.
    pub release_id: String,
    /// Agent.
    pub agent_id: String,
    /// Model profile.
    pub model_profile_id: String,
    /// Builtin or external.
    pub adapter: AdapterKind,
    /// The adapter version the release needs, e.g. `external/1`.
    pub adapter_version: String,
    /// The checkpoint format the release needs.
    pub checkpoint_format: u32,
    /// Limits.
    pub limits: AttemptLimits,
    /// Self-corrections allowed.
    pub max_corrections: u32,
    /// Sub-agent depth of its run (0 for a top-level run).
    pub depth: u32,
    /// The runs above its run, nearest first (see [`crate::domain::run::Run::ancestors`]).
    pub ancestors: Vec<Uuid>,
}

/// One try of one step under one lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionAttempt {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its run.
    pub run_id: Uuid,
    /// Its step.
    pub step_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// Project.
    pub project_id: ProjectId,
    /// Environment.
    pub environment_id: Option<String>,
    /// Run Control's lease of the attempt.
    pub lease_id: Uuid,
    /// Monotonic per step; every call and the outcome carry it.
    pub fencing_token: u64,
    /// The resolved execution snapshot of the run.
    pub snapshot_id: Uuid,
    /// Release.
    pub release_id: String,
    /// Agent.
    pub agent_id: String,
    /// Model profile.
    pub model_profile_id: String,
    /// State.
    pub state: AttemptState,
    /// Phase.
    pub phase: AttemptPhase,
    /// Self-corrections so far.
    pub correction_count: u32,
    /// Self-corrections allowed.
    pub max_corrections: u32,
    /// The latest checkpoint.
    pub last_checkpoint_id: Option<Uuid>,
    /// Context snapshot in use.
    pub context_snapshot_ref: Option<String>,
    /// Hash of the reported outcome.
    pub outcome_hash: Option<String>,
    /// When cancellation was observed.
    pub cancellation_observed_at: Option<DateTime<Utc>>,
    /// Created (dispatched) at.
    pub started_at: DateTime<Utc>,
    /// Ended at.
    pub ended_at: Option<DateTime<Utc>>,
    /// The number of the stored state this value is (0: not stored yet);
    /// the store numbers every write and refuses one derived from an older
    /// state.
    pub version: u64,

    /// 1 for the first attempt of its step.
    pub number: u32,
    /// Builtin or external.
    pub adapter: AdapterKind,
    /// The adapter version the release was verified for.
    pub adapter_version: String,
    /// The checkpoint format the release was verified for.
    pub checkpoint_format: u32,
    /// Budgets.
    pub limits: AttemptLimits,
    /// Sub-agent depth of its run.
    pub depth: u32,
    /// The runs above its run, nearest first: empty for an attempt of a
    /// top-level run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<Uuid>,
    /// Counters.
    pub usage: AttemptUsage,
    /// The call in flight.
    pub open_call: Option<OpenCall>,
    /// The decision awaited.
    pub pending_decision: Option<Uuid>,
    /// The attempt lease.
    pub lease: AttemptLease,
    /// Its capacity lease (agent-runtime), once requested.
    pub capacity_lease_id: Option<Uuid>,
    /// Whether it holds capacity now: false until the first grant, and
    /// while a human decision outlasts the grace (see [`CapacityGap`]).
    pub capacity_granted: bool,
    /// Stretches without capacity (the latest [`HISTORY_LIMIT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_gaps: Vec<CapacityGap>,
    /// Start of the current active stretch.
    pub running_since: Option<DateTime<Utc>>,
    /// A stop request not yet observed.
    pub interrupt: Option<InterruptRequest>,
    /// A lease renewal failed: the attempt pauses at its next checkpoint.
    pub renewal_failure: Option<String>,
    /// Why it is paused.
    pub pause_reason: Option<String>,
    /// Paused because its project's or tenant's `tokensPerDay` is used up:
    /// until when (the next UTC day), unless the quota allows calls again
    /// sooner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_paused_until: Option<DateTime<Utc>>,
    /// Paused because the site's model server its next call goes to is at
    /// its limits: the server, until its queue comes to the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_server_wait: Option<String>,
    /// How it failed.
    pub failure: Option<AttemptFailure>,
    /// Artifact reference of the verified output.
    pub output_ref: Option<String>,
    /// Hash of the adapter's report that ended the attempt: the same
    /// report again is acknowledged.
    pub outcome_report_hash: Option<String>,
    /// The adapter state of the latest checkpoint.
    pub adapter_state_ref: Option<String>,
    /// Phase history (the latest [`HISTORY_LIMIT`]), stored compactly
    /// ([`phase_history`]).
    #[serde(with = "phase_history")]
    pub phases: Vec<PhaseMark>,
    /// Stale-token refusals (the latest [`HISTORY_LIMIT`]).
    pub stale_refusals: Vec<StaleRefusal>,
    /// A checkpoint was found incompatible when resuming.
    pub resume_refused: Option<String>,
    /// Where purged content was: the references above stay (hashes and
    /// contracts still hold), the content is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged: Option<crate::domain::retention::Tombstone>,
    /// An attempt of a re-run's first step: it starts from this
    /// checkpoint of the source run, whose adapter state it holds from
    /// the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<crate::domain::run::RerunOrigin>,
}

/// An illegal move, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("attempt {attempt_id} is {from}; it cannot {command}")]
pub struct IllegalTransition {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its state.
    pub from: AttemptState,
    /// What was asked.
    pub command: String,
}

impl From<IllegalTransition> for DomainError {
    fn from(e: IllegalTransition) -> Self {
        DomainError::FailedPrecondition(e.to_string())
    }
}

/// Why a call may not start now.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// The attempt must observe its interruption first.
    Interrupted,
    /// Paused: ask again after the lease is renewed.
    Paused(String),
    /// It gave its capacity back while it waited and has not got it
    /// again yet: ask again once capacity is granted.
    NoCapacity(String),
    /// Not in a state that makes calls.
    WrongState(IllegalTransition),
    /// Another call is open.
    Busy(Uuid),
}

/// What a call asks for, after the policy decided.
#[derive(Clone, Debug)]
pub struct CallStart {
    /// The call.
    pub call_id: Uuid,
    /// Kind.
    pub kind: CallKind,
    /// Target.
    pub target: String,
    /// Class (tools).
    pub side_effect_class: Option<SideEffectClass>,
    /// Artifact reference of the request.
    pub request_hash: String,
    /// The policy decision.
    pub policy_decision_id: Option<Uuid>,
    /// What it said.
    pub policy_rule: Option<PolicyRule>,
    /// The approval that allowed it.
    pub approval_id: Option<Uuid>,
    /// Context tokens (model calls).
    pub context_tokens: Option<u32>,
    /// The checkpoint written before it.
    pub pre_checkpoint_id: Option<Uuid>,
    /// When the loop began assembling the context of this model call:
    /// BuildingContext is marked from then to the call.
    pub context_since: Option<DateTime<Utc>>,
    /// Seconds a tool call may take.
    pub timeout_seconds: Option<u64>,
}

/// Why a call did not start.
#[derive(Clone, Debug, PartialEq)]
pub enum CallError {
    /// The attempt cannot make calls now.
    Gate(Gate),
    /// A limit stops the attempt.
    Limit(LimitReached),
}

/// How a call ended, as observed.
#[derive(Clone, Debug)]
pub struct CallResult {
    /// Completed or failed.
    pub ok: bool,
    /// Artifact reference of the result.
    pub result_hash: Option<String>,
    /// Artifact reference of the receipt.
    pub receipt_ref: Option<String>,
    /// The error, when it failed.
    pub error: Option<String>,
    /// What served it (model calls).
    pub served_by: Option<String>,
    /// Tokens a model call used, as its server counted them.
    pub usage: Option<crate::domain::usage::TokenUsage>,
    /// Milliseconds the model took, as measured where it was called;
    /// else the call's time from start to result.
    pub latency_ms: Option<u64>,
}

/// How a decision was resolved.
#[derive(Clone, Debug)]
pub enum Resolution {
    /// Approval granted.
    Approved {
        /// Who.
        by: String,
        /// Why.
        reason: Option<String>,
        /// The request hash of the arguments the reviewer approved instead
        /// of the proposed ones.
        edited: Option<String>,
    },
    /// Approval refused.
    Rejected {
        /// Who.
        by: String,
        /// Why.
        reason: Option<String>,
        /// The reviewer responds instead: the call is not made, the reason
        /// goes back to the agent, and the attempt goes on (it fails
        /// otherwise).
        respond: bool,
    },
    /// Input or escalation answered.
    Answered {
        /// Who.
        by: String,
        /// The chosen option (escalations).
        choice: Option<String>,
        /// Artifact reference of the answer.
        answer_ref: Option<String>,
    },
    /// Nobody answered in time.
    Expired {
        /// The configured timeout.
        minutes: u64,
    },
}

/// The verdict on a reported success.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Verified: the attempt Succeeded.
    Verified,
    /// Not valid; the attempt corrects itself (`correctionCount` grew).
    Correct {
        /// What the validator said.
        feedback: String,
        /// Corrections still allowed after this one.
        left: u32,
    },
    /// Not valid and no correction left: Failed(validation).
    Exhausted {
        /// What the validator said.
        feedback: String,
    },
}

/// The hash of an outcome (attempt-outcome-v1).
pub fn outcome_hash(
    attempt_id: Uuid,
    state: AttemptState,
    output_ref: Option<&str>,
    failure: Option<&AttemptFailure>,
) -> String {
    json_hash(&json!({
        "schema": "attempt-outcome-v1",
        "attemptId": attempt_id,
        "state": state.as_str(),
        "outputRef": output_ref,
        "failureClass": failure.map(|f| f.class.as_str()),
        "reason": failure.map(|f| f.reason.as_str()),
    }))
}

/// The hash of an adapter's outcome report: the same report twice hashes
/// the same, so the second is acknowledged.
pub fn report_hash(
    attempt_id: Uuid,
    succeeded: bool,
    output_ref: Option<&str>,
    failure_class: Option<FailureClass>,
    reason: Option<&str>,
) -> String {
    json_hash(&json!({
        "schema": "attempt-outcome-report-v1",
        "attemptId": attempt_id,
        "status": if succeeded { "succeeded" } else { "failed" },
        "outputRef": output_ref,
        "failureClass": failure_class.map(|c| c.as_str()),
        "reason": reason,
    }))
}

/// What the rules between a stored attempt and any state written over it
/// read of the stored one; the store decodes just this from the stored
/// record to check a write.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredAttempt {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its stored version.
    pub version: u64,
    /// Its state.
    pub state: AttemptState,
    /// Its outcome's hash.
    pub outcome_hash: Option<String>,
    /// Its fencing token.
    pub fencing_token: u64,
    /// Its counters (checkpoint and call sequences).
    pub usage: AttemptUsage,
}

impl StoredAttempt {
    /// The rules between a stored attempt and any state written over it,
    /// whoever writes it: an ended attempt never leaves its end and keeps
    /// its one outcome; the fencing token never goes back; checkpoints and
    /// call records are never unwritten (their sequences never go back).
    /// A write that breaks one is refused, so no path can resurrect an
    /// attempt or replace its outcome, whatever copy it holds.
    pub fn check_successor(&self, next: &ExecutionAttempt) -> Result<(), String> {
        if self.state.is_terminal()
            && (next.state != self.state || next.outcome_hash != self.outcome_hash)
        {
            return Err(format!(
                "attempt {} ended {} with outcome {}; it cannot become {} with outcome {}",
                self.attempt_id,
                self.state,
                self.outcome_hash.as_deref().unwrap_or("(none)"),
                next.state,
                next.outcome_hash.as_deref().unwrap_or("(none)")
            ));
        }
        if self.outcome_hash.is_some() && next.outcome_hash != self.outcome_hash {
            return Err(format!(
                "attempt {} reported outcome {}; a second outcome is refused",
                self.attempt_id,
                self.outcome_hash.as_deref().unwrap_or_default()
            ));
        }
        if next.fencing_token < self.fencing_token {
            return Err(format!(
                "the fencing token of attempt {} is {}; it cannot go back to {}",
                self.attempt_id, self.fencing_token, next.fencing_token
            ));
        }
        if next.usage.checkpoints < self.usage.checkpoints || next.usage.calls < self.usage.calls {
            return Err(format!(
                "attempt {} has {} checkpoints and {} call records; a state with {} and {} would unwrite them",
                self.attempt_id,
                self.usage.checkpoints,
                self.usage.calls,
                next.usage.checkpoints,
                next.usage.calls
            ));
        }
        Ok(())
    }
}

impl ExecutionAttempt {
    /// A dispatched attempt: Claimed, Resolving.
    pub fn new(spec: NewAttempt, now: DateTime<Utc>) -> ExecutionAttempt {
        ExecutionAttempt {
            attempt_id: spec.attempt_id,
            run_id: spec.run_id,
            step_id: spec.step_id,
            tenant_id: spec.tenant_id,
            project_id: spec.project_id,
            environment_id: spec.environment_id,
            lease_id: crate::domain::ids::new_id(),
            fencing_token: spec.fencing_token,
            snapshot_id: spec.snapshot_id,
            release_id: spec.release_id,
            agent_id: spec.agent_id,
            model_profile_id: spec.model_profile_id,
            state: AttemptState::Claimed,
            phase: AttemptPhase::Resolving,
            correction_count: 0,
            max_corrections: spec.max_corrections,
            last_checkpoint_id: None,
            context_snapshot_ref: None,
            outcome_hash: None,
            cancellation_observed_at: None,
            started_at: now,
            ended_at: None,
            version: 0,
            number: spec.number,
            adapter: spec.adapter,
            adapter_version: spec.adapter_version,
            checkpoint_format: spec.checkpoint_format,
            limits: spec.limits,
            depth: spec.depth,
            ancestors: spec.ancestors,
            usage: AttemptUsage::default(),
            open_call: None,
            pending_decision: None,
            lease: AttemptLease::default(),
            capacity_lease_id: None,
            capacity_granted: false,
            capacity_gaps: Vec::new(),
            running_since: None,
            interrupt: None,
            renewal_failure: None,
            pause_reason: None,
            quota_paused_until: None,
            model_server_wait: None,
            failure: None,
            output_ref: None,
            outcome_report_hash: None,
            adapter_state_ref: None,
            phases: vec![PhaseMark {
                at: now,
                state: AttemptState::Claimed,
                phase: AttemptPhase::Resolving,
            }],
            stale_refusals: Vec::new(),
            resume_refused: None,
            purged: None,
            rerun_of: None,
        }
    }

    /// What the rules between this state and a successor read of it.
    pub fn stored(&self) -> StoredAttempt {
        StoredAttempt {
            attempt_id: self.attempt_id,
            version: self.version,
            state: self.state,
            outcome_hash: self.outcome_hash.clone(),
            fencing_token: self.fencing_token,
            usage: self.usage,
        }
    }

    /// Whether `next` may be written over this state (see
    /// [`StoredAttempt::check_successor`]).
    pub fn check_successor(&self, next: &ExecutionAttempt) -> Result<(), String> {
        self.stored().check_successor(next)
    }

    fn illegal(&self, command: impl Into<String>) -> IllegalTransition {
        IllegalTransition {
            attempt_id: self.attempt_id,
            from: self.state,
            command: command.into(),
        }
    }

    fn mark(&mut self, now: DateTime<Utc>, events: &mut Vec<NewEvent>) {
        self.phases.push(PhaseMark {
            at: now,
            state: self.state,
            phase: self.phase,
        });
        if self.phases.len() > HISTORY_LIMIT {
            // Keep the first mark (dispatch) and the latest ones.
            self.phases.remove(1);
        }
        events.push(NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptPhaseChanged {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                phase: self.phase,
                state: self.state,
            },
        ));
    }

    /// Moves along an edge of the state machine (and to `phase`), keeping
    /// the active-time account.
    fn move_to(
        &mut self,
        to: AttemptState,
        phase: AttemptPhase,
        now: DateTime<Utc>,
        events: &mut Vec<NewEvent>,
    ) -> Result<(), IllegalTransition> {
        if self.state.edge(to).is_none() {
            return Err(self.illegal(format!("become {to}")));
        }
        self.state = to;
        self.phase = phase;
        self.sync_clock(now);
        self.mark(now, events);
        Ok(())
    }

    /// Changes phase within the state (no event when it is the same).
    pub fn set_phase(&mut self, phase: AttemptPhase, now: DateTime<Utc>) -> Vec<NewEvent> {
        let mut events = Vec::new();
        if self.phase != phase && !self.state.is_terminal() {
            self.phase = phase;
            self.mark(now, &mut events);
        }
        events
    }

    /// Checks a presented fencing token. A stale one is recorded on the
    /// attempt and refused with `aborted`; the caller stores the record.
    pub fn check_fencing(
        &mut self,
        presented: u64,
        operation: &str,
        now: DateTime<Utc>,
    ) -> Result<(), DomainError> {
        if presented == self.fencing_token {
            return Ok(());
        }
        self.stale_refusals.push(StaleRefusal {
            at: now,
            presented,
            operation: operation.to_string(),
        });
        if self.stale_refusals.len() > HISTORY_LIMIT {
            self.stale_refusals.remove(0);
        }
        Err(DomainError::Aborted(format!(
            "fencing token {presented} is stale for attempt {}: the current token is {}; {operation} refused",
            self.attempt_id, self.fencing_token
        )))
    }

    /// Hands the attempt to a holder (an adapter session, or the appliance
    /// for builtin attempts) under a lease until `now + ttl`. A Claimed
    /// attempt is handed out once; a Running or Paused one whose lease has
    /// lapsed, with no call in flight, can be handed to a new holder with a
    /// new fencing token (the old holder is fenced off), to resume from its
    /// last checkpoint.
    pub fn claim(
        &mut self,
        holder: &str,
        new_token: Option<u64>,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<(), IllegalTransition> {
        match self.state {
            AttemptState::Claimed if self.lease.holder.is_none() => {}
            AttemptState::Running | AttemptState::Paused
                if self.lease_lapsed(now) && self.open_call.is_none() =>
            {
                let token =
                    new_token.ok_or_else(|| self.illegal("be re-leased without a new token"))?;
                if token <= self.fencing_token {
                    return Err(self.illegal(format!(
                        "be re-leased with token {token} (not above {})",
                        self.fencing_token
                    )));
                }
                self.fencing_token = token;
                self.lease_id = crate::domain::ids::new_id();
            }
            _ => return Err(self.illegal("be claimed")),
        }
        self.lease.holder = Some(holder.to_string());
        self.lease.expires_at = Some(now + ttl);
        Ok(())
    }

    /// A resuming adapter cannot read the last checkpoint: the attempt
    /// fails (infrastructure), so run control starts a new attempt from the
    /// step input.
    pub fn refuse_resume(
        &mut self,
        why: String,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        let failure = AttemptFailure {
            class: FailureClass::Infrastructure,
            reason: format!("cannot resume: {why}; a new attempt starts from the step input"),
            feedback_ref: None,
            detail_ref: None,
        };
        self.resume_refused = Some(why);
        self.fail(failure, None, now)
    }

    /// Whether the attempt lease has a holder whose lease ran out.
    pub fn lease_lapsed(&self, now: DateTime<Utc>) -> bool {
        self.lease.holder.is_some() && self.lease.expires_at.is_some_and(|t| t <= now)
    }

    /// Extends the attempt lease (heartbeat).
    pub fn renew_lease(&mut self, ttl: Duration, now: DateTime<Utc>) {
        if self.lease.holder.is_some() && !self.state.is_terminal() {
            self.lease.expires_at = Some(now + ttl);
            self.lease.renewals += 1;
        }
    }

    /// Claimed -> Running: the release is loaded and the context built.
    pub fn start(
        &mut self,
        context_snapshot_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.state != AttemptState::Claimed || self.lease.holder.is_none() {
            return Err(self.illegal("start (it must be Claimed by a holder)"));
        }
        let mut events = Vec::new();
        self.context_snapshot_ref = context_snapshot_ref;
        self.move_to(
            AttemptState::Running,
            AttemptPhase::Planning,
            now,
            &mut events,
        )?;
        events.insert(
            0,
            NewEvent::new(
                &self.tenant_id,
                now,
                &AttemptStarted {
                    attempt_id: self.attempt_id,
                    run_id: self.run_id,
                    step_id: self.step_id,
                    tenant_id: &self.tenant_id,
                    release_id: &self.release_id,
                    snapshot_id: self.snapshot_id,
                    fencing_token: self.fencing_token,
                },
            ),
        );
        Ok(events)
    }

    /// Writes a checkpoint at the current phase. A failed lease renewal
    /// turns this checkpoint into the point where the attempt pauses.
    pub fn checkpoint(
        &mut self,
        checkpoint_id: Uuid,
        reason: CheckpointReason,
        adapter_state_ref: String,
        call_id: Option<Uuid>,
        now: DateTime<Utc>,
    ) -> Result<(Checkpoint, Vec<NewEvent>), IllegalTransition> {
        if self.state.is_terminal() || self.state == AttemptState::Claimed {
            return Err(self.illegal("write a checkpoint"));
        }
        self.usage.checkpoints += 1;
        self.usage.calls_since_checkpoint = 0;
        let mut checkpoint = Checkpoint {
            checkpoint_id,
            attempt_id: self.attempt_id,
            tenant_id: self.tenant_id.clone(),
            sequence: self.usage.checkpoints,
            phase: self.phase,
            adapter_state_ref: adapter_state_ref.clone(),
            adapter_version: self.adapter_version.clone(),
            checkpoint_format: self.checkpoint_format,
            context_snapshot_ref: self.context_snapshot_ref.clone(),
            hash: String::new(),
            created_at: now,
            reason,
            call_id,
            evidence: reason == CheckpointReason::BeforeGatedCall,
            purged: None,
            calls_before: Some(self.usage.calls),
        };
        checkpoint.hash = checkpoint.compute_hash();
        self.last_checkpoint_id = Some(checkpoint_id);
        self.adapter_state_ref = Some(adapter_state_ref);
        let mut events = vec![NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptCheckpointed {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                checkpoint_id,
                sequence: checkpoint.sequence,
                adapter_version: &self.adapter_version,
            },
        )];
        if self.state == AttemptState::Running
            && self.open_call.is_none()
            && let Some(why) = self.renewal_failure.clone()
        {
            self.pause_reason = Some(why);
            self.move_to(AttemptState::Paused, self.phase, now, &mut events)?;
        }
        Ok((checkpoint, events))
    }

    /// Records a request to stop. It is observed at the next safe point:
    /// at once when the attempt waits (for capacity, a claim, a decision,
    /// a tool, or while paused), at the holder's next contact while it runs.
    pub fn request_interrupt(
        &mut self,
        request: InterruptRequest,
        now: DateTime<Utc>,
    ) -> Vec<NewEvent> {
        if self.state.is_terminal() || self.interrupt.is_some() {
            return Vec::new();
        }
        let event = NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptInterruptRequested {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                reason: &request.reason,
                source: request.source.as_str(),
            },
        );
        self.interrupt = Some(request);
        vec![event]
    }

    /// Observes the interruption: the open call (if any) settles as
    /// abandoned (no effect possible) or uncertain, and the attempt ends
    /// Cancelled or Uncertain. `open` is the open call's record.
    pub fn observe_cancellation(
        &mut self,
        open: Option<&mut CallRecord>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        let Some(request) = self.interrupt.clone() else {
            return Err(self.illegal("observe a cancellation nobody requested"));
        };
        let mut events = Vec::new();
        let uncertain = self.settle_open_call(open, &request.reason, now, &mut events)?;
        self.cancellation_observed_at = Some(now);
        let failure = Some(AttemptFailure {
            class: if request.source == InterruptSource::LeaseLost {
                FailureClass::Infrastructure
            } else {
                FailureClass::Policy
            },
            reason: format!("{}: {}", request.source.as_str(), request.reason),
            feedback_ref: None,
            detail_ref: None,
        });
        let state = if uncertain {
            AttemptState::Uncertain
        } else {
            AttemptState::Cancelled
        };
        events.push(NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptCancellationObserved {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                uncertain_calls: u32::from(uncertain),
            },
        ));
        events.extend(self.finish(state, failure, None, now)?);
        Ok(events)
    }

    /// The holder of the attempt is gone (the appliance restarted under a
    /// builtin attempt): a call in flight that cannot have had an effect is
    /// abandoned and the lease is let go, so the attempt can be claimed
    /// again and resume from its last checkpoint. Returns false, changing
    /// nothing, when the open call's effect is unconfirmed: that attempt
    /// must settle as Uncertain instead.
    pub fn release_holder(
        &mut self,
        open: Option<&mut CallRecord>,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<(bool, Vec<NewEvent>), IllegalTransition> {
        if self
            .open_call
            .as_ref()
            .is_some_and(OpenCall::effect_unconfirmed)
        {
            return Ok((false, Vec::new()));
        }
        let mut events = Vec::new();
        self.settle_open_call(open, why, now, &mut events)?;
        if self.state == AttemptState::Claimed {
            // Never started: it is claimed afresh, with its token.
            self.lease.holder = None;
            self.lease.expires_at = None;
        } else {
            self.expire_lease(now);
        }
        Ok((true, events))
    }

    /// Ends the current holder's lease now: its holder is known to be gone.
    pub fn expire_lease(&mut self, now: DateTime<Utc>) {
        if self.lease.holder.is_some() {
            self.lease.expires_at = Some(now);
        }
    }

    /// A reported success: verified against the output contract by the
    /// caller (`violations` empty means valid). Valid -> Succeeded. Not
    /// valid: a correction while `correctionCount < maxCorrections`,
    /// otherwise Failed(validation) with the feedback attached.
    pub fn report_success(
        &mut self,
        output_ref: String,
        violations: &[String],
        feedback_ref: Option<String>,
        report_hash: String,
        now: DateTime<Utc>,
    ) -> Result<(Verdict, Vec<NewEvent>), IllegalTransition> {
        if self.state != AttemptState::Running || self.open_call.is_some() {
            return Err(self.illegal("report an outcome (it must be Running with no call open)"));
        }
        let mut events = self.set_phase(AttemptPhase::Verifying, now);
        if violations.is_empty() {
            self.outcome_report_hash = Some(report_hash);
            events.extend(self.finish(AttemptState::Succeeded, None, Some(output_ref), now)?);
            return Ok((Verdict::Verified, events));
        }
        let feedback = violations.join("; ");
        if self.correction_count < self.max_corrections {
            self.correction_count += 1;
            events.extend(self.set_phase(AttemptPhase::Correcting, now));
            let left = self.max_corrections - self.correction_count;
            return Ok((Verdict::Correct { feedback, left }, events));
        }
        self.outcome_report_hash = Some(report_hash);
        let failure = AttemptFailure {
            class: FailureClass::Validation,
            reason: format!(
                "output failed verification after {} correction{} (maxCorrections {}): {feedback}",
                self.correction_count,
                if self.correction_count == 1 { "" } else { "s" },
                self.max_corrections
            ),
            feedback_ref,
            detail_ref: None,
        };
        events.extend(self.finish(AttemptState::Failed, Some(failure), None, now)?);
        Ok((Verdict::Exhausted { feedback }, events))
    }

    /// Ends the attempt Failed: reported by the adapter or decided by the
    /// appliance (a limit, an unloadable release, an incompatible
    /// checkpoint).
    pub fn fail(
        &mut self,
        failure: AttemptFailure,
        report_hash: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        self.end_as(AttemptState::Failed, failure, report_hash, now)
    }

    /// Ends the attempt Failed or TimedOut (a budget ran out) with
    /// `failure`; no call may be in flight.
    pub fn end_as(
        &mut self,
        state: AttemptState,
        failure: AttemptFailure,
        report_hash: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.open_call.is_some() {
            return Err(self.illegal("fail with a call in flight"));
        }
        self.outcome_report_hash = report_hash;
        let mut events = Vec::new();
        if self.state == AttemptState::Running {
            events.extend(self.set_phase(AttemptPhase::Reporting, now));
        }
        events.extend(self.finish(state, Some(failure), None, now)?);
        Ok(events)
    }

    /// Moves to a final state and reports the one outcome.
    fn finish(
        &mut self,
        state: AttemptState,
        failure: Option<AttemptFailure>,
        output_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        let mut events = Vec::new();
        self.move_to(state, AttemptPhase::Reporting, now, &mut events)?;
        if state != AttemptState::Uncertain {
            self.open_call = None;
        }
        self.pending_decision = None;
        self.failure = failure;
        self.output_ref = output_ref;
        self.ended_at = Some(now);
        let hash = outcome_hash(
            self.attempt_id,
            state,
            self.output_ref.as_deref(),
            self.failure.as_ref(),
        );
        self.outcome_hash = Some(hash.clone());
        events.push(NewEvent::new(
            &self.tenant_id,
            now,
            &AttemptOutcomeReported {
                attempt_id: self.attempt_id,
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                state,
                outcome_hash: &hash,
                corrections: self.correction_count,
                model_calls: self.usage.model_calls,
                tool_calls: self.usage.tool_calls,
            },
        ));
        Ok(events)
    }

    /// A new outcome report against an attempt that already has one: the
    /// same report is acknowledged, a different one rejected.
    pub fn check_repeat_report(&self, report_hash: &str) -> Result<(), DomainError> {
        let Some(outcome) = &self.outcome_hash else {
            return Ok(());
        };
        if self.outcome_report_hash.as_deref() == Some(report_hash) {
            return Ok(());
        }
        Err(DomainError::FailedPrecondition(format!(
            "attempt {} already reported its outcome ({}, {outcome}); a different outcome is rejected",
            self.attempt_id, self.state
        )))
    }

    /// The decision it waits for, or why it does not wait for one.
    pub fn waiting_reason(&self) -> Option<String> {
        match self.state {
            AttemptState::Claimed if !self.capacity_granted => {
                Some("waiting for capacity (agent-runtime lease)".into())
            }
            AttemptState::Claimed if self.lease.holder.is_none() => Some(match self.adapter {
                AdapterKind::External => {
                    format!(
                        "waiting for an external adapter of agent {} to claim it",
                        self.agent_id
                    )
                }
                AdapterKind::Builtin => "waiting for the builtin adapter to start it".into(),
            }),
            AttemptState::Claimed => Some("claimed; the adapter is loading the release".into()),
            AttemptState::Running if !self.capacity_granted => Some(
                "waiting for capacity again (agent-runtime lease): it gave its lease back while it waited for a human"
                    .into(),
            ),
            AttemptState::WaitingForTool => self.open_call.as_ref().map(|c| {
                format!(
                    "waiting for the result of {} call {}",
                    c.kind.as_str(),
                    c.call_id
                )
            }),
            AttemptState::WaitingForDecision => self
                .pending_decision
                .map(|d| format!("waiting for a human decision ({d})")),
            AttemptState::Paused => Some(format!(
                "paused: {}",
                self.pause_reason
                    .as_deref()
                    .unwrap_or("lease renewal failed")
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
