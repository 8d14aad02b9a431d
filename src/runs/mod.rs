//! Run control: submission, status, cancellation, approvals and the
//! settlement of uncertain calls.
//!
//! A run's records change in store transactions only. The functions that
//! take a [`Tx`] ([`create_run`], [`record_outcome`]) are also called by
//! the runtime inside an attempt's own transaction, so an attempt's single
//! outcome, the run's decision about it and the next attempt commit
//! together or not at all.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use crate::capacity::Capacity;
use crate::capacity::ledger;
use crate::clock::SharedClock;
use crate::config::RuntimeConfig;
use crate::domain::access::TenantScope;
use crate::domain::attempt::{
    AttemptState, CallRecord, CallStatus, DecisionKind, DecisionRequest, Effect, ExecutionAttempt,
    NewAttempt, Settlement, SubAgentDelegation, json_hash,
};
use crate::domain::events::NewEvent;
use crate::domain::ids::new_id;
use crate::domain::release::{AttemptLimits, LoadedRelease, Manifest};
use crate::domain::run::{Followup, NewRun};
use crate::domain::run::{
    Labels, Next, ParentLink, Run, RunState, RunSubmitted, Snapshot, Step, label_value,
    run_key_value,
};
use crate::domain::usage::TokenUsage;
use crate::domain::{DomainError, FieldError, ProjectId, TenantId};
use crate::releases::{ReleaseError, Releases};
use crate::runtime::port::{ChildPlan, RunPort};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{Derived, Record, StoreError, Table, Tx, time_value};

pub mod purge;
pub mod rerun;

/// Names of the indexes runs derive (see `store/derived.rs`).
pub mod index {
    /// Runs of a tenant by state.
    pub const STATE: &str = "run-state";
    /// Runs of a tenant by project.
    pub const PROJECT: &str = "run-project";
    /// Runs of a tenant by project and state (`<project> <state>`).
    pub const PROJECT_STATE: &str = "run-project-state";
    /// Runs of a tenant by agent.
    pub const AGENT: &str = "run-agent";
    /// Runs of a tenant by release.
    pub const RELEASE: &str = "run-release";
    /// Runs by the caller's idempotency key.
    pub const REQUEST: &str = "run-request";
    /// Runs on legal hold (value `_`).
    pub const HELD: &str = "run-held";
    /// Ended runs, not held, whose payloads are still there, by end time.
    pub const PAYLOAD_DUE: &str = "run-payload-due";
    /// Ended runs, not held, by end time.
    pub const HISTORY_DUE: &str = "run-history-due";
    /// Re-runs by the run they started from.
    pub const RERUN_OF: &str = "run-rerun-of";
    /// Runs by the key their submitter chose (`<project> <key>`).
    pub const RUN_KEY: &str = "run-key";
    /// Runs by label (`key=value`).
    pub const LABEL: &str = "run-label";
}

impl Record for Run {
    const TABLE: Table = Table::Runs;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.run_id.to_string()
    }
    fn derive(&self, d: &mut Derived) {
        let state = self.state.as_str();
        // Counted: the runs page shows how many runs a filter admits.
        d.counted(index::STATE, state)
            .counted(index::PROJECT, self.project_id.as_str())
            .counted(
                index::PROJECT_STATE,
                format!("{} {state}", self.project_id.as_str()),
            )
            .counted(index::AGENT, &*self.agent_id)
            .counted(index::RELEASE, &*self.snapshot.release_id);
        if let Some(key) = &self.request_id {
            d.index(index::REQUEST, &**key);
        }
        if let Some(key) = &self.run_key {
            d.index(index::RUN_KEY, run_key_value(&self.project_id, key));
        }
        for (key, value) in &self.labels {
            d.index(index::LABEL, label_value(key, value));
        }
        if self.hold.is_some() {
            d.index(index::HELD, "_");
        } else if let (true, Some(ended)) = (self.state.is_terminal(), self.ended_at) {
            d.index(index::HISTORY_DUE, time_value(ended));
            if self.purged.is_none() {
                d.index(index::PAYLOAD_DUE, time_value(ended));
            }
        }
        if let Some(origin) = &self.rerun_of {
            d.index(index::RERUN_OF, origin.run_id.to_string());
        }
        if self.purged.is_none() {
            d.reference(Some(&self.input_ref))
                .reference(self.output_ref.as_deref())
                .reference(self.rerun_of.as_ref().map(|o| &*o.adapter_state_ref));
            for step in &self.steps {
                d.reference(step.input_ref.as_deref())
                    .reference(step.output_ref.as_deref());
            }
        }
    }
}

crate::versioned!(Run, version, crate::domain::run::StoredRun);

/// The fields of a run that lists need, read from the store without
/// decoding the rest of the record.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run.
    pub run_id: Uuid,
    /// Its state.
    pub state: RunState,
    /// Its agent.
    pub agent_id: String,
    /// Its project.
    pub project_id: ProjectId,
    /// Its release.
    pub snapshot: SnapshotSummary,
    /// Its steps' attempts.
    pub steps: Vec<StepSummary>,
    /// Why it ended as it did.
    pub reason: Option<String>,
    /// When it was submitted.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// The release of a run's snapshot.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSummary {
    /// Release.
    pub release_id: String,
}

/// The attempts of a step.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepSummary {
    /// Attempts, oldest first.
    pub attempts: Vec<Uuid>,
}

/// What a submission asks for, validated.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// Project.
    pub project_id: ProjectId,
    /// Release.
    pub release_id: String,
    /// Input document.
    pub input: Value,
    /// Tighter limits (0 = the release's).
    pub limits: Option<AttemptLimits>,
    /// Attempts per step (0 = the release's).
    pub max_attempts: u32,
    /// Corrections per attempt.
    pub max_corrections: Option<u32>,
    /// Idempotency key.
    pub request_id: Option<String>,
    /// The run's name in its project, chosen by the caller: the same key
    /// again returns the run it named.
    pub run_key: Option<String>,
    /// Labels to find the run by.
    pub labels: Labels,
    /// Environment.
    pub environment_id: Option<String>,
    /// Who.
    pub submitted_by: String,
}

/// The limits a run gets: the release's, tightened by the request and by
/// the appliance's caps.
pub fn effective_limits(
    release: &AttemptLimits,
    asked: Option<&AttemptLimits>,
    config: &RuntimeConfig,
) -> Result<AttemptLimits, FieldError> {
    let pick = |field: &str, release: u32, asked: u32| -> Result<u32, FieldError> {
        if asked == 0 {
            return Ok(release);
        }
        if asked > release {
            return Err(FieldError::new(
                format!("limits.{field}"),
                format!(
                    "{asked} is above the release's contract ({release}); limits may only tighten it"
                ),
            ));
        }
        Ok(asked)
    };
    let a = asked.copied().unwrap_or(AttemptLimits {
        max_minutes: 0,
        max_model_calls: 0,
        max_tool_calls: 0,
        max_context_tokens: 0,
        max_sub_agent_depth: 0,
        max_total_tokens: 0,
    });
    Ok(AttemptLimits {
        max_minutes: pick("maxMinutes", release.max_minutes, a.max_minutes)?,
        max_model_calls: pick("maxModelCalls", release.max_model_calls, a.max_model_calls)?,
        max_tool_calls: pick("maxToolCalls", release.max_tool_calls, a.max_tool_calls)?,
        max_context_tokens: pick(
            "maxContextTokens",
            release.max_context_tokens.min(config.max_context_tokens),
            a.max_context_tokens,
        )?,
        max_sub_agent_depth: pick(
            "maxSubAgentDepth",
            release.max_sub_agent_depth.min(config.max_sub_agent_depth),
            a.max_sub_agent_depth,
        )?,
        max_total_tokens: match (release.max_total_tokens, a.max_total_tokens) {
            (release, 0) => release,
            (0, asked) => asked,
            (release, asked) if asked > release => {
                return Err(FieldError::new(
                    "limits.maxTotalTokens",
                    format!(
                        "{asked} is above the release's contract ({release}); limits may only tighten it"
                    ),
                ));
            }
            (_, asked) => asked,
        },
    })
}

/// The adapter version attempts of `manifest`'s release need, e.g.
/// `external/1`.
pub fn adapter_version(manifest: &Manifest) -> String {
    format!(
        "{}/{}",
        manifest.adapter.kind.as_str(),
        manifest.adapter.version
    )
}

/// Resolves the snapshot of a run of `release`.
#[allow(clippy::too_many_arguments)]
pub fn plan_run(
    request: &RunRequest,
    tenant: &TenantId,
    release: &LoadedRelease,
    manifest: &Manifest,
    steps: Vec<String>,
    config: &RuntimeConfig,
    parent: Option<(ParentLink, u32)>,
    now: DateTime<Utc>,
) -> Result<NewRun, DomainError> {
    if let Some(key) = &request.request_id {
        FieldError::check_key("requestId", key)?;
    }
    if let Some(environment) = &request.environment_id {
        FieldError::check_key("environmentId", environment)?;
    }
    if let Some(key) = &request.run_key {
        FieldError::check_key("runKey", key)?;
    }
    crate::runtime::release::check_input(manifest, &request.input)?;
    let limits = effective_limits(&manifest.contract.limits, request.limits.as_ref(), config)?;
    let release_attempts = manifest.contract.max_attempts.max(1);
    let max_attempts = match request.max_attempts {
        0 => release_attempts,
        n if n > release_attempts => {
            return Err(FieldError::new(
                "maxAttempts",
                format!("{n} is above the release's maxAttempts ({release_attempts})"),
            )
            .into());
        }
        n => n,
    };
    let release_corrections = manifest
        .contract
        .max_corrections
        .unwrap_or(config.default_max_corrections);
    let max_corrections = match request.max_corrections {
        Some(n) if n > release_corrections => {
            return Err(FieldError::new(
                "maxCorrections",
                format!("{n} is above the release's maxCorrections ({release_corrections})"),
            )
            .into());
        }
        Some(n) => n,
        None => release_corrections,
    };
    let input = crate::domain::release::canonical_json(&request.input);
    let input_hash = json_hash(&request.input);
    let (parent, depth) = match parent {
        Some((link, depth)) => (Some(link), depth),
        None => (None, 0),
    };
    let run_id = new_id();
    let run = Run {
        run_id,
        tenant_id: tenant.clone(),
        project_id: request.project_id.clone(),
        environment_id: request.environment_id.clone(),
        agent_id: release.agent_id.clone(),
        snapshot: Snapshot {
            snapshot_id: new_id(),
            release_id: release.release_id.clone(),
            manifest_hash: release.manifest_hash.clone(),
            policy_revision: manifest.policy.revision.clone(),
            model_profile_id: manifest.model_profile.id.clone(),
            limits,
            input_hash: input_hash.clone(),
            adapter: manifest.adapter.kind,
            adapter_version: adapter_version(manifest),
            checkpoint_format: manifest.checkpoint_format,
            cpu: manifest.contract.cpu,
            memory_gb: manifest.contract.memory_gb,
            retry_agent_failures: manifest.contract.retry_agent_failures,
        },
        input_ref: input_hash.clone(),
        max_attempts,
        max_corrections,
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(i, name)| Step {
                step_id: new_id(),
                index: i as u32,
                name,
                input_ref: (i == 0).then(|| input_hash.clone()),
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
        depth,
        parent,
        request_id: request.request_id.clone(),
        submitted_by: request.submitted_by.clone(),
        created_at: now,
        ended_at: None,
        version: 0,
        hold: None,
        purged: None,
        rerun_of: None,
        run_key: request.run_key.clone(),
        labels: request.labels.clone(),
    };
    Ok(NewRun { run, input })
}

/// The next attempt of the run's current step.
fn next_attempt(
    run: &mut Run,
    number: u32,
    fencing_token: u64,
    now: DateTime<Utc>,
) -> ExecutionAttempt {
    let step = run.step().clone();
    let attempt = ExecutionAttempt::new(
        NewAttempt {
            attempt_id: new_id(),
            run_id: run.run_id,
            step_id: step.step_id,
            number,
            tenant_id: run.tenant_id.clone(),
            project_id: run.project_id.clone(),
            environment_id: run.environment_id.clone(),
            fencing_token,
            snapshot_id: run.snapshot.snapshot_id,
            release_id: run.snapshot.release_id.clone(),
            agent_id: run.agent_id.clone(),
            model_profile_id: run.snapshot.model_profile_id.clone(),
            adapter: run.snapshot.adapter,
            adapter_version: run.snapshot.adapter_version.clone(),
            checkpoint_format: run.snapshot.checkpoint_format,
            limits: run.snapshot.limits,
            max_corrections: run.max_corrections,
            depth: run.depth,
            ancestors: run.ancestors(),
        },
        now,
    );
    let mut attempt = attempt;
    if let Some(origin) = run
        .rerun_of
        .as_ref()
        .filter(|o| o.step_index == run.current_step)
    {
        attempt.adapter_state_ref = Some(origin.adapter_state_ref.clone());
        attempt.rerun_of = Some(origin.clone());
    }
    run.add_attempt(attempt.attempt_id, fencing_token);
    attempt
}

/// Writes a new run with its input and its first attempt; returns the
/// attempt.
pub fn create_run(
    tx: &mut Tx,
    scope: &TenantScope,
    new: NewRun,
    retain_until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(Run, ExecutionAttempt), StoreError> {
    let NewRun { mut run, input } = new;
    tx.put_artifact(scope, &input, "application/json", Some(retain_until), now)?;
    let mut attempt = next_attempt(&mut run, 1, 1, now);
    tx.save(scope, &mut run)?;
    tx.save(scope, &mut attempt)?;
    tx.emit(NewEvent::new(
        scope.tenant(),
        now,
        &RunSubmitted {
            run_id: run.run_id,
            tenant_id: scope.tenant(),
            project_id: &run.project_id,
            release_id: &run.snapshot.release_id,
            snapshot_id: run.snapshot.snapshot_id,
            parent_run_id: run.parent.as_ref().map(|p| p.run_id),
            rerun_of: run.rerun_of.as_ref(),
        },
    ))?;
    Ok((run, attempt))
}

/// Records the single outcome of a terminal attempt in its run (inside the
/// attempt's own transaction) and writes the next attempt, if any.
pub fn record_outcome(
    tx: &mut Tx,
    scope: &TenantScope,
    attempt: &ExecutionAttempt,
    now: DateTime<Utc>,
) -> Result<Followup, StoreError> {
    let mut run = load_run(tx, scope, attempt.run_id)?;
    if !run.awaits_outcome_of(attempt.attempt_id) {
        // An older attempt, or a run that ended: nothing to decide.
        return Ok(Followup::default());
    }
    let (next, events) = run.on_attempt_ended(attempt, now);
    tx.emit_all(events)?;
    let mut next_attempt = apply_next(&mut run, next, now);
    if let Some(a) = &mut next_attempt {
        tx.save(scope, a)?;
    }
    tx.save(scope, &mut run)?;
    Ok(Followup::of(&run, next_attempt.map(|a| a.attempt_id)))
}

fn apply_next(run: &mut Run, next: Next, now: DateTime<Utc>) -> Option<ExecutionAttempt> {
    match next {
        Next::Retry {
            number,
            fencing_token,
            ..
        } => Some(next_attempt(run, number, fencing_token, now)),
        Next::NextStep { fencing_token, .. } => Some(next_attempt(run, 1, fencing_token, now)),
        Next::Done => None,
    }
}

fn load_run(tx: &Tx, scope: &TenantScope, run_id: Uuid) -> Result<Run, StoreError> {
    tx.get::<Run>(scope, &run_id.to_string())?
        .ok_or_else(|| StoreError::Corrupt {
            table: Table::Runs.name(),
            key: run_id.to_string(),
            reason: "an attempt refers to a run that is not stored".into(),
        })
}

/// Which runs a listing returns.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    /// State.
    pub state: Option<RunState>,
    /// Agent.
    pub agent_id: Option<String>,
    /// Release.
    pub release_id: Option<String>,
    /// Project.
    pub project_id: Option<ProjectId>,
    /// Submitted on or after this UTC day.
    pub submitted_from: Option<chrono::NaiveDate>,
    /// Submitted on or before this UTC day.
    pub submitted_until: Option<chrono::NaiveDate>,
    /// Its reason (why it failed, was cancelled or is uncertain) holds
    /// this text, in any case.
    pub reason_contains: Option<String>,
    /// It carries this label (`key`, `value`).
    pub label: Option<(String, String)>,
    /// Its attempt now is in this state (waiting for a decision, paused,
    /// waiting for a tool, claimed and waiting for capacity).
    pub waiting: Option<AttemptState>,
}

impl RunFilter {
    /// The index that serves the filter best: the one that narrows it most
    /// directly (none: the table in id order).
    fn index_value(&self) -> Option<(&'static str, String)> {
        if let Some((key, value)) = &self.label {
            return Some((index::LABEL, label_value(key, value)));
        }
        match (
            &self.project_id,
            self.state,
            &self.release_id,
            &self.agent_id,
        ) {
            (Some(p), Some(s), _, _) => Some((
                index::PROJECT_STATE,
                format!("{} {}", p.as_str(), s.as_str()),
            )),
            (_, _, Some(r), _) => Some((index::RELEASE, r.clone())),
            (_, Some(s), _, _) => Some((index::STATE, s.as_str().to_string())),
            (Some(p), _, _, _) => Some((index::PROJECT, p.as_str().to_string())),
            (_, _, _, Some(a)) => Some((index::AGENT, a.clone())),
            _ => None,
        }
    }

    fn admits(&self, run: &Run) -> bool {
        self.state.is_none_or(|s| s == run.state)
            && self.agent_id.as_ref().is_none_or(|a| *a == run.agent_id)
            && self
                .release_id
                .as_ref()
                .is_none_or(|r| *r == run.snapshot.release_id)
            && self
                .project_id
                .as_ref()
                .is_none_or(|p| *p == run.project_id)
            && self
                .submitted_from
                .is_none_or(|d| run.created_at.date_naive() >= d)
            && self
                .submitted_until
                .is_none_or(|d| run.created_at.date_naive() <= d)
            && self.reason_contains.as_ref().is_none_or(|text| {
                run.reason
                    .as_ref()
                    .is_some_and(|r| r.to_lowercase().contains(&text.to_lowercase()))
            })
            && self
                .label
                .as_ref()
                .is_none_or(|(k, v)| run.labels.get(k) == Some(v))
    }
}

/// Which approval `DecideApproval` decides.
#[derive(Clone, Copy, Debug)]
pub enum ApprovalRef {
    /// By the Run Control approval id.
    Approval(Uuid),
    /// By the pending decision's id.
    Decision(Uuid),
}

/// The run-control service.
pub struct RunControl {
    runtime: Arc<Runtime>,
    releases: Arc<Releases>,
    capacity: Arc<Capacity>,
    clock: SharedClock,
    config: crate::config::Live<RuntimeConfig>,
}

impl From<ReleaseError> for RuntimeError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::Domain(d) => d.into(),
            ReleaseError::Store(s) => s.into(),
            other => DomainError::FailedPrecondition(other.to_string()).into(),
        }
    }
}

impl RunControl {
    /// The service over the runtime.
    pub fn new(
        runtime: Arc<Runtime>,
        releases: Arc<Releases>,
        capacity: Arc<Capacity>,
        clock: SharedClock,
        config: crate::config::Live<RuntimeConfig>,
    ) -> RunControl {
        RunControl {
            runtime,
            releases,
            capacity,
            clock,
            config,
        }
    }

    /// The runtime beneath.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// `SubmitRun`.
    pub async fn submit(
        &self,
        scope: &TenantScope,
        request: RunRequest,
    ) -> Result<Run, RuntimeError> {
        if let Some(run) = self.submitted(scope, &request)? {
            return Ok(run);
        }
        let projects = self.capacity.projects(scope).map_err(RuntimeError::from)?;
        if !projects.iter().any(|p| p.project_id == request.project_id) {
            return Err(DomainError::not_found("project", &request.project_id).into());
        }
        let release = self
            .releases
            .dispatchable(scope, &request.release_id)
            .await?;
        let manifest = self.releases.manifest(scope, &release)?;
        let workflow = self.releases.artifact(scope, &release, "workflow")?;
        let steps = crate::domain::release::workflow_steps(&workflow, &release.agent_id);
        let now = self.clock.now();
        let new = plan_run(
            &request,
            scope.tenant(),
            &release,
            &manifest,
            steps,
            &self.config.get(),
            None,
            now,
        )?;
        self.create(scope, new, now).await
    }

    /// The run a submission names already: by its idempotency key, else
    /// by its run key in its project.
    fn submitted(
        &self,
        scope: &TenantScope,
        request: &RunRequest,
    ) -> Result<Option<Run>, RuntimeError> {
        if let Some(key) = &request.request_id
            && let Some(run) = self.by_request(scope, key)?
        {
            return Ok(Some(run));
        }
        let store = self.runtime.store();
        Ok(match &request.run_key {
            Some(key) => {
                let value = run_key_value(&request.project_id, key);
                match store.index_ids(scope, index::RUN_KEY, &value)?.first() {
                    Some(id) => store.get::<Run>(scope, id)?,
                    None => None,
                }
            }
            None => None,
        })
    }

    /// The run submitted with `request_id` `key`, if any.
    pub fn by_request(&self, scope: &TenantScope, key: &str) -> Result<Option<Run>, RuntimeError> {
        let store = self.runtime.store();
        Ok(match store.index_ids(scope, index::REQUEST, key)?.first() {
            Some(id) => store.get::<Run>(scope, id)?,
            None => None,
        })
    }

    /// Writes a planned run with its first attempt and hands the attempt
    /// to the runtime; a run made meanwhile for the same idempotency key
    /// is returned instead.
    async fn create(
        &self,
        scope: &TenantScope,
        new: NewRun,
        now: DateTime<Utc>,
    ) -> Result<Run, RuntimeError> {
        let retain = crate::store::artifacts::unreferenced_until(now);
        let s = scope.clone();
        let keys = [
            new.run.request_id.clone().map(|k| (index::REQUEST, k)),
            new.run
                .run_key
                .as_ref()
                .map(|k| (index::RUN_KEY, run_key_value(&new.run.project_id, k))),
        ];
        let (run, attempt) = self
            .runtime
            .store()
            .transact(move |tx: &mut Tx| {
                for (index, key) in keys.iter().flatten() {
                    if let Some(id) = tx.index_ids(&s, index, key)?.first()
                        && let Some(run) = tx.get::<Run>(&s, id)?
                    {
                        return Ok::<_, RuntimeError>((run, None));
                    }
                }
                let (run, attempt) = create_run(tx, &s, new, retain, now)?;
                Ok((run, Some(attempt)))
            })
            .await?;
        if let Some(attempt) = attempt {
            self.runtime.adopt(scope, attempt.attempt_id)?;
        }
        Ok(run)
    }

    /// A run's tokens from the ledger: its own attempts', and with the
    /// runs it delegated to.
    pub fn tokens(
        &self,
        scope: &TenantScope,
        run_id: Uuid,
    ) -> Result<ledger::RunTokens, RuntimeError> {
        Ok(ledger::run_tokens(self.runtime.store(), scope, run_id)?)
    }

    /// `GetRun`.
    pub fn get(&self, scope: &TenantScope, run_id: Uuid) -> Result<Run, RuntimeError> {
        self.runtime
            .store()
            .get::<Run>(scope, &run_id.to_string())?
            .ok_or_else(|| DomainError::not_found("run", run_id).into())
    }

    /// `ListRuns`: newest first, after `after` (a run id), at most `limit`,
    /// read through the index of the filter's most selective field.
    pub fn list(
        &self,
        scope: &TenantScope,
        filter: &RunFilter,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Run>, RuntimeError> {
        let by = filter.index_value();
        let after = after.map(|a| a.to_string());
        let waiting = match filter.waiting {
            Some(state) => Some(self.runs_waiting(scope, state)?),
            None => None,
        };
        Ok(self.runtime.store().page(
            scope,
            by.as_ref().map(|(i, v)| (*i, v.as_str())),
            after.as_deref(),
            limit,
            |r| filter.admits(r) && waiting.as_ref().is_none_or(|runs| runs.contains(&r.run_id)),
        )?)
    }

    /// The runs whose attempt is in `state` now (a live state: few).
    fn runs_waiting(
        &self,
        scope: &TenantScope,
        state: AttemptState,
    ) -> Result<std::collections::HashSet<Uuid>, RuntimeError> {
        let store = self.runtime.store();
        let mut runs = std::collections::HashSet::new();
        let ids = store.index_ids(
            scope,
            crate::runtime::records::index::ATTEMPT_STATE,
            state.as_str(),
        )?;
        for id in ids {
            if let Some(a) = store.get::<ExecutionAttempt>(scope, &id)? {
                runs.insert(a.run_id);
            }
        }
        Ok(runs)
    }

    /// How many runs the filter admits, when its index alone decides it
    /// (counts are kept per index value); `None` otherwise.
    pub fn count(
        &self,
        scope: &TenantScope,
        filter: &RunFilter,
    ) -> Result<Option<u64>, RuntimeError> {
        let store = self.runtime.store();
        let fields = [
            filter.state.is_some(),
            filter.agent_id.is_some(),
            filter.release_id.is_some(),
            filter.project_id.is_some(),
        ]
        .iter()
        .filter(|f| **f)
        .count();
        let beyond_indexes = filter.submitted_from.is_some()
            || filter.submitted_until.is_some()
            || filter.reason_contains.is_some()
            || filter.label.is_some()
            || filter.waiting.is_some();
        let exact = !beyond_indexes
            && (fields == 0
                || fields == 1
                || (fields == 2 && filter.state.is_some() && filter.project_id.is_some()));
        if !exact {
            return Ok(None);
        }
        Ok(Some(match filter.index_value() {
            Some((index, value)) => store.index_count(scope, index, &value)?,
            None => RunState::ALL
                .iter()
                .map(|s| store.index_count(scope, index::STATE, s.as_str()))
                .sum::<Result<u64, _>>()?,
        }))
    }

    /// `CancelRun`: records the request, interrupts the live attempt and
    /// cancels the runs it delegated to. Idempotent.
    pub async fn cancel(
        &self,
        scope: &TenantScope,
        run_id: Uuid,
        by: &str,
        reason: &str,
    ) -> Result<Run, RuntimeError> {
        FieldError::check_text("reason", reason)?;
        let why = if reason.is_empty() {
            format!("cancelled by {by}")
        } else {
            format!("cancelled by {by}: {reason}")
        };
        let s = scope.clone();
        let w = why.clone();
        let now = self.clock.now();
        let run = self
            .runtime
            .store()
            .transact(move |tx: &mut Tx| {
                let mut run = tx
                    .get::<Run>(&s, &run_id.to_string())?
                    .ok_or_else(|| DomainError::not_found("run", run_id))?;
                let state = run.state;
                if run.request_cancel(w.clone()) {
                    tx.save(&s, &mut run)?;
                    let change = crate::domain::audit::Change::new(
                        s.tenant(),
                        "run.cancel",
                        run_id.to_string(),
                    )
                    .before(serde_json::json!({ "state": state.as_str() }))
                    .after(serde_json::json!({ "state": state.as_str(), "cancelRequested": w }));
                    tx.audit(now, change)?;
                }
                Ok::<_, RuntimeError>(run)
            })
            .await?;
        if run.state.is_terminal() {
            return Ok(run);
        }
        let mut children = Vec::new();
        for step in &run.steps {
            for attempt_id in &step.attempts {
                let delegations: Vec<SubAgentDelegation> = self
                    .runtime
                    .store()
                    .list_under(scope, &format!("{attempt_id}/"))?;
                children.extend(delegations.into_iter().map(|d| d.child_run_id));
                self.runtime
                    .interrupt(
                        scope,
                        *attempt_id,
                        by,
                        &why,
                        crate::domain::attempt::InterruptSource::RunCancelled,
                    )
                    .await
                    .ok();
            }
        }
        for child in children {
            Box::pin(self.cancel(scope, child, by, "the supervisor run was cancelled")).await?;
        }
        if run.state == RunState::Uncertain {
            // Nothing runs; the operator's settlement ends it.
            return self.get(scope, run_id);
        }
        self.get(scope, run_id)
    }

    /// `HoldRun`: places a legal hold with a reason (`Some`) or releases it
    /// (`None`). Idempotent; the change is an event naming who did it.
    pub async fn hold(
        &self,
        scope: &TenantScope,
        run_id: Uuid,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Run, RuntimeError> {
        let now = self.clock.now();
        let hold = reason
            .map(|r| crate::domain::retention::Hold::new(r, by, now))
            .transpose()?;
        let s = scope.clone();
        let by = by.to_string();
        self.runtime
            .store()
            .transact(move |tx: &mut Tx| {
                let mut run = tx
                    .get::<Run>(&s, &run_id.to_string())?
                    .ok_or_else(|| DomainError::not_found("run", run_id))?;
                if let Some(event) = run.set_hold(hold, &by, now) {
                    tx.save(&s, &mut run)?;
                    tx.emit(event)?;
                }
                Ok::<_, RuntimeError>(run)
            })
            .await
    }

    /// `DecideApproval`, by approval id or decision id.
    pub async fn decide_approval(
        &self,
        scope: &TenantScope,
        which: ApprovalRef,
        verdict: crate::runtime::ApprovalVerdict,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let (index, what, id) = match which {
            ApprovalRef::Approval(id) => (crate::runtime::index::APPROVAL, "approval", id),
            ApprovalRef::Decision(id) => (crate::runtime::index::DECISION, "decision", id),
        };
        let ids = self
            .runtime
            .store()
            .index_ids(scope, index, &id.to_string())?;
        let Some(key) = ids.first() else {
            return Err(DomainError::not_found(what, id).into());
        };
        let decision: DecisionRequest = self
            .runtime
            .store()
            .get(scope, key)?
            .ok_or_else(|| DomainError::not_found(what, id))?;
        if decision.kind != DecisionKind::Approval {
            return Err(DomainError::from(FieldError::new(
                "decisionId",
                format!(
                    "decision {id} is an {} decision, not an approval: answer it with Runtime/AnswerDecision",
                    decision.kind.as_str()
                ),
            ))
            .into());
        }
        self.runtime
            .decide(scope, decision.attempt_id, decision.decision_id, verdict)
            .await
    }

    /// `SettleCall`: an operator's word on an uncertain call.
    #[allow(clippy::too_many_arguments)]
    pub async fn settle_call(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        call_id: Uuid,
        effect: Effect,
        reason: &str,
        retry: bool,
        by: &str,
    ) -> Result<Run, RuntimeError> {
        FieldError::require("reason", reason, "say what was checked")?;
        FieldError::check_text("reason", reason)?;
        if retry && effect == Effect::Happened {
            return Err(FieldError::new(
                "retry",
                "a new attempt is only allowed when the effect did not happen; it would do it twice",
            )
            .into());
        }
        let now = self.clock.now();
        let (s, reason, by) = (scope.clone(), reason.to_string(), by.to_string());
        let (run, followup) = self
            .runtime
            .store()
            .transact(move |tx: &mut Tx| {
                let attempt: ExecutionAttempt = tx
                    .get(&s, &attempt_id.to_string())?
                    .ok_or_else(|| DomainError::not_found("attempt", attempt_id))?;
                let calls: Vec<CallRecord> = tx.list_under(&s, &format!("{attempt_id}/"))?;
                let Some(mut call) = calls.into_iter().find(|c| c.call_id == call_id) else {
                    return Err(DomainError::not_found("call", call_id).into());
                };
                if call.status != CallStatus::Uncertain {
                    return Err(DomainError::FailedPrecondition(format!(
                        "call {call_id} is {}; only an uncertain call is settled",
                        call.status.as_str()
                    ))
                    .into());
                }
                if let Some(done) = &call.settlement {
                    return Err(DomainError::FailedPrecondition(format!(
                        "call {call_id} was settled already by {} ({}: {})",
                        done.by,
                        done.effect.as_str(),
                        done.reason
                    ))
                    .into());
                }
                call.settlement = Some(Settlement {
                    effect,
                    reason: reason.clone(),
                    by: by.clone(),
                    at: now,
                });
                tx.put(&s, &call)?;
                tx.emit(NewEvent::new(
                    s.tenant(),
                    now,
                    &crate::domain::attempt::CallSettled {
                        attempt_id,
                        run_id: attempt.run_id,
                        tenant_id: s.tenant(),
                        call_id,
                        effect: effect.as_str(),
                        by: &by,
                    },
                ))?;
                let mut run = load_run(tx, &s, attempt.run_id)?;
                let still_open = tx
                    .list_under::<CallRecord>(&s, &format!("{attempt_id}/"))?
                    .iter()
                    .any(|c| c.status == CallStatus::Uncertain && c.settlement.is_none());
                let mut followup = Followup::default();
                if !still_open && attempt.state == AttemptState::Uncertain {
                    let why = format!("{} by {by}: {reason}", effect.as_str());
                    let (next, events) = run.on_settled(retry, &why, now);
                    tx.emit_all(events)?;
                    let mut next_attempt = apply_next(&mut run, next, now);
                    if let Some(a) = &mut next_attempt {
                        tx.save(&s, a)?;
                    }
                    tx.save(&s, &mut run)?;
                    followup = Followup::of(&run, next_attempt.map(|a| a.attempt_id));
                }
                Ok::<_, RuntimeError>((run, followup))
            })
            .await?;
        self.runtime.follow(scope, followup).await;
        Ok(run)
    }
}

/// Run control as the runtime sees it (see [`crate::runtime::port`]):
/// handed to the runtime when it starts.
pub struct Port;

impl RunPort for Port {
    fn record_outcome(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        attempt: &ExecutionAttempt,
        now: DateTime<Utc>,
    ) -> Result<Followup, StoreError> {
        record_outcome(tx, scope, attempt, now)
    }

    fn charge_tokens(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        attempt: &ExecutionAttempt,
        usage: &TokenUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        ledger::charge(
            tx,
            scope,
            &ledger::Charge {
                project_id: &attempt.project_id,
                agent_id: &attempt.agent_id,
                release_id: &attempt.release_id,
                run_id: attempt.run_id,
                ancestors: &attempt.ancestors,
                usage: *usage,
                at: now,
            },
        )
    }

    fn plan_child(&self, plan: ChildPlan<'_>) -> Result<NewRun, DomainError> {
        let supervisor = plan.supervisor;
        let request = RunRequest {
            project_id: supervisor.project_id.clone(),
            release_id: plan.release.release_id.clone(),
            input: plan.input,
            limits: None,
            max_attempts: 0,
            max_corrections: None,
            request_id: None,
            run_key: None,
            labels: Default::default(),
            environment_id: None,
            submitted_by: format!("attempt {}", supervisor.attempt_id),
        };
        let mut child = plan_run(
            &request,
            &supervisor.tenant_id,
            plan.release,
            plan.manifest,
            plan.steps,
            plan.config,
            Some((plan.parent, supervisor.depth + 1)),
            plan.now,
        )?;
        // A child never gets a deeper delegation budget than its
        // supervisor had.
        let depth = &mut child.run.snapshot.limits.max_sub_agent_depth;
        *depth = (*depth).min(supervisor.limits.max_sub_agent_depth);
        Ok(child)
    }

    fn create_child(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        child: NewRun,
        retain_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<ExecutionAttempt, StoreError> {
        create_run(tx, scope, child, retain_until, now).map(|(_, attempt)| attempt)
    }
}
