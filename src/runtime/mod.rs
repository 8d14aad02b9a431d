//! The attempt runtime: one [`grain`] task per live attempt, the claim
//! queue external adapters take attempts from, and the workers that keep
//! leases alive, settle orphans and compact checkpoints.
//!
//! Every operation on a live attempt is a message to its grain, which
//! applies it to the ExecutionAttempt aggregate (`domain::attempt`) and
//! answers only once the change is durable. Reads (timelines, checkpoints,
//! decisions) come from the store; long polls wait on the grain's watch
//! channel.

pub mod builtin;
pub mod commands;
#[cfg(unix)]
pub mod confine;
pub mod content;
pub mod follow;
pub mod grain;
#[cfg(windows)]
pub mod jobobject;
pub mod port;
pub mod profiles;
pub mod reach;
pub mod records;
pub mod release;
pub mod servers;
pub mod text;
pub mod workers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use uuid::Uuid;

use self::grain::{AttemptView, Msg};
use self::release::ReleaseInfo;
use crate::capacity::{Capacity, CapacityError};
use crate::clock::SharedClock;
use crate::config::RuntimeConfig;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::attempt::{
    AttemptFailure, AttemptState, CallRecord, CallStatus, Checkpoint, DecisionRequest,
    DecisionStatus, ExecutionAttempt, InterruptRequest, InterruptSource, SubAgentDelegation,
};
use crate::domain::release::{AdapterKind, InFlightPolicy};
use crate::domain::run::{ChildEnded, Followup};
use crate::domain::{DomainError, FieldError, TenantId};
use crate::releases::{InFlight, InFlightReport, Releases};
use crate::store::{Store, StoreError};
use crate::telemetry::{Gauge, names};

pub use self::commands::*;
pub use self::records::{decision_key, index};

/// Errors of the runtime and run control.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A rule, or bad input.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RuntimeError {
    /// Whether a write was refused because it was derived from an older
    /// state than the stored one (or broke a rule between the two).
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            RuntimeError::Store(StoreError::Stale { .. } | StoreError::Invariant { .. })
        )
    }
}

impl From<FieldError> for RuntimeError {
    fn from(e: FieldError) -> Self {
        RuntimeError::Domain(e.into())
    }
}

impl From<crate::domain::attempt::IllegalTransition> for RuntimeError {
    fn from(e: crate::domain::attempt::IllegalTransition) -> Self {
        RuntimeError::Domain(e.into())
    }
}

impl From<CapacityError> for RuntimeError {
    fn from(e: CapacityError) -> Self {
        match e {
            CapacityError::Domain(d) => d.into(),
            other => DomainError::Unavailable(other.to_string()).into(),
        }
    }
}

/// A handle on a running grain.
#[derive(Clone)]
pub struct GrainHandle {
    tx: mpsc::UnboundedSender<grain::Mail>,
    view: watch::Receiver<Arc<AttemptView>>,
}

/// Attempts waiting for an adapter: by (tenant, agent), in arrival order.
type ClaimQueue = BTreeMap<(TenantId, String), BTreeSet<(DateTime<Utc>, Uuid)>>;

/// What the grains share.
pub struct Shared {
    pub(crate) store: Store,
    pub(crate) clock: SharedClock,
    pub(crate) config: crate::config::Live<RuntimeConfig>,
    pub(crate) capacity: Arc<Capacity>,
    pub(crate) releases: Arc<Releases>,
    /// Run control, through the one interface the runtime knows of it.
    pub(crate) runs: Arc<dyn port::RunPort>,
    grains: Mutex<HashMap<Uuid, GrainHandle>>,
    /// Attempts waiting for an external adapter, by (tenant, agent), in
    /// arrival order.
    claimable: Mutex<ClaimQueue>,
    claim_news: Notify,
    release_cache: Mutex<HashMap<(TenantId, String), Arc<ReleaseInfo>>>,
    runtime: Mutex<Weak<Runtime>>,
    shutdown: watch::Receiver<bool>,
    /// This process's name as the holder of builtin attempts.
    pub(crate) holder: String,
    /// Builtin attempts ready for the builtin loop.
    builtin: Mutex<Option<mpsc::UnboundedSender<(TenantId, Uuid)>>>,
    /// Where tool processes start.
    #[cfg(unix)]
    pub(crate) confiner: Arc<confine::Confiner>,
    /// The site's model servers as capacity: their limits and queues.
    pub(crate) servers: Arc<servers::ModelServers>,
    /// The model text of attempts as it is written.
    pub(crate) text: Arc<text::TextStreams>,
}

impl Shared {
    pub(crate) fn runtime(&self) -> Option<Arc<Runtime>> {
        self.runtime.lock().upgrade()
    }

    pub(crate) fn set_claimable(&self, attempt: &ExecutionAttempt, claimable: bool) {
        if attempt.adapter == AdapterKind::Builtin {
            if claimable && let Some(tx) = self.builtin.lock().as_ref() {
                let _ = tx.send((attempt.tenant_id.clone(), attempt.attempt_id));
            }
            return;
        }
        let key = (attempt.tenant_id.clone(), attempt.agent_id.clone());
        let mut map = self.claimable.lock();
        let set = map.entry(key.clone()).or_default();
        let entry = (attempt.started_at, attempt.attempt_id);
        if claimable {
            set.insert(entry);
            drop(map);
            self.claim_news.notify_waiters();
        } else {
            set.remove(&entry);
            if set.is_empty() {
                map.remove(&key);
            }
        }
    }

    pub(crate) fn release_info(
        &self,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<Arc<ReleaseInfo>, RuntimeError> {
        let key = (scope.tenant().clone(), release_id.to_string());
        if let Some(info) = self.release_cache.lock().get(&key).cloned() {
            return Ok(info);
        }
        let info = Arc::new(ReleaseInfo::load(&self.releases, scope, release_id)?);
        self.release_cache.lock().insert(key, info.clone());
        Ok(info)
    }
}

impl Runtime {
    /// What the runtime knows of a release of the scope's tenant: its
    /// manifest, tools and contracts (loaded once).
    pub fn release(
        &self,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<Arc<ReleaseInfo>, RuntimeError> {
        self.shared.release_info(scope, release_id)
    }
}

/// The runtime service: a handle, cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

fn gone(attempt_id: Uuid) -> RuntimeError {
    DomainError::Unavailable(format!(
        "attempt {attempt_id} is shutting down or ended; ask again"
    ))
    .into()
}

impl Runtime {
    /// Starts the runtime: a grain for every live attempt in the store.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        store: Store,
        clock: SharedClock,
        config: crate::config::Live<RuntimeConfig>,
        capacity: Arc<Capacity>,
        releases: Arc<Releases>,
        runs: Arc<dyn port::RunPort>,
        shutdown: watch::Receiver<bool>,
        #[cfg(unix)] confiner: Arc<confine::Confiner>,
    ) -> Result<Arc<Runtime>, RuntimeError> {
        let (model_servers, turns) = servers::ModelServers::new(clock.clone());
        let shared = Arc::new(Shared {
            store: store.clone(),
            servers: Arc::new(model_servers),
            text: Arc::default(),
            clock,
            config,
            capacity,
            runs,
            releases: releases.clone(),
            grains: Mutex::new(HashMap::new()),
            claimable: Mutex::new(BTreeMap::new()),
            claim_news: Notify::new(),
            release_cache: Mutex::new(HashMap::new()),
            runtime: Mutex::new(Weak::new()),
            shutdown,
            holder: format!("appliance:{}", crate::domain::ids::new_id()),
            builtin: Mutex::new(None),
            #[cfg(unix)]
            confiner,
        });
        let runtime = Arc::new(Runtime { shared });
        *runtime.shared.runtime.lock() = Arc::downgrade(&runtime);
        releases.set_in_flight(runtime.clone());
        let (builtin_tx, builtin_rx) = mpsc::unbounded_channel();
        *runtime.shared.builtin.lock() = Some(builtin_tx);
        builtin::start(runtime.clone(), builtin_rx);
        runtime.clone().serve_model_server_turns(turns);
        for (tenant, id) in
            store.global_ids(&PlatformScope::internal(), index::ATTEMPT_LIVE, index::ALL)?
        {
            let Ok(attempt_id) = Uuid::parse_str(&id) else {
                continue;
            };
            runtime.adopt(&TenantScope::new(tenant), attempt_id)?;
        }
        Ok(runtime)
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The content the tenant's store holds under `hash` (a prompt, a
    /// response, a checkpoint's state), or `None` when it has none (never
    /// stored, or removed by retention).
    pub fn content(
        &self,
        scope: &TenantScope,
        hash: &str,
    ) -> Result<Option<Vec<u8>>, RuntimeError> {
        Ok(self.shared.store.read_artifact(scope, hash)?)
    }

    /// The decision an attempt waits for, with its question and proposed
    /// call read from the tenant's content, as people and clients see it.
    pub fn pending_decision(
        &self,
        scope: &TenantScope,
        decision: &crate::domain::attempt::DecisionRequest,
    ) -> PendingDecision {
        PendingDecision::read(&self.shared.store, scope, decision)
    }

    /// Ends every tool process tree (the appliance is stopping).
    #[cfg(unix)]
    pub fn end_tool_processes(&self) {
        self.shared.confiner.end_all();
    }

    /// What this host enforces on tool processes, under the configuration
    /// now.
    #[cfg(unix)]
    pub fn confinement(&self) -> confine::HostReport {
        self.shared.confiner.host(&self.config())
    }

    /// What this host enforces on tool processes, as the start's probe
    /// found it.
    #[cfg(windows)]
    pub fn confinement(&self) -> jobobject::HostReport {
        jobobject::host()
    }

    /// The configuration now (reloadable).
    pub fn config(&self) -> Arc<RuntimeConfig> {
        self.shared.config.get()
    }

    /// The model API key named `name` under `[runtime.model_api_keys]`, as
    /// configured now.
    pub fn model_api_key(&self, name: &str) -> Option<String> {
        self.config()
            .model_api_keys
            .get(name)
            .map(|k| k.expose().to_string())
    }

    /// Starts a grain for a live attempt that has none, from the attempt
    /// as stored now; true when it started one. Whoever names the attempt
    /// holds a snapshot (a list, the copy a transaction returned), and an
    /// attempt whose grain ended it and went away in between must not come
    /// back from that snapshot. So the record is read again under the
    /// registry's lock: a grain leaves the registry only after its last
    /// write was acknowledged, which is after that write is visible to
    /// reads.
    pub fn adopt(&self, scope: &TenantScope, attempt_id: Uuid) -> Result<bool, RuntimeError> {
        let mut grains = self.shared.grains.lock();
        if grains.contains_key(&attempt_id) {
            return Ok(false);
        }
        let Some(attempt) = self
            .shared
            .store
            .get::<ExecutionAttempt>(scope, &attempt_id.to_string())?
            .filter(|a| !a.state.is_terminal())
        else {
            return Ok(false);
        };
        let handle = grain::spawn(self.shared.clone(), attempt);
        grains.insert(attempt_id, handle);
        Ok(true)
    }

    /// Removes a grain that stopped from the registry, unless another grain
    /// has taken its place.
    pub(crate) fn forget(&self, attempt_id: Uuid, grain: &mpsc::UnboundedSender<grain::Mail>) {
        let mut grains = self.shared.grains.lock();
        if grains
            .get(&attempt_id)
            .is_some_and(|g| g.tx.same_channel(grain))
        {
            grains.remove(&attempt_id);
        }
    }

    /// Live attempts.
    pub fn live(&self) -> Vec<Arc<AttemptView>> {
        self.shared
            .grains
            .lock()
            .values()
            .map(|g| g.view.borrow().clone())
            .collect()
    }

    fn handle(&self, scope: &TenantScope, attempt_id: Uuid) -> Option<GrainHandle> {
        let g = self.shared.grains.lock().get(&attempt_id).cloned()?;
        let same_tenant = g.view.borrow().attempt.tenant_id == *scope.tenant();
        same_tenant.then_some(g)
    }

    /// The attempt (from its grain when live, else from the store).
    pub fn attempt(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        Ok(self.view(scope, attempt_id)?.attempt.clone())
    }

    /// Whether the attempt has a grain: it has not ended, or its grain has
    /// not yet finished (every write of an ended grain is durable).
    pub fn is_live(&self, scope: &TenantScope, attempt_id: Uuid) -> bool {
        self.handle(scope, attempt_id).is_some()
    }

    /// The live view (with the capacity wait) of an attempt.
    ///
    /// A grain publishes its view once its write is durable, but the write
    /// is visible in the store a moment earlier (with the run it ended, in
    /// the same transaction). Whichever of the two is newer is the answer,
    /// so a reader who saw the run's new state never sees the attempt's
    /// old one.
    pub fn view(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Arc<AttemptView>, RuntimeError> {
        let live = self
            .handle(scope, attempt_id)
            .map(|g| g.view.borrow().clone());
        let stored = self
            .shared
            .store
            .get::<ExecutionAttempt>(scope, &attempt_id.to_string())?;
        match (live, stored) {
            (Some(view), Some(stored)) if stored.version > view.attempt.version => {
                // Everything derived from the attempt follows the stored
                // copy: its pending decision (written in the same
                // transaction) and the capacity wait only while it has one.
                let decision = match stored.pending_decision {
                    Some(d) if view.decision.as_ref().map(|v| v.decision_id) == Some(d) => {
                        view.decision.clone()
                    }
                    Some(d) => self
                        .shared
                        .store
                        .get::<DecisionRequest>(scope, &decision_key(attempt_id, d))?,
                    None => None,
                };
                let waits = stored.needs_capacity();
                Ok(Arc::new(AttemptView {
                    queue_position: view.queue_position.filter(|_| waits),
                    limiting_quota: view.limiting_quota.clone().filter(|_| waits),
                    capacity_reason: view.capacity_reason.clone().filter(|_| waits),
                    decision,
                    attempt: stored,
                }))
            }
            (Some(view), _) => Ok(view),
            (None, Some(stored)) => Ok(Arc::new(AttemptView::ended(stored))),
            (None, None) => Err(DomainError::not_found("attempt", attempt_id).into()),
        }
    }

    /// A receiver of the attempt's views, for watchers.
    pub fn watch(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<watch::Receiver<Arc<AttemptView>>, RuntimeError> {
        match self.handle(scope, attempt_id) {
            Some(g) => Ok(g.view),
            None => {
                let view = Arc::new(AttemptView::ended(self.attempt(scope, attempt_id)?));
                Ok(watch::channel(view).1)
            }
        }
    }

    /// Sends a message to a live attempt's grain and waits for the answer;
    /// `None` when the attempt has no grain (it ended).
    async fn try_ask<T>(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Msg,
    ) -> Result<Option<T>, RuntimeError> {
        let Some(g) = self.handle(scope, attempt_id) else {
            return Ok(None);
        };
        let (reply, rx) = oneshot::channel();
        if g.tx.send((make(reply), crate::acting::current())).is_err() {
            return Ok(None);
        }
        match rx.await {
            Ok(result) => result.map(Some),
            Err(_) => Err(gone(attempt_id)),
        }
    }

    /// [`Runtime::try_ask`]; an ended attempt answers through `ended`.
    async fn ask<T>(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Msg,
        ended: impl FnOnce(ExecutionAttempt) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        match self.try_ask(scope, attempt_id, make).await? {
            Some(answer) => Ok(answer),
            None => ended(self.attempt(scope, attempt_id)?),
        }
    }

    /// An adapter's operation: the grain answers, or, when the attempt
    /// ended, a refusal that checks (and records) the token first.
    async fn adapter_op<T>(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        operation: &str,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Msg,
    ) -> Result<T, RuntimeError> {
        match self.try_ask(scope, attempt_id, make).await? {
            Some(answer) => Ok(answer),
            None => {
                let attempt = self.attempt(scope, attempt_id)?;
                Err(self.ended_refusal(scope, attempt, token, operation).await)
            }
        }
    }

    /// Refuses a call on an ended attempt, checking the token first. A
    /// stale token is recorded on the stored attempt, read and written in
    /// one transaction.
    async fn ended_refusal(
        &self,
        scope: &TenantScope,
        attempt: ExecutionAttempt,
        token: u64,
        operation: &str,
    ) -> RuntimeError {
        let now = self.shared.clock.now();
        if let Err(e) = attempt.clone().check_fencing(token, operation, now) {
            let (s, id, op) = (
                scope.clone(),
                attempt.attempt_id.to_string(),
                operation.to_string(),
            );
            let _ = self
                .shared
                .store
                .transact(move |tx| {
                    if let Some(mut stored) = tx.get::<ExecutionAttempt>(&s, &id)?
                        && stored.check_fencing(token, &op, now).is_err()
                    {
                        tx.save(&s, &mut stored)?;
                    }
                    Ok::<_, StoreError>(())
                })
                .await
                .map_err(|e: StoreError| tracing::warn!(error = %e, "recording a stale token"));
            return e.into();
        }
        DomainError::Aborted(format!(
            "attempt {} is {}; {operation} refused{}",
            attempt.attempt_id,
            attempt.state,
            attempt
                .failure
                .as_ref()
                .map(|f| format!(" ({}: {})", f.class.as_str(), f.reason))
                .unwrap_or_default()
        ))
        .into()
    }

    /// `ClaimAttempt`: the next attempt of `agent` waiting for an adapter
    /// (or resumable), within `wait`.
    pub async fn claim(
        &self,
        scope: &TenantScope,
        agent: &str,
        session: &str,
        wait: Duration,
    ) -> Result<Option<Ticket>, RuntimeError> {
        let wait = wait.min(Duration::from_secs(
            self.shared.config.get().max_wait_seconds,
        ));
        let deadline = tokio::time::Instant::now() + wait;
        let key = (scope.tenant().clone(), agent.to_string());
        let mut shutdown = self.shared.shutdown.clone();
        loop {
            let news = self.shared.claim_news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            let candidates: Vec<Uuid> = self
                .shared
                .claimable
                .lock()
                .get(&key)
                .map(|s| s.iter().map(|(_, id)| *id).collect())
                .unwrap_or_default();
            for attempt_id in candidates {
                let holder = session.to_string();
                let result = self
                    .ask(
                        scope,
                        attempt_id,
                        |reply| Msg::Claim { holder, reply },
                        |_| Ok(None),
                    )
                    .await;
                if let Ok(Some(ticket)) = result {
                    return Ok(Some(ticket));
                }
            }
            if *shutdown.borrow() {
                return Ok(None);
            }
            tokio::select! {
                _ = &mut news => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
                _ = shutdown.changed() => return Ok(None),
            }
        }
    }

    /// The builtin loop takes an attempt handed to it.
    pub(crate) async fn claim_builtin(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Option<Ticket>, RuntimeError> {
        let holder = self.shared.holder.clone();
        self.ask(
            scope,
            attempt_id,
            |reply| Msg::Claim { holder, reply },
            |_| Ok(None),
        )
        .await
    }

    /// `StartAttempt`.
    pub async fn start_attempt(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        adapter_version: String,
        checkpoint_format: u32,
        context_snapshot_ref: Option<String>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        self.adapter_op(scope, attempt_id, token, "StartAttempt", |reply| {
            Msg::Start {
                token,
                adapter_version,
                checkpoint_format,
                context_snapshot_ref,
                reply,
            }
        })
        .await
    }

    /// `Heartbeat`: renews the adapter's hold on the attempt.
    pub async fn heartbeat(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        self.adapter_op(scope, attempt_id, token, "Heartbeat", |reply| {
            Msg::Heartbeat { token, reply }
        })
        .await
    }

    /// `BeginCall`.
    pub async fn begin_call(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        call: BeginCall,
    ) -> Result<Begun, RuntimeError> {
        self.adapter_op(scope, attempt_id, token, "BeginCall", |reply| {
            Msg::BeginCall { token, call, reply }
        })
        .await
    }

    /// `CompleteCall`. A result for a call settled as uncertain is kept as
    /// evidence (its receipt) and refused.
    pub async fn complete_call(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        completion: Completion,
    ) -> Result<Completed, RuntimeError> {
        let late = completion.clone();
        let make = |reply| Msg::CompleteCall {
            token,
            completion,
            reply,
        };
        if let Some(done) = self.try_ask(scope, attempt_id, make).await? {
            return Ok(done);
        }
        let attempt = self.attempt(scope, attempt_id)?;
        if attempt.fencing_token == token {
            self.late_receipt(scope, &attempt, &late).await?;
        }
        Err(self
            .ended_refusal(scope, attempt, token, "CompleteCall")
            .await)
    }

    /// Keeps the receipt of a result that came after its call was settled.
    async fn late_receipt(
        &self,
        scope: &TenantScope,
        attempt: &ExecutionAttempt,
        late: &Completion,
    ) -> Result<(), RuntimeError> {
        let (s, attempt_id, call_id) = (scope.clone(), attempt.attempt_id, late.call_id);
        let receipt = late.receipt.clone().or_else(|| late.result.clone());
        let now = self.shared.clock.now();
        let retain = crate::store::artifacts::unreferenced_until(now);
        self.shared
            .store
            .transact(move |tx| {
                let calls: Vec<CallRecord> = tx.list_under(&s, &format!("{attempt_id}/"))?;
                if let Some(mut call) = calls.into_iter().find(|c| c.call_id == call_id)
                    && call.status == CallStatus::Uncertain
                    && call.late_receipt_ref.is_none()
                    && let Some(bytes) = receipt
                {
                    call.late_receipt_ref =
                        Some(tx.put_artifact(&s, &bytes, "application/json", Some(retain), now)?);
                    tx.put(&s, &call)?;
                }
                Ok::<_, RuntimeError>(())
            })
            .await
    }

    /// `Checkpoint`.
    pub async fn checkpoint(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        state: Vec<u8>,
        phase: Option<crate::domain::attempt::AttemptPhase>,
    ) -> Result<(Checkpoint, AttemptState), RuntimeError> {
        self.adapter_op(scope, attempt_id, token, "Checkpoint", |reply| {
            Msg::Checkpoint {
                token,
                state,
                phase,
                reply,
            }
        })
        .await
    }

    /// `RequestDecision`.
    pub async fn request_decision(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        ask: DecisionAsk,
    ) -> Result<DecisionRequest, RuntimeError> {
        self.adapter_op(scope, attempt_id, token, "RequestDecision", |reply| {
            Msg::RequestDecision { token, ask, reply }
        })
        .await
    }

    /// A decision of an attempt.
    pub fn decision(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        decision_id: Uuid,
    ) -> Result<DecisionRequest, RuntimeError> {
        self.shared
            .store
            .get::<DecisionRequest>(scope, &decision_key(attempt_id, decision_id))?
            .ok_or_else(|| DomainError::not_found("decision", decision_id).into())
    }

    /// `AwaitDecision`: the decision once it is no longer pending (or as
    /// it is when `wait` ran out).
    pub async fn await_decision(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        decision_id: Uuid,
        wait: Duration,
    ) -> Result<(DecisionRequest, AttemptState), RuntimeError> {
        let attempt = self.attempt(scope, attempt_id)?;
        if attempt.fencing_token != token {
            return Err(self
                .ended_refusal(scope, attempt, token, "AwaitDecision")
                .await);
        }
        let mut rx = self.watch(scope, attempt_id)?;
        let deadline = tokio::time::Instant::now()
            + wait.min(Duration::from_secs(
                self.shared.config.get().max_wait_seconds,
            ));
        loop {
            let decision = self.decision(scope, attempt_id, decision_id)?;
            let state = rx.borrow().attempt.state;
            if decision.status != DecisionStatus::Pending || state.is_terminal() {
                return Ok((decision, state));
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    let state = self.attempt(scope, attempt_id)?.state;
                    return Ok((self.decision(scope, attempt_id, decision_id)?, state));
                },
                _ = tokio::time::sleep_until(deadline) => return Ok((decision, state)),
            }
        }
    }

    /// `AwaitCall`: a call once it is no longer issued.
    pub async fn await_call(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        call_id: Uuid,
        wait: Duration,
    ) -> Result<CallRecord, RuntimeError> {
        let attempt = self.attempt(scope, attempt_id)?;
        if attempt.fencing_token != token {
            return Err(self.ended_refusal(scope, attempt, token, "AwaitCall").await);
        }
        let mut rx = self.watch(scope, attempt_id)?;
        let deadline = tokio::time::Instant::now()
            + wait.min(Duration::from_secs(
                self.shared.config.get().max_wait_seconds,
            ));
        loop {
            let call = self
                .calls(scope, attempt_id)?
                .into_iter()
                .find(|c| c.call_id == call_id)
                .ok_or_else(|| DomainError::not_found("call", call_id))?;
            if call.status != CallStatus::Issued {
                return Ok(call);
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    return self.calls(scope, attempt_id)?.into_iter().find(|c| c.call_id == call_id)
                        .ok_or_else(|| DomainError::not_found("call", call_id).into());
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(call),
            }
        }
    }

    /// `AnswerDecision` (input, escalation).
    pub async fn answer(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        decision_id: Uuid,
        by: &str,
        choice: Option<String>,
        answer: Option<Vec<u8>>,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        let by = by.to_string();
        self.ask(
            scope,
            attempt_id,
            |reply| Msg::Answer {
                decision_id,
                by,
                choice,
                answer,
                reply,
            },
            |a| {
                Err(DomainError::FailedPrecondition(format!(
                    "attempt {} is {}; decision {decision_id} can no longer be answered",
                    a.attempt_id, a.state
                ))
                .into())
            },
        )
        .await
    }

    /// Approves or rejects an approval (run control's ApprovalDecided).
    pub async fn decide(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        decision_id: Uuid,
        verdict: ApprovalVerdict,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        if let Some(reason) = &verdict.reason {
            crate::domain::FieldError::check_text("reason", reason)?;
        }
        self.ask(
            scope,
            attempt_id,
            |reply| Msg::Decide {
                decision_id,
                verdict,
                reply,
            },
            |a| {
                Err(DomainError::FailedPrecondition(format!(
                    "attempt {} is {}; its approval can no longer be decided",
                    a.attempt_id, a.state
                ))
                .into())
            },
        )
        .await
    }

    /// `Interrupt`: records the request; observed at the next safe point.
    pub async fn interrupt(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        by: &str,
        reason: &str,
        source: InterruptSource,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        crate::domain::FieldError::check_text("reason", reason)?;
        let request = InterruptRequest {
            requested_at: self.shared.clock.now(),
            by: by.to_string(),
            reason: if reason.is_empty() {
                format!("interrupted by {by}")
            } else {
                reason.to_string()
            },
            source,
        };
        self.ask(
            scope,
            attempt_id,
            |reply| Msg::Interrupt { request, reply },
            Ok,
        )
        .await
    }

    /// `ReportOutcome`.
    pub async fn report(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        report: Report,
    ) -> Result<Reported, RuntimeError> {
        let repeat = report.clone();
        let make = |reply| Msg::Report {
            token,
            report,
            reply,
        };
        if let Some(reported) = self.try_ask(scope, attempt_id, make).await? {
            return Ok(reported);
        }
        let attempt = self.attempt(scope, attempt_id)?;
        if attempt.fencing_token != token {
            return Err(self
                .ended_refusal(scope, attempt, token, "ReportOutcome")
                .await);
        }
        // The same report again is acknowledged; a different one rejected.
        let hash = grain::report_hash_of(&attempt, &repeat);
        attempt.check_repeat_report(&hash)?;
        Ok(Reported {
            verdict: grain::verdict_of(&attempt),
            state: attempt.state,
            outcome_hash: attempt.outcome_hash.clone(),
            acknowledged: true,
        })
    }

    /// Up to `limit` attempts of a tenant, newest first, before `before`,
    /// in `state` when given (through its index), that `keep` admits.
    pub fn page(
        &self,
        scope: &TenantScope,
        state: Option<AttemptState>,
        before: Option<&str>,
        limit: usize,
        keep: impl FnMut(&ExecutionAttempt) -> bool,
    ) -> Result<Vec<ExecutionAttempt>, RuntimeError> {
        Ok(self.shared.store.page(
            scope,
            state.map(|s| (index::ATTEMPT_STATE, s.as_str())),
            before,
            limit,
            keep,
        )?)
    }

    /// How many attempts of a tenant are in `state` (all when `None`).
    pub fn count(
        &self,
        scope: &TenantScope,
        state: Option<AttemptState>,
    ) -> Result<u64, RuntimeError> {
        let store = &self.shared.store;
        let states = match state {
            Some(s) => vec![s],
            None => AttemptState::ALL.to_vec(),
        };
        let mut n = 0;
        for s in states {
            n += store.index_count(scope, index::ATTEMPT_STATE, s.as_str())?;
        }
        Ok(n)
    }

    /// Pending decisions of a tenant, oldest first, at most `limit`.
    pub fn pending_decisions(
        &self,
        scope: &TenantScope,
        limit: usize,
    ) -> Result<Vec<DecisionRequest>, RuntimeError> {
        let store = &self.shared.store;
        // At most `limit` read: the index runs in attempt order, so these
        // are the oldest attempts' decisions.
        let ids: Vec<String> = store
            .index_range(scope, index::DECISION_PENDING, None, None, limit)?
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let mut d: Vec<DecisionRequest> = store.get_many(scope, &ids)?;
        d.sort_by_key(|d| d.requested_at);
        d.truncate(limit);
        Ok(d)
    }

    /// How many decisions of the tenant wait (index entries only).
    pub fn pending_decision_count(&self, scope: &TenantScope) -> Result<usize, RuntimeError> {
        Ok(self
            .shared
            .store
            .index_range(scope, index::DECISION_PENDING, None, None, usize::MAX)?
            .len())
    }

    /// Decided decisions of a tenant, a page of `limit` in key order after
    /// the key `before` (the console's history below its inbox).
    pub fn decided_decisions(
        &self,
        scope: &TenantScope,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DecisionRequest>, RuntimeError> {
        Ok(self
            .shared
            .store
            .page(scope, None, before, limit, |d: &DecisionRequest| {
                d.status != DecisionStatus::Pending
            })?)
    }

    /// Uncertain calls of a tenant that wait for an operator's settlement.
    pub fn unsettled_calls(&self, scope: &TenantScope) -> Result<Vec<CallRecord>, RuntimeError> {
        let store = &self.shared.store;
        let ids: Vec<String> = store
            .index_range(scope, index::CALL_UNSETTLED, None, None, usize::MAX)?
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        Ok(store.get_many(scope, &ids)?)
    }

    /// The gauges of what waits for a person, per tenant at `now`: seconds
    /// until the soonest waiting decision expires, and the Uncertain calls
    /// awaiting settlement with the age of the oldest.
    pub fn waiting_gauges(&self, tenants: &[TenantId], now: DateTime<Utc>) -> Vec<Gauge> {
        let mut expiry = Gauge::new(
            names::DECISION_NEXT_EXPIRY,
            "Seconds until the tenant's soonest waiting decision expires",
        );
        let mut uncertain = Gauge::new(
            names::UNCERTAIN_CALLS,
            "Uncertain calls awaiting an operator's settlement",
        );
        let mut oldest = Gauge::new(
            names::UNCERTAIN_CALL_OLDEST,
            "Age in seconds of the oldest Uncertain call awaiting settlement",
        );
        let seconds = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
        for tenant in tenants {
            let scope = TenantScope::new(tenant.clone());
            let t = [("tenant", tenant.as_str())];
            if let Ok(pending) = self.pending_decisions(&scope, usize::MAX)
                && let Some(soonest) = pending.iter().map(|d| d.expires_at).min()
            {
                expiry.set(&t, seconds(soonest - now).max(0.0));
            }
            if let Ok(calls) = self.unsettled_calls(&scope) {
                let open: Vec<_> = calls.iter().filter(|c| c.settlement.is_none()).collect();
                uncertain.set(&t, open.len() as f64);
                if let Some(first) = open
                    .iter()
                    .map(|c| c.ended_at.unwrap_or(c.started_at))
                    .min()
                {
                    oldest.set(&t, seconds(now - first).max(0.0));
                }
            }
        }
        vec![expiry, uncertain, oldest]
    }

    /// Checkpoints of an attempt, in order.
    pub fn checkpoints(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Vec<Checkpoint>, RuntimeError> {
        self.attempt(scope, attempt_id)?;
        Ok(self
            .shared
            .store
            .list_under(scope, &format!("{attempt_id}/"))?)
    }

    /// The attempt's last checkpoint, read alone (its sequence is the
    /// attempt's count of checkpoints).
    pub fn last_checkpoint(
        &self,
        scope: &TenantScope,
        a: &crate::domain::attempt::ExecutionAttempt,
    ) -> Result<Option<Checkpoint>, RuntimeError> {
        if a.usage.checkpoints == 0 {
            return Ok(None);
        }
        Ok(self
            .shared
            .store
            .get(scope, &Checkpoint::key(a.attempt_id, a.usage.checkpoints))?)
    }

    /// Call records of an attempt, in order.
    pub fn calls(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Vec<CallRecord>, RuntimeError> {
        Ok(self
            .shared
            .store
            .list_under(scope, &format!("{attempt_id}/"))?)
    }

    /// Decisions of an attempt.
    pub fn decisions(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Vec<DecisionRequest>, RuntimeError> {
        let mut d: Vec<DecisionRequest> = self
            .shared
            .store
            .list_under(scope, &format!("{attempt_id}/"))?;
        d.sort_by_key(|d| d.requested_at);
        Ok(d)
    }

    /// Delegations of an attempt.
    pub fn delegations(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<Vec<SubAgentDelegation>, RuntimeError> {
        Ok(self
            .shared
            .store
            .list_under(scope, &format!("{attempt_id}/"))?)
    }

    /// Acts on what followed an attempt's end: starts the next attempt and
    /// tells a supervisor its child run ended.
    pub async fn follow(&self, scope: &TenantScope, followup: Followup) {
        if let Some(next) = followup.next_attempt
            && let Err(e) = self.adopt(scope, next)
        {
            tracing::error!(attempt = %next, error = %e, "starting the next attempt's grain; the reconciler will retry");
        }
        if let Some(child) = followup.child_ended {
            self.child_ended(scope, child).await;
        }
        if let Some(run_id) = followup.run_ended
            && let Err(e) = self.shared.capacity.end_run_slot(scope, run_id).await
        {
            tracing::error!(run = %run_id, error = %e, "freeing an ended run's run slot; the accounting reconciler will retry");
        }
    }

    async fn child_ended(&self, scope: &TenantScope, child: ChildEnded) {
        let attempt_id = child.parent.attempt_id;
        let r = self
            .ask(
                scope,
                attempt_id,
                |reply| Msg::ChildEnded {
                    child: Box::new(child),
                    reply,
                },
                |_| Ok(()),
            )
            .await;
        if let Err(e) = r {
            tracing::warn!(attempt = %attempt_id, error = %e, "delivering a child run's outcome");
        }
    }

    /// Lets each attempt whose turn came at a model server run again, and
    /// gives the turns a passing minute makes (every second, on the
    /// appliance's clock), until the appliance stops.
    fn serve_model_server_turns(
        self: Arc<Self>,
        mut turns: mpsc::UnboundedReceiver<(TenantId, Uuid)>,
    ) {
        let weak = Arc::downgrade(&self);
        let mut shutdown = self.shared.shutdown.clone();
        drop(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    turn = turns.recv() => {
                        let Some((tenant, attempt_id)) = turn else { return };
                        let Some(runtime) = weak.upgrade() else { return };
                        tokio::spawn(async move {
                            let scope = TenantScope::new(tenant);
                            let r = runtime
                                .try_ask(&scope, attempt_id, |reply| Msg::ModelServerTurn { reply })
                                .await;
                            if let Err(e) = r {
                                tracing::warn!(attempt = %attempt_id, error = %e, "an attempt's turn at its model server");
                            }
                        });
                    }
                    _ = tick.tick() => {
                        let Some(runtime) = weak.upgrade() else { return };
                        runtime.model_servers_tick();
                    }
                    _ = shutdown.changed() => return,
                }
            }
        });
    }

    /// A second of the model servers: turns a passing minute gives,
    /// probes of servers that are down, and attempts whose wait an outage
    /// outlasted, which fail `model-unavailable`.
    fn model_servers_tick(self: &Arc<Self>) {
        let minutes = self.shared.config.get().model_outage_max_minutes;
        let max = chrono::Duration::minutes(i64::try_from(minutes).unwrap_or(i64::MAX / 60_000));
        let (probes, over) = self.shared.servers.tick(max);
        for probe in probes {
            let servers = self.shared.servers.clone();
            tokio::spawn(async move {
                let answered = builtin::probe_model_server(&probe.endpoints).await;
                servers.probed(&probe.key, answered);
            });
        }
        for o in over {
            let runtime = self.clone();
            tokio::spawn(async move {
                let scope = TenantScope::new(o.tenant);
                let r = runtime
                    .try_ask(&scope, o.attempt, |reply| Msg::ModelOutage {
                        why: o.why,
                        reply,
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(attempt = %o.attempt, error = %e, "ending an attempt a model server outage outlasted");
                }
            });
        }
    }

    /// What a site model server is doing now, in words (the console).
    pub fn model_server_now(&self, endpoint: &str) -> String {
        self.shared.servers.now(endpoint)
    }

    /// Why an attempt is paused, as it is now: for a wait at a model
    /// server, its place in the server's queue now, not when it joined.
    pub fn pause_reason(&self, a: &ExecutionAttempt) -> Option<String> {
        a.model_server_wait
            .as_ref()
            .filter(|_| a.state == AttemptState::Paused)
            .and_then(|_| self.shared.servers.waiting(a.attempt_id))
            .or_else(|| a.pause_reason.clone())
    }

    /// Why an attempt waits now ([`AttemptView::waiting_reason`], with a
    /// model server's queue as it is now).
    pub fn waiting_reason(&self, view: &AttemptView) -> Option<String> {
        let a = &view.attempt;
        if a.state == AttemptState::Paused
            && a.model_server_wait.is_some()
            && let Some(why) = self.pause_reason(a)
        {
            return Some(format!("paused: {why}"));
        }
        view.waiting_reason()
    }

    /// LeaseHeartbeat: every live grain renews its leases.
    pub async fn heartbeat_all(&self) -> (usize, usize) {
        let grains: Vec<GrainHandle> = self.shared.grains.lock().values().cloned().collect();
        let mut renewed = 0;
        let mut failed = 0;
        for g in grains {
            let (reply, rx) = oneshot::channel();
            if g.tx.send((Msg::Renew { reply }, None)).is_ok() {
                match rx.await {
                    Ok(Ok(true)) => renewed += 1,
                    Ok(Ok(false)) => {}
                    _ => failed += 1,
                }
            }
        }
        (renewed, failed)
    }

    /// OrphanedAttemptReconciler: attempts whose adapter lease lapsed are
    /// settled (Uncertain with an unconfirmed call in flight, else
    /// Cancelled); returns what it settled.
    pub async fn reconcile(&self) -> Result<Vec<(Uuid, AttemptState)>, RuntimeError> {
        let grains: Vec<(Uuid, GrainHandle)> = self
            .shared
            .grains
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        // Every grain is asked first, then the answers are awaited: each
        // reconciles in its own time, and one tenant's busy grains delay
        // no other grain, only the end of the pass.
        let asked: Vec<_> = grains
            .into_iter()
            .filter_map(|(id, g)| {
                let (reply, rx) = oneshot::channel();
                g.tx.send((Msg::Reconcile { reply }, None))
                    .is_ok()
                    .then_some((id, rx))
            })
            .collect();
        let settled: Vec<(Uuid, AttemptState)> =
            futures::future::join_all(asked.into_iter().map(|(id, rx)| async move {
                match rx.await {
                    Ok(Ok(Some(state))) => Some((id, state)),
                    _ => None,
                }
            }))
            .await
            .into_iter()
            .flatten()
            .collect();
        // An attempt the store says is live but that has no grain (its
        // grain stopped on an error): start one, which resumes or settles it.
        let live = self.shared.store.global_ids(
            &PlatformScope::internal(),
            index::ATTEMPT_LIVE,
            index::ALL,
        )?;
        for (tenant, id) in live {
            let Ok(attempt_id) = Uuid::parse_str(&id) else {
                continue;
            };
            if self.adopt(&TenantScope::new(tenant), attempt_id)? {
                tracing::warn!(attempt = %attempt_id, "a live attempt had no grain; one was started from its stored state");
            }
        }
        Ok(settled)
    }

    /// A tool call with effects outlasted its timeout and its process tree
    /// was killed: the call and the attempt are Uncertain.
    pub async fn call_timed_out(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        token: u64,
        call_id: Uuid,
        why: String,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        self.ask(
            scope,
            attempt_id,
            |reply| Msg::CallTimedOut {
                token,
                call_id,
                why,
                reply,
            },
            Ok,
        )
        .await
    }

    /// Fails an attempt for a reason of the appliance (not startable).
    pub async fn fail(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        failure: AttemptFailure,
    ) -> Result<ExecutionAttempt, RuntimeError> {
        self.ask(scope, attempt_id, |reply| Msg::Fail { failure, reply }, Ok)
            .await
    }
}

impl InFlight for Runtime {
    fn apply<'a>(
        &'a self,
        scope: &'a TenantScope,
        release_id: &'a str,
        policy: InFlightPolicy,
    ) -> BoxFuture<'a, InFlightReport> {
        Box::pin(async move {
            let running: Vec<Uuid> = self
                .live()
                .iter()
                .filter(|v| {
                    v.attempt.tenant_id == *scope.tenant() && v.attempt.release_id == release_id
                })
                .map(|v| v.attempt.attempt_id)
                .collect();
            let mut report = InFlightReport {
                running: running.len(),
                interrupted: 0,
            };
            if policy == InFlightPolicy::Interrupt {
                for id in running {
                    let reason =
                        format!("release {release_id} was revoked (in-flight policy interrupt)");
                    if self
                        .interrupt(
                            scope,
                            id,
                            "release-registry",
                            &reason,
                            InterruptSource::Revocation,
                        )
                        .await
                        .is_ok()
                    {
                        report.interrupted += 1;
                    }
                }
            }
            report
        })
    }
}
