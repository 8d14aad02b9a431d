//! Re-runs: a new run that starts from a checkpoint of a finished attempt,
//! with the same release or a newer verified release of the same agent.
//!
//! The new run records where it came from ([`RerunOrigin`]); the source
//! run is never changed. Its first attempt (and every retry of that step)
//! gets a new fencing token and holds the checkpoint's adapter state from
//! the start: the builtin loop resumes from it, an external adapter is
//! handed it with its ticket. Steps before the checkpoint's keep the
//! outputs the source run verified.
//!
//! Effects are never made twice by accident. A call of the source attempt
//! after the checkpoint whose effect was confirmed (see
//! [`CallRecord::confirmed_effect`]) is not issued again when the re-run
//! makes the identical call (same target, same request): the runtime
//! records it as answered from the source's record and hands the adapter
//! that result. The operator may name such calls to be issued again, one
//! by one. A source attempt with an unsettled uncertain call cannot be
//! re-run until an operator says whether its effect happened.

use serde_json::Value;
use uuid::Uuid;

use super::{RunControl, RunRequest, plan_run};
use crate::domain::access::TenantScope;
use crate::domain::attempt::{CallRecord, Checkpoint, ExecutionAttempt};
use crate::domain::release::workflow_steps;
use crate::domain::release::{LoadedRelease, Manifest, version_order};
use crate::domain::rerun::{attempt_blocker, calls_before, checkpoint_blocker, effects_after};
use crate::domain::run::{RerunOrigin, Run};
use crate::domain::{DomainError, FieldError};
use crate::runtime::RuntimeError;

/// What an operator asks a re-run for.
#[derive(Clone, Debug)]
pub struct RerunRequest {
    /// The finished attempt.
    pub attempt_id: Uuid,
    /// Its checkpoint to start from; `None`: the last one.
    pub checkpoint_sequence: Option<u32>,
    /// The release to run; `None`: the source run's.
    pub release_id: Option<String>,
    /// Confirmed calls after the checkpoint to issue again.
    pub reissue: Vec<Uuid>,
    /// Idempotency key.
    pub request_id: Option<String>,
    /// Who.
    pub by: String,
}

/// A re-run as it would be made, checked.
#[derive(Clone, Debug)]
pub struct RerunPlan {
    /// The source run.
    pub source: Run,
    /// Its attempt.
    pub attempt: ExecutionAttempt,
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// The release the re-run runs.
    pub release: LoadedRelease,
    /// Its manifest.
    pub manifest: Manifest,
    /// Call records of the source attempt written before the checkpoint.
    pub calls_before: u32,
    /// Calls of the source attempt after the checkpoint whose effect was
    /// confirmed: answered from their records unless named for re-issue.
    pub effects_after: Vec<CallRecord>,
}

impl RunControl {
    /// The re-runs made from checkpoints of `run_id`'s attempts, oldest
    /// first.
    pub fn reruns(&self, scope: &TenantScope, run_id: Uuid) -> Result<Vec<Run>, RuntimeError> {
        let store = self.runtime.store();
        let mut runs = Vec::new();
        for id in store.index_ids(scope, super::index::RERUN_OF, &run_id.to_string())? {
            if let Some(run) = store.get::<Run>(scope, &id)? {
                runs.push(run);
            }
        }
        runs.sort_by_key(|r| r.created_at);
        Ok(runs)
    }

    /// Checks a re-run from checkpoint `sequence` (the last when `None`)
    /// of `attempt_id` with `release_id` (the source run's when `None`);
    /// a refusal names what stands in the way.
    pub async fn plan_rerun(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        sequence: Option<u32>,
        release_id: Option<&str>,
    ) -> Result<RerunPlan, RuntimeError> {
        let store = self.runtime.store();
        let attempt: ExecutionAttempt = store
            .get(scope, &attempt_id.to_string())?
            .ok_or_else(|| DomainError::not_found("attempt", attempt_id))?;
        let calls = self.runtime.calls(scope, attempt_id)?;
        if let Some(why) = attempt_blocker(&attempt, &calls) {
            return Err(DomainError::FailedPrecondition(why).into());
        }
        let source = self.get(scope, attempt.run_id)?;
        if let Some(t) = &source.purged {
            return Err(DomainError::FailedPrecondition(format!(
                "the payloads of run {} were {}: its input and checkpoints can no longer start a re-run",
                source.run_id,
                t.describe()
            ))
            .into());
        }
        let checkpoints = self.runtime.checkpoints(scope, attempt_id)?;
        let checkpoint = match sequence {
            None => checkpoints.last(),
            Some(n) => checkpoints.iter().find(|c| c.sequence == n),
        }
        .cloned()
        .ok_or_else(|| {
            let kept: Vec<String> = checkpoints.iter().map(|c| c.sequence.to_string()).collect();
            FieldError::new(
                "checkpointSequence",
                match (sequence, kept.is_empty()) {
                    (_, true) => format!("attempt {attempt_id} has no checkpoint"),
                    (Some(n), false) => format!(
                        "attempt {attempt_id} has no checkpoint {n}; it has {}",
                        kept.join(", ")
                    ),
                    (None, false) => unreachable!("the last of a non-empty list"),
                },
            )
        })?;
        let release_id = release_id.unwrap_or(&source.snapshot.release_id);
        let release = self.releases.dispatchable(scope, release_id).await?;
        if release.agent_id != source.agent_id {
            return Err(FieldError::new(
                "releaseId",
                format!(
                    "release {} is of agent {}; run {} is of agent {}",
                    release.release_id, release.agent_id, source.run_id, source.agent_id
                ),
            )
            .into());
        }
        if release.release_id != source.snapshot.release_id
            && let Some(old) = self.releases.get(scope, &source.snapshot.release_id)?
            && version_order(&release.version, &old.version) == std::cmp::Ordering::Less
        {
            return Err(FieldError::new(
                "releaseId",
                format!(
                    "release {} (version {}) is older than the run's release {} (version {}); a re-run takes the same release or a newer one",
                    release.release_id, release.version, old.release_id, old.version
                ),
            )
            .into());
        }
        let manifest = self.releases.manifest(scope, &release)?;
        if let Some(why) = checkpoint_blocker(
            &checkpoint,
            &super::adapter_version(&manifest),
            manifest.checkpoint_format,
        ) {
            return Err(DomainError::FailedPrecondition(format!(
                "{why}; release {} cannot start from it",
                release.release_id
            ))
            .into());
        }
        if store
            .read_artifact(scope, &checkpoint.adapter_state_ref)?
            .is_none()
        {
            return Err(DomainError::FailedPrecondition(format!(
                "the adapter state of checkpoint {} ({}) is no longer stored",
                checkpoint.sequence, checkpoint.adapter_state_ref
            ))
            .into());
        }
        Ok(RerunPlan {
            calls_before: calls_before(&checkpoint, &calls),
            effects_after: effects_after(&checkpoint, &calls),
            source,
            attempt,
            checkpoint,
            release,
            manifest,
        })
    }

    /// `RerunFromCheckpoint`: a new run from a checkpoint of a finished
    /// attempt. The same `request_id` again returns the run it made.
    pub async fn rerun(
        &self,
        scope: &TenantScope,
        request: RerunRequest,
    ) -> Result<Run, RuntimeError> {
        if let Some(key) = &request.request_id {
            FieldError::check_key("requestId", key)?;
            if let Some(run) = self.by_request(scope, key)? {
                return Ok(run);
            }
        }
        let plan = self
            .plan_rerun(
                scope,
                request.attempt_id,
                request.checkpoint_sequence,
                request.release_id.as_deref(),
            )
            .await?;
        for id in &request.reissue {
            if !plan.effects_after.iter().any(|c| c.call_id == *id) {
                let named: Vec<String> = plan
                    .effects_after
                    .iter()
                    .map(|c| format!("{} ({} {})", c.call_id, c.sequence, c.target))
                    .collect();
                return Err(FieldError::new(
                    "reissueCallIds",
                    format!(
                        "call {id} is not a call of attempt {} after checkpoint {} whose effect was confirmed; {}",
                        plan.attempt.attempt_id,
                        plan.checkpoint.sequence,
                        if named.is_empty() {
                            "there is none".to_string()
                        } else {
                            format!("those are: {}", named.join(", "))
                        }
                    ),
                )
                .into());
            }
        }
        let RerunPlan {
            source,
            attempt,
            checkpoint,
            release,
            manifest,
            calls_before,
            ..
        } = plan;
        let step_index = source
            .steps
            .iter()
            .position(|s| s.attempts.contains(&attempt.attempt_id))
            .ok_or_else(|| {
                DomainError::FailedPrecondition(format!(
                    "attempt {} belongs to no step of run {}",
                    attempt.attempt_id, source.run_id
                ))
            })?;
        let workflow = self.releases.artifact(scope, &release, "workflow")?;
        let steps = workflow_steps(&workflow, &release.agent_id);
        let source_steps: Vec<&str> = source.steps.iter().map(|s| s.name.as_str()).collect();
        if steps
            .iter()
            .map(String::as_str)
            .ne(source_steps.iter().copied())
        {
            return Err(FieldError::new(
                "releaseId",
                format!(
                    "release {}'s workflow has the steps {}; run {} had {}: a re-run keeps the steps",
                    release.release_id,
                    steps.join(", "),
                    source.run_id,
                    source_steps.join(", ")
                ),
            )
            .into());
        }
        let input = self
            .runtime
            .store()
            .read_artifact(scope, &source.input_ref)?
            .ok_or_else(|| {
                DomainError::FailedPrecondition(format!(
                    "the input of run {} ({}) is no longer stored",
                    source.run_id, source.input_ref
                ))
            })?;
        let input: Value = serde_json::from_slice(&input).unwrap_or(Value::Null);
        let now = self.clock.now();
        let mut new = plan_run(
            &RunRequest {
                project_id: source.project_id.clone(),
                release_id: release.release_id.clone(),
                input,
                limits: None,
                max_attempts: 0,
                max_corrections: None,
                request_id: request.request_id.clone(),
                run_key: None,
                labels: source.labels.clone(),
                environment_id: source.environment_id.clone(),
                submitted_by: request.by.clone(),
            },
            scope.tenant(),
            &release,
            &manifest,
            steps,
            &self.config.get(),
            None,
            now,
        )?;
        new.run.continue_from(
            &source,
            RerunOrigin {
                run_id: source.run_id,
                attempt_id: attempt.attempt_id,
                checkpoint_id: checkpoint.checkpoint_id,
                checkpoint_sequence: checkpoint.sequence,
                step_index: step_index as u32,
                release_id: source.snapshot.release_id.clone(),
                adapter_state_ref: checkpoint.adapter_state_ref.clone(),
                calls_before,
                reissue: request.reissue.clone(),
                by: request.by.clone(),
                at: now,
            },
        );
        self.create(scope, new, now).await
    }
}
