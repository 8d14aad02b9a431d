//! The attempt's life: claim, start, heartbeat, interrupt, outcome,
//! lease renewal, orphan reconciliation and the capacity lease.

use super::*;

impl Grain {
    pub(super) async fn claim(&mut self, holder: String) -> Result<Option<Ticket>, RuntimeError> {
        if !self.claimable() {
            self.shared.set_claimable(&self.attempt, false);
            return Ok(None);
        }
        let now = self.now();
        let mut a = self.attempt.clone();
        let resumed = a.state != AttemptState::Claimed;
        if resumed && a.adapter == AdapterKind::Builtin {
            // The loop that held it ran in an earlier run of the appliance.
            a.expire_lease(now);
        }
        let new_token = resumed.then_some(a.fencing_token + 1);
        a.claim(&holder, new_token, self.lease_ttl(), now)?;
        let claimed = a.clone();
        self.save(a, Vec::new(), move |tx, s| {
            if resumed {
                // The step's token moves on with the lease, strictly.
                let id = claimed.run_id.to_string();
                let mut run = tx
                    .get::<crate::domain::run::Run>(s, &id)?
                    .ok_or_else(|| DomainError::not_found("run", &id))?;
                run.lease_again(&claimed)?;
                tx.save(s, &mut run)?;
            }
            Ok(())
        })
        .await?;
        self.shared.set_claimable(&self.attempt, false);
        let run: crate::domain::run::Run = self
            .shared
            .store
            .get(&self.scope, &self.attempt.run_id.to_string())?
            .ok_or_else(|| DomainError::not_found("run", self.attempt.run_id))?;
        let step = run.steps.iter().find(|s| s.step_id == self.attempt.step_id);
        let input = match step.and_then(|s| s.input_ref.clone()) {
            Some(r) => self.read(&r)?.unwrap_or_else(|| b"null".to_vec()),
            None => b"null".to_vec(),
        };
        // A re-run's attempt resumes from the source's checkpoint from its
        // first claim on.
        let resumed = resumed || self.attempt.rerun_of.is_some();
        let state = match (&self.attempt.adapter_state_ref, resumed) {
            (Some(r), true) => self.read(r)?,
            _ => None,
        };
        Ok(Some(Ticket {
            attempt: self.attempt.clone(),
            input,
            state,
            checkpoint_sequence: self.attempt.usage.checkpoints,
            resumed,
        }))
    }

    pub(super) async fn start(
        &mut self,
        token: u64,
        adapter_version: String,
        checkpoint_format: u32,
        context_snapshot_ref: Option<String>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        self.fence(token, "StartAttempt").await?;
        self.check_interrupt("StartAttempt").await?;
        let now = self.now();
        if self.attempt.state != AttemptState::Claimed {
            // Resuming: only from a checkpoint this adapter can read.
            if let Some(cp_id) = self.attempt.last_checkpoint_id {
                let checkpoints: Vec<Checkpoint> = self
                    .shared
                    .store
                    .list_under(&self.scope, &format!("{}/", self.attempt.attempt_id))?;
                if let Some(cp) = checkpoints.iter().find(|c| c.checkpoint_id == cp_id)
                    && let Err(why) = cp.compatible_with(&adapter_version, checkpoint_format)
                {
                    let mut a = self.attempt.clone();
                    let events = a.refuse_resume(why.clone(), now)?;
                    self.save(a, events, |_, _| Ok(())).await?;
                    return Err(precondition(format!(
                        "{why}; attempt {} failed (infrastructure) and a new attempt starts from the step input",
                        self.attempt.attempt_id
                    )));
                }
            }
            let a = self.attempt.clone();
            self.save(a, Vec::new(), |_, _| Ok(())).await?;
            return Ok(self.attempt.clone());
        }
        if adapter_version != self.attempt.adapter_version
            || checkpoint_format != self.attempt.checkpoint_format
        {
            return Err(precondition(format!(
                "adapter {adapter_version} reading checkpoint format {checkpoint_format} cannot run attempt {}: the release needs {} with format {}",
                self.attempt.attempt_id,
                self.attempt.adapter_version,
                self.attempt.checkpoint_format
            )));
        }
        let mut a = self.attempt.clone();
        let mut events = a.start(context_snapshot_ref, now)?;
        // Its first resumable point: no state yet, or the state a re-run
        // starts from.
        let inherited = a.rerun_of.as_ref().map(|o| o.adapter_state_ref.clone());
        let state_ref = inherited
            .clone()
            .unwrap_or_else(|| json_hash(&serde_json::Value::Null));
        let cp_id = new_id();
        let (cp, more) = a.checkpoint(cp_id, CheckpointReason::Started, state_ref, None, now)?;
        events.extend(more);
        let retain = self.retain();
        self.save(a, events, move |tx, s| {
            if inherited.is_none() {
                tx.put_artifact(s, b"null", "application/json", Some(retain), now)?;
            }
            tx.put(s, &cp)?;
            Ok(())
        })
        .await?;
        self.checkpoint_metric();
        Ok(self.attempt.clone())
    }

    pub(super) async fn heartbeat(&mut self, token: u64) -> Result<ExecutionAttempt, RuntimeError> {
        self.fence(token, "Heartbeat").await?;
        if self.attempt.interrupt.is_some() && self.attempt.state == AttemptState::Running {
            self.observe().await?;
            return Ok(self.attempt.clone());
        }
        let a = self.attempt.clone();
        self.save(a, Vec::new(), |_, _| Ok(())).await?;
        Ok(self.attempt.clone())
    }

    pub(super) async fn interrupt(
        &mut self,
        request: InterruptRequest,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let events = a.request_interrupt(request, now);
        if !events.is_empty() {
            self.save(a, events, |_, _| Ok(())).await?;
            self.shared.set_claimable(&self.attempt, false);
        }
        if self.observable_now() {
            self.observe().await?;
        }
        Ok(self.attempt.clone())
    }

    pub(super) async fn report(
        &mut self,
        token: u64,
        report: Report,
    ) -> Result<Reported, RuntimeError> {
        self.fence(token, "ReportOutcome").await?;
        self.check_interrupt("ReportOutcome").await?;
        let now = self.now();
        let hash = report_hash_of(&self.attempt, &report);
        let mut a = self.attempt.clone();
        if report.succeeded {
            let info = self.info()?;
            let output = report.output.clone().ok_or_else(|| {
                crate::domain::FieldError::new("outputJson", "is required when succeeded is true")
            })?;
            let bytes = canonical_json(&output);
            let output_ref = json_hash(&output);
            let problems = info.check_output(&output);
            let feedback = (!problems.is_empty()).then(|| {
                serde_json::to_vec(&serde_json::json!({
                    "schema": "validator-feedback-v1",
                    "outputRef": output_ref,
                    "violations": problems,
                }))
                .expect("json")
            });
            let feedback_ref = feedback
                .as_deref()
                .map(crate::domain::content::content_hash);
            let (verdict, events) =
                a.report_success(output_ref, &problems, feedback_ref, hash, now)?;
            let retain = self.retain();
            self.save(a, events, move |tx, s| {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
                if let Some(f) = &feedback {
                    tx.put_artifact(s, f, "application/json", Some(retain), now)?;
                }
                Ok(())
            })
            .await?;
            let outcome = match verdict {
                Verdict::Verified => crate::runtime::Outcome::Verified,
                Verdict::Correct { feedback, left } => {
                    metrics::counter!(names::CORRECTIONS, "tenant" => self.attempt.tenant_id.to_string(), "agent" => self.attempt.agent_id.clone())
                        .increment(1);
                    crate::runtime::Outcome::Correct { feedback, left }
                }
                Verdict::Exhausted { feedback } => crate::runtime::Outcome::Exhausted { feedback },
            };
            return Ok(Reported {
                verdict: outcome,
                state: self.attempt.state,
                outcome_hash: self.attempt.outcome_hash.clone(),
                acknowledged: false,
            });
        }
        let class = report.failure_class.ok_or_else(|| {
            crate::domain::FieldError::new("failureClass", "is required when succeeded is false")
        })?;
        let reason = report
            .reason
            .clone()
            .filter(|r| !r.trim().is_empty())
            .ok_or_else(|| {
                crate::domain::FieldError::new("reason", "is required when succeeded is false")
            })?;
        let detail = report
            .error
            .as_ref()
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::to_vec(e).expect("json"));
        let detail_ref = detail.as_deref().map(crate::domain::content::content_hash);
        let events = a.fail(
            AttemptFailure {
                class,
                reason,
                feedback_ref: None,
                detail_ref,
            },
            Some(hash),
            now,
        )?;
        let retain = self.retain();
        self.save(a, events, move |tx, s| {
            if let Some(d) = &detail {
                tx.put_artifact(s, d, "application/json", Some(retain), now)?;
            }
            Ok(())
        })
        .await?;
        Ok(Reported {
            verdict: crate::runtime::Outcome::Failed,
            state: self.attempt.state,
            outcome_hash: self.attempt.outcome_hash.clone(),
            acknowledged: false,
        })
    }

    /// LeaseHeartbeat: renews the capacity lease; a failure pauses the
    /// attempt at its next checkpoint, a renewal after one resumes it. A
    /// paused attempt that gave its lease back asks for a new one here.
    pub(super) async fn renew(&mut self) -> Result<bool, RuntimeError> {
        let a = &self.attempt;
        let gave_back = !a.capacity_granted
            && a.state == AttemptState::Paused
            && a.quota_paused_until.is_none()
            && a.model_server_wait.is_none()
            && a.capacity_gaps
                .last()
                .is_some_and(|g| g.granted_at.is_none());
        let renewed = if gave_back {
            Some(
                self.acquire_now("it gave its lease back while paused")
                    .await,
            )
        } else {
            let Some(lease_id) = a.capacity_lease_id.filter(|_| a.capacity_granted) else {
                return Ok(false);
            };
            match self.shared.capacity.renew(&self.scope, lease_id).await {
                Ok(_) => None,
                Err(CapacityError::Domain(DomainError::FailedPrecondition(why))) => {
                    // The lease ended: ask for capacity again, without waiting.
                    Some(
                        self.acquire_now(&format!("capacity lease {lease_id} ended ({why})"))
                            .await,
                    )
                }
                Err(e) => Some(Err(format!(
                    "capacity lease {lease_id} could not be renewed: {e}"
                ))),
            }
        };
        let now = self.now();
        let mut a = self.attempt.clone();
        let events = match renewed {
            None | Some(Ok(_)) => {
                if let Some(Ok(new_lease)) = renewed {
                    a.capacity_granted(new_lease, now);
                }
                // Nothing to record: no failure to clear, and no pause a
                // renewal ends (a `tokensPerDay` pause waits for its quota).
                if a.renewal_failure.is_none()
                    && (a.state != AttemptState::Paused
                        || a.quota_paused_until.is_some()
                        || a.model_server_wait.is_some())
                    && renewed.is_none()
                {
                    return Ok(true);
                }
                a.renewed(now)?
            }
            Some(Err(why)) => {
                tracing::warn!(attempt = %a.attempt_id, reason = %why, "lease renewal failed; the attempt pauses at its next checkpoint");
                a.renewal_failed(why);
                Vec::new()
            }
        };
        let ok = a.renewal_failure.is_none();
        self.save(a, events, |_, _| Ok(())).await?;
        Ok(ok)
    }

    /// Asks for a capacity lease without queueing: the new lease, or why
    /// there is none (`why` says why it asks).
    async fn acquire_now(&self, why: &str) -> Result<Uuid, String> {
        let acquire = AcquireRequest {
            request: self.lease_request(),
            pool_id: None,
            wait: false,
            wait_for: StdDuration::ZERO,
        };
        match self.shared.capacity.acquire(acquire).await {
            Ok(view) if view.lease.state.holds_capacity() => Ok(view.lease.lease_id),
            Ok(view) => Err(format!(
                "{why} and a new capacity lease waits: {}",
                view.limit.map(|l| l.to_string()).unwrap_or_default()
            )),
            Err(e) => Err(format!("{why} and a new capacity lease was refused: {e}")),
        }
    }

    /// OrphanedAttemptReconciler: a lapsed adapter lease settles the
    /// attempt.
    pub(super) async fn reconcile(&mut self) -> Result<Option<AttemptState>, RuntimeError> {
        let now = self.now();
        // An attempt waiting for a human or for a child run waits for
        // nobody's adapter: its lease restarts when the answer arrives.
        if self.attempt.adapter != AdapterKind::External
            || !self.attempt.lease_lapsed(now)
            || self.attempt.state == AttemptState::WaitingForDecision
            || self
                .attempt
                .open_call
                .as_ref()
                .is_some_and(|c| c.kind == CallKind::SubAgent)
        {
            return Ok(None);
        }
        let holder = self.attempt.lease.holder.clone().unwrap_or_default();
        let since = self
            .attempt
            .lease
            .expires_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default();
        let request = InterruptRequest {
            requested_at: now,
            by: "OrphanedAttemptReconciler".into(),
            reason: format!("the lease of adapter session {holder} lapsed at {since}"),
            source: InterruptSource::LeaseLost,
        };
        let mut a = self.attempt.clone();
        if a.interrupt.is_none() {
            let events = a.request_interrupt(request, now);
            self.save(a, events, |_, _| Ok(())).await?;
        }
        self.observe().await?;
        Ok(Some(self.attempt.state))
    }

    /// When a waiting attempt gives its capacity lease back: the grace
    /// after it began to wait for a human or paused.
    pub(super) fn capacity_return_due(&self) -> Option<DateTime<Utc>> {
        let a = &self.attempt;
        if !a.capacity_granted || a.capacity_lease_id.is_none() {
            return None;
        }
        let grace = self.shared.config.get().return_capacity_after_seconds;
        a.idle_since()
            .map(|since| since + Duration::seconds(grace as i64))
    }

    /// Gives the capacity lease back while the attempt waits (see
    /// `runtime.return_capacity_after_seconds`). The lease is released
    /// first: a crash before the attempt is written leaves it naming an
    /// ended lease, which its next renewal replaces.
    pub(super) async fn return_capacity(&mut self) -> Result<(), RuntimeError> {
        let now = self.now();
        let waited = self
            .attempt
            .idle_since()
            .map(|since| (now - since).num_seconds())
            .unwrap_or_default();
        let what = match (&self.pending, self.attempt.state) {
            (Some(d), AttemptState::WaitingForDecision) => {
                format!("for human {} decision {}", d.kind.as_str(), d.decision_id)
            }
            (_, AttemptState::WaitingForTool) => format!(
                "for delegated child run(s) of sub-agent call {}",
                self.attempt
                    .open_call
                    .as_ref()
                    .map(|c| c.call_id.to_string())
                    .unwrap_or_default()
            ),
            _ => "paused".to_string(),
        };
        let mut a = self.attempt.clone();
        let reason = format!(
            "waited {waited} s {what} (runtime.return_capacity_after_seconds = {})",
            self.shared.config.get().return_capacity_after_seconds
        );
        let Some(lease_id) = a.return_capacity(reason, now) else {
            return Ok(());
        };
        if let Err(e) = self.shared.capacity.release(&self.scope, lease_id).await {
            tracing::warn!(attempt = %a.attempt_id, lease = %lease_id, error = %e, "giving a waiting attempt's capacity lease back");
        }
        tracing::info!(attempt = %a.attempt_id, lease = %lease_id, "a waiting attempt gave its capacity lease back");
        self.save(a, Vec::new(), |_, _| Ok(())).await
    }

    pub(super) async fn on_capacity(
        &mut self,
        result: Result<LeaseView, CapacityError>,
    ) -> Result<(), RuntimeError> {
        let now = self.now();
        let settled = match &result {
            Ok(view) => view.lease.state.holds_capacity() || view.lease.state.is_terminal(),
            Err(CapacityError::Denied { .. }) => true,
            Err(_) => false,
        };
        if settled {
            // The request's task has ended: a later gap asks anew.
            self.capacity_task = false;
        }
        match result {
            Ok(view) if !self.attempt.needs_capacity() => {
                // Granted to an attempt that no longer waits for it (it was
                // interrupted, or ended): it goes back now.
                if view.lease.state.holds_capacity()
                    && self.attempt.capacity_lease_id != Some(view.lease.lease_id)
                {
                    release_lease(&self.shared.capacity, &self.scope, view.lease.lease_id);
                }
                Ok(())
            }
            Ok(view) if view.lease.state.holds_capacity() => {
                self.queue_position = None;
                self.limiting_quota = None;
                self.capacity_reason = None;
                let mut a = self.attempt.clone();
                let events = a.capacity_granted(view.lease.lease_id, now);
                self.save(a, events, |_, _| Ok(())).await?;
                if self.claimable() {
                    self.shared.set_claimable(&self.attempt, true);
                }
                Ok(())
            }
            Ok(view) if view.lease.state.is_terminal() => {
                let failure = AttemptFailure {
                    class: FailureClass::Budget,
                    reason: format!(
                        "capacity lease {} ended {}: {}",
                        view.lease.lease_id,
                        format!("{:?}", view.lease.state).to_lowercase(),
                        view.lease.reason.clone().unwrap_or_default()
                    ),
                    feedback_ref: None,
                    detail_ref: None,
                };
                let mut a = self.attempt.clone();
                let events = a.fail(failure, None, now)?;
                self.save(a, events, |_, _| Ok(())).await
            }
            Ok(view) => {
                self.queue_position = view.queue_position;
                self.limiting_quota = view
                    .limit
                    .as_ref()
                    .and_then(|l| l.quota_field())
                    .map(str::to_string)
                    .or_else(|| view.lease.limiting_quota.clone());
                self.capacity_reason = view
                    .limit
                    .as_ref()
                    .map(|l| l.to_string())
                    .or_else(|| view.lease.reason.clone());
                let mut a = self.attempt.clone();
                if a.use_capacity_lease(view.lease.lease_id) {
                    self.save(a, Vec::new(), |_, _| Ok(())).await?;
                }
                Ok(())
            }
            Err(CapacityError::Denied { limit, .. }) => {
                if !self.attempt.needs_capacity() {
                    return Ok(());
                }
                let failure = AttemptFailure {
                    class: FailureClass::Budget,
                    reason: format!("capacity denied: {limit}"),
                    feedback_ref: None,
                    detail_ref: None,
                };
                let mut a = self.attempt.clone();
                let events = a.fail(failure, None, now)?;
                self.save(a, events, |_, _| Ok(())).await
            }
            Err(e) => {
                self.capacity_reason = Some(e.to_string());
                Ok(())
            }
        }
    }
}

/// Releases a capacity lease in the background, logging a failure.
pub(super) fn release_lease(
    capacity: &std::sync::Arc<crate::capacity::Capacity>,
    scope: &crate::domain::access::TenantScope,
    lease_id: uuid::Uuid,
) {
    let (capacity, scope) = (capacity.clone(), scope.clone());
    tokio::spawn(async move {
        if let Err(e) = capacity.release(&scope, lease_id).await {
            tracing::warn!(lease = %lease_id, error = %e, "releasing an ended attempt's capacity lease");
        }
    });
}
