//! The PoolGrain: one task owns one pool's accounting.
//!
//! Every grant, release, expiry, resize and queue decision of a pool goes
//! through its grain's mailbox, one message at a time, so the pool's
//! counters are exact under any concurrency without a lock on the pool.
//! Quotas, which span pools, are checked and reserved under the book's lock
//! inside the same step (see `book.rs`).
//!
//! A grain never waits for the disk while holding up its mailbox: it applies
//! a change in memory, queues the store write (whose place in the global
//! order is fixed at that moment) and answers the caller from a separate
//! task once the write is durable. Writes of one grain commit in the order
//! it made them.
//!
//! The queue: requests that could fit later wait in arrival order. Each
//! drain pass walks the queue and grants every request that fits, so a
//! request that does not fit never blocks the ones behind it. To keep large
//! requests from starving, a request passed over `max_pass_over` times by
//! later grants while it waited for this pool's capacity makes the pool hold
//! its size back: from then on, requests behind it only get what is left
//! beyond it.

use crate::domain::audit::{Change as AuditChange, Origin};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::book::{Book, seconds_by_day};
use super::holders::Holders;
use super::records::{ExecutionMinutes, RunSlot};
use super::{CapacityError, LeaseView};
use crate::clock::SharedClock;
use crate::domain::access::TenantScope;
use crate::domain::amount::Amount;
use crate::domain::capacity::quota::QuotaExceeded;
use crate::domain::capacity::{
    CapacityLease, LeaseRequest, LeaseState, Limit, PoolSpec, SlotSize, Verdict, WorkerPool, decide,
};
use crate::domain::events::NewEvent;
use crate::domain::{ProjectId, TenantId};
use crate::store::{Store, StoreError, Tx};
use crate::telemetry::names;

/// What the grains share with the capacity service.
pub(super) struct Shared {
    pub store: Store,
    pub clock: SharedClock,
    pub book: Mutex<Book>,
    pub grains: RwLock<HashMap<String, GrainHandle>>,
    /// Live leases (requested, granted, active) by holder, for idempotent
    /// AcquireLease.
    pub holders: Mutex<Holders>,
    /// Seconds a lease lasts without renewal (`capacity.lease_ttl_seconds`,
    /// reloadable).
    pub ttl_seconds: std::sync::atomic::AtomicI64,
    pub max_pass_over: u32,
    /// Asks the autoscaler for a pass (when demand queues up).
    pub nudge_autoscaler: Box<dyn Fn() + Send + Sync>,
}

impl Shared {
    /// How long a lease lasts without renewal, now.
    pub(super) fn ttl(&self) -> chrono::Duration {
        chrono::Duration::seconds(self.ttl_seconds.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Shared {
    /// Sends `Drain` to the named pools.
    pub fn wake(&self, pools: &BTreeSet<String>, except: &str) {
        if pools.is_empty() {
            return;
        }
        let grains = self.grains.read();
        for id in pools {
            if id != except
                && let Some(g) = grains.get(id)
            {
                let _ = g.tx.send(Msg::Drain);
            }
        }
    }
}

/// How an AcquireLease that cannot be granted at once is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Probe: grant if it fits now, else say why and keep nothing.
    TryNow,
    /// Deny at once when it cannot be granted now.
    NoWait,
    /// Queue it.
    Queue,
}

/// The answer to an acquire.
pub enum AcquireOutcome {
    /// Granted (durable).
    Granted(LeaseView),
    /// Queued (durable), with its reason and position.
    Queued(LeaseView),
    /// `TryNow` only: would have to wait, for this reason.
    WouldWait(Limit),
    /// Denied (durable).
    Denied(LeaseView, Limit),
}

type Reply<T> = oneshot::Sender<Result<T, CapacityError>>;

/// The state of a pool and its queue, for views and the accounting check.
#[derive(Clone, Debug)]
pub struct PoolSnapshot {
    /// The pool with its counters.
    pub pool: WorkerPool,
    /// Sum of CPU of the leases holding capacity.
    pub leases_cpu: Amount,
    /// Sum of memory of the leases holding capacity.
    pub leases_memory_gb: Amount,
    /// Leases holding capacity.
    pub leases: Vec<CapacityLease>,
    /// Waiting requests in queue order, with their reasons.
    pub queue: Vec<LeaseView>,
    /// Capacity held back for starved requests.
    pub held_back: SlotSize,
}

/// Messages of a grain.
pub enum Msg {
    Acquire {
        lease_id: Uuid,
        request: LeaseRequest,
        mode: Mode,
        reply: oneshot::Sender<Result<AcquireOutcome, CapacityError>>,
    },
    /// The state of a lease of this pool; `listen` waits for its grant or
    /// denial when it is queued.
    Poll {
        lease_id: Uuid,
        listen: bool,
        reply: Reply<LeaseView>,
    },
    Renew {
        lease_id: Uuid,
        reply: Reply<LeaseView>,
    },
    Release {
        lease_id: Uuid,
        reply: Reply<LeaseView>,
    },
    Bind {
        lease_id: Uuid,
        mechanism: String,
        reply: Reply<LeaseView>,
    },
    Expire {
        now: DateTime<Utc>,
        reply: oneshot::Sender<usize>,
    },
    Autoscale {
        reply: oneshot::Sender<Option<(u32, u32)>>,
    },
    Update {
        spec: PoolSpec,
        slot: SlotSize,
        /// Who changes it, for the audit trail.
        origin: Option<std::sync::Arc<Origin>>,
        reply: Reply<WorkerPool>,
    },
    Drain,
    Snapshot {
        reply: oneshot::Sender<PoolSnapshot>,
    },
    Reconcile {
        reply: oneshot::Sender<Option<String>>,
    },
}

/// A handle to a running grain.
#[derive(Clone)]
pub struct GrainHandle {
    pub tx: mpsc::UnboundedSender<Msg>,
    /// The pool as of the last change, for listings without a round trip.
    pub status: Arc<RwLock<PoolStatus>>,
}

/// What listings show of a pool between messages.
#[derive(Clone, Debug)]
pub struct PoolStatus {
    /// The pool.
    pub pool: WorkerPool,
    /// Requests waiting.
    pub queued: usize,
}

struct Waiter {
    lease: CapacityLease,
    /// Whether the Requested lease has been written.
    persisted: bool,
    /// The acquire that made it, while it is being decided.
    reply: Option<oneshot::Sender<Result<AcquireOutcome, CapacityError>>>,
    mode: Mode,
    /// Callers waiting for the grant or denial.
    listeners: Vec<Reply<LeaseView>>,
    /// Times a later request was granted while this one waited for pool
    /// capacity.
    passed_over: u32,
    /// Why it waits now.
    limit: Option<Limit>,
    /// A QuotaExceeded event was published for it.
    quota_reported: bool,
}

impl Waiter {
    fn need(&self) -> SlotSize {
        SlotSize {
            cpu: self.lease.cpu,
            memory_gb: self.lease.memory_gb,
        }
    }

    fn request(&self) -> LeaseRequest {
        LeaseRequest {
            tenant_id: self.lease.tenant_id.clone(),
            project_id: self.lease.project_id.clone(),
            run_id: self.lease.run_id,
            attempt_id: self.lease.attempt_id,
            run_slot: self.lease.run_slot,
            holder_kind: self.lease.holder_kind,
            holder_id: self.lease.holder_id.clone(),
            cpu: self.lease.cpu,
            memory_gb: self.lease.memory_gb,
            internet_egress: self.lease.internet_egress,
        }
    }
}

/// What one message changed, written in one transaction.
#[derive(Default)]
struct Effects {
    leases: Vec<CapacityLease>,
    pool_dirty: bool,
    events: Vec<NewEvent>,
    minutes: Vec<(TenantId, ProjectId, NaiveDate, u64)>,
    /// Run slots taken by grants.
    slots: Vec<RunSlot>,
    /// Changes people made, for the audit trail.
    audits: Vec<(std::sync::Arc<Origin>, AuditChange)>,
    after: Vec<AfterDurable>,
}

/// What runs once a grain's write is durable (or failed): usually a reply.
type AfterDurable = Box<dyn FnOnce(Result<(), CapacityError>) + Send>;

impl Effects {
    fn then(&mut self, f: impl FnOnce(Result<(), CapacityError>) + Send + 'static) {
        self.after.push(Box::new(f));
    }

    /// Queues a write of `lease` as it is now and moves the grain's copy to
    /// the version that write will store (the write's place in the commit
    /// order is fixed when the effects are committed, and a grain's writes
    /// commit in the order it made them). Returns the copy.
    fn write_lease(&mut self, lease: &mut CapacityLease) -> CapacityLease {
        self.leases.push(lease.clone());
        lease.version += 1;
        lease.clone()
    }
}

fn zero() -> SlotSize {
    SlotSize {
        cpu: Amount::ZERO,
        memory_gb: Amount::ZERO,
    }
}

fn add(a: SlotSize, b: SlotSize) -> SlotSize {
    SlotSize {
        cpu: a.cpu + b.cpu,
        memory_gb: a.memory_gb + b.memory_gb,
    }
}

/// The grain.
pub(super) struct PoolGrain {
    pool: WorkerPool,
    live: HashMap<Uuid, CapacityLease>,
    queue: VecDeque<Waiter>,
    held_back: SlotSize,
    shared: Arc<Shared>,
    status: Arc<RwLock<PoolStatus>>,
}

impl PoolGrain {
    /// Starts a grain for `pool` with the leases found in the store. The
    /// pool's counters are checked against its leases first, and repaired
    /// (loudly) if they differ.
    pub fn spawn(
        mut pool: WorkerPool,
        leases: Vec<CapacityLease>,
        shared: Arc<Shared>,
    ) -> GrainHandle {
        let mut live = HashMap::new();
        let mut waiting: Vec<CapacityLease> = Vec::new();
        for lease in leases {
            match lease.state {
                LeaseState::Granted | LeaseState::Active => {
                    live.insert(lease.lease_id, lease);
                }
                LeaseState::Requested => waiting.push(lease),
                _ => {}
            }
        }
        waiting.sort_by_key(|l| (l.requested_at, l.lease_id));
        let (tx, rx) = mpsc::unbounded_channel();
        let status = Arc::new(RwLock::new(PoolStatus {
            pool: pool.clone(),
            queued: waiting.len(),
        }));
        let mut repaired = None;
        if let Some(mismatch) = mismatch(&pool, &live) {
            tracing::error!(pool = %pool.pool_id, %mismatch, "pool counters did not match its leases at start; repaired from the leases");
            metrics::counter!(names::ACCOUNTING_REPAIRS, "pool" => pool.pool_id.clone())
                .increment(1);
            let (cpu, mem, n) = sums(&live);
            pool.set_counters(cpu, mem, n);
            repaired = Some(pool.clone());
        }
        let queue = waiting
            .into_iter()
            .map(|lease| Waiter {
                lease,
                persisted: true,
                reply: None,
                mode: Mode::Queue,
                listeners: Vec::new(),
                passed_over: 0,
                limit: None,
                quota_reported: true,
            })
            .collect();
        let mut grain = PoolGrain {
            pool,
            live,
            queue,
            held_back: zero(),
            shared,
            status: status.clone(),
        };
        tokio::spawn(async move {
            let mut fx = Effects::default();
            if repaired.is_some() {
                fx.pool_dirty = true;
            }
            grain.drain(&mut fx);
            grain.commit(fx);
            grain.run(rx).await;
        });
        GrainHandle { tx, status }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        while let Some(msg) = rx.recv().await {
            self.handle(msg);
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.shared.clock.now()
    }

    fn handle(&mut self, msg: Msg) {
        tracing::debug!(pool = %self.pool.pool_id, msg = msg_name(&msg), "grain message");
        let mut fx = Effects::default();
        match msg {
            Msg::Acquire {
                lease_id,
                request,
                mode,
                reply,
            } => self.acquire(lease_id, request, mode, reply, &mut fx),
            Msg::Poll {
                lease_id,
                listen,
                reply,
            } => self.poll(lease_id, listen, reply),
            Msg::Renew { lease_id, reply } => self.renew(lease_id, reply, &mut fx),
            Msg::Release { lease_id, reply } => self.release(lease_id, reply, &mut fx),
            Msg::Bind {
                lease_id,
                mechanism,
                reply,
            } => self.bind(lease_id, mechanism, reply, &mut fx),
            Msg::Expire { now, reply } => {
                let n = self.expire(now, &mut fx);
                self.drain(&mut fx);
                fx.then(move |_| {
                    let _ = reply.send(n);
                });
            }
            Msg::Autoscale { reply } => {
                let change = self.autoscale(&mut fx);
                self.drain(&mut fx);
                fx.then(move |_| {
                    let _ = reply.send(change);
                });
            }
            Msg::Update {
                spec,
                slot,
                origin,
                reply,
            } => self.update(spec, slot, origin, reply, &mut fx),
            Msg::Drain => self.drain(&mut fx),
            Msg::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Msg::Reconcile { reply } => {
                let found = mismatch(&self.pool, &self.live);
                if let Some(m) = &found {
                    tracing::error!(pool = %self.pool.pool_id, mismatch = %m, "pool counters drifted from its leases; repaired");
                    metrics::counter!(names::ACCOUNTING_REPAIRS, "pool" => self.pool.pool_id.clone()).increment(1);
                    let (cpu, mem, n) = sums(&self.live);
                    self.pool.set_counters(cpu, mem, n);
                    fx.pool_dirty = true;
                }
                let _ = reply.send(found);
            }
        }
        self.commit(fx);
        tracing::debug!(pool = %self.pool.pool_id, "grain message done");
    }

    fn publish_status(&self) {
        let mut status = self.status.write();
        status.pool = self.pool.clone();
        status.queued = self.queue.len();
        metrics::gauge!(names::POOL_UTILISATION, "poolId" => self.pool.pool_id.clone(), "kind" => self.pool.kind.as_str())
            .set(self.pool.utilisation);
    }

    /// Writes what changed in one transaction and runs the replies once it
    /// is durable.
    fn commit(&mut self, fx: Effects) {
        self.publish_status();
        let Effects {
            leases,
            pool_dirty,
            events,
            minutes,
            slots,
            audits,
            after,
        } = fx;
        if leases.is_empty()
            && !pool_dirty
            && events.is_empty()
            && minutes.is_empty()
            && slots.is_empty()
            && audits.is_empty()
        {
            for f in after {
                f(Ok(()));
            }
            return;
        }
        let pool = pool_dirty.then(|| self.pool.clone());
        if pool_dirty {
            // As for leases (see `Effects::write_lease`).
            self.pool.version += 1;
        }
        let now = self.now();
        let mut leases = leases;
        let write = move |tx: &mut Tx| {
            for lease in &mut leases {
                tx.save(&TenantScope::new(lease.tenant_id.clone()), lease)?;
            }
            if let Some(mut pool) = pool {
                tx.save(&TenantScope::new(pool.tenant_id.clone()), &mut pool)?;
            }
            for (tenant, project, day, seconds) in &minutes {
                let scope = TenantScope::new(tenant.clone());
                let id = day.to_string();
                let mut record =
                    tx.get::<ExecutionMinutes>(&scope, &id)?
                        .unwrap_or(ExecutionMinutes {
                            tenant_id: tenant.clone(),
                            day: *day,
                            seconds: 0,
                            projects: Default::default(),
                            updated_at: now,
                        });
                record.seconds += seconds;
                *record.projects.entry(project.clone()).or_default() += seconds;
                record.updated_at = now;
                tx.put(&scope, &record)?;
            }
            for slot in &slots {
                tx.put(&TenantScope::new(slot.tenant_id.clone()), slot)?;
            }
            tx.emit_all(events)?;
            for (origin, change) in audits {
                tx.audit_as(&origin, now, change)?;
            }
            Ok::<_, StoreError>(())
        };
        // The replies are sent from the store's flusher as soon as the
        // write is durable.
        self.shared.store.submit_then(write, move |durable| {
            let result = durable.map_err(|e| {
                CapacityError::Unavailable(format!(
                    "the lease change could not be made durable: {e}"
                ))
            });
            for f in after {
                f(result.clone());
            }
        });
    }

    fn view(&self, lease: &CapacityLease) -> LeaseView {
        let (position, limit) = match self
            .queue
            .iter()
            .position(|w| w.lease.lease_id == lease.lease_id)
        {
            Some(i) => (Some(i + 1), self.queue[i].limit.clone()),
            None => (None, None),
        };
        LeaseView {
            lease: lease.clone(),
            queue_position: position,
            limit,
        }
    }

    fn forget_holder(&self, lease: &CapacityLease) {
        self.shared.holders.lock().forget(lease);
    }

    fn acquire(
        &mut self,
        lease_id: Uuid,
        request: LeaseRequest,
        mode: Mode,
        reply: oneshot::Sender<Result<AcquireOutcome, CapacityError>>,
        fx: &mut Effects,
    ) {
        let now = self.now();
        let lease = CapacityLease::request(
            lease_id,
            request,
            &self.pool.pool_id,
            now,
            self.shared.ttl(),
        );
        self.queue.push_back(Waiter {
            lease,
            persisted: false,
            reply: Some(reply),
            mode,
            listeners: Vec::new(),
            passed_over: 0,
            limit: None,
            quota_reported: false,
        });
        self.drain(fx);
        // The newcomer is still waiting: settle it by its mode.
        let Some(index) = self.queue.iter().position(|w| w.lease.lease_id == lease_id) else {
            return;
        };
        let limit = self.queue[index]
            .limit
            .clone()
            .expect("a waiting request has a reason");
        match mode {
            Mode::TryNow => {
                let mut waiter = self.queue.remove(index).expect("index is valid");
                if let Some(reply) = waiter.reply.take() {
                    let _ = reply.send(Ok(AcquireOutcome::WouldWait(limit)));
                }
            }
            Mode::NoWait => {
                // Demand the pool could meet by growing: let the autoscaler
                // know, even though this request does not wait.
                if limit.is_pool_capacity() {
                    (self.shared.nudge_autoscaler)();
                }
                let mut waiter = self.queue.remove(index).expect("index is valid");
                self.deny(&mut waiter, limit, now, fx);
            }
            Mode::Queue => {
                let position = index + 1;
                let waiter = &mut self.queue[index];
                waiter.persisted = true;
                let _ = waiter.lease.wait(limit.to_string(), limit.quota_field());
                fx.write_lease(&mut waiter.lease);
                if let Some(event) = quota_event(waiter, &limit, now) {
                    fx.events.push(event);
                }
                if limit.is_pool_capacity() {
                    (self.shared.nudge_autoscaler)();
                }
                let view = LeaseView {
                    lease: waiter.lease.clone(),
                    queue_position: Some(position),
                    limit: Some(limit),
                };
                if let Some(reply) = waiter.reply.take() {
                    fx.then(move |durable| {
                        let _ = reply.send(durable.map(|()| AcquireOutcome::Queued(view)));
                    });
                }
            }
        }
    }

    /// Denies a waiter (taken out of the queue): writes it, tells whoever
    /// waits for it.
    fn deny(&mut self, waiter: &mut Waiter, limit: Limit, now: DateTime<Utc>, fx: &mut Effects) {
        let _ = waiter
            .lease
            .deny(limit.to_string(), limit.quota_field(), now);
        self.forget_holder(&waiter.lease);
        fx.write_lease(&mut waiter.lease);
        if let Some(event) = quota_event(waiter, &limit, now) {
            fx.events.push(event);
        }
        let view = LeaseView {
            lease: waiter.lease.clone(),
            queue_position: None,
            limit: Some(limit.clone()),
        };
        let reply = waiter.reply.take();
        let listeners = std::mem::take(&mut waiter.listeners);
        fx.then(move |durable| {
            if let Some(reply) = reply {
                let _ = reply.send(
                    durable
                        .clone()
                        .map(|()| AcquireOutcome::Denied(view.clone(), limit)),
                );
            }
            for l in listeners {
                let _ = l.send(durable.clone().map(|()| view.clone()));
            }
        });
    }

    fn grant(&mut self, mut waiter: Waiter, book: &mut Book, now: DateTime<Utc>, fx: &mut Effects) {
        let event = waiter
            .lease
            .grant(now, self.shared.ttl())
            .expect("only requested leases wait");
        if let Some(run_id) = book.reserve(&waiter.lease) {
            fx.slots.push(RunSlot {
                tenant_id: waiter.lease.tenant_id.clone(),
                project_id: waiter.lease.project_id.clone(),
                run_id,
                lease_id: waiter.lease.lease_id,
                taken_at: now,
            });
        }
        self.pool.take(waiter.lease.cpu, waiter.lease.memory_gb);
        fx.pool_dirty = true;
        fx.events.push(event);
        fx.write_lease(&mut waiter.lease);
        let waited = (now - waiter.lease.requested_at).num_milliseconds().max(0) as f64 / 1000.0;
        metrics::histogram!(names::LEASE_WAIT, "tenant" => waiter.lease.tenant_id.to_string(), "holderKind" => waiter.lease.holder_kind.as_str())
            .record(waited);
        let view = LeaseView {
            lease: waiter.lease.clone(),
            queue_position: None,
            limit: None,
        };
        self.live.insert(waiter.lease.lease_id, waiter.lease);
        let reply = waiter.reply.take();
        let listeners = std::mem::take(&mut waiter.listeners);
        fx.then(move |durable| {
            if let Some(reply) = reply {
                let _ = reply.send(
                    durable
                        .clone()
                        .map(|()| AcquireOutcome::Granted(view.clone())),
                );
            }
            for l in listeners {
                let _ = l.send(durable.clone().map(|()| view.clone()));
            }
        });
    }

    /// One pass over the queue: grant what fits, deny what never can, keep
    /// the rest with its current reason.
    fn drain(&mut self, fx: &mut Effects) {
        if self.queue.is_empty() {
            self.held_back = zero();
            self.update_blocked(&BTreeSet::new());
            return;
        }
        let now = self.now();
        let shared = self.shared.clone();
        let mut book = shared.book.lock();
        let old = std::mem::take(&mut self.queue);
        let mut kept: VecDeque<Waiter> = VecDeque::with_capacity(old.len());
        // Indexes (into `kept`) of requests waiting for this pool's capacity.
        let mut pool_blocked: Vec<usize> = Vec::new();
        let mut held_back = zero();
        let mut quota_blocked = BTreeSet::new();
        for mut waiter in old {
            waiter.listeners.retain(|l| !l.is_closed());
            let request = waiter.request();
            let verdict = book
                .with_context(
                    &request.tenant_id,
                    &request.project_id,
                    request.run_slot,
                    now,
                    |q| decide(&request, &self.pool, held_back, q),
                )
                .unwrap_or_else(|| {
                    Verdict::Deny(Limit::NoPool {
                        why: format!("tenant {} is not registered", request.tenant_id),
                    })
                });
            match verdict {
                Verdict::Grant => {
                    for &i in &pool_blocked {
                        kept[i].passed_over += 1;
                    }
                    self.grant(waiter, &mut book, now, fx);
                }
                // A probe that can never fit here is only told so: another
                // pool may fit it.
                Verdict::Deny(limit) if waiter.mode == Mode::TryNow => {
                    if let Some(reply) = waiter.reply.take() {
                        let _ = reply.send(Ok(AcquireOutcome::WouldWait(limit)));
                    }
                }
                Verdict::Deny(limit) => self.deny(&mut waiter, limit, now, fx),
                Verdict::Wait(limit) => {
                    if limit.is_pool_capacity() {
                        if waiter.passed_over >= self.shared.max_pass_over {
                            held_back = add(held_back, waiter.need());
                        }
                        pool_blocked.push(kept.len());
                    } else if limit.quota_field().is_some() {
                        quota_blocked.insert(request.tenant_id.clone());
                    }
                    if waiter.persisted && waiter.limit.as_ref() != Some(&limit) {
                        let _ = waiter.lease.wait(limit.to_string(), limit.quota_field());
                    }
                    if waiter.persisted
                        && !waiter.quota_reported
                        && let Some(event) = quota_event(&mut waiter, &limit, now)
                    {
                        fx.events.push(event);
                    }
                    waiter.limit = Some(limit);
                    kept.push_back(waiter);
                }
            }
        }
        drop(book);
        self.queue = kept;
        self.held_back = held_back;
        self.update_blocked(&quota_blocked);
    }

    fn update_blocked(&self, tenants: &BTreeSet<TenantId>) {
        self.shared
            .book
            .lock()
            .set_quota_blocked(&self.pool.pool_id, tenants);
    }

    fn poll(&mut self, lease_id: Uuid, listen: bool, reply: Reply<LeaseView>) {
        if let Some(lease) = self.live.get(&lease_id) {
            let _ = reply.send(Ok(self.view(lease)));
            return;
        }
        if let Some(i) = self.queue.iter().position(|w| w.lease.lease_id == lease_id) {
            if listen {
                self.queue[i].listeners.push(reply);
            } else {
                let view = self.view(&self.queue[i].lease);
                let _ = reply.send(Ok(view));
            }
            return;
        }
        let _ = reply.send(Err(CapacityError::NotHere));
    }

    fn renew(&mut self, lease_id: Uuid, reply: Reply<LeaseView>, fx: &mut Effects) {
        let now = self.now();
        let ttl = self.shared.ttl();
        let lease = if let Some(lease) = self.live.get_mut(&lease_id) {
            lease.renew(now, ttl).map(|()| fx.write_lease(lease))
        } else if let Some(w) = self.queue.iter_mut().find(|w| w.lease.lease_id == lease_id) {
            w.lease
                .renew(now, ttl)
                .map(|()| fx.write_lease(&mut w.lease))
        } else {
            let _ = reply.send(Err(CapacityError::NotHere));
            return;
        };
        match lease {
            Ok(lease) => {
                let view = self.view(&lease);
                fx.then(move |durable| {
                    let _ = reply.send(durable.map(|()| view));
                });
            }
            Err(e) => {
                let _ = reply.send(Err(CapacityError::Domain(e.into())));
            }
        }
    }

    /// Records what binds a live lease's processes (once, or when it
    /// changes).
    fn bind(
        &mut self,
        lease_id: Uuid,
        mechanism: String,
        reply: Reply<LeaseView>,
        fx: &mut Effects,
    ) {
        let Some(lease) = self.live.get_mut(&lease_id) else {
            let _ = reply.send(Err(CapacityError::NotHere));
            return;
        };
        if lease.bound_by.as_deref() == Some(mechanism.as_str()) {
            let lease = lease.clone();
            let _ = reply.send(Ok(self.view(&lease)));
            return;
        }
        lease.bound_by = Some(mechanism);
        let lease = fx.write_lease(lease);
        let view = self.view(&lease);
        fx.then(move |durable| {
            let _ = reply.send(durable.map(|()| view));
        });
    }

    /// Gives a lease's capacity back and charges its minutes.
    fn end(
        &mut self,
        lease: &mut CapacityLease,
        ended: crate::domain::capacity::lease::Ended,
        fx: &mut Effects,
    ) {
        let now = lease.released_at.unwrap_or_else(|| self.now());
        self.pool.give_back(lease.cpu, lease.memory_gb);
        fx.pool_dirty = true;
        fx.events.push(ended.event);
        fx.write_lease(lease);
        if let Some(granted) = lease.granted_at {
            for (day, seconds) in seconds_by_day(granted, now) {
                fx.minutes.push((
                    lease.tenant_id.clone(),
                    lease.project_id.clone(),
                    day,
                    seconds,
                ));
            }
        }
        let to_wake = self.shared.book.lock().free(lease, now);
        self.shared.wake(&to_wake, &self.pool.pool_id);
        self.forget_holder(lease);
    }

    fn release(&mut self, lease_id: Uuid, reply: Reply<LeaseView>, fx: &mut Effects) {
        let now = self.now();
        if let Some(mut lease) = self.live.remove(&lease_id) {
            let ended = lease.release(now).expect("a live lease can be released");
            self.end(&mut lease, ended, fx);
            self.drain(fx);
            let view = self.view(&lease);
            fx.then(move |durable| {
                let _ = reply.send(durable.map(|()| view));
            });
        } else if let Some(i) = self.queue.iter().position(|w| w.lease.lease_id == lease_id) {
            let mut waiter = self.queue.remove(i).expect("index is valid");
            waiter.lease.release(now);
            self.forget_holder(&waiter.lease);
            fx.write_lease(&mut waiter.lease);
            let view = LeaseView {
                lease: waiter.lease.clone(),
                queue_position: None,
                limit: None,
            };
            for l in waiter.listeners.drain(..) {
                let _ = l.send(Ok(view.clone()));
            }
            self.drain(fx);
            fx.then(move |durable| {
                let _ = reply.send(durable.map(|()| view));
            });
        } else {
            let _ = reply.send(Err(CapacityError::NotHere));
        }
    }

    /// Expires leases whose heartbeat stopped and requests nobody asks for
    /// any more. Returns how many.
    fn expire(&mut self, now: DateTime<Utc>, fx: &mut Effects) -> usize {
        let due: Vec<Uuid> = self
            .live
            .values()
            .filter(|l| l.is_due(now))
            .map(|l| l.lease_id)
            .collect();
        let mut count = 0;
        for id in due {
            let mut lease = self.live.remove(&id).expect("collected from live");
            if let Ok(Some(ended)) = lease.expire(now) {
                tracing::info!(lease = %id, pool = %self.pool.pool_id, holder = %lease.holder_id, "lease expired: its heartbeat stopped");
                self.end(&mut lease, ended, fx);
                count += 1;
            }
        }
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].lease.is_due(now) {
                let mut waiter = self.queue.remove(i).expect("index is valid");
                let _ = waiter.lease.expire(now);
                self.forget_holder(&waiter.lease);
                fx.write_lease(&mut waiter.lease);
                count += 1;
            } else {
                i += 1;
            }
        }
        count
    }

    /// Demand of requests waiting for this pool's own capacity.
    fn queued_demand(&self) -> SlotSize {
        self.queue
            .iter()
            .filter(|w| w.limit.as_ref().is_some_and(Limit::is_pool_capacity))
            .fold(zero(), |acc, w| add(acc, w.need()))
    }

    fn autoscale(&mut self, fx: &mut Effects) -> Option<(u32, u32)> {
        let before = self.pool.current_size;
        let desired = self.pool.desired_size(self.queued_demand());
        let event = self.pool.resize(desired, self.now())?;
        tracing::info!(pool = %self.pool.pool_id, from = before, to = self.pool.current_size, "autoscaled");
        fx.events.push(event);
        fx.pool_dirty = true;
        Some((before, self.pool.current_size))
    }

    fn update(
        &mut self,
        spec: PoolSpec,
        slot: SlotSize,
        origin: Option<std::sync::Arc<Origin>>,
        reply: Reply<WorkerPool>,
        fx: &mut Effects,
    ) {
        let now = self.now();
        let before = self.pool.settings();
        match WorkerPool::set(
            Some(&self.pool),
            &self.pool.pool_id.clone(),
            spec,
            slot,
            now,
        ) {
            Ok((pool, events)) => {
                self.pool = pool;
                fx.pool_dirty = true;
                if let Some(origin) = origin {
                    let change =
                        AuditChange::new(&self.pool.tenant_id, "pool.set", &self.pool.pool_id)
                            .before(before)
                            .after(self.pool.settings());
                    fx.audits.push((origin, change));
                }
                fx.events.extend(events);
                self.drain(fx);
                let pool = self.pool.clone();
                fx.then(move |durable| {
                    let _ = reply.send(durable.map(|()| pool));
                });
            }
            Err(e) => {
                let _ = reply.send(Err(CapacityError::Domain(e)));
            }
        }
    }

    fn snapshot(&self) -> PoolSnapshot {
        let (cpu, mem, _) = sums(&self.live);
        let mut leases: Vec<CapacityLease> = self.live.values().cloned().collect();
        leases.sort_by_key(|l| l.lease_id);
        PoolSnapshot {
            pool: self.pool.clone(),
            leases_cpu: cpu,
            leases_memory_gb: mem,
            leases,
            queue: self.queue.iter().map(|w| self.view(&w.lease)).collect(),
            held_back: self.held_back,
        }
    }
}

fn msg_name(m: &Msg) -> &'static str {
    match m {
        Msg::Acquire { .. } => "acquire",
        Msg::Poll { .. } => "poll",
        Msg::Renew { .. } => "renew",
        Msg::Release { .. } => "release",
        Msg::Bind { .. } => "bind",
        Msg::Expire { .. } => "expire",
        Msg::Autoscale { .. } => "autoscale",
        Msg::Update { .. } => "update",
        Msg::Drain => "drain",
        Msg::Snapshot { .. } => "snapshot",
        Msg::Reconcile { .. } => "reconcile",
    }
}

fn sums(live: &HashMap<Uuid, CapacityLease>) -> (Amount, Amount, u32) {
    live.values()
        .fold((Amount::ZERO, Amount::ZERO, 0), |(c, m, n), l| {
            (c + l.cpu, m + l.memory_gb, n + 1)
        })
}

/// How the pool's counters differ from the sum of its live leases, if they do.
fn mismatch(pool: &WorkerPool, live: &HashMap<Uuid, CapacityLease>) -> Option<String> {
    let (cpu, mem, n) = sums(live);
    (pool.granted_cpu != cpu || pool.granted_memory_gb != mem || pool.active_leases != n).then(|| {
        format!(
            "counters say cpu {} / memoryGb {} / {} leases, the leases sum to cpu {cpu} / memoryGb {mem} / {n}",
            pool.granted_cpu, pool.granted_memory_gb, pool.active_leases
        )
    })
}

/// The QuotaExceeded event for a waiter stopped by a quota (once per request).
fn quota_event(waiter: &mut Waiter, limit: &Limit, now: DateTime<Utc>) -> Option<NewEvent> {
    let field = limit.quota_field()?;
    if waiter.quota_reported {
        return None;
    }
    waiter.quota_reported = true;
    metrics::counter!(names::QUOTA_DENIALS, "tenant" => waiter.lease.tenant_id.to_string(), "limit" => field).increment(1);
    Some(NewEvent::new(
        &waiter.lease.tenant_id,
        now,
        &QuotaExceeded {
            tenant_id: &waiter.lease.tenant_id,
            project_id: &waiter.lease.project_id,
            holder_kind: waiter.lease.holder_kind.as_str(),
            holder_id: &waiter.lease.holder_id,
            limit: limit.to_string(),
        },
    ))
}
