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
use crate::domain::access::TenantScope;
use crate::domain::amount::Amount;
use crate::domain::attempt::{
    AttemptFailure, AttemptPhase, AttemptState, CallError, CallKind, CallRecord, CallResult,
    CallStart, CallStatus, Checkpoint, CheckpointReason, DecisionKind, DecisionRequest,
    DecisionStatus, ExecutionAttempt, FailureClass, Gate, InterruptRequest, InterruptSource,
    ProposedCall, Resolution, SubAgentDelegated, SubAgentDelegation, Verdict, json_hash,
    report_hash,
};
use crate::domain::audit::Origin;
use crate::domain::capacity::{HolderKind, LeaseRequest};
use crate::domain::events::NewEvent;
use crate::domain::ids::new_id;
use crate::domain::release::{AdapterKind, PolicyRule, canonical_json};
use crate::domain::run::{ApprovalDecided, ParentLink, RunState};
use crate::domain::run::{ChildEnded, Followup};
use crate::store::Tx;
use crate::telemetry::names;

mod calls;
mod decisions;
mod lifecycle;

type Reply<T> = oneshot::Sender<Result<T, RuntimeError>>;

/// How a handled message is answered, once the grain's view shows it.
type Answer = Option<Box<dyn FnOnce() + Send>>;

fn reply_with<T: Send + 'static>(reply: Reply<T>, result: Result<T, RuntimeError>) -> Answer {
    Some(Box::new(move || {
        let _ = reply.send(result);
    }))
}

/// A message with who sent it, when a person or a client did: the grain
/// handles it as done by them, so that what it changes is audited so.
pub type Mail = (Msg, Option<std::sync::Arc<Origin>>);

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
        /// The reviewer's word.
        verdict: crate::runtime::ApprovalVerdict,
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
    /// The model server it waits for stayed down past the outage limit.
    ModelOutage {
        /// Why, in words.
        why: String,
        /// Answer.
        reply: Reply<()>,
    },
    /// Its turn came at the model server it waits for.
    ModelServerTurn {
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
    /// A tool call with effects outlasted its timeout.
    CallTimedOut {
        /// The adapter's token.
        token: u64,
        /// The call.
        call_id: Uuid,
        /// Why, in words.
        why: String,
        /// Answer.
        reply: Reply<ExecutionAttempt>,
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
    /// The decision it waits for.
    pub decision: Option<DecisionRequest>,
}

impl AttemptView {
    /// An attempt as stored, without a grain's live details (the
    /// capacity wait and the pending decision).
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
        if a.needs_capacity() {
            let mut why = String::from(if a.state == AttemptState::Claimed {
                "waiting for capacity (agent-runtime lease)"
            } else {
                "waiting for capacity again (agent-runtime lease) after a human decision"
            });
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
            let mut why = format!(
                "waiting for a human {} decision {}: {}",
                d.kind.as_str(),
                d.decision_id,
                d.summary
            );
            if let Some(approval) = d.approval_id {
                why.push_str(&format!(
                    " (approval {approval}: accept, edit or reject it in Decisions)"
                ));
            }
            why.push_str(&format!(
                "; expires {}",
                d.expires_at.format("%Y-%m-%d %H:%M:%S UTC")
            ));
            if let Some(gap) = a.capacity_gaps.last().filter(|_| !a.capacity_granted) {
                why.push_str(&format!(
                    "; capacity lease {} given back at {}: it counts against no quota and is not charged until answered",
                    gap.lease_id,
                    gap.returned_at.format("%Y-%m-%d %H:%M:%S UTC")
                ));
            }
            return Some(why);
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
    me: mpsc::UnboundedSender<Mail>,
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
        crate::store::artifacts::unreferenced_until(self.now())
    }

    fn lease_ttl(&self) -> Duration {
        Duration::seconds(self.shared.config.get().attempt_lease_seconds as i64)
    }

    fn publish(&self) {
        self.view_tx.send_replace(Arc::new(AttemptView {
            attempt: self.attempt.clone(),
            queue_position: self.queue_position,
            limiting_quota: self.limiting_quota.clone(),
            capacity_reason: self.capacity_reason.clone(),
            decision: self.pending.clone(),
        }));
    }

    fn gauge(&self, state: AttemptState, delta: f64) {
        if !state.is_terminal() {
            metrics::gauge!(names::ATTEMPTS_ACTIVE, "tenant" => self.attempt.tenant_id.to_string(), "state" => state.as_str())
                .increment(delta);
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Mail>) {
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
                    Some((msg, origin)) => {
                        let answer = match origin {
                            Some(origin) => crate::acting::scope(origin, self.handle(msg)).await,
                            None => self.handle(msg).await,
                        };
                        if self.claimable() {
                            self.shared.set_claimable(&self.attempt, true);
                        }
                        // Readers of a live attempt read this view: it
                        // shows a write before its writer is answered, so
                        // whoever was told can read it back.
                        self.publish();
                        if let Some(send) = answer {
                            send();
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
            runtime.forget(self.attempt.attempt_id, &self.me);
        }
        // Messages that raced with the end are answered from the store by
        // their senders (their reply channels close here), except the
        // answer to the capacity request, which nobody waits for: a lease
        // granted to an attempt that has ended goes back now rather than at
        // the end of its TTL.
        rx.close();
        while let Ok((msg, _)) = rx.try_recv() {
            if let Msg::Capacity(Ok(view)) = msg
                && !view.lease.state.is_terminal()
            {
                lifecycle::release_lease(&self.shared.capacity, &self.scope, view.lease.lease_id);
            }
        }
    }

    /// Reads the open call and the pending decision the attempt names.
    fn load_entities(&mut self) -> Result<(), RuntimeError> {
        let id = self.attempt.attempt_id;
        self.open = match &self.attempt.open_call {
            Some(open) => self
                .shared
                .store
                .list_under::<CallRecord>(&self.scope, &format!("{id}/"))?
                .into_iter()
                .find(|c| c.call_id == open.call_id),
            None => None,
        };
        self.pending = match self.attempt.pending_decision {
            Some(d) => self.shared.store.get(&self.scope, &decision_key(id, d))?,
            None => None,
        };
        Ok(())
    }

    /// The grain's copy turned out older than the stored attempt (a write
    /// of it was refused as stale): someone else wrote the attempt. The
    /// grain takes the stored state, read through the writer so that no
    /// queued write is missed, and goes on from there; when that state has
    /// ended, the grain stops without writing anything.
    async fn resync(&mut self) {
        let id = self.attempt.attempt_id;
        let stored = match self
            .shared
            .store
            .get_latest::<ExecutionAttempt>(&self.scope, &id.to_string())
            .await
        {
            Ok(Some(stored)) => stored,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(attempt = %id, error = %e, "reading the attempt after a stale write");
                return;
            }
        };
        tracing::warn!(
            attempt = %id,
            held = self.attempt.version,
            stored = stored.version,
            state = %stored.state,
            "the attempt's grain held a stale copy; it goes on from the stored state"
        );
        self.become_current(stored);
        if let Err(e) = self.load_entities() {
            tracing::error!(attempt = %id, error = %e, "reading the attempt's open call and decision");
        }
        if self.attempt.state.is_terminal() {
            self.shared.set_claimable(&self.attempt, false);
        }
    }

    async fn init(&mut self) -> Result<(), RuntimeError> {
        let id = self.attempt.attempt_id;
        self.load_entities()?;
        match self
            .shared
            .release_info(&self.scope, &self.attempt.release_id)
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
                        detail_ref: None,
                    };
                    let mut a = self.attempt.clone();
                    let events = a.fail(failure, None, self.now())?;
                    return self.save(a, events, |_, _| Ok(())).await;
                }
                return Err(e);
            }
        }
        // An external adapter's lease counts from its last renewal by the
        // adapter, across restarts: renewing it here would keep an orphaned
        // attempt alive for ever under a crash loop. A live adapter renews
        // it with its next heartbeat.
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
        if self.attempt.needs_capacity() {
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

    /// The agent-runtime lease the attempt asks for: the release's
    /// contract CPUs and memory.
    fn lease_request(&self) -> LeaseRequest {
        let a = &self.attempt;
        let (cpu, memory) = self
            .info
            .as_ref()
            .map(|i| (i.manifest.contract.cpu, i.manifest.contract.memory_gb))
            .unwrap_or((0.5, 0.5));
        LeaseRequest {
            tenant_id: a.tenant_id.clone(),
            project_id: a.project_id.clone(),
            run_id: Some(a.run_id),
            attempt_id: Some(a.attempt_id),
            run_slot: Some(a.run_slot()),
            holder_kind: HolderKind::Attempt,
            holder_id: a.attempt_id.to_string(),
            cpu: amount(cpu),
            memory_gb: amount(memory),
            internet_egress: false,
        }
    }

    fn acquire_capacity(&mut self) {
        if self.capacity_task {
            return;
        }
        self.capacity_task = true;
        let request = self.lease_request();
        let capacity = self.shared.capacity.clone();
        let me = self.me.clone();
        let mut shutdown = self.shared.shutdown.clone();
        let scope = self.scope.clone();
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
                let live_lease = result
                    .as_ref()
                    .ok()
                    .filter(|v| !v.lease.state.is_terminal())
                    .map(|v| v.lease.lease_id);
                if me.send((Msg::Capacity(result), None)).is_err() {
                    // The grain is gone (its attempt ended): nobody will use
                    // or release this lease but us.
                    if let Some(lease_id) = live_lease {
                        lifecycle::release_lease(&capacity, &scope, lease_id);
                    }
                    return;
                }
                if done {
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
        if let Some(t) = a.open_call.as_ref().and_then(|c| c.timeout_at) {
            at.push(t);
        }
        if let Some(due) = self.capacity_return_due() {
            at.push(due);
        }
        if let Some(until) = a.quota_paused_until {
            at.push(until);
        }
        if let Some(i) = &a.interrupt {
            at.push(
                i.requested_at
                    + Duration::seconds(self.shared.config.get().interrupt_grace_seconds as i64),
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
            if let Some(call) = self.attempt.open_call.clone()
                && call.timeout_at.is_some_and(|t| t <= now)
            {
                // The call-timeout reminder.
                let mut a = self.attempt.clone();
                let mut open = self.open.clone();
                let seconds = open
                    .as_ref()
                    .and_then(|r| call.timeout_at.map(|t| (t - r.started_at).num_seconds()))
                    .unwrap_or(0);
                let target = open.as_ref().map(|r| r.target.clone()).unwrap_or_default();
                let why = format!("tool {target} timed out after {seconds} s");
                let events = a.call_timed_out(open.as_mut(), call.call_id, &why, now)?;
                return self.save_with_open(a, events, open).await;
            }
            if let Some(d) = self.pending.clone()
                && d.expires_at <= now
                && d.status == DecisionStatus::Pending
            {
                let minutes = self.shared.config.get().input_timeout_minutes;
                return self.resolve(d, Resolution::Expired { minutes }, None).await;
            }
            if let Some(i) = &self.attempt.interrupt
                && i.requested_at
                    + Duration::seconds(self.shared.config.get().interrupt_grace_seconds as i64)
                    <= now
            {
                return self.observe().await;
            }
            if self.capacity_return_due().is_some_and(|due| due <= now) {
                self.return_capacity().await?;
            }
            if self.attempt.quota_paused_until.is_some_and(|t| t <= now) {
                self.quota_check().await?;
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

    /// Applies a message; returns how to answer it, which the caller does
    /// once the grain's view shows the result (see [`Grain::run`]).
    async fn handle(&mut self, msg: Msg) -> Answer {
        match msg {
            Msg::Claim { holder, reply } => reply_with(reply, self.claim(holder).await),
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
                reply_with(reply, r)
            }
            Msg::Heartbeat { token, reply } => reply_with(reply, self.heartbeat(token).await),
            Msg::BeginCall { token, call, reply } => {
                reply_with(reply, self.begin_call(token, call).await)
            }
            Msg::CompleteCall {
                token,
                completion,
                reply,
            } => reply_with(reply, self.complete_call(token, completion).await),
            Msg::Checkpoint {
                token,
                state,
                phase,
                reply,
            } => reply_with(reply, self.adapter_checkpoint(token, state, phase).await),
            Msg::RequestDecision { token, ask, reply } => {
                reply_with(reply, self.request_decision(token, ask).await)
            }
            Msg::Answer {
                decision_id,
                by,
                choice,
                answer,
                reply,
            } => reply_with(reply, self.answer(decision_id, by, choice, answer).await),
            Msg::Decide {
                decision_id,
                verdict,
                reply,
            } => reply_with(reply, self.decide(decision_id, verdict).await),
            Msg::Interrupt { request, reply } => reply_with(reply, self.interrupt(request).await),
            Msg::Report {
                token,
                report,
                reply,
            } => reply_with(reply, self.report(token, report).await),
            Msg::ChildEnded { child, reply } => reply_with(reply, self.child_ended(*child).await),
            Msg::ModelServerTurn { reply } => reply_with(reply, self.model_server_turn().await),
            Msg::ModelOutage { why, reply } => {
                let r = async {
                    let mut a = self.attempt.clone();
                    let events = a.model_outage_over(why, self.now())?;
                    if !events.is_empty() {
                        self.save(a, events, |_, _| Ok(())).await?;
                    }
                    Ok(())
                }
                .await;
                reply_with(reply, r)
            }
            Msg::Renew { reply } => {
                let renewed = match self.quota_check().await {
                    Ok(()) => self.model_server_check().await,
                    Err(e) => Err(e),
                };
                let renewed = match renewed {
                    Ok(()) => self.renew().await,
                    Err(e) => Err(e),
                };
                reply_with(reply, renewed)
            }
            Msg::Reconcile { reply } => reply_with(reply, self.reconcile().await),
            Msg::CallTimedOut {
                token,
                call_id,
                why,
                reply,
            } => {
                let r = async {
                    self.fence(token, "CallTimedOut").await?;
                    let mut a = self.attempt.clone();
                    let mut open = self.open.clone();
                    let events = a.call_timed_out(open.as_mut(), call_id, &why, self.now())?;
                    self.save_with_open(a, events, open).await?;
                    Ok(self.attempt.clone())
                }
                .await;
                reply_with(reply, r)
            }
            Msg::Fail { failure, reply } => {
                let r = async {
                    let mut a = self.attempt.clone();
                    let events = a.fail(failure, None, self.now())?;
                    self.save(a, events, |_, _| Ok(())).await?;
                    Ok(self.attempt.clone())
                }
                .await;
                reply_with(reply, r)
            }
            Msg::Capacity(result) => {
                if let Err(e) = self.on_capacity(result).await {
                    tracing::warn!(attempt = %self.attempt.attempt_id, error = %e, "recording a capacity lease");
                }
                None
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
        let mut record = next.clone();
        let now = self.now();
        let runs = self.shared.runs.clone();
        let written = self
            .shared
            .store
            .transact(move |tx: &mut Tx| {
                extra(tx, &scope)?;
                tx.save(&scope, &mut record)?;
                tx.emit_all(events)?;
                let followup = if ended {
                    runs.record_outcome(tx, &scope, &record, now)?
                } else {
                    Followup::default()
                };
                Ok::<_, RuntimeError>((record.version, followup))
            })
            .await;
        let (version, followup) = match written {
            Ok(written) => written,
            Err(e) => {
                if e.is_stale() {
                    self.resync().await;
                }
                return Err(e);
            }
        };
        let mut next = next;
        next.version = version;
        self.become_current(next);
        if ended {
            self.ended(followup).await;
        }
        Ok(())
    }

    /// Makes `next` the grain's copy of the attempt.
    fn become_current(&mut self, next: ExecutionAttempt) {
        let before = self.attempt.state;
        if next.state.is_terminal() && !before.is_terminal() {
            // Its place at a model server, if any, is given up.
            self.shared.servers.forget(next.attempt_id);
        }
        self.attempt = next;
        if before != self.attempt.state {
            self.gauge(before, -1.0);
            self.gauge(self.attempt.state, 1.0);
        }
    }

    /// [`Grain::save`] for a write nobody outside the appliance waits for:
    /// the builtin loop's start of a call without effect (a model call, a
    /// read tool). Its place in the commit order is fixed now, so every
    /// later write of the attempt (the call's result, its checkpoint, the
    /// outcome) commits after it; the loop goes on without waiting for the
    /// disk. A crash before the sync loses only a call nobody was told of,
    /// that had no effect, and that the resumed loop makes again.
    fn save_queued<F>(&mut self, next: ExecutionAttempt, events: Vec<NewEvent>, extra: F)
    where
        F: FnOnce(&mut Tx, &TenantScope) -> Result<(), RuntimeError> + Send + 'static,
    {
        let scope = self.scope.clone();
        let mut record = next.clone();
        let attempt_id = self.attempt.attempt_id;
        self.shared.store.submit_then(
            move |tx: &mut Tx| {
                extra(tx, &scope)?;
                tx.save(&scope, &mut record)?;
                tx.emit_all(events)?;
                Ok::<_, RuntimeError>(())
            },
            move |durable| {
                if let Err(e) = durable {
                    tracing::error!(attempt = %attempt_id, error = %e, "a queued write of the attempt failed");
                }
            },
        );
        // The write's place in the order is fixed: the version it will
        // carry is known. Should it fail, the next write is refused as
        // stale and the grain reads the attempt again.
        let mut next = next;
        next.version += 1;
        self.become_current(next);
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
            lifecycle::release_lease(&self.shared.capacity, &self.scope, lease_id);
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
            d.cancel(now);
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

    fn checkpoint_metric(&self) {
        metrics::counter!(names::CHECKPOINTS_WRITTEN, "tenant" => self.attempt.tenant_id.to_string()).increment(1);
    }

    /// An attempt paused by `tokensPerDay` runs again once the quota
    /// allows model calls (the day turned, or the quota was raised); else
    /// it waits for the next day. The timer and every LeaseHeartbeat pass
    /// ask.
    pub(super) async fn quota_check(&mut self) -> Result<(), RuntimeError> {
        if self.attempt.state != AttemptState::Paused || self.attempt.quota_paused_until.is_none() {
            return Ok(());
        }
        let now = self.now();
        let mut a = self.attempt.clone();
        let events = match self
            .shared
            .capacity
            .token_quota(&a.tenant_id, &a.project_id)
        {
            None => a.quota_resumed(now)?,
            Some(limit) if a.quota_paused_until.is_some_and(|t| t <= now) => {
                a.quota_still_out(&limit, now);
                Vec::new()
            }
            Some(_) => return Ok(()),
        };
        self.save(a, events, |_, _| Ok(())).await?;
        if self.attempt.needs_capacity() {
            self.acquire_capacity();
        }
        Ok(())
    }

    /// Its turn came at the model server it waits for: it runs again (and
    /// asks for compute again if it gave it back); its next model call
    /// takes the place held for it.
    pub(super) async fn model_server_turn(&mut self) -> Result<(), RuntimeError> {
        if self.attempt.model_server_wait.is_none() {
            return Ok(());
        }
        let mut a = self.attempt.clone();
        let events = a.model_server_turn(self.now())?;
        self.save(a, events, |_, _| Ok(())).await?;
        if self.attempt.needs_capacity() {
            self.acquire_capacity();
        }
        Ok(())
    }

    /// An attempt paused for a model server that holds no place there
    /// (the appliance restarted since it queued) runs again, and its next
    /// call queues anew. Every LeaseHeartbeat pass asks.
    async fn model_server_check(&mut self) -> Result<(), RuntimeError> {
        if self.attempt.state == AttemptState::Paused
            && self.attempt.model_server_wait.is_some()
            && !self.shared.servers.holds_place(self.attempt.attempt_id)
        {
            return self.model_server_turn().await;
        }
        Ok(())
    }

    fn call_metric(&self, kind: CallKind, status: CallStatus) {
        metrics::counter!(names::CALLS, "tenant" => self.attempt.tenant_id.to_string(), "kind" => kind.as_str(), "status" => status.as_str())
            .increment(1);
    }

    /// A model call's tokens and latency, once its result is durable; its
    /// tokens also count toward today's `tokensPerDay`.
    fn model_metrics(&self, record: &CallRecord) {
        let (tenant, agent) = (
            self.attempt.tenant_id.to_string(),
            self.attempt.agent_id.clone(),
        );
        if let Some(ms) = record.latency_ms {
            metrics::histogram!(names::MODEL_CALL_SECONDS, "tenant" => tenant.clone(), "agent" => agent.clone())
                .record(ms as f64 / 1000.0);
        }
        let Some(usage) = record.usage else {
            return;
        };
        for kind in crate::domain::usage::KINDS {
            metrics::counter!(names::MODEL_TOKENS, "tenant" => tenant.clone(), "agent" => agent.clone(), "kind" => kind)
                .increment(usage.of_kind(kind));
        }
        self.shared.capacity.tokens_charged(
            &self.attempt.tenant_id,
            &self.attempt.project_id,
            record.ended_at.unwrap_or_else(|| self.now()),
            usage.total(),
        );
    }
}
