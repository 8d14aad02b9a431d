//! The AttemptGrain: one task owns one live attempt.
//!
//! Every command on the attempt (from its adapter, an operator, run
//! control, the capacity module or a timer) is a message to the grain,
//! handled one at a time. A handler applies the command to a copy of the
//! aggregate, writes the copy with the records and events the transition
//! produced in one store transaction, and only once that is durable makes
//! the copy current and answers. So the fencing token, the limits and the
//! single outcome are enforced in one place, whatever runs the loop, and a
//! crash at any moment leaves the last acknowledged state on disk.
//!
//! Reminders (the attempt budget, decision expiry, the interrupt grace
//! period, a lapsed adapter lease) run on the appliance clock, so tests
//! move time instead of sleeping.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use super::release::ReleaseInfo;
use super::{
    BeginCall, BeginOutcome, Begun, Completed, Completion, DecisionAsk, GrainHandle, Report,
    Reported, RuntimeError, Shared, Ticket, decision_key,
};
use crate::capacity::{AcquireRequest, CapacityError, LeaseView};
use crate::domain::DomainError;
use crate::domain::amount::Amount;
use crate::domain::attempt::{
    AttemptFailure, AttemptPhase, AttemptState, CallError, CallKind, CallRecord, CallResult,
    CallStart, CallStatus, Checkpoint, CheckpointReason, DecisionKind, DecisionRequest,
    DecisionStatus, ExecutionAttempt, FailureClass, Gate, InterruptRequest, InterruptSource,
    ProposedCall, Resolution, SubAgentDelegated, SubAgentDelegation, Verdict, json_hash,
    report_hash,
};
use crate::domain::capacity::{HolderKind, LeaseRequest};
use crate::domain::events::NewEvent;
use crate::domain::ids::new_id;
use crate::domain::release::{AdapterKind, PolicyRule, canonical_json};
use crate::domain::run::{ApprovalDecided, ParentLink, RunState};
use crate::runs::{ChildEnded, Followup};
use crate::store::{TenantScope, Tx};
use crate::telemetry::names;

type Reply<T> = oneshot::Sender<Result<T, RuntimeError>>;

/// A message to a grain. Messages are few and short-lived; their size
/// does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Msg {
    /// An adapter session claims the attempt.
    Claim {
        /// The session.
        holder: String,
        /// The ticket, or none when it is not claimable (any more).
        reply: Reply<Option<Ticket>>,
    },
    /// StartAttempt.
    Start {
        /// Token.
        token: u64,
        /// The adapter's version.
        adapter_version: String,
        /// The checkpoint format it reads.
        checkpoint_format: u32,
        /// Context snapshot.
        context_snapshot_ref: Option<String>,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// Heartbeat.
    Heartbeat {
        /// Token.
        token: u64,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// BeginCall.
    BeginCall {
        /// Token.
        token: u64,
        /// The call.
        call: BeginCall,
        /// Answer.
        reply: Reply<Begun>,
    },
    /// CompleteCall.
    CompleteCall {
        /// Token.
        token: u64,
        /// The result.
        completion: Completion,
        /// Answer.
        reply: Reply<Completed>,
    },
    /// Checkpoint.
    Checkpoint {
        /// Token.
        token: u64,
        /// Adapter state.
        state: Vec<u8>,
        /// Phase.
        phase: Option<AttemptPhase>,
        /// Answer.
        reply: Reply<(Checkpoint, AttemptState)>,
    },
    /// RequestDecision.
    RequestDecision {
        /// Token.
        token: u64,
        /// The question.
        ask: DecisionAsk,
        /// Answer.
        reply: Reply<DecisionRequest>,
    },
    /// AnswerDecision.
    Answer {
        /// Decision.
        decision_id: Uuid,
        /// Who.
        by: String,
        /// Choice.
        choice: Option<String>,
        /// Answer document.
        answer: Option<Vec<u8>>,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// ApprovalDecided.
    Decide {
        /// Decision.
        decision_id: Uuid,
        /// Approved?
        approve: bool,
        /// Who.
        by: String,
        /// Why.
        reason: Option<String>,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// Interrupt.
    Interrupt {
        /// The request.
        request: InterruptRequest,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// ReportOutcome.
    Report {
        /// Token.
        token: u64,
        /// The report.
        report: Report,
        /// Answer.
        reply: Reply<Reported>,
    },
    /// A child run ended.
    ChildEnded {
        /// The child.
        child: Box<ChildEnded>,
        /// Answer.
        reply: Reply<()>,
    },
    /// LeaseHeartbeat: renew the capacity lease.
    Renew {
        /// Whether something was renewed.
        reply: Reply<bool>,
    },
    /// OrphanedAttemptReconciler.
    Reconcile {
        /// The state it settled in, if it did.
        reply: Reply<Option<AttemptState>>,
    },
    /// The appliance fails the attempt.
    Fail {
        /// Why.
        failure: AttemptFailure,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
    },
    /// News from the capacity request.
    Capacity(Result<LeaseView, CapacityError>),
}

/// An attempt as watchers see it.
#[derive(Clone, Debug)]
pub struct AttemptView {
    /// The attempt.
    pub attempt: ExecutionAttempt,
    /// Place in the pool's queue while it waits for capacity.
    pub queue_position: Option<usize>,
    /// The quota that holds it.
    pub limiting_quota: Option<String>,
    /// Why capacity is not granted yet, in words.
    pub capacity_reason: Option<String>,
    /// The pending decision, in words.
    pub decision: Option<String>,
}

impl AttemptView {
    /// An ended attempt.
    pub fn ended(attempt: ExecutionAttempt) -> AttemptView {
        AttemptView {
            attempt,
            queue_position: None,
            limiting_quota: None,
            capacity_reason: None,
            decision: None,
        }
    }

    /// Why it waits now.
    pub fn waiting_reason(&self) -> Option<String> {
        let a = &self.attempt;
        if a.state == AttemptState::Claimed && !a.capacity_granted {
            let mut why = String::from("waiting for capacity (agent-runtime lease)");
            if let Some(reason) = &self.capacity_reason {
                why.push_str(": ");
                why.push_str(reason);
            }
            if let Some(p) = self.queue_position {
                why.push_str(&format!("; queue position {p}"));
            }
            return Some(why);
        }
        if a.state == AttemptState::WaitingForDecision
            && let Some(d) = &self.decision
        {
            return Some(d.clone());
        }
        if let Some(i) = a.interrupt.as_ref().filter(|_| !a.state.is_terminal()) {
            return Some(format!(
                "interrupt requested by {} ({}); stopping at the next safe point",
                i.by, i.reason
            ));
        }
        a.waiting_reason()
    }
}

/// Starts a grain for a live attempt.
pub(super) fn spawn(shared: Arc<Shared>, attempt: ExecutionAttempt) -> GrainHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let (view_tx, view) = watch::channel(Arc::new(AttemptView::ended(attempt.clone())));
    let grain = Grain {
        scope: TenantScope::new(attempt.tenant_id.clone()),
        shared,
        attempt,
        open: None,
        pending: None,
        info: None,
        view_tx,
        me: tx.clone(),
        queue_position: None,
        limiting_quota: None,
        capacity_reason: None,
        capacity_task: false,
    };
    tokio::spawn(grain.run(rx));
    GrainHandle { tx, view }
}

struct Grain {
    shared: Arc<Shared>,
    scope: TenantScope,
    attempt: ExecutionAttempt,
    /// The open call's record (or the uncertain one of an ended attempt).
    open: Option<CallRecord>,
    /// The pending decision.
    pending: Option<DecisionRequest>,
    info: Option<Arc<ReleaseInfo>>,
    view_tx: watch::Sender<Arc<AttemptView>>,
    me: mpsc::UnboundedSender<Msg>,
    queue_position: Option<usize>,
    limiting_quota: Option<String>,
    capacity_reason: Option<String>,
    capacity_task: bool,
}

fn amount(value: f64) -> Amount {
    Amount::parse("contract", value).unwrap_or(Amount::from_thousandths(500))
}

fn aborted(text: String) -> RuntimeError {
    DomainError::Aborted(text).into()
}

fn precondition(text: String) -> RuntimeError {
    DomainError::FailedPrecondition(text).into()
}

/// The hash of a report, as [`ExecutionAttempt::check_repeat_report`] sees it.
pub fn report_hash_of(attempt: &ExecutionAttempt, report: &Report) -> String {
    let output_ref = report
        .output
        .as_ref()
        .filter(|_| report.succeeded)
        .map(json_hash);
    report_hash(
        attempt.attempt_id,
        report.succeeded,
        output_ref.as_deref(),
        report.failure_class.filter(|_| !report.succeeded),
        report.reason.as_deref().filter(|_| !report.succeeded),
    )
}

/// The verdict an ended attempt stands by.
pub fn verdict_of(attempt: &ExecutionAttempt) -> super::Outcome {
    match (&attempt.state, &attempt.failure) {
        (AttemptState::Succeeded, _) => super::Outcome::Verified,
        (AttemptState::Failed, Some(f))
            if f.class == FailureClass::Validation && f.feedback_ref.is_some() =>
        {
            super::Outcome::Exhausted {
                feedback: f.reason.clone(),
            }
        }
        _ => super::Outcome::Failed,
    }
}

impl Grain {
    fn now(&self) -> DateTime<Utc> {
        self.shared.clock.now()
    }

    fn retain(&self) -> DateTime<Utc> {
        self.now() + Duration::days(self.shared.config.payload_retention_days.into())
    }

    fn lease_ttl(&self) -> Duration {
        Duration::seconds(self.shared.config.attempt_lease_seconds as i64)
    }

    fn publish(&self) {
        self.view_tx.send_replace(Arc::new(AttemptView {
            attempt: self.attempt.clone(),
            queue_position: self.queue_position,
            limiting_quota: self.limiting_quota.clone(),
            capacity_reason: self.capacity_reason.clone(),
            decision: self.pending.as_ref().map(|d| {
                let mut why = format!(
                    "waiting for a human {} decision {}: {}",
                    d.kind.as_str(),
                    d.decision_id,
                    d.summary
                );
                if let Some(approval) = d.approval_id {
                    why.push_str(&format!(" (approval {approval}, Runs/DecideApproval)"));
                }
                why.push_str(&format!("; expires {}", d.expires_at.to_rfc3339()));
                why
            }),
        }));
    }

    fn gauge(&self, state: AttemptState, delta: f64) {
        if !state.is_terminal() {
            metrics::gauge!(names::ATTEMPTS_ACTIVE, "tenant" => self.attempt.tenant_id.to_string(), "state" => state.as_str())
                .increment(delta);
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        self.gauge(self.attempt.state, 1.0);
        if let Err(e) = self.init().await {
            tracing::warn!(attempt = %self.attempt.attempt_id, error = %e, "starting the attempt's grain");
        }
        self.publish();
        let mut ticks = self.shared.clock.ticks();
        let mut shutdown = self.shared.shutdown.clone();
        while !self.attempt.state.is_terminal() {
            let sleep = self
                .next_reminder()
                .map(|at| (at - self.now()).to_std().unwrap_or(StdDuration::ZERO))
                .unwrap_or(StdDuration::from_secs(3600))
                .min(StdDuration::from_secs(3600));
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => {
                        self.handle(msg).await;
                        if self.claimable() {
                            self.shared.set_claimable(&self.attempt, true);
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep(sleep) => self.on_timer().await,
                _ = ticks.changed() => self.on_timer().await,
                _ = shutdown.changed() => if *shutdown.borrow() { break },
            }
            self.publish();
        }
        self.publish();
        if let Some(runtime) = self.shared.runtime() {
            runtime.forget(self.attempt.attempt_id);
        }
        // Messages that raced with the end are answered from the store by
        // their senders (their reply channels close here).
    }

    async fn init(&mut self) -> Result<(), RuntimeError> {
        let id = self.attempt.attempt_id;
        if let Some(open) = &self.attempt.open_call {
            let calls: Vec<CallRecord> = self
                .shared
                .store
                .list_under(&self.scope, &format!("{id}/"))?;
            self.open = calls.into_iter().find(|c| c.call_id == open.call_id);
        }
        if let Some(d) = self.attempt.pending_decision {
            self.pending = self.shared.store.get(&self.scope, &decision_key(id, d))?;
        }
        match self
            .shared
            .release_info(&self.scope, &self.attempt.release_id)
            .await
        {
            Ok(info) => self.info = Some(info),
            Err(e) => {
                if self.attempt.state == AttemptState::Claimed {
                    let failure = AttemptFailure {
                        class: FailureClass::Infrastructure,
                        reason: format!(
                            "release {} cannot be loaded: {e}",
                            self.attempt.release_id
                        ),
                        feedback_ref: None,
                    };
                    let mut a = self.attempt.clone();
                    let events = a.fail(failure, None, self.now())?;
                    return self.save(a, events, |_, _| Ok(())).await;
                }
                return Err(e);
            }
        }
        // After a restart, an adapter holding the attempt gets a full
        // lease to come back with its token.
        if self.attempt.lease.holder.is_some() && self.attempt.adapter == AdapterKind::External {
            let mut a = self.attempt.clone();
            a.renew_lease(self.lease_ttl(), self.now());
            self.save(a, Vec::new(), |_, _| Ok(())).await?;
        }
        // A builtin loop that ran in an earlier run of the appliance is
        // gone: a call it had out without an effect is abandoned and the
        // attempt resumes from its last checkpoint; one whose effect cannot
        // be confirmed leaves the attempt Uncertain.
        if self.attempt.adapter == AdapterKind::Builtin
            && self.attempt.lease.holder.is_some()
            && self.attempt.lease.holder.as_deref() != Some(self.shared.holder.as_str())
            && self.attempt.state != AttemptState::WaitingForDecision
        {
            let now = self.now();
            let mut a = self.attempt.clone();
            let mut open = self.open.clone();
            let why = "the appliance stopped while the call was out";
            let (released, events) = a.release_holder(open.as_mut(), why, now)?;
            if released {
                self.save_with_open(a, events, open).await?;
            } else {
                let request = InterruptRequest {
                    requested_at: now,
                    by: "appliance".into(),
                    reason: format!("{why}; its effect cannot be confirmed"),
                    source: InterruptSource::LeaseLost,
                };
                let events = a.request_interrupt(request, now);
                self.save(a, events, |_, _| Ok(())).await?;
                self.observe().await?;
            }
        }
        if self.attempt.state == AttemptState::Claimed && !self.attempt.capacity_granted {
            self.acquire_capacity();
        } else if self.claimable() {
            self.shared.set_claimable(&self.attempt, true);
        }
        // A child run that ended while nobody listened.
        if let Some(open) = self.attempt.open_call.clone()
            && open.kind == CallKind::SubAgent
        {
            let delegations: Vec<SubAgentDelegation> = self
                .shared
                .store
                .list_under(&self.scope, &format!("{id}/"))?;
            if let Some(d) = delegations.iter().find(|d| d.call_id == open.call_id)
                && let Some(run) = self
                    .shared
                    .store
                    .get::<crate::domain::run::Run>(&self.scope, &d.child_run_id.to_string())?
                && run.state.is_terminal()
            {
                let child = ChildEnded {
                    parent: run.parent.clone().expect("a child run has a parent"),
                    child_run_id: run.run_id,
                    state: run.state,
                    output_ref: run.output_ref.clone(),
                    reason: run.reason.clone(),
                };
                self.child_ended(child).await?;
            }
        }
        if self.attempt.interrupt.is_some() && self.observable_now() {
            self.observe().await?;
        }
        Ok(())
    }

    /// Whether an adapter may take the attempt now: a fresh one with
    /// capacity, or one whose holder is gone (an external adapter's lease
    /// lapsed; a builtin loop of an earlier run of the appliance) with no
    /// call in flight, to resume from its last checkpoint.
    fn claimable(&self) -> bool {
        let a = &self.attempt;
        let holder_gone = match a.adapter {
            AdapterKind::External => a.lease_lapsed(self.now()),
            AdapterKind::Builtin => a.lease.holder.as_deref() != Some(self.shared.holder.as_str()),
        };
        match a.state {
            AttemptState::Claimed => a.capacity_granted && a.lease.holder.is_none(),
            AttemptState::Running | AttemptState::Paused => {
                holder_gone && a.open_call.is_none() && a.interrupt.is_none()
            }
            _ => false,
        }
    }

    fn acquire_capacity(&mut self) {
        if self.capacity_task {
            return;
        }
        self.capacity_task = true;
        let a = &self.attempt;
        let run_snapshot = self
            .info
            .as_ref()
            .map(|i| (i.manifest.contract.cpu, i.manifest.contract.memory_gb));
        let (cpu, memory) = run_snapshot.unwrap_or((0.5, 0.5));
        let request = LeaseRequest {
            tenant_id: a.tenant_id.clone(),
            project_id: a.project_id.clone(),
            run_id: Some(a.run_id),
            attempt_id: Some(a.attempt_id),
            holder_kind: HolderKind::Attempt,
            holder_id: a.attempt_id.to_string(),
            cpu: amount(cpu),
            memory_gb: amount(memory),
            internet_egress: false,
        };
        let capacity = self.shared.capacity.clone();
        let me = self.me.clone();
        let mut shutdown = self.shared.shutdown.clone();
        tokio::spawn(async move {
            // The first answer comes at once (granted, or queued with its
            // position and limit); then the position is refreshed every few
            // seconds while it waits.
            let mut wait_for = StdDuration::ZERO;
            loop {
                let acquire = AcquireRequest {
                    request: request.clone(),
                    pool_id: None,
                    wait: true,
                    wait_for,
                };
                wait_for = StdDuration::from_secs(5);
                let result = tokio::select! {
                    r = capacity.acquire(acquire) => r,
                    _ = shutdown.changed() => return,
                };
                let done = match &result {
                    Ok(view) => view.lease.state.holds_capacity() || view.lease.state.is_terminal(),
                    Err(CapacityError::Denied { .. }) => true,
                    Err(_) => false,
                };
                let retry_later = result.is_err() && !done;
                if me.send(Msg::Capacity(result)).is_err() || done {
                    return;
                }
                if retry_later {
                    tokio::time::sleep(StdDuration::from_secs(1)).await;
                }
            }
        });
    }

    fn next_reminder(&self) -> Option<DateTime<Utc>> {
        let a = &self.attempt;
        let mut at: Vec<DateTime<Utc>> = Vec::new();
        if let Some(deadline) = a.budget_deadline() {
            at.push(deadline);
        }
        if let Some(d) = &self.pending {
            at.push(d.expires_at);
        }
        if let Some(i) = &a.interrupt {
            at.push(
                i.requested_at
                    + Duration::seconds(self.shared.config.interrupt_grace_seconds as i64),
            );
        }
        if a.adapter == AdapterKind::External
            && let Some(exp) = a.lease.expires_at
            && exp > self.now()
        {
            at.push(exp);
        }
        at.into_iter().min()
    }

    async fn on_timer(&mut self) {
        let now = self.now();
        let result = async {
            if let Some(deadline) = self.attempt.budget_deadline()
                && deadline <= now
            {
                let mut a = self.attempt.clone();
                let mut open = self.open.clone();
                let events = a.time_out(open.as_mut(), now)?;
                return self.save_with_open(a, events, open).await;
            }
            if let Some(d) = self.pending.clone()
                && d.expires_at <= now
                && d.status == DecisionStatus::Pending
            {
                let minutes = self.shared.config.input_timeout_minutes;
                return self.resolve(d, Resolution::Expired { minutes }, None).await;
            }
            if let Some(i) = &self.attempt.interrupt
                && i.requested_at
                    + Duration::seconds(self.shared.config.interrupt_grace_seconds as i64)
                    <= now
            {
                return self.observe().await;
            }
            if self.claimable() {
                self.shared.set_claimable(&self.attempt, true);
            }
            Ok::<_, RuntimeError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(attempt = %self.attempt.attempt_id, error = %e, "an attempt reminder failed");
        }
    }

    async fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Claim { holder, reply } => {
                let _ = reply.send(self.claim(holder).await);
            }
            Msg::Start {
                token,
                adapter_version,
                checkpoint_format,
                context_snapshot_ref,
                reply,
            } => {
                let r = self
                    .start(
                        token,
                        adapter_version,
                        checkpoint_format,
                        context_snapshot_ref,
                    )
                    .await;
                let _ = reply.send(r);
            }
            Msg::Heartbeat { token, reply } => {
                let _ = reply.send(self.heartbeat(token).await);
            }
            Msg::BeginCall { token, call, reply } => {
                let _ = reply.send(self.begin_call(token, call).await);
            }
            Msg::CompleteCall {
                token,
                completion,
                reply,
            } => {
                let _ = reply.send(self.complete_call(token, completion).await);
            }
            Msg::Checkpoint {
                token,
                state,
                phase,
                reply,
            } => {
                let _ = reply.send(self.adapter_checkpoint(token, state, phase).await);
            }
            Msg::RequestDecision { token, ask, reply } => {
                let _ = reply.send(self.request_decision(token, ask).await);
            }
            Msg::Answer {
                decision_id,
                by,
                choice,
                answer,
                reply,
            } => {
                let _ = reply.send(self.answer(decision_id, by, choice, answer).await);
            }
            Msg::Decide {
                decision_id,
                approve,
                by,
                reason,
                reply,
            } => {
                let _ = reply.send(self.decide(decision_id, approve, by, reason).await);
            }
            Msg::Interrupt { request, reply } => {
                let _ = reply.send(self.interrupt(request).await);
            }
            Msg::Report {
                token,
                report,
                reply,
            } => {
                let _ = reply.send(self.report(token, report).await);
            }
            Msg::ChildEnded { child, reply } => {
                let _ = reply.send(self.child_ended(*child).await);
            }
            Msg::Renew { reply } => {
                let _ = reply.send(self.renew().await);
            }
            Msg::Reconcile { reply } => {
                let _ = reply.send(self.reconcile().await);
            }
            Msg::Fail { failure, reply } => {
                let r = async {
                    let mut a = self.attempt.clone();
                    let events = a.fail(failure, None, self.now())?;
                    self.save(a, events, |_, _| Ok(())).await?;
                    Ok(self.attempt.clone())
                }
                .await;
                let _ = reply.send(r);
            }
            Msg::Capacity(result) => {
                if let Err(e) = self.on_capacity(result).await {
                    tracing::warn!(attempt = %self.attempt.attempt_id, error = %e, "recording a capacity lease");
                }
            }
        }
    }

    /// Writes `next` (with `extra` records and `events`) durably, then makes
    /// it current. A newly ended attempt's outcome is recorded in its run
    /// in the same transaction.
    async fn save<F>(
        &mut self,
        next: ExecutionAttempt,
        events: Vec<NewEvent>,
        extra: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnOnce(&mut Tx, &TenantScope) -> Result<(), RuntimeError> + Send + 'static,
    {
        let ended = next.state.is_terminal() && !self.attempt.state.is_terminal();
        let scope = self.scope.clone();
        let record = next.clone();
        let now = self.now();
        let followup = self
            .shared
            .store
            .transact(move |tx: &mut Tx| {
                extra(tx, &scope)?;
                tx.put(&scope, &record)?;
                tx.emit_all(events)?;
                if ended {
                    Ok::<_, RuntimeError>(crate::runs::record_outcome(tx, &scope, &record, now)?)
                } else {
                    Ok(Followup::default())
                }
            })
            .await?;
        let before = self.attempt.state;
        self.attempt = next;
        if before != self.attempt.state {
            self.gauge(before, -1.0);
            self.gauge(self.attempt.state, 1.0);
        }
        if ended {
            self.ended(followup).await;
        }
        Ok(())
    }

    async fn save_with_open(
        &mut self,
        next: ExecutionAttempt,
        events: Vec<NewEvent>,
        open: Option<CallRecord>,
    ) -> Result<(), RuntimeError> {
        let record = open.clone();
        self.save(next, events, move |tx, s| {
            if let Some(r) = &record {
                tx.put(s, r)?;
            }
            Ok(())
        })
        .await?;
        self.open =
            open.filter(|r| r.status == CallStatus::Issued || r.status == CallStatus::Uncertain);
        Ok(())
    }

    async fn ended(&mut self, followup: Followup) {
        let a = &self.attempt;
        self.shared.set_claimable(a, false);
        let tenant = a.tenant_id.to_string();
        metrics::histogram!(names::ATTEMPT_DURATION, "tenant" => tenant.clone(), "agent" => a.agent_id.clone(), "outcome" => a.state.as_str())
            .record((self.now() - a.started_at).num_milliseconds().max(0) as f64 / 1000.0);
        if a.state == AttemptState::Uncertain {
            metrics::counter!(names::UNCERTAIN_OUTCOMES, "tenant" => tenant).increment(1);
        }
        if let Some(lease_id) = a.capacity_lease_id {
            let capacity = self.shared.capacity.clone();
            let scope = self.scope.clone();
            tokio::spawn(async move {
                if let Err(e) = capacity.release(&scope, lease_id).await {
                    tracing::warn!(lease = %lease_id, error = %e, "releasing an ended attempt's capacity lease");
                }
            });
        }
        if let Some(runtime) = self.shared.runtime() {
            let scope = self.scope.clone();
            tokio::spawn(async move { runtime.follow(&scope, followup).await });
        }
    }

    /// Checks the token; a stale one is recorded and refused. A current
    /// one extends the adapter's lease.
    async fn fence(&mut self, token: u64, operation: &str) -> Result<(), RuntimeError> {
        let mut a = self.attempt.clone();
        let now = self.now();
        if let Err(e) = a.check_fencing(token, operation, now) {
            self.save(a, Vec::new(), |_, _| Ok(())).await?;
            return Err(e.into());
        }
        let ttl = self.lease_ttl();
        self.attempt.renew_lease(ttl, now);
        Ok(())
    }

    /// Whether an interrupt can be observed without the adapter.
    fn observable_now(&self) -> bool {
        match self.attempt.state {
            AttemptState::Claimed
            | AttemptState::WaitingForTool
            | AttemptState::WaitingForDecision
            | AttemptState::Paused => true,
            AttemptState::Running => self.attempt.open_call.is_some(),
            _ => false,
        }
    }

    /// Observes the interruption now.
    async fn observe(&mut self) -> Result<(), RuntimeError> {
        if self.attempt.state.is_terminal() || self.attempt.interrupt.is_none() {
            return Ok(());
        }
        let now = self.now();
        let mut a = self.attempt.clone();
        let mut open = self.open.clone();
        let mut pending = self.pending.clone();
        if let Some(d) = pending.as_mut() {
            d.status = DecisionStatus::Cancelled;
            d.answered_at = Some(now);
        }
        let events = a.observe_cancellation(open.as_mut(), now)?;
        if let Some(d) = &pending {
            self.decision_metric(d.kind, -1.0);
        }
        let decision = pending.clone();
        self.save(a, events, move |tx, s| {
            if let Some(d) = &decision {
                tx.put(s, d)?;
            }
            Ok(())
        })
        .await?;
        self.pending = None;
        self.save_open_only(open).await
    }

    async fn save_open_only(&mut self, open: Option<CallRecord>) -> Result<(), RuntimeError> {
        if let Some(r) = open.clone() {
            let s = self.scope.clone();
            self.shared.store.transact(move |tx| tx.put(&s, &r)).await?;
        }
        self.open =
            open.filter(|r| r.status == CallStatus::Issued || r.status == CallStatus::Uncertain);
        Ok(())
    }

    /// At an adapter's contact: an interrupt is observed, and the call
    /// refused with `aborted`.
    async fn check_interrupt(&mut self, operation: &str) -> Result<(), RuntimeError> {
        let Some(i) = self.attempt.interrupt.clone() else {
            return Ok(());
        };
        self.observe().await?;
        Err(aborted(format!(
            "attempt {} was interrupted by {} ({}: {}); it is now {}; {operation} refused, stop the loop",
            self.attempt.attempt_id,
            i.by,
            i.source.as_str(),
            i.reason,
            self.attempt.state
        )))
    }

    fn info(&self) -> Result<Arc<ReleaseInfo>, RuntimeError> {
        self.info.clone().ok_or_else(|| {
            DomainError::Unavailable(format!("release {} is not loaded", self.attempt.release_id))
                .into()
        })
    }

    fn read(&self, hash: &str) -> Result<Option<Vec<u8>>, RuntimeError> {
        Ok(self.shared.store.read_artifact(&self.scope, hash)?)
    }

    async fn claim(&mut self, holder: String) -> Result<Option<Ticket>, RuntimeError> {
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
        let (run_id, token) = (a.run_id, a.fencing_token);
        self.save(a, Vec::new(), move |tx, s| {
            if resumed {
                // The step's token moves on with the lease.
                if let Some(mut run) = tx.get::<crate::domain::run::Run>(s, &run_id.to_string())? {
                    let i = run.current_step as usize;
                    run.steps[i].fencing_token = run.steps[i].fencing_token.max(token);
                    tx.put(s, &run)?;
                }
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

    async fn start(
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
                    a.resume_refused = Some(why.clone());
                    let failure = AttemptFailure {
                        class: FailureClass::Infrastructure,
                        reason: format!(
                            "cannot resume: {why}; a new attempt starts from the step input"
                        ),
                        feedback_ref: None,
                    };
                    let events = a.fail(failure, None, now)?;
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
        let state_ref = json_hash(&serde_json::Value::Null);
        let cp_id = new_id();
        let (cp, more) = a.checkpoint(cp_id, CheckpointReason::Started, state_ref, None, now)?;
        events.extend(more);
        let retain = self.retain();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, b"null", "application/json", Some(retain), now)?;
            tx.put(s, &cp)?;
            Ok(())
        })
        .await?;
        self.checkpoint_metric();
        Ok(self.attempt.clone())
    }

    fn checkpoint_metric(&self) {
        metrics::counter!(names::CHECKPOINTS_WRITTEN, "tenant" => self.attempt.tenant_id.to_string()).increment(1);
    }

    fn call_metric(&self, kind: CallKind, status: CallStatus) {
        metrics::counter!(names::CALLS, "tenant" => self.attempt.tenant_id.to_string(), "kind" => kind.as_str(), "status" => status.as_str())
            .increment(1);
    }

    async fn heartbeat(&mut self, token: u64) -> Result<ExecutionAttempt, RuntimeError> {
        self.fence(token, "Heartbeat").await?;
        if self.attempt.interrupt.is_some() && self.attempt.state == AttemptState::Running {
            self.observe().await?;
            return Ok(self.attempt.clone());
        }
        let a = self.attempt.clone();
        self.save(a, Vec::new(), |_, _| Ok(())).await?;
        Ok(self.attempt.clone())
    }

    /// The adapter state to keep with a checkpoint: the one sent now, else
    /// the last one.
    fn state_ref(&self, state: Option<&[u8]>) -> (String, Option<Vec<u8>>) {
        match state {
            Some(bytes) => (
                crate::store::artifacts::content_hash(bytes),
                Some(bytes.to_vec()),
            ),
            None => match &self.attempt.adapter_state_ref {
                Some(r) => (r.clone(), None),
                None => (json_hash(&serde_json::Value::Null), Some(b"null".to_vec())),
            },
        }
    }

    async fn refuse(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        reason: String,
    ) -> Result<Begun, RuntimeError> {
        let policy_decision_id = start.policy_decision_id;
        let request_hash = start.request_hash.clone();
        let call_id = self.record_refusal(start, request, &reason, None).await?;
        Ok(Begun {
            outcome: BeginOutcome::Refused,
            call_id: Some(call_id),
            policy_decision_id,
            fencing_token: self.attempt.fencing_token,
            reason: Some(reason),
            request_hash,
            ..Begun::default()
        })
    }

    /// Records a refused call (and, with `failure`, ends the attempt).
    async fn record_refusal(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        reason: &str,
        failure: Option<AttemptFailure>,
    ) -> Result<uuid::Uuid, RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let kind = start.kind;
        let record = a.refuse_call(start, reason, now);
        let call_id = record.call_id;
        let events = match failure {
            Some(f) => a.fail(f, None, now)?,
            None => Vec::new(),
        };
        let retain = self.retain();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            tx.put(s, &record)?;
            Ok(())
        })
        .await?;
        self.call_metric(kind, CallStatus::Failed);
        Ok(call_id)
    }

    async fn begin_call(&mut self, token: u64, call: BeginCall) -> Result<Begun, RuntimeError> {
        self.fence(token, "BeginCall").await?;
        self.check_interrupt("BeginCall").await?;
        match self.attempt.gate() {
            Ok(()) => {}
            Err(Gate::Paused(why)) => {
                return Err(DomainError::Unavailable(format!(
                    "attempt {} is paused ({why}); call again once its lease is renewed",
                    self.attempt.attempt_id
                ))
                .into());
            }
            Err(Gate::Busy(id)) => {
                return Err(precondition(format!(
                    "call {id} is still open; complete it before beginning another"
                )));
            }
            Err(Gate::WrongState(e)) => return Err(e.into()),
            Err(Gate::Interrupted) => unreachable!("observed above"),
        }
        let info = self.info()?;
        let now = self.now();
        let request = canonical_json(&call.request);
        let request_hash = json_hash(&call.request);
        let policy_decision_id = new_id();
        let mut start = CallStart {
            call_id: new_id(),
            kind: call.kind,
            target: call.target.clone(),
            side_effect_class: None,
            request_hash: request_hash.clone(),
            policy_decision_id: Some(policy_decision_id),
            policy_rule: None,
            approval_id: None,
            context_tokens: call.context_tokens,
            pre_checkpoint_id: None,
        };
        let mut consumed: Option<DecisionRequest> = None;
        let mut child: Option<(crate::runs::NewRun, SubAgentDelegation)> = None;
        match call.kind {
            CallKind::Tool => {
                let Some((tool, schema)) = info.tool(&call.target) else {
                    let reason = format!(
                        "tool {:?} is outside the release's closure (its tools: {})",
                        call.target,
                        info.tool_ids().join(", ")
                    );
                    return self.refuse(start, request, reason).await;
                };
                let class = tool.side_effect_class;
                start.side_effect_class = Some(class);
                let problems = super::release::violations(schema, &call.request);
                if !problems.is_empty() {
                    let reason = format!(
                        "the arguments do not match the input schema of tool {}: {}",
                        call.target,
                        problems.join("; ")
                    );
                    return self.refuse(start, request, reason).await;
                }
                let rule = info.manifest.policy.rule(&call.target, class);
                start.policy_rule = Some(rule);
                match rule {
                    PolicyRule::Allow => {}
                    PolicyRule::Deny => {
                        let reason = format!(
                            "policy revision {} denies tool {} (side-effect class {})",
                            info.manifest.policy.revision,
                            call.target,
                            class.as_str()
                        );
                        return self.refuse(start, request, reason).await;
                    }
                    PolicyRule::RequireApproval => {
                        match call.approval_id.or_else(|| self.granted_approval(&start)) {
                            None => return self.ask_approval(start, request, class).await,
                            Some(approval_id) => {
                                let decision = self.approved(approval_id, &start)?;
                                start.approval_id = Some(approval_id);
                                start.policy_decision_id =
                                    decision.proposal.as_ref().map(|p| p.policy_decision_id);
                                let mut d = decision;
                                d.consumed = true;
                                consumed = Some(d);
                            }
                        }
                    }
                }
            }
            CallKind::Model => {
                if call.target != info.manifest.model_profile.id {
                    let reason = format!(
                        "model profile {:?} is not the release's ({}); a release cannot widen its models",
                        call.target, info.manifest.model_profile.id
                    );
                    return self.refuse(start, request, reason).await;
                }
                start.policy_rule = Some(PolicyRule::Allow);
            }
            CallKind::SubAgent => {
                if let Some(limit) = self.attempt.limit_for(
                    CallKind::SubAgent,
                    None,
                    self.shared.config.max_sub_agent_depth,
                ) {
                    return self.limit_reached(start, request, limit.reason).await;
                }
                let child_info = match self
                    .shared
                    .releases
                    .dispatchable(&self.scope, &call.target)
                    .await
                {
                    Ok(_) => self.shared.release_info(&self.scope, &call.target).await?,
                    Err(e) => {
                        let reason = format!("sub-agent release {:?} cannot run: {e}", call.target);
                        return self.refuse(start, request, reason).await;
                    }
                };
                start.policy_rule = Some(PolicyRule::Allow);
                let delegation_id = new_id();
                let depth = self.attempt.depth + 1;
                let plan = crate::runs::plan_child(
                    &self.attempt.tenant_id,
                    &self.attempt.project_id,
                    &child_info.release,
                    &child_info.manifest,
                    child_info.steps.clone(),
                    call.request.clone(),
                    &self.shared.config,
                    ParentLink {
                        run_id: self.attempt.run_id,
                        attempt_id: self.attempt.attempt_id,
                        delegation_id,
                        call_id: start.call_id,
                    },
                    depth,
                    &format!("attempt {}", self.attempt.attempt_id),
                    now,
                )?;
                // A child never gets a deeper delegation budget than its
                // supervisor had.
                let mut plan = plan;
                plan.run.snapshot.limits.max_sub_agent_depth = plan
                    .run
                    .snapshot
                    .limits
                    .max_sub_agent_depth
                    .min(self.attempt.limits.max_sub_agent_depth);
                let delegation = SubAgentDelegation {
                    delegation_id,
                    attempt_id: self.attempt.attempt_id,
                    tenant_id: self.attempt.tenant_id.clone(),
                    child_run_id: plan.run.run_id,
                    child_agent_id: child_info.release.agent_id.clone(),
                    child_release_id: child_info.release.release_id.clone(),
                    purpose: call
                        .request
                        .get("purpose")
                        .and_then(|p| p.as_str())
                        .unwrap_or("delegated task")
                        .chars()
                        .take(200)
                        .collect(),
                    depth,
                    status: "submitted".into(),
                    call_id: start.call_id,
                    created_at: now,
                };
                child = Some((plan, delegation));
            }
        }
        let gated = start.side_effect_class.is_some_and(|c| c.is_gated());
        let mut a = self.attempt.clone();
        let mut events = Vec::new();
        let mut checkpoint = None;
        let (state_ref, state_bytes) = self.state_ref(call.state.as_deref());
        if gated || a.cadence_due(self.shared.config.checkpoint_every_calls) {
            let reason = if gated {
                CheckpointReason::BeforeGatedCall
            } else {
                CheckpointReason::Cadence
            };
            let (cp, more) = a.checkpoint(
                new_id(),
                reason,
                state_ref.clone(),
                Some(start.call_id),
                now,
            )?;
            start.pre_checkpoint_id = Some(cp.checkpoint_id);
            events.extend(more);
            checkpoint = Some(cp);
        }
        let depth_cap = self.shared.config.max_sub_agent_depth;
        let kind = start.kind;
        let record = match a.begin_call(start.clone(), depth_cap, now) {
            Ok((record, more)) => {
                events.extend(more);
                record
            }
            Err(CallError::Limit(limit)) => {
                return self.limit_reached(start, request, limit.reason).await;
            }
            Err(CallError::Gate(Gate::Paused(why))) => {
                // The checkpoint before the call was where it paused.
                let cp = checkpoint.clone();
                let retain = self.retain();
                self.save(a, events, move |tx, s| {
                    if let Some(bytes) = state_bytes {
                        tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
                    }
                    if let Some(cp) = &cp {
                        tx.put(s, cp)?;
                    }
                    Ok(())
                })
                .await?;
                return Err(DomainError::Unavailable(format!(
                    "attempt {} paused at checkpoint before the call ({why}); call again once its lease is renewed",
                    self.attempt.attempt_id
                ))
                .into());
            }
            Err(CallError::Gate(g)) => {
                return Err(precondition(format!("the call cannot start: {g:?}")));
            }
        };
        let mut child_attempt = None;
        let mut delegated = None;
        if let Some((plan, delegation)) = &child {
            delegated = Some(NewEvent::new(
                &a.tenant_id,
                now,
                &SubAgentDelegated {
                    attempt_id: a.attempt_id,
                    run_id: a.run_id,
                    tenant_id: &a.tenant_id,
                    child_run_id: plan.run.run_id,
                    child_agent_id: &delegation.child_agent_id,
                    depth: delegation.depth,
                },
            ));
        }
        events.extend(delegated);
        let retain = self.retain();
        let cp = checkpoint.clone();
        let rec = record.clone();
        let approval = consumed.clone();
        let (tx_out, rx_out) = oneshot::channel();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            if let Some(bytes) = state_bytes {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            if let Some(cp) = &cp {
                tx.put(s, cp)?;
            }
            tx.put(s, &rec)?;
            if let Some(d) = &approval {
                tx.put(s, d)?;
            }
            if let Some((plan, delegation)) = child {
                tx.put(s, &delegation)?;
                let (_, attempt) = crate::runs::create_run(tx, s, plan, retain, now)?;
                let _ = tx_out.send(attempt);
            }
            Ok(())
        })
        .await?;
        if let Ok(attempt) = rx_out.await {
            child_attempt = Some(attempt);
        }
        if checkpoint.is_some() {
            self.checkpoint_metric();
        }
        self.call_metric(kind, CallStatus::Issued);
        self.open = Some(record.clone());
        let child_run_id = child_attempt.as_ref().map(|c| c.run_id);
        if let Some(attempt) = child_attempt
            && let Some(runtime) = self.shared.runtime()
        {
            runtime.adopt(attempt);
        }
        Ok(Begun {
            outcome: BeginOutcome::Started,
            call_id: Some(record.call_id),
            policy_decision_id: record.policy_decision_id,
            fencing_token: self.attempt.fencing_token,
            reason: None,
            decision_id: None,
            approval_id: record.approval_id,
            checkpoint_id: checkpoint.map(|c| c.checkpoint_id),
            child_run_id,
            request_hash: record.request_hash,
        })
    }

    /// A limit stops the attempt: the call is recorded as refused and the
    /// attempt fails (budget), naming the limit.
    async fn limit_reached(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        reason: String,
    ) -> Result<Begun, RuntimeError> {
        let failure = AttemptFailure {
            class: FailureClass::Budget,
            reason: reason.clone(),
            feedback_ref: None,
        };
        self.record_refusal(start, request, &reason, Some(failure))
            .await?;
        Err(DomainError::Exhausted(format!(
            "{reason}; attempt {} failed (budget)",
            self.attempt.attempt_id
        ))
        .into())
    }

    /// An approved approval of this attempt, not yet used, for exactly
    /// this call (the adapter restarted between the answer and the call).
    fn granted_approval(&self, start: &CallStart) -> Option<Uuid> {
        let decisions: Vec<DecisionRequest> = self
            .shared
            .store
            .list_under(&self.scope, &format!("{}/", self.attempt.attempt_id))
            .ok()?;
        decisions
            .into_iter()
            .filter(|d| d.status == DecisionStatus::Approved && !d.consumed)
            .find(|d| {
                self.approved(d.approval_id.unwrap_or_default(), start)
                    .is_ok()
            })
            .and_then(|d| d.approval_id)
    }

    /// The approval that allows exactly this call, checked.
    fn approved(
        &self,
        approval_id: Uuid,
        start: &CallStart,
    ) -> Result<DecisionRequest, RuntimeError> {
        let ids = self
            .shared
            .store
            .index_ids(&self.scope, "approval", &approval_id.to_string())?;
        let decision: Option<DecisionRequest> = match ids.first() {
            Some(key) => self.shared.store.get(&self.scope, key)?,
            None => None,
        };
        let Some(decision) = decision.filter(|d| d.attempt_id == self.attempt.attempt_id) else {
            return Err(DomainError::not_found("approval", approval_id).into());
        };
        if decision.status != DecisionStatus::Approved {
            return Err(precondition(format!(
                "approval {approval_id} is {}; the call needs it approved",
                decision.status.as_str()
            )));
        }
        if decision.consumed {
            return Err(precondition(format!(
                "approval {approval_id} was used already; each approval allows one call"
            )));
        }
        let proposal = ProposedCall {
            kind: start.kind,
            target: start.target.clone(),
            side_effect_class: start.side_effect_class,
            request_hash: start.request_hash.clone(),
            policy_decision_id: Uuid::nil(),
        };
        if decision.proposal_hash.as_deref() != Some(proposal.hash().as_str()) {
            return Err(precondition(format!(
                "approval {approval_id} was given for another call (proposal {}); this request hashes to {}",
                decision.proposal_hash.as_deref().unwrap_or("-"),
                proposal.hash()
            )));
        }
        Ok(decision)
    }

    async fn ask_approval(
        &mut self,
        start: CallStart,
        request: Vec<u8>,
        class: crate::domain::release::SideEffectClass,
    ) -> Result<Begun, RuntimeError> {
        let now = self.now();
        let decision_id = new_id();
        let approval_id = new_id();
        let policy_decision_id = start.policy_decision_id.expect("set");
        let proposal = ProposedCall {
            kind: start.kind,
            target: start.target.clone(),
            side_effect_class: Some(class),
            request_hash: start.request_hash.clone(),
            policy_decision_id,
        };
        let summary = format!(
            "{} call {} ({}) needs approval",
            start.kind.as_str(),
            start.target,
            class.as_str()
        );
        let timeout = Duration::minutes(self.shared.config.input_timeout_minutes as i64);
        let mut a = self.attempt.clone();
        let (decision, events) = a.request_decision(
            decision_id,
            DecisionKind::Approval,
            Some(approval_id),
            Some(proposal),
            Some(start.request_hash.clone()),
            summary,
            Vec::new(),
            None,
            timeout,
            now,
        )?;
        let retain = self.retain();
        let d = decision.clone();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &request, "application/json", Some(retain), now)?;
            tx.put(s, &d)?;
            tx.index_put(
                s,
                "approval",
                &approval_id.to_string(),
                &decision_key(d.attempt_id, d.decision_id),
            )?;
            Ok(())
        })
        .await?;
        self.decision_metric(DecisionKind::Approval, 1.0);
        self.pending = Some(decision);
        Ok(Begun {
            outcome: BeginOutcome::ApprovalRequired,
            call_id: None,
            policy_decision_id: Some(policy_decision_id),
            fencing_token: self.attempt.fencing_token,
            reason: Some(format!(
                "policy requires approval for tool {} ({}); wait for decision {decision_id}, then begin the same call with approval {approval_id}",
                start.target,
                class.as_str()
            )),
            decision_id: Some(decision_id),
            approval_id: Some(approval_id),
            checkpoint_id: None,
            child_run_id: None,
            request_hash: start.request_hash,
        })
    }

    fn decision_metric(&self, kind: DecisionKind, delta: f64) {
        metrics::gauge!(names::DECISIONS_WAITING, "tenant" => self.attempt.tenant_id.to_string(), "kind" => kind.as_str())
            .increment(delta);
    }

    async fn complete_call(
        &mut self,
        token: u64,
        c: Completion,
    ) -> Result<Completed, RuntimeError> {
        self.fence(token, "CompleteCall").await?;
        let Some(open) = self
            .open
            .clone()
            .filter(|r| r.call_id == c.call_id && r.is_open())
        else {
            let calls: Vec<CallRecord> = self
                .shared
                .store
                .list_under(&self.scope, &format!("{}/", self.attempt.attempt_id))?;
            return match calls.iter().find(|r| r.call_id == c.call_id) {
                Some(r) => Err(precondition(format!(
                    "call {} is {}; only an open call is completed",
                    c.call_id,
                    r.status.as_str()
                ))),
                None => Err(DomainError::not_found("call", c.call_id).into()),
            };
        };
        if open.kind == CallKind::SubAgent {
            return Err(precondition(
                "a sub-agent call completes when its child run ends; use AwaitCall".into(),
            ));
        }
        let now = self.now();
        let retain = self.retain();
        let result_hash = c
            .result
            .as_deref()
            .map(crate::store::artifacts::content_hash);
        let receipt_ref = c
            .receipt
            .as_deref()
            .map(crate::store::artifacts::content_hash);
        let mut record = open;
        let mut a = self.attempt.clone();
        let mut events = a.observe_call(
            &mut record,
            CallResult {
                ok: c.ok,
                result_hash: result_hash.clone(),
                receipt_ref: receipt_ref.clone(),
                error: c.error.clone(),
            },
            now,
        )?;
        let (state_ref, state_bytes) = self.state_ref(c.state.as_deref());
        let (cp, more) = a.checkpoint(
            new_id(),
            CheckpointReason::AfterObservation,
            state_ref,
            Some(record.call_id),
            now,
        )?;
        events.extend(more);
        let (rec, cp2) = (record.clone(), cp.clone());
        let (result, receipt) = (c.result.clone(), c.receipt.clone());
        self.save(a, events, move |tx, s| {
            for bytes in [result, receipt, state_bytes].into_iter().flatten() {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            tx.put(s, &rec)?;
            tx.put(s, &cp2)?;
            Ok(())
        })
        .await?;
        self.open = None;
        self.checkpoint_metric();
        self.call_metric(record.kind, record.status);
        Ok(Completed {
            state: self.attempt.state,
            checkpoint: Some(cp),
            result_hash,
            receipt_ref,
            interrupt_requested: self.attempt.interrupt.is_some(),
        })
    }

    async fn adapter_checkpoint(
        &mut self,
        token: u64,
        state: Vec<u8>,
        phase: Option<AttemptPhase>,
    ) -> Result<(Checkpoint, AttemptState), RuntimeError> {
        self.fence(token, "Checkpoint").await?;
        self.check_interrupt("Checkpoint").await?;
        let now = self.now();
        let mut a = self.attempt.clone();
        let mut events = Vec::new();
        if let Some(phase) = phase {
            events.extend(a.set_phase(phase, now));
        }
        let state_ref = crate::store::artifacts::content_hash(&state);
        let (cp, more) = a.checkpoint(new_id(), CheckpointReason::Adapter, state_ref, None, now)?;
        events.extend(more);
        let retain = self.retain();
        let cp2 = cp.clone();
        self.save(a, events, move |tx, s| {
            tx.put_artifact(s, &state, "application/json", Some(retain), now)?;
            tx.put(s, &cp2)?;
            Ok(())
        })
        .await?;
        self.checkpoint_metric();
        Ok((cp, self.attempt.state))
    }

    async fn request_decision(
        &mut self,
        token: u64,
        ask: DecisionAsk,
    ) -> Result<DecisionRequest, RuntimeError> {
        self.fence(token, "RequestDecision").await?;
        self.check_interrupt("RequestDecision").await?;
        let now = self.now();
        let timeout = Duration::minutes(self.shared.config.input_timeout_minutes as i64);
        let question_ref = ask
            .question
            .as_deref()
            .map(crate::store::artifacts::content_hash);
        let mut a = self.attempt.clone();
        let (decision, events) = a.request_decision(
            new_id(),
            ask.kind,
            None,
            None,
            question_ref,
            ask.summary,
            ask.options,
            ask.recommendation,
            timeout,
            now,
        )?;
        let retain = self.retain();
        let d = decision.clone();
        let question = ask.question;
        self.save(a, events, move |tx, s| {
            if let Some(q) = &question {
                tx.put_artifact(s, q, "application/json", Some(retain), now)?;
            }
            tx.put(s, &d)?;
            Ok(())
        })
        .await?;
        self.decision_metric(decision.kind, 1.0);
        self.pending = Some(decision.clone());
        Ok(decision)
    }

    fn pending_named(&self, decision_id: Uuid) -> Result<DecisionRequest, RuntimeError> {
        match &self.pending {
            Some(d) if d.decision_id == decision_id => Ok(d.clone()),
            _ => {
                let stored: Option<DecisionRequest> = self.shared.store.get(
                    &self.scope,
                    &decision_key(self.attempt.attempt_id, decision_id),
                )?;
                match stored {
                    Some(d) => Err(precondition(format!(
                        "decision {decision_id} is {}; only a pending decision is answered",
                        d.status.as_str()
                    ))),
                    None => Err(DomainError::not_found("decision", decision_id).into()),
                }
            }
        }
    }

    /// Resolves the pending decision and stores it.
    async fn resolve(
        &mut self,
        mut decision: DecisionRequest,
        resolution: Resolution,
        answer: Option<Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let now = self.now();
        let mut a = self.attempt.clone();
        let mut events = a.resolve_decision(&mut decision, resolution, now)?;
        // The adapter gets a full lease to pick the answer up.
        a.renew_lease(self.lease_ttl(), now);
        if decision.kind == DecisionKind::Approval
            && matches!(
                decision.status,
                DecisionStatus::Approved | DecisionStatus::Rejected
            )
        {
            events.push(NewEvent::new(
                &a.tenant_id,
                now,
                &ApprovalDecided {
                    approval_id: decision.approval_id.unwrap_or_default(),
                    run_id: a.run_id,
                    attempt_id: a.attempt_id,
                    tenant_id: &a.tenant_id,
                    decision: decision.status.as_str(),
                    decided_by: decision.answered_by.as_deref().unwrap_or(""),
                    proposal_hash: decision.proposal_hash.as_deref().unwrap_or(""),
                },
            ));
        }
        let retain = self.retain();
        let d = decision.clone();
        self.save(a, events, move |tx, s| {
            if let Some(bytes) = &answer {
                tx.put_artifact(s, bytes, "application/json", Some(retain), now)?;
            }
            tx.put(s, &d)?;
            Ok(())
        })
        .await?;
        self.decision_metric(decision.kind, -1.0);
        self.pending = None;
        Ok(())
    }

    async fn answer(
        &mut self,
        decision_id: Uuid,
        by: String,
        choice: Option<String>,
        answer: Option<Vec<u8>>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let decision = self.pending_named(decision_id)?;
        match decision.kind {
            DecisionKind::Approval => {
                return Err(precondition(format!(
                    "decision {decision_id} is an approval ({}); approvals are decided with Runs/DecideApproval",
                    decision
                        .approval_id
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                )));
            }
            DecisionKind::Escalation => match &choice {
                Some(c) if decision.options.contains(c) => {}
                Some(c) => {
                    return Err(crate::domain::FieldError::new(
                        "choice",
                        format!(
                            "{c:?} is not one of the options: {}",
                            decision.options.join(", ")
                        ),
                    )
                    .into());
                }
                None if decision.options.is_empty() && answer.is_some() => {}
                None => {
                    return Err(crate::domain::FieldError::new(
                        "choice",
                        format!("is required: one of {}", decision.options.join(", ")),
                    )
                    .into());
                }
            },
            DecisionKind::Input => {
                if answer.is_none() {
                    return Err(crate::domain::FieldError::new(
                        "answerJson",
                        "is required for an input decision",
                    )
                    .into());
                }
            }
        }
        let answer_ref = answer.as_deref().map(crate::store::artifacts::content_hash);
        self.resolve(
            decision,
            Resolution::Answered {
                by,
                choice,
                answer_ref,
            },
            answer,
        )
        .await?;
        Ok(self.attempt.clone())
    }

    async fn decide(
        &mut self,
        decision_id: Uuid,
        approve: bool,
        by: String,
        reason: Option<String>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let decision = self.pending_named(decision_id)?;
        if decision.kind != DecisionKind::Approval {
            return Err(precondition(format!(
                "decision {decision_id} is an {} decision; answer it with Runtime/AnswerDecision",
                decision.kind.as_str()
            )));
        }
        let resolution = if approve {
            Resolution::Approved { by, reason }
        } else {
            Resolution::Rejected { by, reason }
        };
        self.resolve(decision, resolution, None).await?;
        Ok(self.attempt.clone())
    }

    async fn interrupt(
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

    async fn report(&mut self, token: u64, report: Report) -> Result<Reported, RuntimeError> {
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
                .map(crate::store::artifacts::content_hash);
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
                Verdict::Verified => super::Outcome::Verified,
                Verdict::Correct { feedback, left } => {
                    metrics::counter!(names::CORRECTIONS, "tenant" => self.attempt.tenant_id.to_string(), "agent" => self.attempt.agent_id.clone())
                        .increment(1);
                    super::Outcome::Correct { feedback, left }
                }
                Verdict::Exhausted { feedback } => super::Outcome::Exhausted { feedback },
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
        let events = a.fail(
            AttemptFailure {
                class,
                reason,
                feedback_ref: None,
            },
            Some(hash),
            now,
        )?;
        self.save(a, events, |_, _| Ok(())).await?;
        Ok(Reported {
            verdict: super::Outcome::Failed,
            state: self.attempt.state,
            outcome_hash: self.attempt.outcome_hash.clone(),
            acknowledged: false,
        })
    }

    async fn child_ended(&mut self, child: ChildEnded) -> Result<(), RuntimeError> {
        let Some(open) = self
            .open
            .clone()
            .filter(|r| r.call_id == child.parent.call_id && r.is_open())
        else {
            return Ok(());
        };
        let now = self.now();
        let mut record = open;
        let mut a = self.attempt.clone();
        let ok = child.state == RunState::Succeeded;
        let mut events = a.observe_call(
            &mut record,
            CallResult {
                ok,
                result_hash: child.output_ref.clone(),
                receipt_ref: Some(format!("run:{}", child.child_run_id)),
                error: (!ok).then(|| {
                    format!(
                        "child run {} ended {}: {}",
                        child.child_run_id,
                        child.state,
                        child.reason.clone().unwrap_or_default()
                    )
                }),
            },
            now,
        )?;
        // The adapter gets a full lease to pick the result up.
        a.renew_lease(self.lease_ttl(), now);
        let (state_ref, state_bytes) = self.state_ref(None);
        let (cp, more) = a.checkpoint(
            new_id(),
            CheckpointReason::AfterObservation,
            state_ref,
            Some(record.call_id),
            now,
        )?;
        events.extend(more);
        let retain = self.retain();
        let rec = record.clone();
        let (attempt_id, delegation_id, state) =
            (a.attempt_id, child.parent.delegation_id, child.state);
        self.save(a, events, move |tx, s| {
            if let Some(bytes) = state_bytes {
                tx.put_artifact(s, &bytes, "application/json", Some(retain), now)?;
            }
            tx.put(s, &rec)?;
            tx.put(s, &cp)?;
            let key = SubAgentDelegation::key(attempt_id, delegation_id);
            if let Some(mut d) = tx.get::<SubAgentDelegation>(s, &key)? {
                d.status = state.as_str().to_string();
                tx.put(s, &d)?;
            }
            Ok(())
        })
        .await?;
        self.open = None;
        self.checkpoint_metric();
        self.call_metric(CallKind::SubAgent, record.status);
        Ok(())
    }

    /// LeaseHeartbeat: renews the capacity lease; a failure pauses the
    /// attempt at its next checkpoint, a renewal after one resumes it.
    async fn renew(&mut self) -> Result<bool, RuntimeError> {
        if !self.attempt.capacity_granted {
            return Ok(false);
        }
        let Some(lease_id) = self.attempt.capacity_lease_id else {
            return Ok(false);
        };
        let now = self.now();
        let renewed = match self.shared.capacity.renew(&self.scope, lease_id).await {
            Ok(_) => None,
            Err(CapacityError::Domain(DomainError::FailedPrecondition(why))) => {
                // The lease ended: ask for capacity again, without waiting.
                let acquire = AcquireRequest {
                    request: LeaseRequest {
                        tenant_id: self.attempt.tenant_id.clone(),
                        project_id: self.attempt.project_id.clone(),
                        run_id: Some(self.attempt.run_id),
                        attempt_id: Some(self.attempt.attempt_id),
                        holder_kind: HolderKind::Attempt,
                        holder_id: self.attempt.attempt_id.to_string(),
                        cpu: amount(self.info.as_ref().map_or(0.5, |i| i.manifest.contract.cpu)),
                        memory_gb: amount(
                            self.info
                                .as_ref()
                                .map_or(0.5, |i| i.manifest.contract.memory_gb),
                        ),
                        internet_egress: false,
                    },
                    pool_id: None,
                    wait: false,
                    wait_for: StdDuration::ZERO,
                };
                match self.shared.capacity.acquire(acquire).await {
                    Ok(view) if view.lease.state.holds_capacity() => Some(Ok(view.lease.lease_id)),
                    Ok(view) => Some(Err(format!(
                        "capacity lease {lease_id} ended ({why}) and a new one waits: {}",
                        view.limit.map(|l| l.to_string()).unwrap_or_default()
                    ))),
                    Err(e) => Some(Err(format!(
                        "capacity lease {lease_id} ended ({why}) and a new one was refused: {e}"
                    ))),
                }
            }
            Err(e) => Some(Err(format!(
                "capacity lease {lease_id} could not be renewed: {e}"
            ))),
        };
        let mut a = self.attempt.clone();
        let events = match renewed {
            None | Some(Ok(_)) => {
                if let Some(Ok(new_lease)) = renewed {
                    a.capacity_lease_id = Some(new_lease);
                }
                if a.renewal_failure.is_none()
                    && a.state != AttemptState::Paused
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

    /// OrphanedAttemptReconciler: a lapsed adapter lease settles the
    /// attempt.
    async fn reconcile(&mut self) -> Result<Option<AttemptState>, RuntimeError> {
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

    async fn on_capacity(
        &mut self,
        result: Result<LeaseView, CapacityError>,
    ) -> Result<(), RuntimeError> {
        let now = self.now();
        match result {
            Ok(view)
                if self.attempt.state.is_terminal()
                    || self.attempt.state != AttemptState::Claimed =>
            {
                let _ = view;
                Ok(())
            }
            Ok(view) if view.lease.state.holds_capacity() => {
                self.queue_position = None;
                self.limiting_quota = None;
                self.capacity_reason = None;
                let mut a = self.attempt.clone();
                a.capacity_granted = true;
                a.capacity_lease_id = Some(view.lease.lease_id);
                let events = a.set_phase(AttemptPhase::LoadingRelease, now);
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
                if self.attempt.capacity_lease_id != Some(view.lease.lease_id) {
                    let mut a = self.attempt.clone();
                    a.capacity_lease_id = Some(view.lease.lease_id);
                    self.save(a, Vec::new(), |_, _| Ok(())).await?;
                }
                Ok(())
            }
            Err(CapacityError::Denied { limit, .. }) => {
                if self.attempt.state != AttemptState::Claimed {
                    return Ok(());
                }
                let failure = AttemptFailure {
                    class: FailureClass::Budget,
                    reason: format!("capacity denied: {limit}"),
                    feedback_ref: None,
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
