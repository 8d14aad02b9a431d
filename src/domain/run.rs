//! The Run aggregate: the run-control role's record of one execution of a
//! release, its steps and the attempts made for each.
//!
//! A run resolves its snapshot once, at submission (release, manifest hash,
//! policy revision, model profile, limits, input hash), and every attempt
//! of every step runs against that snapshot. Run Control records each
//! attempt's single outcome and decides what follows: another attempt of
//! the step (fencing token + 1) when the failure class allows it and
//! attempts are left, the next step, or the end of the run.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::attempt::{AttemptState, ExecutionAttempt, FailureClass};
use super::error::{DomainError, FieldError};
use super::events::{EventPayload, NewEvent};
use super::ids::{ProjectId, TenantId};
use super::release::{AdapterKind, AttemptLimits};

/// Where a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RunState {
    /// An attempt of a step is live or about to be.
    Running,
    /// Every step succeeded.
    Succeeded,
    /// A step failed with no attempt left, or for a reason another attempt
    /// cannot fix.
    Failed,
    /// A step's last attempt timed out.
    TimedOut,
    /// Cancelled.
    Cancelled,
    /// A call's effect is unconfirmed: an operator must settle it before
    /// the run goes on or ends.
    Uncertain,
}

impl RunState {
    /// Every state, in the order lists show them.
    pub const ALL: &'static [RunState] = &[
        RunState::Running,
        RunState::Uncertain,
        RunState::Succeeded,
        RunState::Failed,
        RunState::TimedOut,
        RunState::Cancelled,
    ];

    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "Running",
            RunState::Succeeded => "Succeeded",
            RunState::Failed => "Failed",
            RunState::TimedOut => "TimedOut",
            RunState::Cancelled => "Cancelled",
            RunState::Uncertain => "Uncertain",
        }
    }

    /// Parses a name, exactly as [`RunState::as_str`] spells it.
    pub fn parse(text: &str) -> Option<RunState> {
        [
            RunState::Running,
            RunState::Succeeded,
            RunState::Failed,
            RunState::TimedOut,
            RunState::Cancelled,
            RunState::Uncertain,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Final states.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Running | RunState::Uncertain)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The execution snapshot a run resolved at submission.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The snapshot.
    pub snapshot_id: Uuid,
    /// Release.
    pub release_id: String,
    /// The release's manifest hash.
    pub manifest_hash: String,
    /// The release's policy revision.
    pub policy_revision: String,
    /// The model profile.
    pub model_profile_id: String,
    /// The limits every attempt gets.
    pub limits: AttemptLimits,
    /// Hash of the run's input.
    pub input_hash: String,
    /// Builtin or external.
    pub adapter: AdapterKind,
    /// The adapter version attempts need, e.g. `external/1`.
    pub adapter_version: String,
    /// The checkpoint format attempts write.
    pub checkpoint_format: u32,
    /// CPUs an attempt's capacity lease asks for.
    pub cpu: f64,
    /// Memory (GB) an attempt's capacity lease asks for.
    pub memory_gb: f64,
    /// The release's contract retries failures of class `agent`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry_agent_failures: bool,
}

impl Snapshot {
    /// Whether a failure of `class` earns another attempt: the classes
    /// another attempt may get past, and `agent` when the release says so.
    pub fn retries(&self, class: FailureClass) -> bool {
        class.retryable() || (class == FailureClass::Agent && self.retry_agent_failures)
    }
}

/// One step of the release's workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// The step.
    pub step_id: Uuid,
    /// 0, 1, ... in workflow order.
    pub index: u32,
    /// The workflow's name for it.
    pub name: String,
    /// Artifact reference of its input (the run's input for the first
    /// step, the previous step's output after that).
    pub input_ref: Option<String>,
    /// Running (or not started), then the state of its last attempt.
    pub state: RunState,
    /// Attempts made, in order.
    pub attempts: Vec<Uuid>,
    /// The fencing token of its latest attempt lease.
    pub fencing_token: u64,
    /// Artifact reference of its verified output.
    pub output_ref: Option<String>,
}

/// The supervisor of a child run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    /// The supervisor's run.
    pub run_id: Uuid,
    /// The supervisor attempt.
    pub attempt_id: Uuid,
    /// The delegation.
    pub delegation_id: Uuid,
    /// The sub-agent call of the supervisor that waits for this run.
    pub call_id: Uuid,
    /// The runs above the supervisor's run, nearest first (empty when the
    /// supervisor's run is a top-level run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<Uuid>,
}

/// Where a re-run started: a checkpoint of a finished attempt of another
/// run. The source run is never changed by its re-runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RerunOrigin {
    /// The source run.
    pub run_id: Uuid,
    /// Its attempt the checkpoint belongs to.
    pub attempt_id: Uuid,
    /// The checkpoint.
    pub checkpoint_id: Uuid,
    /// Its sequence within the source attempt.
    pub checkpoint_sequence: u32,
    /// The step (index) the source attempt worked on: the re-run starts
    /// there, with the steps before it as the source ended them.
    pub step_index: u32,
    /// The source run's release.
    pub release_id: String,
    /// The checkpoint's adapter state: every attempt of the step starts
    /// from it.
    pub adapter_state_ref: String,
    /// Call records the source attempt had written when the checkpoint was
    /// (the calls after it have higher sequences).
    pub calls_before: u32,
    /// Calls of the source attempt after the checkpoint whose effect was
    /// confirmed and that the operator asked to issue again; every other
    /// such call is answered from the source's record instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reissue: Vec<Uuid>,
    /// Who asked for the re-run.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// What an operator does to a run from the console, one run or many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAction {
    /// Cancel it.
    Cancel,
    /// Place a legal hold.
    Hold,
    /// Release the legal hold.
    Release,
}

impl RunAction {
    /// Reads a form's `action`, naming the field when it is none of them.
    pub fn parse(text: &str) -> Result<RunAction, FieldError> {
        match text {
            "cancel" => Ok(RunAction::Cancel),
            "hold" => Ok(RunAction::Hold),
            "unhold" => Ok(RunAction::Release),
            other => Err(FieldError::new(
                "action",
                format!("{other:?} is not a bulk action on runs: cancel, hold or unhold"),
            )),
        }
    }

    /// What it is called in a form.
    pub fn as_str(self) -> &'static str {
        match self {
            RunAction::Cancel => "cancel",
            RunAction::Hold => "hold",
            RunAction::Release => "unhold",
        }
    }

    /// The scope it needs.
    pub fn scope(self) -> crate::domain::access::Scope {
        match self {
            RunAction::Cancel => crate::domain::access::Scope::RunsWrite,
            RunAction::Hold | RunAction::Release => crate::domain::access::Scope::RunsOperate,
        }
    }

    /// The verb, for a sentence about runs.
    pub fn verb(self) -> &'static str {
        match self {
            RunAction::Cancel => "Cancel",
            RunAction::Hold => "Place a legal hold on",
            RunAction::Release => "Release the legal hold of",
        }
    }
}

/// One execution of a release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// The run.
    pub run_id: Uuid,
    /// Owner.
    pub tenant_id: TenantId,
    /// Project.
    pub project_id: ProjectId,
    /// Environment.
    pub environment_id: Option<String>,
    /// Agent.
    pub agent_id: String,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Artifact reference of the input.
    pub input_ref: String,
    /// Attempts allowed per step.
    pub max_attempts: u32,
    /// Self-corrections allowed per attempt.
    pub max_corrections: u32,
    /// Steps in workflow order.
    pub steps: Vec<Step>,
    /// The step being worked on.
    pub current_step: u32,
    /// State.
    pub state: RunState,
    /// Why it ended this way (failed, cancelled, uncertain).
    pub reason: Option<String>,
    /// Artifact reference of the last step's verified output.
    pub output_ref: Option<String>,
    /// A cancellation was requested.
    pub cancel_requested: Option<String>,
    /// Sub-agent depth (0 for a top-level run).
    pub depth: u32,
    /// The supervisor, for a child run.
    pub parent: Option<ParentLink>,
    /// The caller's idempotency key.
    pub request_id: Option<String>,
    /// Who submitted it.
    pub submitted_by: String,
    /// Submitted at.
    pub created_at: DateTime<Utc>,
    /// Ended at.
    pub ended_at: Option<DateTime<Utc>>,
    /// The number of the stored state this value is (0: not stored yet);
    /// the store numbers every write and refuses one derived from an older
    /// state.
    pub version: u64,
    /// A legal hold: nothing of the run is purged while it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<crate::domain::retention::Hold>,
    /// Where purged content was: the references above stay (hashes and
    /// contracts still hold), the content is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged: Option<crate::domain::retention::Tombstone>,
    /// A re-run: the checkpoint it started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<RerunOrigin>,
    /// The name its submitter chose, unique in its project: submitting
    /// the same key again returns this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_key: Option<String>,
    /// Labels to find it by.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// A run's labels: `key=value` pairs, at most [`MAX_LABELS`].
pub type Labels = std::collections::BTreeMap<String, String>;

/// Most labels a run carries.
pub const MAX_LABELS: usize = 16;
/// Longest label key, in characters.
pub const MAX_LABEL_KEY: usize = 63;
/// Longest label value, in characters.
pub const MAX_LABEL_VALUE: usize = 128;

/// Checks labels given as `key=value` texts: a key of 1 to 63 of a-z, 0-9,
/// `.`, `_`, `-` starting with a letter or digit; a value of 1 to 128
/// characters without control characters; each key once; at most
/// [`MAX_LABELS`].
pub fn parse_labels<'a>(
    field: &str,
    given: impl IntoIterator<Item = &'a str>,
) -> Result<Labels, FieldError> {
    let mut labels = Labels::new();
    for (i, text) in given.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Some((key, value)) = text.split_once('=') else {
            return Err(FieldError::new(at, format!("{text:?} is not key=value")));
        };
        check_label(&at, key, value)?;
        if labels.insert(key.to_string(), value.to_string()).is_some() {
            return Err(FieldError::new(
                at,
                format!("the key {key:?} is given twice"),
            ));
        }
    }
    if labels.len() > MAX_LABELS {
        return Err(FieldError::new(
            field,
            format!(
                "{} labels; a run carries at most {MAX_LABELS}",
                labels.len()
            ),
        ));
    }
    Ok(labels)
}

/// Checks one label.
pub fn check_label(field: &str, key: &str, value: &str) -> Result<(), FieldError> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_LABEL_KEY
        && key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if !key_ok {
        return Err(FieldError::new(
            field,
            format!(
                "the key {key:?} must be 1 to {MAX_LABEL_KEY} of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
            ),
        ));
    }
    let n = value.chars().count();
    if n == 0 || n > MAX_LABEL_VALUE || value.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            format!(
                "the value of {key} must be 1 to {MAX_LABEL_VALUE} characters without control characters"
            ),
        ));
    }
    Ok(())
}

/// A live attempt state a run can be found waiting in: WaitingForDecision,
/// Paused, WaitingForTool or Claimed (waiting for capacity).
pub fn parse_waiting(field: &str, text: &str) -> Result<AttemptState, FieldError> {
    [
        AttemptState::WaitingForDecision,
        AttemptState::Paused,
        AttemptState::WaitingForTool,
        AttemptState::Claimed,
    ]
    .into_iter()
    .find(|s| s.as_str() == text)
    .ok_or_else(|| {
        FieldError::new(
            field,
            format!("{text:?} is not one of WaitingForDecision, Paused, WaitingForTool, Claimed"),
        )
    })
}

/// A label as its index stores it (`key=value`).
pub fn label_value(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// A run key as its index stores it: unique per project.
pub fn run_key_value(project: &ProjectId, key: &str) -> String {
    format!("{} {key}", project.as_str())
}

impl Run {
    /// The runs above this one, nearest first: empty for a top-level run.
    /// A child run counts in its top-level run's run slot, and its token
    /// usage is charged to every run above it as well as to itself.
    pub fn ancestors(&self) -> Vec<Uuid> {
        self.parent.as_ref().map_or_else(Vec::new, |p| {
            std::iter::once(p.run_id)
                .chain(p.ancestors.iter().copied())
                .collect()
        })
    }

    /// Places (`Some`) or releases (`None`) a legal hold; the event of the
    /// change, or `None` when nothing changed (the same hold again, or no
    /// hold to release).
    pub fn set_hold(
        &mut self,
        hold: Option<crate::domain::retention::Hold>,
        by: &str,
        now: DateTime<Utc>,
    ) -> Option<NewEvent> {
        let same = match (&self.hold, &hold) {
            (None, None) => true,
            (Some(a), Some(b)) => a.reason == b.reason,
            _ => false,
        };
        if same {
            return None;
        }
        self.hold = hold;
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &RunHoldChanged {
                run_id: self.run_id,
                held: self.hold.is_some(),
                reason: self.hold.as_ref().map(|h| h.reason.as_str()),
                by,
            },
        ))
    }
}

/// Payload of `agentbay.runs.v1.run-hold-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunHoldChanged<'a> {
    /// The run.
    pub run_id: Uuid,
    /// Whether it is held now.
    pub held: bool,
    /// The hold's reason.
    pub reason: Option<&'a str>,
    /// Who changed it.
    pub by: &'a str,
}

impl EventPayload for RunHoldChanged<'_> {
    const TOPIC: &'static str = "agentbay.runs.v1.run-hold-changed";
}

/// What Run Control does after an attempt's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Another attempt of the same step with this fencing token.
    Retry {
        /// The step.
        step_index: u32,
        /// The new attempt's number within the step.
        number: u32,
        /// Its fencing token.
        fencing_token: u64,
    },
    /// The next step, from the previous step's output.
    NextStep {
        /// The step.
        step_index: u32,
        /// Its fencing token.
        fencing_token: u64,
    },
    /// The run is over (or waits for an operator: Uncertain).
    Done,
}

/// What the rules between a stored run and any state written over it read
/// of the stored one; the store decodes just this from the stored record.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRun {
    /// The run.
    pub run_id: Uuid,
    /// Its stored version.
    pub version: u64,
    /// Its state.
    pub state: RunState,
    /// Its output.
    pub output_ref: Option<String>,
    /// Its steps.
    pub steps: Vec<StoredStep>,
}

/// A stored step, as the successor rules read it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredStep {
    /// Its name.
    pub name: String,
    /// Its attempts.
    pub attempts: Vec<Uuid>,
    /// Its latest fencing token.
    pub fencing_token: u64,
}

impl StoredRun {
    /// The rules between a stored run and any state written over it: an
    /// ended run stays ended with its output and gets no new attempt; a
    /// step's attempts are never removed and its fencing token never goes
    /// back.
    pub fn check_successor(&self, next: &Run) -> Result<(), String> {
        if self.state.is_terminal()
            && (next.state != self.state || next.output_ref != self.output_ref)
        {
            return Err(format!(
                "run {} ended {}; it cannot become {}",
                self.run_id, self.state, next.state
            ));
        }
        if next.steps.len() != self.steps.len() {
            return Err(format!(
                "run {} has {} steps; its steps are fixed at submission",
                self.run_id,
                self.steps.len()
            ));
        }
        for (old, new) in self.steps.iter().zip(&next.steps) {
            if !new.attempts.starts_with(&old.attempts) {
                return Err(format!(
                    "the attempts of step {} of run {} are never removed or replaced",
                    old.name, self.run_id
                ));
            }
            if self.state.is_terminal() && new.attempts.len() > old.attempts.len() {
                return Err(format!(
                    "run {} ended {}; it gets no new attempt",
                    self.run_id, self.state
                ));
            }
            if new.fencing_token < old.fencing_token {
                return Err(format!(
                    "the fencing token of step {} of run {} is {}; it cannot go back to {}",
                    old.name, self.run_id, old.fencing_token, new.fencing_token
                ));
            }
        }
        Ok(())
    }
}

impl Run {
    /// The step being worked on.
    pub fn step(&self) -> &Step {
        &self.steps[self.current_step as usize]
    }

    /// Records a new attempt for the current step.
    pub fn add_attempt(&mut self, attempt_id: Uuid, fencing_token: u64) {
        let step = &mut self.steps[self.current_step as usize];
        step.attempts.push(attempt_id);
        step.fencing_token = fencing_token;
        step.state = RunState::Running;
    }

    /// What the rules between this state and a successor read of it.
    pub fn stored(&self) -> StoredRun {
        StoredRun {
            run_id: self.run_id,
            version: self.version,
            state: self.state,
            output_ref: self.output_ref.clone(),
            steps: self
                .steps
                .iter()
                .map(|s| StoredStep {
                    name: s.name.clone(),
                    attempts: s.attempts.clone(),
                    fencing_token: s.fencing_token,
                })
                .collect(),
        }
    }

    /// Whether `next` may be written over this state (see
    /// [`StoredRun::check_successor`]).
    pub fn check_successor(&self, next: &Run) -> Result<(), String> {
        self.stored().check_successor(next)
    }

    /// A live attempt of the current step is leased again (resumed by a new
    /// holder) with a new fencing token: the token must be above every
    /// token the step has issued, so none is ever reused.
    pub fn lease_again(&mut self, attempt: &ExecutionAttempt) -> Result<(), DomainError> {
        let Some(step) = self.steps.iter_mut().find(|s| s.step_id == attempt.step_id) else {
            return Err(DomainError::FailedPrecondition(format!(
                "attempt {} belongs to no step of run {}",
                attempt.attempt_id, self.run_id
            )));
        };
        if attempt.fencing_token <= step.fencing_token {
            return Err(DomainError::Aborted(format!(
                "fencing token {} for attempt {} is not above {}, the latest its step issued; tokens are never reused",
                attempt.fencing_token, attempt.attempt_id, step.fencing_token
            )));
        }
        step.fencing_token = attempt.fencing_token;
        Ok(())
    }

    /// Whether the run still waits for the outcome of this attempt: it is
    /// live and the attempt is its current step's latest.
    pub fn awaits_outcome_of(&self, attempt_id: Uuid) -> bool {
        !self.state.is_terminal() && self.step().attempts.last() == Some(&attempt_id)
    }

    /// Records the single outcome of `attempt` and decides what follows.
    /// Only the outcome of the current step's latest attempt of a live run
    /// counts: an ended run decides nothing again (it never gets a second
    /// attempt after it succeeded), and an older attempt's end changes
    /// nothing.
    pub fn on_attempt_ended(
        &mut self,
        attempt: &ExecutionAttempt,
        now: DateTime<Utc>,
    ) -> (Next, Vec<NewEvent>) {
        if !self.awaits_outcome_of(attempt.attempt_id) {
            return (Next::Done, Vec::new());
        }
        let index = self.current_step as usize;
        let step_attempts = self.steps[index].attempts.len() as u32;
        let token = self.steps[index].fencing_token;
        match attempt.state {
            AttemptState::Succeeded => {
                let step = &mut self.steps[index];
                step.state = RunState::Succeeded;
                step.output_ref = attempt.output_ref.clone();
                if self.cancel_requested.is_none() && index + 1 < self.steps.len() {
                    self.current_step += 1;
                    let next = &mut self.steps[index + 1];
                    next.input_ref = attempt.output_ref.clone();
                    return (
                        Next::NextStep {
                            step_index: self.current_step,
                            fencing_token: next.fencing_token + 1,
                        },
                        Vec::new(),
                    );
                }
                if let Some(why) = self.cancel_requested.clone() {
                    return (Next::Done, self.end(RunState::Cancelled, Some(why), now));
                }
                self.output_ref = attempt.output_ref.clone();
                (Next::Done, self.end(RunState::Succeeded, None, now))
            }
            AttemptState::Uncertain => {
                self.steps[index].state = RunState::Uncertain;
                self.state = RunState::Uncertain;
                self.reason = Some(format!(
                    "attempt {} stopped with a call whose effect cannot be confirmed; an operator must settle it",
                    attempt.attempt_id
                ));
                (Next::Done, Vec::new())
            }
            state => {
                let failure = attempt.failure.as_ref();
                let class = failure.map(|f| f.class);
                let reason = failure
                    .map(|f| f.reason.clone())
                    .unwrap_or_else(|| format!("attempt {} ended {state}", attempt.attempt_id));
                let retryable = state == AttemptState::Failed
                    || (state == AttemptState::Cancelled
                        && class == Some(FailureClass::Infrastructure));
                let retries = class.is_some_and(|c| self.snapshot.retries(c));
                if retryable
                    && retries
                    && self.cancel_requested.is_none()
                    && step_attempts < self.max_attempts
                {
                    return (
                        Next::Retry {
                            step_index: self.current_step,
                            number: step_attempts + 1,
                            fencing_token: token + 1,
                        },
                        Vec::new(),
                    );
                }
                let run_state = match state {
                    _ if self.cancel_requested.is_some() => RunState::Cancelled,
                    AttemptState::TimedOut => RunState::TimedOut,
                    AttemptState::Cancelled if class != Some(FailureClass::Infrastructure) => {
                        RunState::Cancelled
                    }
                    _ => RunState::Failed,
                };
                self.steps[index].state = run_state;
                let reason = if retryable && retries {
                    format!(
                        "{reason} (attempt {step_attempts} of {}; none left)",
                        self.max_attempts
                    )
                } else {
                    reason
                };
                (Next::Done, self.end(run_state, Some(reason), now))
            }
        }
    }

    /// An operator settled the uncertain call that held the run: the run
    /// ends, Failed (the effect happened or not, but the attempt did not
    /// finish its work) unless the operator asks for another attempt,
    /// which is only allowed when the effect did not happen.
    pub fn on_settled(
        &mut self,
        retry: bool,
        reason: &str,
        now: DateTime<Utc>,
    ) -> (Next, Vec<NewEvent>) {
        if self.state != RunState::Uncertain {
            return (Next::Done, Vec::new());
        }
        self.state = RunState::Running;
        let index = self.current_step as usize;
        let step = &self.steps[index];
        if retry
            && self.cancel_requested.is_none()
            && (step.attempts.len() as u32) < self.max_attempts
        {
            return (
                Next::Retry {
                    step_index: self.current_step,
                    number: step.attempts.len() as u32 + 1,
                    fencing_token: step.fencing_token + 1,
                },
                Vec::new(),
            );
        }
        let state = if self.cancel_requested.is_some() {
            RunState::Cancelled
        } else {
            RunState::Failed
        };
        self.steps[index].state = state;
        (
            Next::Done,
            self.end(
                state,
                Some(format!("uncertain call settled: {reason}")),
                now,
            ),
        )
    }

    /// What `action` would do to the run now, in words, or why it would
    /// do nothing (the rule a bulk action's plan shows and keeps to).
    pub fn effect_of(&self, action: RunAction) -> Result<&'static str, String> {
        match action {
            RunAction::Cancel if self.state.is_terminal() => {
                Err(format!("it has ended ({})", self.state.as_str()))
            }
            RunAction::Cancel if self.cancel_requested.is_some() => {
                Err("its cancellation was asked already".into())
            }
            RunAction::Cancel => Ok("cancelled: each live attempt stops at its next safe point"),
            RunAction::Hold if self.hold.is_some() => Err("it is held already".into()),
            RunAction::Hold => Ok("placed on legal hold: retention keeps all of it"),
            RunAction::Release if self.hold.is_none() => Err("it is not held".into()),
            RunAction::Release => Ok("hold released: retention applies again"),
        }
    }

    /// Records a cancellation request; false when the run is over already.
    pub fn request_cancel(&mut self, why: String) -> bool {
        if self.state.is_terminal() || self.cancel_requested.is_some() {
            return false;
        }
        self.cancel_requested = Some(why);
        true
    }

    fn end(
        &mut self,
        state: RunState,
        reason: Option<String>,
        now: DateTime<Utc>,
    ) -> Vec<NewEvent> {
        self.state = state;
        self.reason = reason;
        self.ended_at = Some(now);
        vec![NewEvent::new(
            &self.tenant_id,
            now,
            &RunEnded {
                run_id: self.run_id,
                tenant_id: &self.tenant_id,
                state,
                reason: self.reason.as_deref(),
            },
        )]
    }
}

/// `execution.runs.v1.run-submitted` (the appliance's).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSubmitted<'a> {
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Project.
    pub project_id: &'a ProjectId,
    /// Release.
    pub release_id: &'a str,
    /// Snapshot.
    pub snapshot_id: Uuid,
    /// Parent run, for a child run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    /// The run a re-run started from (a checkpoint of its attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<&'a RerunOrigin>,
}

impl EventPayload for RunSubmitted<'_> {
    const TOPIC: &'static str = "execution.runs.v1.run-submitted";
}

/// `execution.runs.v1.run-ended` (the appliance's).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEnded<'a> {
    /// Run.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// Final state.
    pub state: RunState,
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
}

impl EventPayload for RunEnded<'_> {
    const TOPIC: &'static str = "execution.runs.v1.run-ended";
}

/// `execution.approvals.v1.approval-decided`
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecided<'a> {
    /// Approval.
    pub approval_id: Uuid,
    /// Run.
    pub run_id: Uuid,
    /// Attempt.
    pub attempt_id: Uuid,
    /// Tenant.
    pub tenant_id: &'a TenantId,
    /// approved | rejected.
    pub decision: &'a str,
    /// Who.
    pub decided_by: &'a str,
    /// What was approved.
    pub proposal_hash: &'a str,
}

impl EventPayload for ApprovalDecided<'_> {
    const TOPIC: &'static str = "execution.approvals.v1.approval-decided";
}

/// Everything a new run is made of, resolved outside the transaction.
#[derive(Clone, Debug)]
pub struct NewRun {
    /// The run record.
    pub run: Run,
    /// The input's bytes.
    pub input: Vec<u8>,
}

/// What follows an attempt's outcome, for the runtime to act on after the
/// transaction committed.
#[derive(Clone, Debug, Default)]
pub struct Followup {
    /// The run's next attempt, written in the same transaction.
    pub next_attempt: Option<Uuid>,
    /// A child run that ended: its supervisor's call completes.
    pub child_ended: Option<ChildEnded>,
    /// A top-level run that ended: its run slot is freed.
    pub run_ended: Option<Uuid>,
}

impl Followup {
    /// What follows `run` as written, with its next attempt.
    pub fn of(run: &Run, next_attempt: Option<Uuid>) -> Followup {
        Followup {
            next_attempt,
            child_ended: ended_child(run),
            run_ended: (run.state.is_terminal() && run.parent.is_none()).then_some(run.run_id),
        }
    }
}

/// A child run's end, for its supervisor.
#[derive(Clone, Debug)]
pub struct ChildEnded {
    /// The supervisor.
    pub parent: ParentLink,
    /// The child run.
    pub child_run_id: Uuid,
    /// Its final state.
    pub state: RunState,
    /// Its output.
    pub output_ref: Option<String>,
    /// Why it ended so.
    pub reason: Option<String>,
}

fn ended_child(run: &Run) -> Option<ChildEnded> {
    if !run.state.is_terminal() {
        return None;
    }
    run.parent.clone().map(|parent| ChildEnded {
        parent,
        child_run_id: run.run_id,
        state: run.state,
        output_ref: run.output_ref.clone(),
        reason: run.reason.clone(),
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::domain::attempt::{AttemptFailure, NewAttempt};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 1, 8, 0, 0).unwrap()
    }

    fn run(steps: usize, max_attempts: u32) -> Run {
        let tenant = TenantId::parse("acme").unwrap();
        Run {
            run_id: Uuid::now_v7(),
            tenant_id: tenant,
            project_id: ProjectId::parse("ops").unwrap(),
            environment_id: None,
            agent_id: "triage".into(),
            snapshot: Snapshot {
                snapshot_id: Uuid::now_v7(),
                release_id: "r".into(),
                manifest_hash: "sha256:m".into(),
                policy_revision: "1".into(),
                model_profile_id: "p".into(),
                limits: AttemptLimits::default(),
                input_hash: "sha256:i".into(),
                adapter: AdapterKind::External,
                adapter_version: "external/1".into(),
                checkpoint_format: 1,
                cpu: 0.5,
                memory_gb: 0.5,
                retry_agent_failures: false,
            },
            input_ref: "sha256:i".into(),
            max_attempts,
            max_corrections: 2,
            steps: (0..steps)
                .map(|i| Step {
                    step_id: Uuid::now_v7(),
                    index: i as u32,
                    name: format!("s{i}"),
                    input_ref: None,
                    state: RunState::Running,
                    attempts: Vec::new(),
                    fencing_token: 0,
                    output_ref: None,
                })
                .collect(),
            current_step: 0,
            state: RunState::Running,
            reason: None,
            output_ref: None,
            cancel_requested: None,
            depth: 0,
            parent: None,
            request_id: None,
            submitted_by: "t".into(),
            created_at: now(),
            ended_at: None,
            version: 1,
            hold: None,
            purged: None,
            rerun_of: None,
            run_key: None,
            labels: Labels::new(),
        }
    }

    #[test]
    fn release_versions_order_by_their_numbers() {
        use crate::domain::release::version_order;
        use std::cmp::Ordering::*;
        assert_eq!(version_order("1.10.0", "1.9.3"), Greater);
        assert_eq!(version_order("1.1.0", "1.1.0"), Equal);
        assert_eq!(version_order("0.9.0", "1.0.0"), Less);
        assert_eq!(version_order("1.0", "1.0.1"), Less);
        assert_eq!(version_order("2026-11", "2026-12"), Less);
    }

    fn ended(
        run: &mut Run,
        token: u64,
        state: AttemptState,
        class: Option<FailureClass>,
    ) -> ExecutionAttempt {
        let step = run.step().clone();
        let mut a = ExecutionAttempt::new(
            NewAttempt {
                attempt_id: Uuid::now_v7(),
                run_id: run.run_id,
                step_id: step.step_id,
                number: step.attempts.len() as u32 + 1,
                tenant_id: run.tenant_id.clone(),
                project_id: run.project_id.clone(),
                environment_id: None,
                fencing_token: token,
                snapshot_id: run.snapshot.snapshot_id,
                release_id: "r".into(),
                agent_id: "triage".into(),
                model_profile_id: "p".into(),
                adapter: AdapterKind::External,
                adapter_version: "external/1".into(),
                checkpoint_format: 1,
                limits: AttemptLimits::default(),
                max_corrections: 2,
                depth: 0,
                ancestors: Vec::new(),
            },
            now(),
        );
        run.add_attempt(a.attempt_id, token);
        a.state = state;
        a.output_ref = (state == AttemptState::Succeeded).then(|| format!("sha256:out{token}"));
        a.failure = class.map(|class| AttemptFailure {
            class,
            reason: "x".into(),
            feedback_ref: None,
            detail_ref: None,
        });
        a
    }

    #[test]
    fn a_retryable_failure_gets_another_attempt_with_the_next_token_until_none_are_left() {
        let mut r = run(1, 2);
        let a = ended(
            &mut r,
            1,
            AttemptState::Failed,
            Some(FailureClass::Transient),
        );
        let (next, _) = r.on_attempt_ended(&a, now());
        assert_eq!(
            next,
            Next::Retry {
                step_index: 0,
                number: 2,
                fencing_token: 2
            }
        );
        let a = ended(
            &mut r,
            2,
            AttemptState::Failed,
            Some(FailureClass::Infrastructure),
        );
        let (next, events) = r.on_attempt_ended(&a, now());
        assert_eq!(next, Next::Done);
        assert_eq!(r.state, RunState::Failed);
        assert!(r.reason.as_deref().unwrap().contains("attempt 2 of 2"));
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn policy_and_validation_failures_end_the_run_at_once() {
        for class in [
            FailureClass::Policy,
            FailureClass::Validation,
            FailureClass::Budget,
        ] {
            let mut r = run(1, 3);
            let a = ended(&mut r, 1, AttemptState::Failed, Some(class));
            assert_eq!(r.on_attempt_ended(&a, now()).0, Next::Done);
            assert_eq!(r.state, RunState::Failed);
        }
    }

    #[test]
    fn a_step_output_becomes_the_next_step_input_and_the_last_ends_the_run() {
        let mut r = run(2, 1);
        let a = ended(&mut r, 1, AttemptState::Succeeded, None);
        let (next, _) = r.on_attempt_ended(&a, now());
        assert_eq!(
            next,
            Next::NextStep {
                step_index: 1,
                fencing_token: 1
            }
        );
        assert_eq!(r.steps[1].input_ref.as_deref(), Some("sha256:out1"));
        let b = ended(&mut r, 1, AttemptState::Succeeded, None);
        assert_eq!(r.on_attempt_ended(&b, now()).0, Next::Done);
        assert_eq!(r.state, RunState::Succeeded);
        assert_eq!(r.output_ref.as_deref(), Some("sha256:out1"));
    }

    #[test]
    fn an_uncertain_attempt_holds_the_run_until_settled() {
        let mut r = run(1, 3);
        let a = ended(&mut r, 1, AttemptState::Uncertain, None);
        assert_eq!(r.on_attempt_ended(&a, now()).0, Next::Done);
        assert_eq!(r.state, RunState::Uncertain);
        assert!(!r.state.is_terminal());
        let (next, _) = r.on_settled(true, "did not happen", now());
        assert!(matches!(
            next,
            Next::Retry {
                fencing_token: 2,
                ..
            }
        ));
        let mut r2 = run(1, 3);
        let a = ended(&mut r2, 1, AttemptState::Uncertain, None);
        r2.on_attempt_ended(&a, now());
        assert_eq!(r2.on_settled(false, "happened", now()).0, Next::Done);
        assert_eq!(r2.state, RunState::Failed);
    }

    #[test]
    fn a_cancelled_run_gets_no_new_attempt() {
        let mut r = run(1, 3);
        assert!(r.request_cancel("ops".into()));
        let a = ended(
            &mut r,
            1,
            AttemptState::Failed,
            Some(FailureClass::Transient),
        );
        assert_eq!(r.on_attempt_ended(&a, now()).0, Next::Done);
        assert_eq!(r.state, RunState::Cancelled);
    }
    #[test]
    fn an_ended_run_decides_nothing_again_and_gets_no_new_attempt() {
        let mut r = run(1, 3);
        let a = ended(&mut r, 1, AttemptState::Succeeded, None);
        r.on_attempt_ended(&a, now());
        assert_eq!(r.state, RunState::Succeeded);
        let before = r.clone();
        // The same attempt read back later as Cancelled (infrastructure),
        // which would otherwise earn a retry.
        let mut again = a.clone();
        again.state = AttemptState::Cancelled;
        again.failure = Some(AttemptFailure {
            class: FailureClass::Infrastructure,
            reason: "lease-lost".into(),
            feedback_ref: None,
            detail_ref: None,
        });
        assert!(!r.awaits_outcome_of(again.attempt_id));
        let (next, events) = r.on_attempt_ended(&again, now());
        assert_eq!(next, Next::Done);
        assert!(events.is_empty());
        assert_eq!(r, before);
        // Whoever writes it, an ended run keeps its state and gets no
        // attempt.
        let mut forged = before.clone();
        forged.add_attempt(Uuid::now_v7(), 2);
        let rule = before.check_successor(&forged).unwrap_err();
        assert!(rule.contains("no new attempt"), "{rule}");
        let mut reopened = before.clone();
        reopened.state = RunState::Running;
        assert!(before.check_successor(&reopened).is_err());
    }

    #[test]
    fn a_resume_takes_a_token_above_every_token_the_step_issued() {
        let mut r = run(1, 3);
        let mut a = ended(&mut r, 1, AttemptState::Running, None);
        a.fencing_token = 2;
        r.lease_again(&a).unwrap();
        assert_eq!(r.steps[0].fencing_token, 2);
        // The same token again, or an older one, is refused.
        let e = r.lease_again(&a).unwrap_err();
        assert!(e.to_string().contains("never reused"), "{e}");
        a.fencing_token = 1;
        assert!(r.lease_again(&a).is_err());
        // A step's token never goes back, whoever writes the run.
        let mut back = r.clone();
        back.steps[0].fencing_token = 1;
        assert!(r.check_successor(&back).is_err());
    }
}
