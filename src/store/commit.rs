//! Group commit: one writer thread, one flusher thread.
//!
//! The writer takes every transaction that has queued up, runs each closure
//! against an in-memory overlay of the group's writes (so later closures
//! read what earlier ones wrote), and hands the whole group to the engine
//! ([`KvEngine::apply`]): sled applies it atomically, its redo record
//! first, then plain inserts (`redo.rs`), while no reader reads
//! (`engine.rs`); PostgreSQL keeps it for the flusher, and the writer reads
//! it from memory until it is committed. The flusher then makes every
//! group that arrived meanwhile durable in one step (sled: a flush and a
//! sync of its data file; PostgreSQL: one transaction), and only after
//! that publishes their events and answers their writers.
//!
//! Why not sled transactions: a sled 0.34 transaction takes a process-wide
//! lock exclusively, and once one has run in a process, every `flush`
//! holds that lock shared while it writes the log and waits for
//! `sync_file_range`. Applying a group and flushing the previous one then
//! take turns, and the cycle is their sum. With plain inserts they
//! overlap: a cycle is the longer of the two. And since only this thread
//! writes, closures run exactly once, in one global order, and events are
//! numbered by a plain counter.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use tokio::sync::{broadcast, oneshot};

use super::kv::{KvEngine, KvRead};
use super::tx::{DerivedCache, Finished, Tx, Writes};
use super::{StoreError, trail};
use crate::domain::events::StoredEvent;

/// Most transactions applied as one group; bounds the size of a group's
/// redo record and the latency a group adds to its first member.
const MAX_GROUP: usize = 512;

/// A committed write waiting for the flusher: how to answer it.
type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// What the writer thread lends each job.
pub(super) struct WriterCtx {
    engine: Arc<dyn KvEngine>,
    /// Groups handed to the engine: numbers each group.
    groups: u64,
    /// Writes of the current group, not yet handed to the engine.
    group: Writes,
    /// Groups handed over but not readable until durable, oldest first
    /// (see [`KvEngine::visible_when_durable`]).
    pending: VecDeque<(u64, Arc<Writes>)>,
    /// What the versioned records written lately derive.
    derived: DerivedCache,
    /// Events of the current group.
    events: Vec<Arc<StoredEvent>>,
    /// Sequence number of the next event.
    next_seq: u64,
    /// The end of the audit chain.
    trail: trail::Head,
}

/// A transaction: runs against the group overlay, returns how to answer
/// once durable, or `None` when it already answered (it aborted).
type TxJob = Box<dyn FnOnce(&mut WriterCtx) -> Option<Completion> + Send>;
/// Work that must see no write in progress.
type ExclusiveJob = Box<dyn FnOnce(&dyn KvRead) + Send>;

enum Job {
    /// A transaction.
    Tx(TxJob),
    /// Runs alone, after the current group is applied.
    Exclusive(ExclusiveJob),
    /// Finish the queue, flush, stop.
    Stop(mpsc::SyncSender<Result<(), StoreError>>),
}

/// How the writer is set up.
pub(super) struct CommitOptions {
    /// Sequence number of the next event.
    pub next_seq: u64,
    /// The end of the audit chain.
    pub trail: trail::Head,
}

/// Counters of the group commit.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommitStats {
    /// Transactions committed.
    pub commits: u64,
    /// Groups handed to the engine.
    pub groups: u64,
    /// Keys written or removed by those groups (a key a group writes
    /// twice counts once).
    pub keys: u64,
    /// Rounds that made groups durable.
    pub flushes: u64,
    /// Maintenance pauses between groups (sled's reopens, see
    /// `engine.rs`).
    pub reopens: u64,
    /// The longest such pause, in milliseconds.
    pub longest_reopen_ms: u64,
}

struct Shared {
    healthy: AtomicBool,
    /// Sequence of the last durable event (0: none yet).
    head: AtomicU64,
    /// Number of the last durable group.
    durable_group: AtomicU64,
    last_error: Mutex<Option<String>>,
    commits: AtomicU64,
    groups: AtomicU64,
    keys: AtomicU64,
    flushes: AtomicU64,
    reopens: AtomicU64,
    longest_reopen_ms: AtomicU64,
}

impl Shared {
    fn fail(&self, e: &StoreError) {
        tracing::error!(error = %e, "the store cannot confirm writes; the appliance is no longer ready");
        self.last_error.lock().get_or_insert_with(|| e.to_string());
        self.healthy.store(false, Ordering::Release);
    }

    fn failure(&self) -> StoreError {
        StoreError::FlushFailed(self.last_error.lock().clone().unwrap_or_default())
    }
}

pub(super) struct Committer {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl Committer {
    pub(super) fn start(
        engine: Arc<dyn KvEngine>,
        options: CommitOptions,
        events: broadcast::Sender<Arc<StoredEvent>>,
    ) -> Result<Committer, StoreError> {
        let CommitOptions { next_seq, trail } = options;
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(true),
            head: AtomicU64::new(next_seq.saturating_sub(1)),
            durable_group: AtomicU64::new(0),
            last_error: Mutex::new(None),
            commits: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            reopens: AtomicU64::new(0),
            longest_reopen_ms: AtomicU64::new(0),
        });
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (flush_tx, flush_rx) = mpsc::channel::<Flush>();
        let ctx = WriterCtx {
            engine: engine.clone(),
            groups: 0,
            group: Writes::default(),
            pending: VecDeque::new(),
            derived: DerivedCache::default(),
            events: Vec::new(),
            next_seq,
            trail,
        };
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || writer_loop(job_rx, flush_tx, ctx, shared))
                .map_err(StoreError::io("starting the store writer thread"))?
        };
        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("store-flusher".into())
                .spawn(move || flusher_loop(flush_rx, engine, events, shared))
                .map_err(StoreError::io("starting the store flusher thread"))?
        };
        Ok(Committer {
            sender: Mutex::new(Some(job_tx)),
            threads: Mutex::new(vec![writer, flusher]),
            shared,
        })
    }

    fn send(&self, job: Job) -> Result<(), StoreError> {
        self.sender
            .lock()
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(job)
            .map_err(|_| StoreError::Closed)
    }

    /// Queues a transaction; the receiver answers once it is durable.
    pub(super) fn submit<R, E, F>(
        &self,
        f: F,
    ) -> Result<oneshot::Receiver<Result<R, E>>, StoreError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<Result<R, E>>();
        self.submit_then(f, move |result| {
            let _ = reply.send(result);
        })?;
        Ok(rx)
    }

    /// Queues a transaction; `done` is called with its result once it is
    /// durable (on the flusher thread: it must only hand the result on),
    /// at once if it aborted, or with [`StoreError::Closed`] if the store
    /// stopped first.
    pub(super) fn submit_then<R, E, F, D>(&self, f: F, done: D) -> Result<(), StoreError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        D: FnOnce(Result<R, E>) + Send + 'static,
    {
        let mut done = Answer(Some(done), std::marker::PhantomData);
        let origin = crate::acting::current();
        self.send(Job::Tx(Box::new(move |ctx: &mut WriterCtx| {
            let mut tx = Tx::new(
                ctx.engine.as_ref(),
                &ctx.group,
                &ctx.pending,
                &ctx.derived,
                ctx.next_seq,
                ctx.trail.clone(),
                origin,
            );
            match f(&mut tx) {
                Ok(value) => {
                    let Finished {
                        writes,
                        events,
                        learnt,
                        trail,
                    } = tx.finish();
                    ctx.next_seq += events.len() as u64;
                    ctx.trail = trail;
                    ctx.group.merge(writes);
                    ctx.derived.merge(learnt);
                    ctx.events.extend(events);
                    Some(Box::new(move |durable: Result<(), StoreError>| {
                        done.answer(durable.map(|()| value).map_err(E::from));
                    }) as Completion)
                }
                Err(e) => {
                    // Its writes are dropped with the Tx: answer at once.
                    done.answer(Err(e));
                    None
                }
            }
        })))
    }

    /// Runs `f` on the writer thread between two groups: no write
    /// interleaves with it. For consistent snapshots.
    pub(super) fn run_exclusive<R, F>(&self, f: F) -> oneshot::Receiver<R>
    where
        F: FnOnce(&dyn KvRead) -> R + Send + 'static,
        R: Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        // If the writer is gone the job is dropped with `reply`, and the
        // receiver reports the store closed.
        let _ = self.send(Job::Exclusive(Box::new(move |kv| {
            let _ = reply.send(f(kv));
        })));
        rx
    }

    pub(super) fn health(&self) -> Result<(), String> {
        if self.shared.healthy.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.shared.failure().to_string())
        }
    }

    /// Sequence of the last durable event.
    pub(super) fn head(&self) -> u64 {
        self.shared.head.load(Ordering::Acquire)
    }

    pub(super) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            groups: self.shared.groups.load(Ordering::Relaxed),
            keys: self.shared.keys.load(Ordering::Relaxed),
            flushes: self.shared.flushes.load(Ordering::Relaxed),
            reopens: self.shared.reopens.load(Ordering::Relaxed),
            longest_reopen_ms: self.shared.longest_reopen_ms.load(Ordering::Relaxed),
        }
    }

    /// Stops after everything already queued, with a final flush.
    pub(super) fn stop(&self) -> Result<(), StoreError> {
        let Some(sender) = self.sender.lock().take() else {
            return Ok(());
        };
        // A std channel: stop() also runs from Drop, possibly on an async
        // worker thread, where a tokio blocking receive would panic.
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if sender.send(Job::Stop(done_tx)).is_err() {
            return Err(StoreError::Closed);
        }
        drop(sender);
        let result = done_rx.recv().unwrap_or(Err(StoreError::Closed));
        for handle in self.threads.lock().drain(..) {
            let _ = handle.join();
        }
        result
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // A store dropped without close() still finishes queued writes.
        let _ = self.stop();
    }
}

/// Whoever waits for a transaction: answered once, with
/// [`StoreError::Closed`] if the transaction is dropped unanswered (the
/// writer stopped before it ran).
struct Answer<D, R, E>(Option<D>, std::marker::PhantomData<fn(R, E)>)
where
    D: FnOnce(Result<R, E>),
    E: From<StoreError>;

impl<D, R, E> Answer<D, R, E>
where
    D: FnOnce(Result<R, E>),
    E: From<StoreError>,
{
    fn answer(&mut self, result: Result<R, E>) {
        if let Some(done) = self.0.take() {
            done(result);
        }
    }
}

impl<D, R, E> Drop for Answer<D, R, E>
where
    D: FnOnce(Result<R, E>),
    E: From<StoreError>,
{
    fn drop(&mut self) {
        self.answer(Err(E::from(StoreError::Closed)));
    }
}

/// A group handed to the flusher.
enum Flush {
    Group {
        number: u64,
        completions: Vec<Completion>,
        events: Vec<Arc<StoredEvent>>,
        /// The writes, when the engine makes them readable only once
        /// durable.
        writes: Option<Arc<Writes>>,
        applied: Result<(), StoreError>,
    },
    /// Answered once every earlier group is flushed and answered.
    Barrier(mpsc::SyncSender<()>),
    Stop(mpsc::SyncSender<Result<(), StoreError>>),
}

/// Hands the group's overlay to the engine.
fn apply_group(ctx: &mut WriterCtx) -> Result<Option<Arc<Writes>>, StoreError> {
    let writes = std::mem::take(&mut ctx.group);
    if writes.is_empty() {
        return Ok(None);
    }
    ctx.groups += 1;
    let applied = ctx.engine.apply(ctx.groups, writes)?;
    if let Some(writes) = &applied {
        ctx.pending.push_back((ctx.groups, writes.clone()));
    }
    Ok(applied)
}

fn writer_loop(
    jobs: mpsc::Receiver<Job>,
    flusher: mpsc::Sender<Flush>,
    mut ctx: WriterCtx,
    shared: Arc<Shared>,
) {
    let mut completions: Vec<Completion> = Vec::new();
    // Applies the open group and hands it to the flusher.
    let close_group = |ctx: &mut WriterCtx, completions: &mut Vec<Completion>| -> bool {
        if completions.is_empty() {
            return true;
        }
        let group_start = ctx.next_seq - ctx.events.len() as u64;
        let applied = if shared.healthy.load(Ordering::Acquire) {
            shared
                .keys
                .fetch_add(ctx.group.len() as u64, Ordering::Relaxed);
            apply_group(ctx)
        } else {
            Err(shared.failure())
        };
        let (applied, writes) = match applied {
            Ok(writes) => (Ok(()), writes),
            Err(e) => (Err(e), None),
        };
        if let Err(e) = &applied {
            if shared.healthy.load(Ordering::Acquire) {
                shared.fail(e);
            }
            // The group is answered with the error and the store stops
            // taking writes. What sled holds of it is completed or removed
            // when the store is next opened (`redo.rs`), before the event
            // numbers are read again; what it derived is forgotten.
            ctx.next_seq = group_start;
            ctx.group = Writes::default();
            ctx.pending.clear();
            ctx.derived.clear();
        }
        shared
            .commits
            .fetch_add(completions.len() as u64, Ordering::Relaxed);
        shared.groups.fetch_add(1, Ordering::Relaxed);
        flusher
            .send(Flush::Group {
                number: ctx.groups,
                completions: std::mem::take(completions),
                events: std::mem::take(&mut ctx.events),
                writes,
                applied,
            })
            .is_ok()
    };
    while let Ok(first) = jobs.recv() {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(job) = next.take() {
            taken += 1;
            forget_durable(&mut ctx, &shared);
            match job {
                Job::Tx(run) => {
                    if let Some(done) = run(&mut ctx) {
                        completions.push(done);
                    }
                }
                Job::Exclusive(run) => {
                    if !close_group(&mut ctx, &mut completions) {
                        return;
                    }
                    // It reads what is durable: every group so far must be.
                    if ctx.engine.visible_when_durable() && !all_durable(&flusher) {
                        return;
                    }
                    run(ctx.engine.reader());
                }
                Job::Stop(done) => {
                    close_group(&mut ctx, &mut completions);
                    let _ = flusher.send(Flush::Stop(done));
                    return;
                }
            }
            if taken < MAX_GROUP {
                next = jobs.try_recv().ok();
            }
        }
        if !close_group(&mut ctx, &mut completions) {
            return;
        }
        if ctx.engine.maintenance_due() && shared.healthy.load(Ordering::Acquire) {
            maintain(&ctx, &flusher, &shared);
        }
    }
    shared.healthy.store(false, Ordering::Release);
}

/// Drops the groups the flusher made durable from the writer's overlay:
/// the engine reads them now.
fn forget_durable(ctx: &mut WriterCtx, shared: &Shared) {
    if ctx.pending.is_empty() {
        return;
    }
    let durable = shared.durable_group.load(Ordering::Acquire);
    while ctx.pending.front().is_some_and(|(n, _)| *n <= durable) {
        ctx.pending.pop_front();
    }
}

/// Waits until every group handed to the flusher is durable and answered.
fn all_durable(flusher: &mpsc::Sender<Flush>) -> bool {
    let (done, flushed) = mpsc::sync_channel(1);
    flusher.send(Flush::Barrier(done)).is_ok() && flushed.recv().is_ok()
}

/// Runs the engine's maintenance once every group so far is durable (see
/// [`KvEngine::between_groups`]); writes queue meanwhile.
fn maintain(ctx: &WriterCtx, flusher: &mpsc::Sender<Flush>, shared: &Shared) {
    if !all_durable(flusher) {
        return;
    }
    match ctx.engine.between_groups() {
        Ok(Some(took)) => {
            shared.reopens.fetch_add(1, Ordering::Relaxed);
            shared
                .longest_reopen_ms
                .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
            metrics::counter!(crate::telemetry::names::STORE_REOPENS).increment(1);
            metrics::histogram!(crate::telemetry::names::STORE_REOPEN_SECONDS)
                .record(took.as_secs_f64());
        }
        Ok(None) => {}
        Err(e) => shared.fail(&e),
    }
}

fn flusher_loop(
    queue: mpsc::Receiver<Flush>,
    engine: Arc<dyn KvEngine>,
    events: broadcast::Sender<Arc<StoredEvent>>,
    shared: Arc<Shared>,
) {
    loop {
        let Ok(first) = queue.recv() else { return };
        let mut batch = vec![first];
        // Take every group that arrived while the previous sync ran.
        while !matches!(batch.last(), Some(Flush::Stop(_))) {
            match queue.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        // After a failed sync the state of unsynced writes is unknown, so
        // nothing is acknowledged again until the appliance restarts.
        let pending: Vec<Arc<Writes>> = batch
            .iter()
            .filter_map(|message| match message {
                Flush::Group {
                    writes: Some(w),
                    applied: Ok(()),
                    ..
                } => Some(w.clone()),
                _ => None,
            })
            .collect();
        let flushed = if shared.healthy.load(Ordering::Acquire) {
            engine.make_durable(&pending)
        } else {
            Err(shared.failure())
        };
        shared.flushes.fetch_add(1, Ordering::Relaxed);
        match &flushed {
            Err(e) => shared.fail(e),
            Ok(()) => {
                let last = batch.iter().rev().find_map(|message| match message {
                    Flush::Group { number, .. } => Some(*number),
                    _ => None,
                });
                if let Some(last) = last {
                    shared.durable_group.fetch_max(last, Ordering::AcqRel);
                }
            }
        }
        let mut stop = None;
        let mut barriers = Vec::new();
        for message in batch {
            let (completions, group_events, applied) = match message {
                Flush::Group {
                    completions,
                    events,
                    applied,
                    ..
                } => (completions, events, applied),
                Flush::Barrier(done) => {
                    barriers.push(done);
                    continue;
                }
                Flush::Stop(done) => {
                    stop = Some(done);
                    continue;
                }
            };
            let failure = match (&applied, &flushed) {
                (Ok(()), Ok(())) => None,
                (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
            };
            // Subscribers hear of a durable event before its writer's call
            // returns, so whoever saw the write can find the event.
            if failure.is_none() {
                if let Some(last) = group_events.last() {
                    shared.head.fetch_max(last.sequence, Ordering::AcqRel);
                }
                for event in group_events {
                    // No subscriber is not an error.
                    let _ = events.send(event);
                }
            }
            for complete in completions {
                complete(match &failure {
                    None => Ok(()),
                    Some(e) => Err(StoreError::FlushFailed(e.clone())),
                });
            }
        }
        for done in barriers {
            let _ = done.send(());
        }
        if let Some(done) = stop {
            let _ = done.send(flushed);
            return;
        }
    }
}
